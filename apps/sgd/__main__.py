"""``mpiexec -n N python -m apps.sgd train|bench|plot …`` (``--help`` on each)."""

from apps.sgd.cli import run
from mpicomm.runtime import main

if __name__ == "__main__":
    raise SystemExit(main(run))
