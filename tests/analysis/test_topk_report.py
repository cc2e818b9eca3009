"""The top-K notebook's tables and findings (andromeda_nb.analysis.topk_report) on hand-made rows."""

import numpy as np
import pandas as pd
import pytest

from andromeda_nb.analysis import topk_report as TR


def _row(variant, items_per_s, n=1e8, k=1000, access="random", batch=1, verified="ok", commit="c1", timestamp="1",
         eligible_fraction=np.nan, fraction=0.5):
    return dict(variant=variant, items_per_s=float(items_per_s), n_ads=float(n), k=float(k), access=access,
                batch=float(batch), verified=verified, ok=verified.startswith("ok"), commit=commit, timestamp=timestamp,
                eligible_fraction=eligible_fraction, seconds_median=n * batch / items_per_s,
                fraction_of_read_ceiling=fraction, device="NVIDIA H200")


ROWS = pd.DataFrame([
    _row("block_topk_seeded", 600e9, timestamp="1", commit="old"),
    _row("block_topk_seeded", 700e9, timestamp="2", fraction=0.6),
    _row("block_topk_seeded", 750e9, k=100),
    _row("torch.topk", 50e9, verified="baseline (values checked above)"),
    _row("block_topk", 60e9),
    _row("block_topk", 900e9, verified="FAIL: wrong ids"),
    _row("block_topk_stage_seed", 3e12, verified="n/a (stage timing)"),
    _row("block_topk_stage_filter", 1e12, verified="n/a (stage timing)"),
    _row("block_topk_seeded_eligible", 300e9, access="bitset", eligible_fraction=0.1),
    _row("block_topk_batched_seeded", 470e9, n=50_000, k=100, batch=1024),
    _row("torch.topk", 70e9, n=50_000, k=100, batch=1024, verified="baseline"),
])


def test_cases_pivot_and_stages():
    cases = TR.label_cases(ROWS)
    assert cases.loc[8, "case"] == "n=100,000,000 k=1000 bitset 10%"
    assert cases.loc[9, "case"] == "n=50,000 k=100 random x1024" and cases.loc[1, "latency_us"] == pytest.approx(1e8 / 700e9 * 1e6)
    pivot = TR.throughput_pivot(ROWS)
    assert pivot.loc["n=100,000,000 k=1000 random", "block_topk_seeded"] == pytest.approx(700)  # the newest run
    assert pivot.loc["n=100,000,000 k=1000 random", "block_topk"] == pytest.approx(60)  # the FAIL row left out
    assert "block_topk_batched_seeded" not in pivot.columns and "block_topk_seeded" in pivot.columns
    assert list(pivot.index)[-1].endswith("x1024")  # batches last
    stages = TR.stage_table(ROWS)
    assert stages["stage"].tolist() == ["seed", "filter"] and stages["label"].iloc[0] == TR.STAGE_LABELS["seed"]
    # the seed reads a sample: no fraction of the read ceiling; the filter reads every score: its own
    frac = stages.set_index("stage")["fraction_of_read_ceiling"]
    assert np.isnan(frac["seed"]) and frac["filter"] == pytest.approx(
        ROWS.loc[ROWS["variant"].str.endswith("stage_filter"), "fraction_of_read_ceiling"].iloc[-1])


def test_headline_metrics():
    got = TR.headline_metrics(ROWS)
    assert got["topk_100M_k1000_over_torch"] == pytest.approx(14.0)  # 700 / 50: stages and FAIL rows never count
    assert got["topk_100M_k1000_fraction_of_read_ceiling"] == pytest.approx(0.6)
    assert TR.headline_metrics(ROWS[ROWS["variant"] != "torch.topk"]) == {}


def test_findings_quote_the_newest_rows():
    text = TR.findings(ROWS)
    assert "14.0x faster than `torch.topk`: 700 G scores/s against 50.0 at k = 1000" in text
    assert "750 at k = 100" in text and "0.60 of the read ceiling" in text
    assert "Stages timed alone: seed 33 µs, filter 100 µs" in text
    assert "300 G scores/s at 10% eligible" in text
    assert "**Batched** (1,024 requests x 50,000 scores, k = 100)" in text and "6.7x `torch.topk(dim=1)`" in text
    assert "Sorted-ascending" not in text  # no such rows: no such claim


def test_correctness_demo_on_the_active_backend():
    table, ok = TR.correctness_demo(200, 7, seed=1)
    assert ok and len(table) == 7 and (table["id"] == table["oracle id"]).all()
