"""The serving notebook's scaling table from rows of the serving bench's scaling phase (made up
here: no multi-GPU run is committed yet), and the byte model table."""

import numpy as np
import pandas as pd
import pytest

from andromeda_nb.analysis import serving_report


def scaling_rows():
    rows = []
    for mode, per_gpu in (("weak", 1e8), ("strong", None)):
        for g, rps, one in ((1, 1000.0, 0.5e-3), (2, 950.0 if mode == "weak" else 1500.0, 0.4e-3)):
            n = per_gpu * g if per_gpu else 1e8
            for batch, secs, r in ((32, 32 / rps, rps), (1, one, 1 / one)):
                rows.append(dict(variant="sharded", ok=True, notes=f"{mode} scaling, x", commit="c1",
                                 timestamp="2026-12-02", n_gpus=g, n_ads=n, batch=batch, requests_per_s=r,
                                 seconds_median=secs))
    return pd.DataFrame(rows)


def test_scaling_table_relative_to_one_gpu():
    t = serving_report.scaling_table(scaling_rows()).set_index(["scaling", "n_gpus"])
    assert t.loc[("weak", 1), "relative_to_one_gpu"] == 1.0
    # weak: 950 requests/s over 2 x 10^8 ads against 1,000 over 10^8: 0.95 of the ads a second per GPU
    assert t.loc[("weak", 2), "relative_to_one_gpu"] == pytest.approx(0.95)
    assert t.loc[("strong", 2), "one_p50_ms"] == pytest.approx(0.4)
    assert serving_report.scaling_table(None).empty
    assert serving_report.scaling_table(scaling_rows().assign(ok=False)).empty


def test_byte_model_table_grows_with_the_eligible_ads():
    m = serving_report.byte_model_table(fractions=(0.005, 0.01, 0.02))
    assert (np.diff(m["remote_over_colocated"]) > 0).all()
    assert (m["colocated_bytes"] == m["colocated_bytes"].iloc[0]).all()


def topology_rows():
    """Made-up GPU rows as the serving bench writes them (strings, as read from the CSV): two runs
    at 10^7 ads (the newer wins), an unverified row, and the in-process row alone at 10^8."""
    rows = []
    for commit, stamp, co in (("old0000", "2026-12-01", 9e-3), ("new1111", "2026-12-02", 1.5e-3)):
        for variant, n_workers, secs, nbytes, notes in (
                ("inprocess_retrieve", 0, 4e-4, 0, ""), ("colocated", 1, co, 20_000, "byte model 15,584 bytes a request; x"),
                ("remote_scoring", 2, 2e-2, 500_000, "byte model 455,674 bytes a request; x")):
            rows.append(dict(variant=variant, ok=True, n_ads=1e7, n_workers=str(n_workers), seconds_median=str(secs),
                             seconds_p99=str(2 * secs), requests_per_s=str(1 / secs), transport_bytes_per_request=str(nbytes),
                             notes=notes, device="GPU", commit=commit, timestamp=stamp))
    rows.append(dict(rows[-2], ok=False, seconds_median="1"))  # a failed row never counts
    rows.append(dict(rows[0], n_ads=1e8, commit="new1111", timestamp="2026-12-02"))
    return pd.DataFrame(rows)


def test_gpu_table_and_findings_quote_the_newest_verified_rows():
    t = serving_report.gpu_table(topology_rows())
    assert list(t["variant"]) == ["inprocess_retrieve", "colocated", "remote_scoring", "inprocess_retrieve"]
    co = t[(t["variant"] == "colocated")].iloc[0]
    assert co["commit"] == "new1111" and co["p50_ms"] == pytest.approx(1.5) and co["model_bytes"] == 15_584
    live = pd.DataFrame({"mean_eligible": [10, 10], "bytes_per_request": [100.0, 1000.0],
                         "equal_to_in_process": [True, True]}, index=["colocated", "remote_scoring"])
    text = serving_report.findings(live, serving_report.byte_model_table(), topology_rows())
    assert "+1.10 ms (target within 2 ms: met)" in text and "25.0x co-location's bytes" in text
    assert "100,000,000 ads): only inprocess_retrieve measured" in text
    assert "no co-located GPU row is committed: not measured" in text
    assert serving_report.gpu_table(None).empty and "No GPU rows" in serving_report.findings(
        live, serving_report.byte_model_table(), None)


