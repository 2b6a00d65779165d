"""Measurements of output quality (lip-sync, stillness) used by tests and benchmarks."""
