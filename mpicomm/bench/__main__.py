"""``python -m mpicomm.bench``: run :func:`mpicomm.bench.cli.main` (kept apart so importing the package runs nothing)."""

import sys

from .cli import main

sys.exit(main())
