"""Tests of mpicomm.plan."""
