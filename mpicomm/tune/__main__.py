"""``python -m mpicomm.tune`` (see :mod:`mpicomm.tune.command`)."""

import sys

from .command import main

if __name__ == "__main__":
    sys.exit(main())
