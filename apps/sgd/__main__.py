"""``mpiexec -n N python -m apps.sgd train|bench|plot …`` (``--help`` on each)."""

from mpicomm.runtime import main

from apps.sgd.cli import run

if __name__ == "__main__":
    raise SystemExit(main(run))
