"""The targeting notebook's tables and findings (andromeda_nb.analysis.targeting_report)."""

import numpy as np
import pandas as pd
import pytest

from andromeda_nb.analysis import targeting_report as TG

HEADER = ("suite,variant,device,commit,timestamp,n_ads,categories,batch,access,eligible_fraction,seconds_median,"
          "items_per_s,bytes_per_item,achieved_TBps,ceiling_read_TBps,ceiling_copy_TBps,fraction_of_read_ceiling,"
          "verified,notes\n")


def _line(variant, items_per_s, n=1e8, categories=20, batch=1, access="pool", verified="ok", notes="bits_per_ad=20.0",
          bytes_per_item=2.75):
    return (f"targeting,{variant},NVIDIA H200,abc,2026-01-01,{n},{categories},{batch},{access},0.01,{n * batch / items_per_s},"
            f"{items_per_s},{bytes_per_item},2.5,4.5,4.2,{items_per_s * bytes_per_item / 4.5e12},{verified},{notes}\n")


@pytest.fixture
def results_dir(tmp_path):
    default = TG.default_variant()
    text = HEADER + "".join([
        "targeting,ceiling_read_cupy_sum,NVIDIA H200,abc,2026-01-01,,,,,,,,,,4.5,4.2,,n/a (ceiling),x\n",
        _line(default, 0.9e12),
        _line("match_U1_b256", 0.4e12),
        _line("match_U4_b256", 0.85e12),
        _line("match_U4_b256_prefetch", 0.8e12),
        _line("match_batch32_U4", 1.2e12, batch=32),
        _line("match_U4_pool_prefix", 2e10, n=1e6),
        _line("match_U4_user_values_6", 0.7e12),
        _line("match_U4_density_0.3", 0.5e12, n=2.5e7),
        _line("match_U4_categories_5", 0.75e12, n=2.5e7, categories=5),
        _line(default.replace("_b256", "_stage_match"), 1.1e12, verified="n/a (stage timing)", notes="kernels match"),
        _line("cpu_numba_parallel_16threads", 3e9, notes="device=Xeon"),
        _line("update_batch_gpu", 9e6, batch=1000, access="updates", notes="x"),
        _line("update_batch_end_to_end", 4e4, batch=1000, access="updates", notes="x"),
    ])
    (tmp_path / "targeting.csv").write_text(text)
    return tmp_path


def test_measurements_parse_the_notes_and_split_the_ceilings(results_dir):
    m = TG.measurements(results_dir)
    assert m.read_TBps == 4.5 and not m.rows["variant"].str.startswith("ceiling").any()
    assert m.rows.set_index("variant").loc[TG.default_variant(), "bits_per_ad"] == 20.0
    assert TG.measurements(results_dir / "missing") is None


def test_metrics_sweeps_and_shapes(results_dir):
    rows = TG.measurements(results_dir).rows
    got = TG.measured_metrics(rows)
    assert got["measured_T_ads_per_s"] == pytest.approx(0.9) and got["gpu_over_cpu"] == pytest.approx(300)
    assert got["all_rows_verified"] is True and got["updates_per_s_gpu"] == 9e6
    pool, cats, values, density = TG.sweeps(rows)
    assert pool[0]["x"].tolist() == [1e6, 1e8] and cats[0]["x"].tolist() == [5, 20]
    assert values[0]["x"].tolist() == [6.0] and density[0]["x"].tolist() == [0.3]
    shapes = TG.kernel_shapes(rows)["variant"].tolist()
    assert "match_U4_pool_prefix" not in shapes and "cpu_numba_parallel_16threads" in shapes


def test_findings_quote_the_model_the_rows_and_the_checks(results_dir):
    rows = TG.measurements(results_dir).rows
    model = pd.DataFrame([{"layout": "default (groups <= 512 rows)", "row_bits_per_ad": 20.0, "bytes_per_ad": 2.7,
                           "eligible_fraction": 0.01, "predicted_T_ads_per_s": 0.85 * 4.5 / 2.7},
                          {"layout": "one folded row per category", "row_bits_per_ad": 26.0, "bytes_per_ad": 3.6,
                           "eligible_fraction": 0.01, "predicted_T_ads_per_s": 0.85 * 4.5 / 3.6}])
    checks = pd.DataFrame({"check": ["a", "b"], "ok": [True, True]})
    text = TG.findings(model, rows, 4.5, checks)
    assert "20.0 row bits (2.70 bytes)" in text and "needs 60% of it" in text and "predicts 1.42 T ads/s" in text
    assert "0.90 T ads/s" in text and "`match_batch32_U4`) reaches 1.20 T" in text
    assert "1: 0.40 T, 4: 0.85 T" in text and "4 words: -6%" in text
    assert "300x faster" in text and "9.0 M ops/s" in text and "does **not** sustain" in text
    assert "2 of 2 device checks" in text
    assert "No committed GPU measurements" in TG.findings(model, None, 4.5, checks)


def test_memory_tables(tmp_path):
    mem = pd.DataFrame({"layout": ["default", "default", "lists"], "unit": ["m00", "h00", "h00"],
                        "storage": ["split"] * 3, "bytes": [1e9, 2e9, 0.5e9]})
    got, source = TG.memory(tmp_path, mem, 1000)
    assert got is mem and "host byte model" in source
    assert TG.memory_totals(mem).to_dict() == {"default": 3.0, "lists": 0.5}
    assert TG.memory_table(mem).loc["h00", "lists"] == 0.5 and np.isnan(TG.memory_table(mem).loc["m00", "lists"])
