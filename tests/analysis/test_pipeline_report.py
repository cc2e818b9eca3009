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
