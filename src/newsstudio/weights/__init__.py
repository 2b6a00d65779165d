"""Weight loading: official checkpoint layouts, seeded random weights for tests and benchmarks."""
