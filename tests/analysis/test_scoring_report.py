"""The scoring notebook's tables (andromeda_nb.analysis.scoring_report) on small hand-made result tables,
and the notebook itself under parameters other than its defaults."""

import numpy as np
import pandas as pd
import pytest

from andromeda_nb.analysis import scoring_report as SR
from andromeda_nb.score.unfused import fused_bytes_per_ad


def _row(variant, items_per_s, commit="c1", d=64, dtype="fp16", experts=6, k_experts=2, access="pool", layout="tiles",
         k=1000, eligible_fraction=1.0, ok=True, notes="", timestamp="2026-01-01", bytes_per_item=132.0,
         seconds_median=None, ceiling=4.5, math="fp32"):
    return dict(variant=variant, math=math, items_per_s=float(items_per_s), commit=commit, device="NVIDIA H200", d=d, dtype=dtype,
                experts=experts, k_experts=k_experts, access=access, layout=layout, k=k,
                eligible_fraction=eligible_fraction, ok=ok,
                regression_flag="REGRESSION" in notes, notes=notes, timestamp=timestamp, bytes_per_item=bytes_per_item,
                seconds_median=seconds_median if seconds_median is not None else 1e8 / items_per_s,
                fraction_of_read_ceiling=items_per_s * bytes_per_item / (ceiling * 1e12), ceiling_read_TBps=ceiling)


def _frame(*rows):
    return pd.DataFrame(list(rows))


def test_issue_bound_marks_where_the_modelled_instructions_outrun_the_memory_roof():
    """At a 4.5 TB/s ceiling a 132-byte ad leaves 132 x 4 x 1.98e9 x 32 x 132 / 4.5e12 = 981 issue
    slots; the model needs 1211 / 640 per multiply-add: 969 at E + K = 6 (d = 64), 1,090 at 7."""
    grid = [(E, K) for K in (1, 2, 4) for E in (1, 2, 4, 6, 8) if E >= K]
    rows = _frame(*[_row("gated_fused_topk", 1e10, experts=E, k_experts=K) for E, K in grid],
                  _row("dot_fused_topk", 20e9), _row("dot_fused_topk", 25e9, commit="other"))
    sweep = SR.complexity_sweep(rows, 64, "fp16")
    assert sweep["commit"] == "c1" and sweep["dot"] == 20e9  # the other run's dot row is not this run's
    marks = sweep["issue_bound"].set_index("k_experts")["experts"].to_dict()
    assert marks == {1: 6, 2: 6, 4: 4}
    budget = SR.H200_LANE_ISSUE_PER_S * 132 / 4.5e12
    assert SR.INSTRUCTIONS_PER_MULTIPLY_ADD * SR.gated_multiply_adds(64, 4, 2) < budget
    assert SR.INSTRUCTIONS_PER_MULTIPLY_ADD * SR.gated_multiply_adds(64, 6, 1) > budget
    assert SR.issue_bound_points(sweep["points"], 64, "fp16", float("nan")).empty


def test_every_table_is_empty_not_an_error_without_rows():
    rows = _frame(_row("dot_scores_to_memory", 30e9))
    assert SR.complexity_sweep(rows, 128, "int8") is None
    assert SR.fusion_speedups(rows, 64, "fp16", 6, 2).empty
    table, commit = SR.fusion_cost(rows, 64, "fp16")
    assert table.empty and commit is None
    assert SR.bitset_savings(rows, commit, 6, 2).empty
    assert list(SR.by_d_and_dtype(rows.iloc[0:0], 6, 2).columns)[:3] == ["model", "d", "dtype"]


def test_unverified_and_regression_rows_never_count():
    rows = _frame(_row("gated_fused_topk", 10e9), _row("gated_fused_topk", 99e9, ok=False),
                  _row("gated_fused_topk", 98e9, notes="REGRESSION: spills"),
                  _row("unfused_per_op", 1e9, bytes_per_item=992.0))
    got = SR.fusion_speedups(rows, 64, "fp16", 6, 2)
    assert len(got) == 1
    r = got.iloc[0]
    assert r["measured speed-up of fused"] == pytest.approx(10.0)
    assert r["byte ratio"] == pytest.approx(992.0 / fused_bytes_per_ad(64, "fp16"))
    assert r["speed-up / byte ratio"] == pytest.approx(10.0 / r["byte ratio"])


