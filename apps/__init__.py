"""Programs built on mpicomm, each run as ``mpiexec -n N python -m apps.<name>``.

* ``apps.demo`` - a checked tour of topology, push, pull and barriers.
"""
