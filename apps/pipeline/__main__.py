"""``python -m apps.pipeline schedule …`` and ``mpiexec -n N python -m apps.pipeline train|bench …`` (``--help`` on each)."""

from mpicomm.runtime import main

from apps.pipeline.cli import run

if __name__ == "__main__":
    raise SystemExit(main(run))
