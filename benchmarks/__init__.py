"""Benchmarks: ``python -m benchmarks.run`` (run from the repository root)."""
