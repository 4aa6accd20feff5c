"""Tests of apps.torchddp (PyTorch DDP on the mpicomm backend); each module skips itself without PyTorch."""

#: The skip reason when PyTorch is not importable (every module here calls pytest.importorskip with it).
NO_TORCH = "PyTorch is not installed: pip install torch==2.13.0 (the CPU wheel), then pip install -e '.[torch]'"
