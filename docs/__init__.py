"""Documentation with code: ``docs.examples`` holds worked examples importable from the repository root."""
