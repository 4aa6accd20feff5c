"""``python -m apps.pipeline schedule …`` and ``mpiexec -n N python -m apps.pipeline train|bench …`` (``--help`` on each)."""

from apps.pipeline.cli import run
from mpicomm.runtime import main

if __name__ == "__main__":
    raise SystemExit(main(run))
