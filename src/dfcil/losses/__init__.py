"""Loss functions: pure, tested, each with its formula and a reference."""
