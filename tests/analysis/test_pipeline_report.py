"""The request-path notebook's findings from the committed pipeline and pool rows, and the soak's
line (passed or failed) from a row added to them."""

import re

import pandas as pd
import pytest

from andromeda_nb.analysis import pipeline_report, pool_report, results


def test_findings_state_each_target():
    rows = results.load("pipeline")
    text = pipeline_report.findings(rows)
    assert "One request" in text and "Batches of 32" in text and "Live" not in text


@pytest.mark.parametrize("p50_ms,device_ms,rps,verdicts", [(0.35, 0.3, 6000, ("met", "met", "met")),
                                                           (0.5, 0.25, 4000, ("**not met**",) * 3)])
def test_findings_print_the_newest_numbers_and_their_verdicts(p50_ms, device_ms, rps, verdicts):
    """Newer rows of one request and of batches of 32 become the findings' numbers, each against its
    target (0.4 ms, wall / device 1.3, 5,000 requests/s)."""
    rows = results.load("pipeline")
    last = pipeline_report.newest(rows)
    new = last[(last["variant"] == "retrieve") & (last["n_ads"].astype(float) > 9e7) & (last["dtype"] == "fp16")
               & (last["math"] == pipeline_report.DEFAULT_PATH_MATH) & last["batch"].astype(int).isin([1, 32])]
    assert sorted(new["batch"].astype(int)) == [1, 32]
    new = new[rows.columns].assign(timestamp="2999-01-01T00:00:00+00:00", commit="zz3",
                                   seconds_median=p50_ms / 1e3, device_seconds=device_ms / 1e3, requests_per_s=rps)
    text = pipeline_report.findings(pd.concat([rows, new], ignore_index=True))
    one, b32 = (next(line for line in text.splitlines() if line.startswith(s))
                for s in ("- One request", "- Batches of 32"))
    assert one == (f"- One request: p50 {p50_ms:.3f} ms wall (target 0.4 ms: {verdicts[0]}), "
                   f"{p50_ms / device_ms:.2f} x its {device_ms:.3f} ms of device time (target 1.3: {verdicts[1]}) "
                   "(run zz3, 2999-01-01).")
    assert b32 == f"- Batches of 32: {rps:,} requests/s (target 5,000: {verdicts[2]}) (run zz3, 2999-01-01)."


def test_pool_findings_state_each_target_and_the_newest_soak():
    rows = results.load("pool")
    text = pool_report.findings(rows)
    assert "`Pool.apply` end to end" in text and "target 1 M/s at 10,000" in text
    base = rows[rows["variant"] == "soak"].iloc[-1].copy()
    for verified, word in (("ok: 10/10 checkpoints", "nothing lost"), ("FAILED: after batch 3: x", "a mismatch")):
        soak = base.copy()
        soak.update({"verified": verified, "ok": verified.startswith("ok"),
                     "timestamp": "2999-01-01T00:00:00+00:00", "notes": "1,000 updates"})
        line = pool_report.soak_line(pd.concat([rows, soak.to_frame().T], ignore_index=True))
        assert word in line and verified in line
    assert pool_report.soak_line(rows[rows["variant"] != "soak"]) == ""


def test_pool_tables_pair_end_to_end_with_device_and_alone_with_during():
    rows = results.load("pool")
    base = rows[rows["variant"] == "apply_end_to_end"].iloc[-1].copy()
    extra = []
    for variant, items, secs in (("apply_end_to_end", 5e5, 0.02), ("apply_device", 5e6, 0.002),
                                 ("retrieve_alone", "", 0.4e-3), ("retrieve_during_updates", "", 0.6e-3)):
        r = base.copy()
        r.update({"variant": variant, "items_per_s": items, "seconds_median": secs, "seconds_p99": 2 * secs,
                  "commit": "zz2", "n_ads": 1e8, "batch": 10_000 if variant.startswith("apply") else 1, "ok": True,
                  "timestamp": "2999-01-01T00:00:00+00:00", "notes": "updates offered at 100,000/s; x"})
        extra.append(r)
    both = pd.concat([rows, pd.DataFrame(extra)], ignore_index=True)
    t = pool_report.apply_table(both)
    assert list(t["commit"].unique()) == ["zz2"]
    assert t.iloc[0].to_dict() == {"n_ads": 100_000_000, "batch": 10_000, "updates_per_s": 5e5,
                                   "device_updates_per_s": 5e6, "wall_ms": 20.0, "p99_ms": 40.0, "commit": "zz2",
                                   "device": base["device"]}
    d = pool_report.during_table(both)
    assert d.iloc[-1]["p50_ratio"] == pytest.approx(1.5) and d.iloc[-1]["p99_ratio"] == pytest.approx(1.5)
    m = pool_report.headline_metrics(both)
    assert m["apply_batch10000_updates_per_s"] == 5e5 and m["during_p50_ratio"] == pytest.approx(1.5)
    text = pool_report.findings(both)
    assert "500.0 K/s in batches of 10,000 (device alone 5.00 M/s)" in text
    assert "target 1 M/s at 10,000: **not met**" in text
    assert ("p50 0.600 ms against 0.400 alone (1.50x, target 1.2: **not met**), p99 1.200 against 0.800 "
            "(1.50x, target 1.5: met)") in text
    fast = both.copy()
    fast.loc[fast["commit"] == "zz2", "items_per_s"] = fast.loc[fast["commit"] == "zz2", "items_per_s"].map(
        lambda v: 2e6 if v == 5e5 else v)
    fast.loc[(fast["commit"] == "zz2") & (fast["variant"] == "retrieve_during_updates"), "seconds_median"] = 0.44e-3
    text = pool_report.findings(fast)
    assert "2,000.0 K/s in batches of 10,000" in text and "target 1 M/s at 10,000: met" in text
    assert "(1.10x, target 1.2: met)" in text