def test_findings_state_the_sharded_pools_overhead_over_the_colocated_call():
    rows = topology_rows()
    extra = [dict(rows.iloc[3].to_dict(), variant="sharded", n_workers=str(w), seconds_median=str(s), notes="x")
             for w, s in ((2, 3.5e-3), (1, 2.25e-3))]  # the co-located call: 1.5 ms, commit new1111
    rows = pd.concat([rows, pd.DataFrame(extra)], ignore_index=True)
    live = pd.DataFrame({"mean_eligible": [10, 10], "bytes_per_request": [100.0, 1000.0],
                         "equal_to_in_process": [True, True]}, index=["colocated", "remote_scoring"])
    text = serving_report.findings(live, serving_report.byte_model_table(), rows)
    assert "p50 1 shard 2.25 ms, 2 shards 3.50 ms: one shard +0.75 ms over the co-located call" in text
    assert "+1.25 ms for each shard past the first" in text


def test_eligible_table_sets_the_picked_fractions_beside_the_worlds_own():
    rows = topology_rows()
    base = rows.iloc[3].to_dict()  # a verified in-process row of commit new1111 at 10^7
    picked = []
    for frac, co, rs_bytes in (("0.005", 1.4e-3, 220_000.0), ("0.02", 1.6e-3, 820_000.0)):
        for variant, w, secs, nbytes, model in (("inprocess_retrieve", 0, 3e-4, 0, ""),
                                                ("colocated", 1, co, 20_000, "byte model 15,584 bytes a request; "),
                                                ("remote_scoring", 2, 9e-3, rs_bytes, "byte model 200,000 bytes a request; ")):
            picked.append(dict(base, variant=variant, n_workers=str(w), seconds_median=str(secs),
                               transport_bytes_per_request=str(nbytes), eligible_fraction=frac,
                               notes=f"requests picked for {float(frac):.1%} eligible from 2048 drawn profiles; {model}x"))
    rows = pd.concat([rows.assign(eligible_fraction="0.0106"), pd.DataFrame(picked)], ignore_index=True)
    # the newest-per-topology table keeps the world's own requests, not the picked ones
    assert serving_report.gpu_table(rows)["p50_ms"].round(3).tolist()[:3] == [0.4, 1.5, 20.0]
    t = serving_report.eligible_table(rows)
    assert t["eligible_fraction"].tolist() == [0.005, 0.0106, 0.02]
    assert t["remote_over_colocated"].round(1).tolist() == [11.0, 25.0, 41.0]
    assert t["colocated_p50_ms"].round(2).tolist() == [1.4, 1.5, 1.6]
    live = pd.DataFrame({"mean_eligible": [10, 10], "bytes_per_request": [100.0, 1000.0],
                         "equal_to_in_process": [True, True]}, index=["colocated", "remote_scoring"])
    text = serving_report.findings(live, serving_report.byte_model_table(), rows)
    assert ("Against the eligible fraction (10,000,000 ads): 0.50% eligible: co-located 1.40 ms (+1.10 ms over "
            "in-process), remote scoring 11x its bytes (model 13x)") in text
    # a fraction without a remote-scoring row says so (no "nanx" in the prose)
    no_remote = rows[~((rows["variant"] == "remote_scoring") & (rows["eligible_fraction"] == "0.02"))]
    text = serving_report.findings(live, serving_report.byte_model_table(), no_remote)
    assert "2.00% eligible: co-located 1.60 ms (+1.30 ms over in-process), no remote-scoring row at this fraction" in text
    assert "nan" not in text
