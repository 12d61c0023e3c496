import sys

from dfcil.cli import main

if __name__ == "__main__":
    sys.exit(main())