def test_fusion_cost_and_bitset_savings_come_from_one_run():
    rows = _frame(_row("gated_scores_to_memory", 20e9, k=np.nan, commit="old", timestamp="1"),
                  _row("gated_fused_topk_filter", 19e9, commit="old", timestamp="1"),
                  _row("gated_scores_to_memory", 21e9, k=np.nan, commit="new", timestamp="2"),
                  _row("gated_fused_topk_filter", 20.58e9, commit="new", timestamp="2", seconds_median=4e-3),
                  _row("gated_fused_topk_filter", 2e9, commit="new", timestamp="2", access="bitset",
                       eligible_fraction=0.1, seconds_median=1e-3, notes="weights=param"),
                  _row("gated_fused_topk_filter", 2e9, commit="new", timestamp="2", access="bitset",
                       eligible_fraction=0.1, layout="rows", seconds_median=1e-3))  # no rows-layout pool row
    table, commit = SR.fusion_cost(rows, 64, "fp16")
    assert commit == "new"
    got = table.set_index("variant")["of_scoring_alone"]
    assert got["gated_fused_topk_filter"] == pytest.approx(0.98) and got["gated_scores_to_memory"] == 1.0
    elig = SR.bitset_savings(rows, commit, 6, 2).set_index("layout")
    assert elig.loc["tiles", "weights"] == "param" and elig.loc["tiles", "of_full_pool_time"] == pytest.approx(0.25)
    assert np.isnan(elig.loc["rows", "of_full_pool_time"])  # no rows-layout pool row in that run
    assert elig.loc["rows", "of_fastest_pool_time"] == pytest.approx(0.25)


def test_by_d_and_dtype_takes_the_latest_run_of_each_point():
    rows = _frame(_row("gated_scores_to_memory", 30e9, commit="a", timestamp="1", k=np.nan),
                  _row("gated_scores_to_memory", 20e9, commit="b", timestamp="2", k=np.nan),
                  _row("gated_scores_to_memory", 21e9, commit="b", timestamp="2", k=np.nan),
                  _row("gated_scores_to_memory", 5e9, commit="b", timestamp="2", k=np.nan, experts=8),
                  _row("dot_scores_to_memory", 56e9, commit="b", timestamp="2", k=np.nan, dtype="int8",
                       bytes_per_item=72.0))
    got = SR.by_d_and_dtype(rows, 6, 2).set_index(["model", "dtype"])
    assert got.loc[("gated", "fp16"), "G_ads_per_s"] == pytest.approx(21.0)
    assert got.loc[("gated", "fp16"), "commit"] == "b"
    assert got.loc[("dot", "int8"), "ceiling_G_ads_per_s"] == pytest.approx(4.5e3 / fused_bytes_per_ad(64, "int8"))


def test_fp16_math_rows_are_their_own_mode():
    """fp16-math rows never stand in for fp32 ones (by_d_and_dtype, fusion_cost); math_modes puts
    both maths beside the dot product of the same d and run, ratios of device time."""
    rows = _frame(_row("gated_scores_to_memory", 20e9, k=np.nan), _row("gated_scores_to_memory", 28e9, k=np.nan,
                                                                       math="fp16"),
                  _row("dot_scores_to_memory", 30e9, k=np.nan), _row("gated_fused_topk_filter", 19e9),
                  _row("gated_fused_topk_filter", 27e9, math="fp16"), _row("dot_fused_topk_filter", 33e9),
                  _row("gated_scores_to_memory", 99e9, k=np.nan, math="fp16", ok=False),
                  _row("gated_scores_to_memory", 98e9, k=np.nan, math="fp16",  # an experiment, not the default
                       notes="block=256 math=fp16 (mma) tile_order=steps"))
    got = SR.by_d_and_dtype(rows, 6, 2).set_index("model")
    assert got.loc["gated", "G_ads_per_s"] == pytest.approx(20.0)
    table, _ = SR.fusion_cost(rows, 64, "fp16")
    assert table.set_index("variant").loc["gated_fused_topk_filter", "G_ads_per_s"] == pytest.approx(19.0)
    m = SR.math_modes(rows).set_index("output")
    assert len(m) == 2
    assert m.loc["scores to memory", "fp16_over_dot"] == pytest.approx(30 / 28)
    assert m.loc["scores to memory", "fp32_over_dot"] == pytest.approx(1.5)
    assert m.loc["top-1000", "fp16_over_dot"] == pytest.approx(33 / 27)
    assert SR.math_modes(rows[rows["math"] == "fp32"]).empty
    # a newer run of gated fp16 rows without the dot product (an experiment's baseline) does not
    # displace the run that measured the ratio; alone, it is still shown (its ratio not measured)
    newer = _row("gated_scores_to_memory", 29e9, k=np.nan, math="fp16", commit="newer", timestamp="9")
    m = SR.math_modes(pd.concat([rows, _frame(newer)], ignore_index=True))
    assert set(m["commit"]) == {rows["commit"].iloc[0]} and len(m) == 2
    alone = SR.math_modes(_frame(newer))
    assert alone["commit"].tolist() == ["newer"] and np.isnan(alone["fp16_over_dot"].iloc[0])