def test_launches_line_compares_graph_and_bound_in_one_run():
    rows = results.load("pipeline")
    base = rows[(rows["variant"] == "retrieve") & (rows["dtype"] != "int8")].iloc[-1].copy()
    extra = []
    for variant, ms in (("retrieve", 0.4), ("retrieve_bound_launches", 0.6)):
        r = base.copy()
        r.update({"variant": variant, "seconds_median": ms / 1e3, "commit": "zz1", "n_ads": 1e8, "batch": 1,
                  "ok": True, "timestamp": "2999-01-01T00:00:00+00:00", "dtype": "fp16"})
        extra.append(r)
    line = pipeline_report.launches_line(pd.concat([rows, pd.DataFrame(extra)], ignore_index=True))
    assert "commit `zz1`" in line and "batch 1: 0.400 ms with the graph, 0.600 ms launched one by one" in line
    assert pipeline_report.launches_line(rows[rows["variant"] != "retrieve_bound_launches"]) == ""
    assert "one CUDA graph" in pipeline_report.findings(rows)  # the committed runs hold both


def test_rows_off_the_default_launch_never_become_the_figure():
    """A newer row measured with a non-default setting (f16_weights=shared) stays history: the case's
    newest row and the headline are the default launch's."""
    committed = results.load("pipeline")
    default = committed[~results.text(committed, "notes").str.contains(results.EXPERIMENT)]
    before = pipeline_report.headline_metrics(default)
    last = pipeline_report.newest(default)
    last = last[(last["variant"] == "score_topk") & (last["n_ads"] > 9e7) & (last["math"] == "fp16")
                & (last["dtype"] == "fp16")]
    assert len(last) == 1
    shared = last.drop(columns=["wall_ms", "p99_ms", "device_ms", "wall_over_device"]).assign(
        notes="f16_weights=shared; " + last["notes"].iloc[0], timestamp="2999-01-01T00:00:00+00:00",
        device_seconds="0.0001", commit="sharedrun")
    both = pd.concat([default, shared], ignore_index=True)
    assert pipeline_report.headline_metrics(both) == before
    assert "sharedrun" not in set(pipeline_report.newest(both)["commit"])
    unmarked = pd.concat([default, shared.assign(notes=last["notes"].iloc[0])], ignore_index=True)
    assert pipeline_report.headline_metrics(unmarked) != before  # without its setting, the row would count


def test_int8_rows_stay_out_of_the_fp16_headline_and_get_their_own_line():
    committed = results.load("pipeline")
    assert pipeline_report.int8_line(pipeline_report.newest(committed)).startswith("- On an int8 table")
    rows = committed[committed["dtype"] != "int8"]
    before = pipeline_report.headline_metrics(rows)
    assert pipeline_report.headline_metrics(committed) == before
    assert pipeline_report.int8_line(pipeline_report.newest(rows)) == ""  # no int8 row: no line
    card = results.one_device(rows)  # the card the findings report
    new = card[(card["variant"].isin(["retrieve", "score_topk"])) & (card["math"] == "fp16")
               & (card["n_ads"].astype(float) > 9e7) & ~results.text(card, "notes").str.contains(results.EXPERIMENT)
               ].sort_values("timestamp").groupby(["variant", "batch"]).tail(1)
    new = new.assign(dtype="int8", timestamp="2999-01-01T00:00:00+00:00", seconds_median="0.0005",
                     device_seconds="0.0002", commit="int8run")
    both = pd.concat([rows, new], ignore_index=True)
    assert pipeline_report.headline_metrics(both) == before  # the default path's rows are the fp16 table's
    line = pipeline_report.int8_line(pipeline_report.newest(both))
    assert line.startswith("- On an int8 table (fp16 math), 10^8 ads: one request 0.500 ms p50 wall, 0.200 ms device")
    assert "`score_topk` 0.500 ms p50 wall" in line and line in pipeline_report.findings(both)
    assert pipeline_report.batch_table(both)["commit"].ne("int8run").all()


