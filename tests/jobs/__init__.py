"""Tests of jobs/: the batch scripts on a real Slurm, outside Slurm, and the results collector."""