@pytest.mark.notebook
@pytest.mark.parametrize("overrides", [pytest.param({"dtype": "int8"}, marks=pytest.mark.slow),
                                       pytest.param({"d": 128, "dtype": "bf16"}, marks=pytest.mark.slow),
                                       pytest.param({"experts": 8, "k_experts": 4}, marks=pytest.mark.slow)])
def test_scoring_notebook_runs_for_other_parameters(tmp_path, overrides):
    """The notebook plots committed rows for any configuration and says where there are none
    (it once failed on anything but its defaults)."""
    from andromeda_nb.runner.series import run_series

    runs = run_series(params=None, out_dir=tmp_path / "nb", figures_dir=tmp_path / "fig", only=["02_scoring"],
                      overrides=overrides, progress=False)
    assert [r.name for r in runs] == ["02_scoring"]
    assert (tmp_path / "fig" / "scoring_complexity.png").exists()
    assert (tmp_path / "fig" / "scoring_network_bytes.png").exists()


def test_a_bitset_baseline_meets_the_fused_row_of_its_own_fraction():
    rows = _frame(_row("gated_fused_topk", 14e9), _row("gated_fused_topk_filter", 20e9),
                  _row("gated_fused_topk_filter", 3e9, access="bitset", eligible_fraction=0.1, layout="rows"),
                  _row("gated_fused_topk_filter", 1e9, access="bitset", eligible_fraction=0.01, layout="rows"),
                  _row("unfused_per_op", 1e9, bytes_per_item=992.0),
                  _row("unfused_per_op", 0.5e9, access="bitset", eligible_fraction=0.1, layout="rows",
                       bytes_per_item=1000.0))
    got = SR.fusion_speedups(rows, 64, "fp16", 6, 2).set_index("access")
    assert got.loc["pool", "measured speed-up of fused"] == pytest.approx(20.0)  # the filter path is fused too
    assert got.loc["pool", "fused variant"] == "gated_fused_topk_filter"
    assert got.loc["bitset", "measured speed-up of fused"] == pytest.approx(6.0)
    assert got.loc["bitset", "byte ratio"] == pytest.approx(1000.0 / fused_bytes_per_ad(64, "fp16", "bitset", 0.1))


def test_newest_keeps_the_latest_verified_or_baseline_row_of_each_point():
    from andromeda_nb.analysis import results

    df = pd.DataFrame([
        dict(variant="block_topk_seeded", n_ads=1e8, k=1000, access="random", ok=True, verified="ok", timestamp="1", v=1),
        dict(variant="block_topk_seeded", n_ads=1e8, k=1000, access="random", ok=True, verified="ok", timestamp="3", v=2),
        dict(variant="block_topk_seeded", n_ads=1e8, k=100, access="random", ok=False, verified="FAIL x", timestamp="4", v=3),
        dict(variant="torch.topk", n_ads=1e8, k=1000, access="random", ok=False, verified="baseline (checked)",
             timestamp="2", v=4),
        dict(variant="torch.topk", n_ads=1e8, k=1000, access="ascending", ok=False, verified="baseline", timestamp="5", v=5),
    ])
    got = results.newest(df, ["block_topk_seeded", "torch.topk"], access="random")
    assert got["v"].tolist() == [2, 4]  # newest of the seeded point; the FAIL row and the other order dropped


def test_fusion_cost_and_bitset_savings_keep_to_their_configuration():
    """Rows of another E / K, d or dtype, or flagged REGRESSION, in the same run never enter."""
    rows = _frame(_row("gated_scores_to_memory", 20e9, k=np.nan, seconds_median=5e-3),
                  _row("gated_fused_topk_filter", 19e9, seconds_median=4e-3),
                  _row("gated_fused_topk", 5e9, experts=16, k_experts=4),
                  _row("gated_fused_topk_filter", 2e9, notes="REGRESSION: x", timestamp="2026-02-01"),
                  _row("gated_fused_topk_filter", 9e9, dtype="int8", seconds_median=2e-3),
                  _row("gated_fused_topk_filter", 1e9, access="bitset", eligible_fraction=0.1, seconds_median=1e-3),
                  _row("gated_fused_topk_filter", 1e9, access="bitset", eligible_fraction=0.1, d=128,
                       seconds_median=9e-3))
    table, commit = SR.fusion_cost(rows, 64, "fp16", 6, 2)
    assert sorted(table["variant"]) == ["gated_fused_topk_filter", "gated_scores_to_memory"]
    assert table.set_index("variant").loc["gated_fused_topk_filter", "of_scoring_alone"] == pytest.approx(0.95)
    elig = SR.bitset_savings(rows, commit, 6, 2, 64, "fp16")
    assert elig["of_full_pool_time"].tolist() == [pytest.approx(0.25)]


