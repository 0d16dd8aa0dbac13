"""benchmarks/run's pieces: runner (cases, progress, builds), suites (the benchmarks), report,
goals and plots (the report folder)."""
