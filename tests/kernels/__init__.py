"""Tests of kernels/: every path against the NumPy reference and against plain loops (no MPI)."""