def test_a_candidate_subset_meets_fused_candidates_of_its_fraction():
    rows = _frame(_row("gated_fused_topk_filter", 20e9),
                  _row("gated_fused_topk_filter", 4e9, access="candidates", eligible_fraction=0.1),
                  _row("unfused_per_op", 1e9, access="candidates", eligible_fraction=0.1, bytes_per_item=1020.0),
                  _row("unfused_per_op", 2e9, access="candidates", eligible_fraction=1.0, bytes_per_item=1020.0))
    got = SR.fusion_speedups(rows, 64, "fp16", 6, 2).set_index("eligible_fraction")
    assert got.loc[0.1, "measured speed-up of fused"] == pytest.approx(4.0)
    assert got.loc[1.0, "measured speed-up of fused"] == pytest.approx(10.0)  # every ad listed: the pool


def test_byte_budget_and_network_tables_are_the_counted_models():
    from andromeda_nb.score.unfused import network_bytes_per_request, per_op_bytes_per_ad

    budget = SR.byte_budget(64, "fp16", 6, 2)
    assert budget.loc["fused (one kernel, scores never stored)"].sum() == fused_bytes_per_ad(64, "fp16")
    assert budget.loc["per-op (one kernel per model step)"].sum() == pytest.approx(
        sum(per_op_bytes_per_ad(64, 6, 2, "fp16").values()))
    assert (budget >= 0).all().all() and budget.sum(axis=1).idxmin().startswith("fused")
    net = SR.network_bytes(64, "fp16", k=1000, candidates=(10**4, 10**8))
    assert list(net.index) == ["10^4", "10^8"]
    assert net.loc["10^8", "candidate ids"] == network_bytes_per_request(10**8, 1000, 64, "fp16")["candidate ids"]
    assert net.loc["10^8", "ids_over_answer"] == pytest.approx(8e8 / (12 * 1000 + 8))


def test_metric_names_and_values_follow_the_tables():
    rows = _frame(_row("gated_scores_to_memory", 20e9, k=np.nan, seconds_median=5e-3),
                  _row("gated_fused_topk_filter", 19e9, seconds_median=4e-3),
                  _row("dot_scores_to_memory", 30e9, k=np.nan, experts=np.nan, k_experts=np.nan),
                  _row("gated_fused_topk_filter", 1e9, access="bitset", eligible_fraction=0.1, seconds_median=1e-3),
                  _row("unfused_per_op", 1e9, bytes_per_item=992.0))
    fuse, _ = SR.fusion_cost(rows, 64, "fp16", 6, 2)
    got = SR.fusion_cost_metrics(fuse)
    assert got == {"gated_fused_filter_k1000_over_scoring_alone": pytest.approx(0.95),
                   "gated_over_dot_time_scores_to_memory": pytest.approx(1.5)}
    assert SR.bitset_metrics(SR.bitset_savings(rows, None, 6, 2)) == {"bitset_0.1_best_of_fastest_pool_time": 0.25}
    assert SR.speedup_metrics(SR.fusion_speedups(rows, 64, "fp16", 6, 2)) == {"fused_over_unfused_per_op_pool": 19.0}


def test_findings_quote_the_rows_and_say_what_is_missing():
    rows = _frame(_row("gated_scores_to_memory", 20e9, k=np.nan, seconds_median=5e-3, commit="abc1234ff"),
                  _row("gated_fused_topk_filter", 19e9, seconds_median=4e-3, commit="abc1234ff"),
                  _row("dot_scores_to_memory", 30e9, k=np.nan, experts=np.nan, k_experts=np.nan, commit="abc1234ff"),
                  _row("gated_scores_to_memory", 18e9, k=np.nan, notes="tensor_cores (3xTF32 mma)", commit="abc1234ff"),
                  _row("gated_fused_topk", 9e9, notes="REGRESSION: spills"))
    text = SR.findings(rows, 64, "fp16", 6, 2, read_TBps=4.5)
    assert "no committed unfused baseline" in text
    assert "20.0 G ads/s" in text and "30.0 G" in text and "gated / dot device time 1.50" in text
    assert "run abc1234" in text and "18.0 G ads/s" in text and "they do not help as built" in text
    assert "0.95 of its scores-to-memory rate" in text and "Fused top-K costs nothing measurable" in text
    assert "1 rows flagged `REGRESSION`" in text
    model = SR.issue_model(64, "fp16", 6, 2, 4.5)
    assert model["instructions"] == pytest.approx(1211) and model["budget"] == pytest.approx(
        SR.H200_LANE_ISSUE_PER_S * 132 / 4.5e12)
    assert f"{model['instructions']:.0f} instructions" in text


