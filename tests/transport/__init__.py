"""Tests of mpicomm.transport."""
