"""The request-path notebook's findings from the committed pipeline rows, and the soak's line
(passed or failed) from a row added to them."""

import pandas as pd

from andromeda_nb.analysis import pipeline_report, results


def test_findings_state_each_target_and_the_newest_soak():
    rows = results.load("pipeline")
    text = pipeline_report.findings(rows)
    assert "One request" in text and "Batches of 32" in text
    base = rows[rows["variant"] == "retrieve"].iloc[-1].copy()
    for verified, word in (("ok: 10/10 checkpoints", "nothing lost"), ("FAILED: after batch 3: x", "a mismatch")):
        soak = base.copy()
        soak.update({"variant": "pool_soak", "verified": verified, "ok": verified.startswith("ok"),
                     "timestamp": "2999-01-01T00:00:00+00:00", "notes": "1,000 updates"})
        line = pipeline_report.soak_line(pd.concat([rows, soak.to_frame().T], ignore_index=True))
        assert word in line and verified in line
    assert pipeline_report.soak_line(rows[rows["variant"] != "pool_soak"]) == ""


def test_launches_line_compares_graph_and_bound_in_one_run():
    rows = results.load("pipeline")
    base = rows[rows["variant"] == "retrieve"].iloc[-1].copy()
    extra = []
    for variant, ms in (("retrieve", 0.4), ("retrieve_bound_launches", 0.6)):
        r = base.copy()
        r.update({"variant": variant, "seconds_median": ms / 1e3, "commit": "zz1", "n_ads": 1e8, "batch": 1,
                  "ok": True, "timestamp": "2999-01-01T00:00:00+00:00"})
        extra.append(r)
    line = pipeline_report.launches_line(pd.concat([rows, pd.DataFrame(extra)], ignore_index=True))
    assert "commit `zz1`" in line and "batch 1: 0.400 ms with the graph, 0.600 ms launched one by one" in line
    assert pipeline_report.launches_line(rows[rows["variant"] != "retrieve_bound_launches"]) == ""
    assert "one CUDA graph" in pipeline_report.findings(rows)  # the committed runs hold both