def test_tensor_core_rows_pair_the_run_with_its_cuda_core_row():
    rows = _frame(_row("gated_scores_to_memory", 20e9, k=np.nan, commit="a", timestamp="1"),
                  _row("gated_scores_to_memory", 19e9, k=np.nan, commit="b", timestamp="2", notes="tensor_cores"),
                  _row("gated_scores_to_memory", 21e9, k=np.nan, commit="b", timestamp="2"))
    got = SR.tensor_core_rows(rows, 64, "fp16", 6, 2).set_index("kernel")
    assert got.loc["tensor cores", "G_ads_per_s"] == pytest.approx(19) and got.loc["CUDA cores", "G_ads_per_s"] == 21
    assert SR.tensor_core_rows(rows.iloc[:1], 64, "fp16", 6, 2).empty


def test_peers_table_takes_the_latest_triton_run_and_its_best_points():
    """The peers table: the latest run with a verified Triton row; per contender its best verified
    row (a failed or other-shape row never counts); times over that run's dot product."""
    rows = _frame(_row("triton_gated_scores_to_memory", 10e9, commit="old", timestamp="2025-01-01", math="fp16"),
                  _row("triton_gated_scores_to_memory", 15e9, layout="rows", math="fp16", notes="Triton, 64 rows"),
                  _row("triton_gated_scores_to_memory", 20e9, layout="rows", math="fp16", notes="Triton, 128 rows"),
                  _row("triton_gated_scores_to_memory", 99e9, layout="rows", math="fp16", ok=False),
                  _row("triton_gated_scores_to_memory", 98e9, layout="rows", math="fp16", experts=8),
                  _row("torch_eager_gated", 0.5e9, layout="rows", math="fp16"),
                  _row("gated_scores_to_memory", 24e9, math="fp16"), _row("gated_scores_to_memory", 18e9),
                  _row("dot_scores_to_memory", 30e9, experts=np.nan, k_experts=np.nan),
                  _row("dot_scores_to_memory", 40e9, commit="old", experts=np.nan, k_experts=np.nan))
    table, run = SR.peers(rows, 64, "fp16", 6, 2)
    assert run == "c1"
    by = table.set_index("contender")
    assert by.loc["Triton (best of its grid)", "G_ads_per_s"] == pytest.approx(20.0)
    assert by.loc["Triton (best of its grid)", "notes"] == "Triton, 128 rows"
    assert by.loc["fused kernel, fp16 math, tiles", "time_over_dot"] == pytest.approx(1.25)
    assert "torch.compile" not in by.index and "fused kernel, fp16 math, rows" not in by.index
    assert SR.peers_metrics(table) == {"gated_fp16_over_dot_time": pytest.approx(1.25),
                                       "triton_fraction_of_read_ceiling": pytest.approx(20e9 * 132 / 4.5e12),
                                       "fused_fp16_over_triton": pytest.approx(1.2)}
    text = SR.peers_summary(table, run)
    assert "1.20x" in text and "1.25x" in text and "1.67x in fp32" in text and "torch.compile" in text
    empty, none = SR.peers(rows[rows["variant"] != "triton_gated_scores_to_memory"], 64, "fp16", 6, 2)
    assert empty.empty and none is None and SR.peers_metrics(empty) == {}
    assert "No committed run" in SR.peers_summary(empty, none)


