"""``python -m moelab.runner ...``: see :mod:`moelab.runner.cli`."""
import sys

from moelab.runner.cli import main

if __name__ == "__main__":
    sys.exit(main())
