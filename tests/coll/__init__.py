"""Tests of mpicomm.coll: every collective, every algorithm, against the MPI library."""