def test_the_newest_rows_are_one_cards():
    """A newer score_topk row from another card stays out of the findings, which compare the cases
    with each other and with the H200's targets; a card alone in the table is its own figure."""
    committed = results.load("pipeline")
    h200 = committed[results.text(committed, "device") == "NVIDIA H200"]
    before = pipeline_report.newest(h200)
    other = h200[h200["variant"] == "score_topk"].assign(device="NVIDIA H100 80GB HBM3", commit="h100run",
                                                          timestamp="2999-01-01T00:00:00+00:00")
    both = pd.concat([h200, other], ignore_index=True)
    assert set(pipeline_report.newest(both)["device"]) == {"NVIDIA H200"}
    assert pipeline_report.newest(both)["commit"].tolist() == before["commit"].tolist()
    assert pipeline_report.findings(both) == pipeline_report.findings(h200)
    alone = pipeline_report.newest(other)
    assert set(alone["commit"]) == {"h100run"} and len(alone) == other.groupby(
        ["n_ads", "batch", "math", "dtype"]).ngroups


def test_newest_of_a_run_s_rows_is_the_last_written():
    """A bench run stamps every row with one timestamp: among a case's rows of one run the one
    written last is the newest, however many other rows surround them (a sort that is not stable
    had let the int8 rows decide which fp16 row the headline took)."""
    committed = results.load("pipeline")
    case = pipeline_report.newest(committed)
    case = case[(case["variant"] == "score_topk") & (case["dtype"] == "fp16") & (case["math"] == "fp16")
                & (case["n_ads"] > 9e7)]
    assert len(case) == 1
    row = committed.loc[[case.index[0]]]
    first, last = (row.assign(seconds_median=s, commit="tie", timestamp="2999-01-01T00:00:00+00:00") for s in (1.0, 2.0))
    others = committed[committed["dtype"] == "int8"]  # other cases' rows of the same run
    noise = pd.concat([others.assign(timestamp="2999-01-01T00:00:00+00:00")] * 3, ignore_index=True)
    for frame in (pd.concat([committed, first, last], ignore_index=True),
                  pd.concat([noise, first, noise, last, noise], ignore_index=True)):
        got = pipeline_report.newest(frame)
        got = got[(got["variant"] == "score_topk") & (got["dtype"] == "fp16") & (got["math"] == "fp16")
                  & (got["n_ads"] > 9e7)]
        assert got["wall_ms"].tolist() == [2000.0]


def test_int8_line_names_each_side_s_run_and_gives_a_ratio_only_within_one():
    committed = results.load("pipeline")
    t = pipeline_report.newest(committed)
    line = pipeline_report.int8_line(t)
    i8 = t[(t["variant"] == "score_topk") & (t["dtype"] == "int8") & (t["n_ads"] > 9e7)].iloc[-1]
    f16 = t[(t["variant"] == "score_topk") & (t["dtype"] == "fp16") & (t["math"] == "fp16") & (t["n_ads"] > 9e7)]
    f16 = f16.iloc[-1]
    part = line.split("`score_topk`")[1]
    assert f"run {str(i8['commit'])[:7]}" in part
    if str(i8["commit"]) == str(f16["commit"]):
        assert f"int8 / fp16 {f16['wall_ms'] / i8['wall_ms']:.2f}x by wall" in part
    moved = t.copy()
    moved.loc[moved["dtype"] == "int8", "commit"] = "elsewhere"
    other = pipeline_report.int8_line(moved)
    assert "by wall" not in other and "run elsewhe," in other and "fp16 table, run " in other


