import sys

from dfcil.cli import main

sys.exit(main())
