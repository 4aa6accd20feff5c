"""``mpiexec -n N python -m apps.torchddp train|bench …`` (``--help`` on each)."""

from apps.torchddp.cli import run
from mpicomm.runtime import main

if __name__ == "__main__":
    raise SystemExit(main(run))