def test_int8_line_gives_the_range_over_every_pair_its_run_timed():
    """A run that timed the fp16 and int8 tables twice (two phases) gives both pairs' ratios: the
    k-th fp16 call with the k-th int8 call, in the order written, not only the last pair."""
    committed = results.load("pipeline")
    t = pipeline_report.newest(committed)
    case = t[(t["variant"] == "score_topk") & (t["math"] == "fp16") & (t["n_ads"] > 9e7)]
    base = committed.loc[case.index].set_index("dtype")
    rows = [base.loc[[dt]].reset_index().assign(seconds_median=s, device_seconds=s, commit="pairs",
                                                timestamp="2999-01-01T00:00:00+00:00")
            for dt, s in (("fp16", 3.0e-3), ("int8", 2.0e-3), ("fp16", 3.3e-3), ("int8", 2.5e-3))]
    frame = pd.concat([committed, *rows], ignore_index=True)[committed.columns]
    line = pipeline_report.int8_line(pipeline_report.newest(frame), frame)
    part = line.split("`score_topk`")[1]
    assert "int8 / fp16 1.32x by wall (1.32-1.50x over the run's 2 pairs)" in part, part
    assert "over the run's" not in pipeline_report.int8_line(pipeline_report.newest(frame))  # no rows: the last pair
    assert part in pipeline_report.findings(frame)


def test_steps_are_the_default_path_s_and_the_filter_share_is_the_sparse_row_s_run():
    committed = results.load("pipeline")
    st = pipeline_report.steps(committed)
    assert st.attrs["math"] == pipeline_report.DEFAULT_PATH_MATH and set(st.attrs["runs"]) == set(st.index)
    assert pipeline_report.steps(committed, "fp32").attrs["math"] == "fp32"
    t = pipeline_report.newest(committed)
    sparse = t[(t["variant"] == "score_sparse") & (t["math"] == pipeline_report.DEFAULT_PATH_MATH)
               & (t["dtype"] == "fp16") & (t["n_ads"] > 9e7)].iloc[-1]
    same = t[(t["variant"] == "retrieve") & (t["commit"] == sparse["commit"]) & (t["batch"] == 1)
             & (t["math"] == sparse["math"]) & (t["dtype"] == sparse["dtype"]) & (t["n_ads"] > 9e7)].iloc[-1]
    step = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+)", same["notes"].split(";")[0].split(":", 1)[1])}
    share = step["filter"] / sum(step[s] for s in ("reset", "gather", "sample", "seed", "filter", "final0", "final1"))
    assert (f"the filter pass over the gathered rows takes {share:.0%} of it (run {str(sparse['commit'])[:7]}, "
            in pipeline_report.findings(committed))
    # a sparse row whose run timed no one-request retrieve: no share, not another run's
    alone = committed.loc[[sparse.name]].assign(commit="alone", timestamp="2999-01-01T00:00:00+00:00")
    text = pipeline_report.findings(pd.concat([committed, alone], ignore_index=True))
    assert "Sparse scoring of one request" in text and "filter pass" not in text


def test_batch_stalls_name_a_p99_far_above_its_p50_and_the_graph_line_says_when_it_is_slower():
    table = pd.DataFrame({"n_ads": [1e7, 1e8], "batch": [8, 8], "wall_ms": [1.5, 3.5], "p99_ms": [1.9, 13359.1],
                          "commit": ["r", "r"]})
    line = pipeline_report.batch_stalls(table)
    assert line.startswith("Stalls in the sweep: 1e8 ads, batch 8: p99 13,359.1 ms against p50 3.500 ms (run r).")
    assert "1e7" not in line and pipeline_report.batch_stalls(table.iloc[:1]) == ""
    rows = results.load("pipeline")
    pair = rows[rows["variant"].isin(["retrieve", "retrieve_bound_launches"]) & (rows["n_ads"].astype(float) > 9e7)]
    pair = pair[pair["commit"] == pipeline_report.in_time_order(pair[pair["variant"] == "retrieve_bound_launches"])
                ["commit"].iloc[-1]]  # the newest run that timed both on the 10^8-ad pool
    pair = pair[pair["variant"].isin(["retrieve", "retrieve_bound_launches"]) & (pair["dtype"] == "fp16")
                & (pair["math"] == pipeline_report.DEFAULT_PATH_MATH) & (pair["n_ads"].astype(float) > 9e7)
                & (pair["batch"].astype(float) == 1)]
    fake = pair.assign(commit="g", timestamp="2999-01-01T00:00:00+00:00", batch=4)
    fake["seconds_median"] = [2e-3 if v == "retrieve" else 1e-3 for v in fake["variant"]]
    line = pipeline_report.launches_line(pd.concat([rows, fake], ignore_index=True))
    assert "batch 4: 2.000 ms with the graph, 1.000 ms launched one by one (the graph 100.0 % slower" in line, line
    fake["seconds_median"] = [1e-3 if v == "retrieve" else 2e-3 for v in fake["variant"]]
    assert "slower" not in pipeline_report.launches_line(pd.concat([rows, fake], ignore_index=True))
