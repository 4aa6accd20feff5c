"""mpicomm's test suite: ``python -m tests`` runs it serially and at 2, 3 and 4 ranks."""