def test_frontier_takes_the_run_with_most_shapes_and_marks_the_free_models():
    """The frontier: the run with the most gated scores-to-memory shapes; each shape's time over the
    dot product of its own d in that run; free at <= 1.10; failed rows and other runs never count."""
    dot = dict(experts=np.nan, k_experts=np.nan)
    rows = _frame(_row("dot_scores_to_memory", 30e9, **dot), _row("dot_scores_to_memory", 16e9, d=128, **dot),
                  _row("dot_scores_to_memory", 99e9, commit="old", **dot),
                  _row("gated_scores_to_memory", 28e9, math="fp16"),  # 30 / 28 = 1.07: free
                  _row("gated_scores_to_memory", 20e9, math="fp16", experts=8, k_experts=4),  # 1.5
                  _row("gated_scores_to_memory", 15e9, math="fp16", d=128),  # 16 / 15 = 1.067: free
                  _row("gated_scores_to_memory", 29.9e9, math="fp16", experts=8, k_experts=4, ok=False),
                  _row("gated_scores_to_memory", 20e9),  # fp32 math: 1.5
                  _row("gated_scores_to_memory", 29e9, commit="old", math="fp16"))
    table, run = SR.frontier(rows)
    assert run == "c1"
    got = {(r.math, r.d, r.experts, r.k_experts): (round(r.time_over_dot, 3), r.free) for r in table.itertuples()}
    assert got == {("fp16", 64, 6, 2): (1.071, True), ("fp16", 64, 8, 4): (1.5, False),
                   ("fp16", 128, 6, 2): (1.067, True), ("fp32", 64, 6, 2): (1.5, False)}
    assert table.set_index(["math", "d", "experts"]).loc[("fp16", 64, 8), "flops_per_ad"] == 2 * (128 + 512 + 256)
    m = SR.frontier_metrics(table)
    assert m == {"frontier_fp16_d64_largest_free_flops": 1280.0, "frontier_fp16_d128_largest_free_flops": 2560.0,
                 "frontier_fp32_d64_largest_free_flops": 0.0}
    text = SR.frontier_summary(table, run)
    assert "fp16 math, d = 64: up to E = 6, K = 2 (1,280 FLOPs an ad, 1.071x)" in text
    assert "fp32 math, d = 64: no measured shape is free (the cheapest takes 1.500x" in text
    assert SR.frontier(rows[rows["variant"] != "gated_scores_to_memory"])[1] is None
    assert "No committed run" in SR.frontier_summary(*SR.frontier(rows.iloc[:3]))


def test_frontier_grid_matches_the_bench_phase():
    from andromeda_nb.bench import scoring as bench_scoring

    assert (SR.FRONTIER_D, SR.FRONTIER_EK) == (bench_scoring.FRONTIER_D, bench_scoring.FRONTIER_EK)


def test_the_bench_notes_name_the_tile_order_only_where_it_is_not_the_default():
    from andromeda_nb.bench.scoring import config_note
    from andromeda_nb.score.config import KernelConfig

    assert "tile_order=steps" in config_note(KernelConfig(math="fp16", tile_order="steps"))
    for config in (KernelConfig(math="fp16"), KernelConfig(math="fp32", tile_order="steps")):
        assert "tile_order" not in config_note(config)


def test_figures_show_one_card_and_name_their_runs_briefly():
    """The roofline and the E / K sweep never put two cards' rows under one read ceiling: the
    reference card's rows where there are any (else the card with most rows); a source note past
    three runs names the oldest and newest and the count (it must fit the figure's width)."""
    from andromeda_nb.analysis import results, scoring_figures

    h200 = [_row("gated_fused_topk", 20e9 + i, commit=f"c{i}", timestamp=f"2026-01-0{i + 1}", experts=2 + i)
            for i in range(5)]
    h100 = _row("gated_fused_topk_filter", 30e9, commit="h100run", timestamp="2027-01-01", ceiling=3.1)
    h100["device"] = "NVIDIA H100 80GB HBM3"
    rows = _frame(*h200, _row("gated_fused_topk_filter", 19e9, commit="c4", timestamp="2026-01-05"), h100)
    assert set(results.one_device(rows)["device"]) == {"NVIDIA H200"}
    gh = rows.assign(device="NVIDIA GH200 480GB")
    assert set(results.one_device(pd.concat([gh, gh, rows.iloc[[0]]]))["device"]) == {"NVIDIA H200"}
    assert set(results.one_device(gh)["device"]) == {"NVIDIA GH200 480GB"}
    h100_sweep = _frame(*[dict(r, device=h100["device"], commit="h100sweep", ceiling_read_TBps=3.1) for r in h200 * 2])
    on_h100 = SR.complexity_sweep(pd.concat([rows, h100_sweep], ignore_index=True), 64, "fp16")
    assert on_h100["commit"] == "c0" and on_h100["read_TBps"] == pytest.approx(4.5)  # the H200's sweep, not the larger
    assert set(results.one_device(rows.iloc[[-1, -1, 0]])["device"]) == {"NVIDIA H200"}
    only_h100 = rows.iloc[[-1]]
    assert results.one_device(only_h100).equals(only_h100)
    note = results.provenance(rows, "x.csv")
    assert note == "measured on NVIDIA H100 80GB HBM3, NVIDIA H200 (commit c0 ... h100run, 6 commits); x.csv"
    assert results.provenance(rows.iloc[:2], "x.csv") == "measured on NVIDIA H200 (commit c0, c1); x.csv"
    sweep = SR.complexity_sweep(rows, 64, "fp16")
    assert list(sweep["filter"]["commit"]) == ["c4"]  # the newer H100 star is another card's
    assert sweep["read_TBps"] == pytest.approx(4.5)
    fig = scoring_figures.roofline(rows.assign(flops_per_item=1000.0, ceiling_copy_TBps=4.0), "x.csv")
    assert "H100" not in fig.texts[-1].get_text() and "c0 ... c4, 5 commits" in fig.texts[-1].get_text()


