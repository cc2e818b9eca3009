"""GPU benchmarks: ``python -m andromeda_nb.bench <suite>``; ``harness`` holds the timing rules,
ceilings and CSV rows, the other modules the suites."""
