"""Tests of mpicomm.engine."""