def test_gated_int8_over_fp16_takes_the_newest_run_with_both_and_its_default_launches():
    """int8 / fp16 of the gated model in fp16 math: each dtype's best default-launch row of the
    newest run holding both (a newer run of one dtype, an experiment's faster row, fp32 math, another
    shape or an unverified row do not count); met only at >= 1.6x."""
    def g(variant, ips, dtype, **kw):
        k = 1000 if "topk" in variant else None
        return _row(variant, ips, dtype=dtype, k=k, math=kw.pop("math", "fp16"),
                    bytes_per_item=72.0 if dtype == "int8" else 132.0, **kw)

    rows = _frame(g("gated_scores_to_memory", 47e9, "int8", commit="r2", timestamp="2026-02"),
                  g("gated_scores_to_memory", 46e9, "int8", commit="r2", timestamp="2026-02"),
                  g("gated_scores_to_memory", 29e9, "fp16", commit="r2", timestamp="2026-02"),
                  g("gated_fused_topk_filter", 45e9, "int8", commit="r2", timestamp="2026-02"),
                  g("gated_fused_topk_filter", 30e9, "fp16", commit="r2", timestamp="2026-02"),
                  g("gated_fused_topk_filter", 60e9, "int8", commit="r2", timestamp="2026-02", notes="ring_stages=3"),
                  g("gated_fused_topk_filter", 90e9, "int8", commit="r2", timestamp="2026-02", ok=False),
                  g("gated_scores_to_memory", 99e9, "int8", commit="r2", timestamp="2026-02", math="fp32"),
                  g("gated_scores_to_memory", 99e9, "int8", commit="r2", timestamp="2026-02", experts=8),
                  g("gated_scores_to_memory", 10e9, "int8", commit="r1", timestamp="2026-01"),
                  g("gated_scores_to_memory", 10e9, "fp16", commit="r1", timestamp="2026-01"),
                  g("gated_scores_to_memory", 20e9, "int8", commit="r3", timestamp="2026-03"))  # no fp16 row
    t = SR.gated_int8_over_fp16(rows, 6, 2).set_index("output")
    assert set(t["commit"]) == {"r2"}
    assert t.loc["scores to memory", "ratio"] == pytest.approx(47 / 29)
    assert t.loc["fused top-1000", "ratio"] == pytest.approx(1.5)
    line = SR.findings(rows, 64, "fp16", 6, 2, 4.5)
    assert "scores to memory 1.62x (47.0 against 29.0 G ads/s" in line and "): met; fused top-1000 1.50x" in line
    assert "1.50x (45.0 against 30.0 G ads/s, 0.72 and 0.88 of the read ceiling): missed" in line
    assert SR.gated_int8_over_fp16(rows[rows["dtype"] == "fp16"], 6, 2).empty


def test_findings_compare_within_one_run_and_say_which_math():
    """The gate's cost pairs gated and dot rows of one run (the newest with both), in fp32 math; the
    fused top-K line comes once per math mode that has a run; the bitset line names the lowest
    ratio measured and the newest run; the int8 dot line names its run(s)."""
    dot = dict(k=np.nan, experts=np.nan, k_experts=np.nan)
    rows = _frame(_row("gated_scores_to_memory", 20e9, k=np.nan, commit="pair", timestamp="2026-01-01"),
                  _row("dot_scores_to_memory", 30e9, commit="pair", timestamp="2026-01-01", **dot),
                  _row("dot_scores_to_memory", 40e9, commit="dotonly", timestamp="2026-02-01", **dot),
                  _row("gated_scores_to_memory", 29e9, k=np.nan, commit="f16", math="fp16", timestamp="2026-03-01"),
                  _row("gated_fused_topk_filter", 31e9, commit="f16", math="fp16", timestamp="2026-03-01"),
                  _row("gated_fused_topk_filter", 33e9, commit="f16", math="fp16", timestamp="2026-03-01",
                       notes="f16_weights=shared"),  # an experiment's launch: not the figure
                  _row("dot_scores_to_memory", 56e9, commit="i8", dtype="int8", bytes_per_item=72.0,
                       timestamp="2026-04-01", **dot))
    text = SR.findings(rows, 64, "fp16", 6, 2, read_TBps=4.5)
    gate = next(line for line in text.splitlines() if "gate's cost" in line)
    assert "in fp32 math** (scores to memory, pool; run pair, 2026-01-01" in gate and "device time 1.50" in gate
    fp16 = next(line for line in text.splitlines() if "filter path (fp16 math" in line)
    assert "run f16, NVIDIA H200): gated filter path at k = 1000: 31.0 G ads/s, 1.07 of its scores-to-memory rate (29.0 G)" in fp16
    assert "1.40x at d = 64 (56.0 against 40.0 G ads/s" in text and "int8 run i8, fp16 run dotonly)" in text
    base = dict(variant="gated_fused_topk_filter", experts=6, k_experts=2, k=1000)
    bits = _frame(*[_row(base["variant"], v, commit=c, timestamp=t, access=a, layout=lay, eligible_fraction=f,
                         seconds_median=s)
                    for c, t, a, lay, f, v, s in (("low", "2026-01-01", "pool", "tiles", 1.0, 20e9, 10.0),
                                                  ("low", "2026-01-01", "bitset", "tiles", 0.1, 4e9, 7.0),
                                                  ("low", "2026-01-01", "bitset", "rows", 0.1, 8e9, 2.7),
                                                  ("new", "2026-02-01", "pool", "tiles", 1.0, 20e9, 10.0),
                                                  ("new", "2026-02-01", "bitset", "tiles", 0.1, 5e9, 4.6))])
    line = SR._bitset_lines(bits, 64, "fp16", 6, 2)[0]
    assert "at 10 % eligible (fp32 math)" in line
    assert ("the lowest measured is 0.27 on `rows` (run low, 8.0 G eligible ads/s; that run: 0.70 on `tiles`, 0.27 on "
            "`rows`), the newest run (new): 0.46 on `tiles`; target 0.25: not met.") in line, line


