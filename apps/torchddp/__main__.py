"""``mpiexec -n N python -m apps.torchddp train|bench …`` (``--help`` on each)."""

from mpicomm.runtime import main

from apps.torchddp.cli import run

if __name__ == "__main__":
    raise SystemExit(main(run))
