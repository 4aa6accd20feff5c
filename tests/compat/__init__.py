"""Compatibility with the other side's own tests: mpi4py's test suite run through mpicomm.Comm."""