def test_frontier_summary_names_the_shapes_newer_runs_measured():
    dot = dict(experts=np.nan, k_experts=np.nan)
    rows = _frame(_row("dot_scores_to_memory", 30e9, **dot), _row("dot_scores_to_memory", 16e9, d=128, **dot),
                  _row("gated_scores_to_memory", 20e9, math="fp16", experts=8, k_experts=4),  # 1.5
                  _row("gated_scores_to_memory", 15e9, math="fp16", d=128),
                  _row("dot_scores_to_memory", 30e9, commit="later", timestamp="2026-02-01", **dot),
                  _row("gated_scores_to_memory", 29e9, math="fp16", experts=8, k_experts=4, commit="later",
                       timestamp="2026-02-01"),  # 30 / 29: free now
                  _row("gated_scores_to_memory", 10e9, math="fp16", experts=8, k_experts=4, commit="odd",
                       timestamp="2026-03-01"))  # no dot product in its run: not a ratio
    table, run = SR.frontier(rows)
    assert run == "c1"
    since = SR.frontier_since(rows, run)
    assert since[["math", "d", "experts", "k_experts", "commit"]].values.tolist() == [["fp16", 64, 8, 4, "later"]]
    text = SR.frontier_summary(table, run, rows)
    assert ("fp16 math, d = 64, E = 8, K = 4: 1.034x (free; run `later`; 1.500x in the frontier's run)") in text
    assert SR.frontier_summary(table, run) == text.split(" **Newer runs")[0]
    # a newer run on another card is not the frontier's card's figure
    other = _frame(*[dict(r, commit="h100", timestamp="2026-03-01", device="NVIDIA H100 80GB HBM3")
                     for r in rows.to_dict("records") if r["commit"] == "later"])
    assert list(SR.frontier_since(pd.concat([rows, other], ignore_index=True), run)["commit"]) == ["later"]


def test_fp16_math_and_fused_top_k_lines_stay_on_the_targets_card():
    """A newer run on another card (an H100) does not replace the H200 run the targets are set on
    in the fp16 math line or the fused top-K lines; each line names its card."""
    dot = dict(k=np.nan, experts=np.nan, k_experts=np.nan)
    h200 = [_row("gated_scores_to_memory", 29e9, k=np.nan, commit="h2", math="fp16", timestamp="2026-01-01"),
            _row("dot_scores_to_memory", 30e9, commit="h2", timestamp="2026-01-01", **dot),
            _row("gated_fused_topk_filter", 31e9, commit="h2", math="fp16", timestamp="2026-01-01")]
    h100 = [dict(r, commit="h1", timestamp="2026-02-01", device="NVIDIA H100 80GB HBM3", items_per_s=r["items_per_s"] / 2)
            for r in h200]
    rows = _frame(*h200, *h100)
    assert set(SR.math_modes(rows)["commit"]) == {"h2"} and SR.fusion_cost(rows, 64, "fp16", math="fp16")[1] == "h2"
    text = SR.findings(rows, 64, "fp16", 6, 2, read_TBps=4.5)
    assert "run h2, NVIDIA H200), scores to memory" in text and "(fp16 math, run h2, NVIDIA H200)" in text
    assert "h1" not in text
