"""GPU benchmarks: ``python -m andromeda_nb.bench <suite> [--phases ...] [--list]``. ``harness`` holds the
timing rules, ceilings, verification, CSV rows and the loop over a suite's cases; ``scoring``,
``topk``, ``targeting`` and ``pipeline`` declare their cases (phase -> cases, as data) and measure
them; ``tables`` generates GPU data, ``targeting_world`` the targeting suite's world."""
