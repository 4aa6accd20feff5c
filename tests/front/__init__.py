"""Tests of mpicomm.front."""
