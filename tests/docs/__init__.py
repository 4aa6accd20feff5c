"""Tests of the documentation: its examples run, its command lines use options their commands have."""
