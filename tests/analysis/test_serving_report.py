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
