"""The tables, figures and findings behind the expert-count notebook
(``notebooks/05_expert_count.ipynb``): recall against compute for the retrieval models of
:mod:`.quality`, trained here or read from ``data/results/quality.csv``, and a worked example of
the gate on one synthetic user.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import plots, quality, results

#: The retrieval models compared with the single tower in the findings.
MIXTURES = ("mixture_k1", "mixture_k2", "mixture_k4", "dense_mixture")
#: The recall cut-off each dataset's findings quote besides recall@100 (the published
#: multi-interest comparisons use recall@50; MovieLens' lists are short).
FINDINGS_K = {"multi_interest": 50, "ml-100k": 10}
COMPUTE_METRICS = ("flops_per_ad", "kernel_flops_per_ad", "bytes_per_ad", "kernel_ads_per_s")


# --------------------------------------------------------------------------------------------------
# results: trained here or committed


def train_here(datasets, preset: str, scoring_csv) -> pd.DataFrame:
    """Train and evaluate every model of :func:`.quality.run_expert_count` on each dataset at
    ``preset`` size, with the compute rows (FLOPs, bytes, the kernel's measured ads/s)."""
    frames = []
    for ds in datasets:
        data = quality.load_data(ds, preset)
        frame, _ = quality.run_expert_count(data, preset, progress=False)
        d = quality.PRESETS[preset].cfg(ds, "mixture_k2").d
        frames.append(pd.concat([frame, quality.compute_rows(ds, d=d, scoring_csv=scoring_csv, preset=preset)]))
    return pd.concat(frames, ignore_index=True)


def load(run_experiments: bool, results_csv, run_preset: str, datasets, scoring_csv) -> tuple[pd.DataFrame, str]:
    """The rows of ``datasets`` and a source line: trained here (``run_experiments``) or the
    committed preset of ``results_csv`` (:func:`.quality.committed`, which says when it is not
    the full preset)."""
    if run_experiments:
        frame, source = train_here(datasets, run_preset, scoring_csv), quality.trained_here_source(run_preset)
    else:
        frame, source, pick = quality.committed(results_csv)
        if pick != "full":
            source += " (no full-preset rows: run `python -m andromeda_nb.training --preset full`)"
        frame = _fresh_compute_rows(frame, datasets, scoring_csv, pick)
    return frame[frame["dataset"].isin(datasets)], source


def _fresh_compute_rows(frame: pd.DataFrame, datasets, scoring_csv, preset: str) -> pd.DataFrame:
    """``frame`` with the kernel rows of its compute rows (the kernel's ads/s and the FLOPs of the
    configuration measured) made again from today's ``scoring_csv``: the committed ones hold the
    rates of the day they were written. The analytic rows (the model's FLOPs and bytes, which depend
    on the dataset's settings) stay as committed."""
    kernel = ("kernel_ads_per_s", "kernel_flops_per_ad")
    comp = (frame["experiment"] == "compute") & frame["metric"].isin(kernel)
    fresh = []
    for ds in datasets:
        rows = frame[comp & (frame["dataset"] == ds)]
        if len(rows):
            dtypes = tuple(dict.fromkeys(str(x) for x in rows["dtype"] if str(x) not in ("", "nan")))
            made = quality.compute_rows(ds, d=int(float(rows["d"].iloc[0])), dtypes=dtypes or ("fp16",),
                                        scoring_csv=scoring_csv, preset=preset)
            fresh.append(made[made["metric"].isin(kernel)])
    return pd.concat([frame[~comp], *fresh], ignore_index=True) if fresh else frame


# --------------------------------------------------------------------------------------------------
# tables


def recall_tables(frame: pd.DataFrame, datasets) -> dict[str, dict[str, pd.DataFrame]]:
    """Per dataset with rows, ``{"recall@<k>": model x (mean, std, seeds)}`` for each cut-off of
    :data:`.quality.KS` (:func:`.quality.recall_table`)."""
    out = {}
    for ds in datasets:
        parts = {f"recall@{k}": quality.recall_table(frame, ds, f"recall@{k}") for k in quality.KS[ds]}
        if all(len(p) for p in parts.values()):
            if "recall@100" in parts:
                parts["recall@100"] = parts["recall@100"].assign(trained=trained_as(frame, ds,
                                                                                    parts["recall@100"].index))
            out[ds] = parts
    return out


def trained_as(frame: pd.DataFrame, dataset: str, models) -> list[str]:
    """How each model's recall rows were trained: ``tuned on last sessions`` or ``tuned on last
    clicks`` (the project's models whose ``scorer`` says they were tuned, and the baselines, by the
    validation split their scorer names: :meth:`~andromeda_nb.training.data.InteractionData.resolve_split`;
    ``tuned`` where no scorer says; a baseline whose scorer names no setting: ``nothing to
    tune``), ``preset's settings``, ``mixed`` (seeds of both), ``generator``
    (the true click model; with the users' interests estimated from their training clicks:
    ``generator, interests from clicks``)."""
    rec = frame[(frame["metric"] == "recall@100") & (frame["dataset"] == dataset)
                & (frame["experiment"] == "expert_count")]  # the rows recall_table averages
    if "scorer" not in rec:  # a frame written before the column: the preset's settings
        rec = rec.assign(scorer="")
    base = frame[(frame["metric"] == "recall@100") & (frame["dataset"] == dataset)
                 & (frame["experiment"] == "baselines")]
    out = []
    for m in models:
        if str(m).startswith("baseline_"):
            scorer = results.text(base.loc[base["model"] == m], "scorer")
            # a baseline without settings (most popular: its scorer names none) had nothing to tune
            named = len(scorer) and (scorer != "").all()
            out.append("nothing to tune" if named and not scorer.str.contains("=").any() else _tuned_on(scorer))
            continue
        scorer = results.text(rec.loc[rec["model"] == m], "scorer")
        tuned = scorer.str.startswith("tuned")
        out.append("generator" if m == "true_model" else "generator, interests from clicks"
                   if m == "true_model_estimated" else _tuned_on(scorer) if len(tuned) and tuned.all()
                   else "preset's settings" if not tuned.any() else "mixed")
    return out


def _tuned_on(scorers: pd.Series) -> str:
    """``tuned on last sessions`` / ``tuned on last clicks`` as every one of a model's tuned rows'
    scorers says: a session split names its "last sessions"; a scorer that does not was tuned on the
    last click, the only split before sessions (:mod:`~andromeda_nb.training.tuning`); ``tuned``
    without scorers or where they differ."""
    said = set(scorers[scorers != ""].str.contains("last sessions"))
    return "tuned" if len(said) != 1 else "tuned on last sessions" if said.pop() else "tuned on last clicks"


def recall_display(parts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One dataset's recall tables as ``mean ± sd`` strings, the number of seeds, recall@100's
    95 % interval half-width and how each model was trained (:func:`trained_as`)."""
    t = pd.concat({m: p["mean"].map("{:.4f}".format) + " ± " + p["std"].fillna(0).map("{:.4f}".format)
                   for m, p in parts.items()}, axis=1)
    if "recall@100" in parts and "ci95" in parts["recall@100"]:
        t["recall@100 95 % ±"] = parts["recall@100"]["ci95"].map("{:.4f}".format)
    t = t.assign(seeds=next(iter(parts.values()))["seeds"])
    if "trained" in parts.get("recall@100", {}):
        t["trained"] = parts["recall@100"]["trained"]
    return t


def recall_metrics(tables) -> dict[str, float]:
    """``<dataset>/<model>/recall@100``: the mean over seeds."""
    return {f"{ds}/{model}/recall@100": float(r["mean"]) for ds, parts in tables.items()
            for model, r in parts["recall@100"].iterrows()}


def compute_table(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Per model (rows, in :data:`.quality.MODEL_ORDER`): FLOPs and bytes per ad, the kernel's
    measured ads/s (fp16 table, every model's from one run: NaN where that run did not measure the
    configuration, :func:`throughput_line`), and the overlap
    of its top-100 with the ranking model's."""
    comp = frame[(frame["dataset"] == dataset) & frame["metric"].isin(COMPUTE_METRICS)]
    comp = comp[(comp["dtype"] == "fp16") | (comp["model"] == "ranking")]
    c = comp.pivot_table(index="model", columns="metric", values="value", aggfunc="first")
    c = c.reindex([m for m in quality.MODEL_ORDER if m in c.index])
    overlap = quality.recall_table(frame, dataset, "overlap@100_ranking")
    return c.assign(**{"overlap@100_ranking": overlap["mean"].reindex(c.index)})


def routing_table(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Per mixture (rows): the busiest expert's share of the K-of-E choices and the gate's
    normalised entropy over the pairs it retrieved (:func:`.quality.routing_stats`), mean and
    standard deviation over seeds, with the balanced share 1/E and the collapsed share 1/K beside
    them (no share where K = E). Empty where no run reported them."""
    sel = (frame["dataset"] == dataset) & frame["metric"].isin(("expert_share_max", "routing_entropy"))
    if "experiment" in frame:  # the models of the recall table, not those kept to compare (preset_settings)
        sel &= frame["experiment"] == "expert_count"
    if not sel.any():
        return pd.DataFrame()
    g = frame[sel].assign(value=lambda f: f["value"].astype(float))
    out = g.pivot_table(index="model", columns="metric", values="value", aggfunc=["mean", "std"])
    out.columns = [f"{m} ({agg})" for agg, m in out.columns]
    shape = g.drop_duplicates("model").set_index("model")[["experts", "k_experts"]].astype(float)
    out["balanced share (1/E)"] = 1 / shape["experts"].reindex(out.index)
    out["collapsed share (1/K)"] = 1 / shape["k_experts"].reindex(out.index)
    return out.reindex([m for m in quality.MODEL_ORDER if m in out.index])


def throughput_line(frame: pd.DataFrame, dataset: str) -> str:
    """Where the compute table's ``kernel_ads_per_s`` of ``dataset`` (fp16 tables) come from: the one run (and
    device) every rate is taken from, and for each model that run did not measure (NaN in the
    table), what its scorer says (another run's rate, named, or "not measured")."""
    sel = (frame["dataset"] == dataset) & (frame["metric"] == "kernel_ads_per_s") & (frame["dtype"] == "fp16")
    if "experiment" in frame:
        sel &= frame["experiment"] == "compute"
    rows = frame[sel].assign(value=lambda f: pd.to_numeric(f["value"], errors="coerce"))
    got = rows[rows["value"].notna()]
    if got.empty:
        return f"{dataset}: kernel throughput not measured (NaN)"
    runs = sorted({f"{s.rsplit('run ', 1)[-1]} ({dv})" for s, dv in zip(got["scorer"].astype(str), got["device"])})
    line = f"{dataset}: kernel throughput from run {', '.join(runs)}"
    missing = rows[rows["value"].isna()].drop_duplicates("model")
    return line + "".join(f"; {m}: {s}" for m, s in zip(missing["model"], missing["scorer"].astype(str)))


def recall_vs_compute_figure(frame: pd.DataFrame, tables, source: str):
    """Per dataset: recall@100 (mean ± sd over seeds) against FLOPs per ad; the ground truth and
    the same with the users' interests estimated (no FLOPs) as dashed lines, the tuned standard
    baselines as dotted ones."""
    import matplotlib.pyplot as plt

    n = max(1, len(tables))
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 3.8), squeeze=False)
    if not tables:
        plots.no_data(axes[0, 0], "no recall rows")
    for ax, (ds, parts) in zip(axes[0], tables.items()):
        flops = frame[(frame["dataset"] == ds) & (frame["metric"] == "flops_per_ad")].groupby("model")["value"].first()
        for model, row in parts["recall@100"].iterrows():
            if model in quality.BASELINE_ORDER:  # no kernel of ours: a level to compare with
                ax.axhline(row["mean"], ls=":", lw=1, color="0.6")
                ax.text(0.99, row["mean"], model.removeprefix("baseline_"), transform=ax.get_yaxis_transform(),
                        ha="right", va="bottom", fontsize="x-small", color="0.45")
                continue
            if model not in flops.index:
                ax.axhline(row["mean"], ls="--", lw=1, color="0.5")
                label = f"{model} (ceiling)" if model == "true_model" else f"{model} (interests from clicks)"
                ax.text(0.01, row["mean"], label, transform=ax.get_yaxis_transform(), va="bottom",
                        fontsize="small", color="0.4")
                continue
            ax.errorbar(flops[model], row["mean"], yerr=0 if np.isnan(row["std"]) else row["std"], fmt="o",
                        capsize=3, label=model)
        ax.set(xscale="log", xlabel="FLOPs per ad (log)", ylabel="recall@100", title=ds)
        ax.legend(fontsize="small", loc="best")  # clear of the points and the baselines' levels
    trained = ", ".join(quality.devices(frame)) or "n/a"
    plots.source_note(fig, f"{source}; mean ± sd over seeds; trained on {trained}")
    return fig


# --------------------------------------------------------------------------------------------------
# worked example

def two_interest_user(data, min_weight: float = 0.3) -> int:
    """An evaluated synthetic user holding exactly two interests, each with weight >= ``min_weight``,
    whose topics are the most different (lowest centroid cosine). Returns the user id."""
    w = data.world
    rows = data.eval_rows
    t = w.interest_topics[data.user_ids[rows]]
    wt = w.interest_weights[data.user_ids[rows]]
    two = ((t >= 0).sum(1) == 2) & (wt[:, :2].min(1) >= min_weight)
    if not two.any():
        raise ValueError("no evaluated user holds two balanced interests")
    cand = rows[two]
    tt = t[two][:, :2]
    mu = w.topic_centroids
    cos = np.einsum("nd,nd->n", mu[tt[:, 0]], mu[tt[:, 1]])
    return int(data.user_ids[cand[int(np.argmin(cos))]])


def gate_example(tm, user_id, n_top: int = 30, table=None) -> pd.DataFrame:
    """The user's top ads (eligible, unseen) under a trained mixture with each ad's gate: one row per
    ad with ``rank, ad_id, score, topic`` (synthetic: which of the user's interests it belongs to),
    ``p_<expert>`` and ``chosen`` (the expert names the design's top-K gate picked). Scored by the oracle."""
    from .. import reference
    from ..training.data import GROUPS

    data = tm.data
    row = data.row_of(user_id)
    req = tm.export_request(user_id)
    table = tm.export_table("fp32") if table is None else table
    mask = data.eligible(np.array([row]))[0]
    top = reference.retrieve(req, table, n_top, eligible=mask)
    slots = table.slots_of(top.ids[top.ids >= 0])
    g = reference.gate(req, table.dequantized()[slots])
    names = GROUPS[: req.experts]
    out = pd.DataFrame({"rank": np.arange(1, slots.size + 1), "ad_id": table.ad_ids[slots],
                        "score": top.scores[: slots.size]})
    if hasattr(data.world, "ad_topic"):
        w = data.world
        topic = w.ad_topic[slots]
        mine = w.interest_topics[int(user_id)]
        out["topic"] = topic
        out["interest"] = [f"interest {int(np.flatnonzero(mine == t)[0])}" if t in mine else "other" for t in topic]
    for e, nm in enumerate(names):
        out[f"p_{nm}"] = g.p[:, e]
    out["chosen"] = [", ".join(names[e] for e in np.flatnonzero(c)) for c in g.chosen]
    return out


def gate_by_interest(tm, user_id) -> pd.DataFrame:
    """Synthetic world: for every eligible unseen ad of each of the user's interest topics, the mean
    gate weight ``p`` of each expert and how often each expert is among the chosen K
    (rows: interests; columns ``p_<expert>``, ``chosen_<expert>``)."""
    from .. import reference
    from ..training.data import GROUPS

    data, w = tm.data, tm.data.world
    row = data.row_of(user_id)
    req = tm.export_request(user_id)
    table = tm.export_table("fp32")
    mask = data.eligible(np.array([row]))[0]
    names = GROUPS[: req.experts]
    rows = []
    for j, t in enumerate(w.interest_topics[int(user_id)]):
        if t < 0:
            continue
        slots = np.flatnonzero(mask & (w.ad_topic == t))
        g = reference.gate(req, table.dequantized()[slots])
        r = {"interest": f"interest {j}", "topic": int(t), "weight": float(w.interest_weights[int(user_id), j]),
             "ads": int(slots.size)}
        r.update({f"p_{nm}": float(g.p[:, e].mean()) for e, nm in enumerate(names)})
        r.update({f"chosen_{nm}": float(g.chosen[:, e].mean()) for e, nm in enumerate(names)})
        rows.append(r)
    return pd.DataFrame(rows).set_index("interest")


def example_figure(example: pd.DataFrame, by_interest: pd.DataFrame, user: int, note: str):
    """Left: the gate's p over the user's top ads (● = chosen). Right: how often each expert is
    chosen for each interest's eligible ads."""
    import matplotlib.pyplot as plt

    pcols = [c for c in example.columns if c.startswith("p_")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    ex = example.sort_values(["interest", "rank"])
    im = axes[0].imshow(ex[pcols].to_numpy(), aspect="auto", cmap="viridis", vmin=0)
    axes[0].grid(False)
    axes[0].set_xticks(range(len(pcols)), [c[2:] for c in pcols], rotation=30, ha="right")
    axes[0].set_yticks(range(len(ex)), [f"#{r} {i}" for r, i in zip(ex["rank"], ex["interest"])], fontsize="x-small")
    for y, chosen in enumerate(ex["chosen"]):
        for x, c in enumerate(pcols):
            if c[2:] in chosen.split(", "):
                axes[0].text(x, y, "●", ha="center", va="center", color="white", fontsize="x-small")
    k = len(ex["chosen"].iloc[0].split(", ")) if len(ex) else 0
    axes[0].set_title(f"gate p of user {user}'s top-{len(ex)} ads (● = chosen, K = {k})")
    fig.colorbar(im, ax=axes[0], fraction=0.04, pad=0.01, label="gate weight p")
    chosen = by_interest[[c for c in by_interest.columns if c.startswith("chosen_")]].rename(columns=lambda c: c[7:])
    chosen.T.plot.barh(ax=axes[1])
    axes[1].set(xlabel="share of the interest's ads routed to the expert", title="routing per interest (all eligible ads)")
    fig.tight_layout()
    plots.source_note(fig, note)
    return fig


def example_findings(example: pd.DataFrame, by_interest: pd.DataFrame) -> str:
    """What the worked example shows, as Markdown: how many of the top ads belong to neither
    interest, and each interest's most chosen experts (whether the experts split by interest)."""
    other = float((example["interest"] == "other").mean()) if "interest" in example else float("nan")
    chosen = by_interest[[c for c in by_interest.columns if c.startswith("chosen_")]].rename(columns=lambda c: c[7:])
    top = {i: list(r.sort_values(ascending=False).index[:2]) for i, r in chosen.iterrows()}
    same = len({t[0] for t in top.values()}) == 1
    lines = [f"* {other:.0%} of the user's top-{len(example)} ads belong to neither of the two interests "
             f"(topics {', '.join(str(t) for t in by_interest['topic'])})."]
    lines.append("* Most chosen experts per interest: " + "; ".join(
        f"{i} (topic {by_interest.loc[i, 'topic']}): {', '.join(f'`{e}` {chosen.loc[i, e]:.0%}' for e in t)}"
        for i, t in top.items()) + ".")
    lines.append("* " + ("Both interests route mostly to the same expert: the experts split by *signal type* "
                         "(demographics, history, recent clicks, ...), and the gate picks the signals that score an "
                         "ad best, not an interest." if same else
                         "The interests route to different experts first: in this example the gate separates them."))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# findings


def _paired(frame, dataset: str, a: str, b: str) -> str:
    """`` (paired over n seeds: 95 % interval ±x pp[, within noise])`` for recall@100 of ``a``
    minus ``b``, or '' where fewer than two seeds pair up (no frame: '')."""
    if frame is None:
        return ""
    p = quality.paired_difference(frame, dataset, a, b)
    if p["seeds"] < 2:
        return ""
    within = abs(p["mean"]) <= p["ci95"]
    return (f" (paired over {p['seeds']} seeds: 95 % interval ±{100 * p['ci95']:.2f} pp"
            + (", within noise)" if within else ")"))


def _difference(p: dict, a_rows: pd.DataFrame | None = None, b_rows: pd.DataFrame | None = None) -> str:
    """``+x.xx pp (paired over n seeds ±y.yy[, within noise][; trained on A against B])`` for a
    paired difference (:func:`.quality.paired_experiments`), naming the devices of its two sides'
    rows where they differ (of the seeds both sides ran: those the difference pairs)."""
    if a_rows is not None and b_rows is not None:
        both = set(a_rows["seed"].astype(str)) & set(b_rows["seed"].astype(str))
        a_rows, b_rows = (r[r["seed"].astype(str).isin(both)] for r in (a_rows, b_rows))
    on = ["" if r is None else ", ".join(sorted(set(results.text(r, "device")) - {""})) for r in (a_rows, b_rows)]
    return (f"{100 * p['mean']:+.2f} pp (paired over {p['seeds']} seeds ±{100 * p['ci95']:.2f}"
            + (", within noise" if abs(p["mean"]) <= p["ci95"] else "")
            + (f"; trained on {on[0]} against {on[1]})" if on[0] != on[1] else ")"))


def verdict(tables, dataset: str, frame: pd.DataFrame | None = None) -> list[str]:
    """Per mixture: recall@k relative to the single tower and recall@100 in points, with (given
    the rows, ``frame``) the paired difference's 95 % interval over the seeds both ran; the ranking
    model against the best retrieval model (the anchor must be stronger for "close to ranking" to
    mean anything) and the best tuned baseline against the best project model, paired likewise."""
    if dataset not in tables:
        return [f"{dataset}: no results"]
    r, k = tables[dataset], FINDINGS_K[dataset]
    rk, r100 = r[f"recall@{k}"]["mean"], r["recall@100"]
    own = r100[~r100.index.isin(quality.BASELINE_ORDER)]
    seeds = int((own if len(own) else r100)["seeds"].max())  # the project's models' seeds
    noise = ": no spread to judge noise by" if seeds < 2 else ""
    lines = [f"**{dataset}** ({seeds} seed{'s' if seeds != 1 else ''}{noise}):"]
    if "single_tower" in rk.index:
        for m in MIXTURES:
            if m in rk.index:
                # on the seeds both ran where they pair (the interval beside it is theirs), else of the means
                gain, ratio = r100.loc[m, "mean"] - r100.loc["single_tower", "mean"], rk[m] / rk["single_tower"]
                p = quality.paired_difference(frame, dataset, m, "single_tower") if frame is not None else {"seeds": 0}
                if p["seeds"] >= 2:
                    pk = quality.paired_difference(frame, dataset, m, "single_tower", metric=f"recall@{k}")
                    gain, ratio = p["mean"], pk["a"] / pk["b"] if pk["seeds"] == p["seeds"] else ratio
                lines.append(f"  * {m}: recall@{k} {100 * (ratio - 1):+.1f} % against the single "
                             f"tower, recall@100 {100 * gain:+.2f} pp" + _paired(frame, dataset, m, "single_tower")
                             + ("" if frame is None else _gap_share(frame, dataset, m, ("expert_count",))))
    ours = r100[~r100.index.isin(quality.BASELINE_ORDER)]
    base = r100[r100.index.isin(quality.BASELINE_ORDER)]
    retrieval = ours.drop([m for m in ("ranking", *quality.GENERATOR_MODELS) if m in ours.index])
    if len(base) and len(retrieval):
        mine = retrieval["mean"]
        top = base["mean"].idxmax()
        # the lead on the seeds both ran where they pair (the interval is theirs), else of the means
        p = quality.paired_difference(frame, dataset, mine.idxmax(), top) if frame is not None else {"seeds": 0}
        lead = p["mean"] if p["seeds"] >= 2 else mine.max() - base.loc[top, "mean"]
        on = " on the seeds both ran" if p["seeds"] >= 2 else ""
        lines.append(f"  * best tuned baseline {top.removeprefix('baseline_')} recall@100 {base.loc[top, 'mean']:.4f} "
                     f"(tuned on the training part's validation split) against the best project retrieval model "
                     f"({mine.idxmax()}) {mine.max():.4f}: "
                     + (f"the project's model leads by {100 * lead:.2f} pp{on}" if lead > 0 else
                        f"the baseline leads by {-100 * lead:.2f} pp{on}")
                     + _paired(frame, dataset, mine.idxmax(), top))
    if "ranking" in ours.index:
        best = retrieval["mean"].idxmax()
        stronger = r100.loc["ranking", "mean"] > retrieval["mean"].max()
        p = quality.paired_difference(frame, dataset, "ranking", best) if frame is not None else {"seeds": 0}
        clear = p["seeds"] < 2 or p["mean"] > p["ci95"]  # no pairs to judge by, or beyond the interval
        lines.append(f"  * ranking model recall@100 {r100.loc['ranking', 'mean']:.4f} against the best retrieval model "
                     f"({best}) {retrieval['mean'].max():.4f}: "
                     + ("the anchor is stronger" if stronger and clear else
                        "the anchor leads, but not beyond the seeds' interval" if stronger else
                        "the anchor is NOT stronger: the 'close to ranking' comparison is not meaningful")
                     + _paired(frame, dataset, "ranking", best))
    elif frame is not None and "experiment" in frame:
        kept = frame[(frame["dataset"] == dataset) & (frame["model"] == "ranking") & (frame["metric"] == "recall@100")
                     & (frame["experiment"] != "expert_count")]
        if len(kept):
            lines.append("  * ranking model: no rows among the models compared here, only "
                         + ", ".join(sorted(kept["experiment"].astype(str).unique()))
                         + " rows: the 'close to ranking' comparison waits for its tuned seeds")
    return lines


def kernel_cost_line(frame: pd.DataFrame, scoring_csv=None) -> str:
    """The fused kernel's measured ads/s for one vector (E = K = 1) and for K = 2 of E = 6 (fp16
    tables), with the device; the two rates compared only where one run measured both (the rows'
    scorer names the run), else each named with its run; empty where either was not measured.
    With ``scoring_csv``, the newest K = 2 rates of each math mode beside them, each named with its
    run (a shape sweep is older than the kernels' latest changes)."""
    sel = frame[(frame["metric"] == "kernel_ads_per_s") & (frame["dtype"] == "fp16") & frame["value"].notna()]
    per_model = sel.groupby("model")[["value", "device", "scorer"]].first()
    if not {"single_tower", "mixture_k2"} <= set(per_model.index):
        return ""
    one, k2 = per_model.loc["single_tower"], per_model.loc["mixture_k2"]
    runs = [re.search(r"run (\S+)", str(r["scorer"])) for r in (one, k2)]
    runs = [m.group(1) if m else "" for m in runs]
    rates = f"{one['value'] / 1e9:.1f} G ads/s for one vector, {k2['value'] / 1e9:.1f} G for K = 2 ({k2['device']}"
    if runs[0] and runs[0] == runs[1]:
        line = (f"the cost that matters is the kernel's measured ads/s (`kernel_ads_per_s`): {rates}, run {runs[0]}; "
                f"fp16 tables in fp32 math): K = 2 takes {one['value'] / k2['value']:.2f}x the one vector's time there")
    else:
        line = (f"the kernel's measured ads/s (`kernel_ads_per_s`, fp16 tables in fp32 math): {rates}; the newest row "
                f"of each, from different runs{' (' + ' and '.join(r for r in runs if r) + ')' if any(runs) else ''} "
                "and possibly paths, so not a like-for-like cost: notebook 02's complexity sweep compares the shapes "
                "within one run)")
    if scoring_csv is None:
        return line
    newest = quality.kernel_throughput(scoring_csv)
    newest = newest[(newest["d"] == 64) & (newest["experts"] == 6) & (newest["k_experts"] == 2)].set_index("dtype")
    now = [f"{newest.loc[dt, 'items_per_s'] / 1e9:.1f} G in {math} math (run {newest.loc[dt, 'commit']}, "
           f"{newest.loc[dt, 'device']})" for dt, math in (("fp16", "fp32"), ("fp16_math", "fp16"))
           if dt in newest.index and str(newest.loc[dt, "commit"]) not in runs]
    return line + (f"; the newest K = 2 runs, fp16 tables, score {' and '.join(now)}: today's cost of the "
                   "gate against the dot product is notebook 02's" if now else "")


def tuning_line(frame: pd.DataFrame) -> str:
    """Whether the project's models in these rows were tuned (their ``scorer`` column says so:
    :mod:`~andromeda_nb.training.tuning`) or trained at the preset's settings."""
    rec = frame[(frame["metric"] == "recall@100") & frame["model"].isin(quality.PROJECT_MODELS)
                & (frame.get("experiment", "expert_count") == "expert_count")]
    if rec.empty:
        return ""
    tuned = rec["scorer"].astype(str).str.startswith("tuned")
    if tuned.all():
        return ("The project's models were tuned on the training part's validation split (learning rate x "
                "length, the same grid each), as the baselines were.")
    if not tuned.any():
        return ("The project's models were trained at the preset's settings (not tuned per model) while the "
                "baselines were tuned on a validation split: a comparison with them leans toward the baselines.")
    untuned = rec.loc[~tuned, ["dataset", "model"]].drop_duplicates() if "dataset" in rec else None
    which = ("; untuned: " + "; ".join(f"{ds} {', '.join(g['model'])}"
                                       for ds, g in untuned.groupby("dataset", sort=False))
             if untuned is not None else "")
    return (f"{int(tuned.sum())} of {len(tuned)} of the project's recall@100 rows come from tuned models, the rest "
            f"from the preset's settings{which}: compare within one kind.")


def tuning_effect_line(frame: pd.DataFrame, dataset: str) -> str:
    """Where the rows hold a model both tuned and at the preset's settings: whether the tuning's
    choice did better on the held-out part (paired over seeds), one clause a model; '' otherwise."""
    eff = quality.tuning_effect(frame, dataset)
    if eff.empty:
        return ""
    # every seed equal: the tuning chose the preset's settings, and the rows are the same runs
    parts = [f"{m} chose the preset's settings ({r['tuned']:.4f}, the same runs)"
             if r["seeds"] >= 2 and r["mean"] == 0 and r["ci95"] == 0 else
             f"{m} {r['tuned']:.4f} against {r['preset']:.4f} ({100 * r['mean']:+.2f} pp"
             + (f", paired over {int(r['seeds'])} seeds ±{100 * r['ci95']:.2f}" if r["seeds"] >= 2 else
                ", one seed: no interval") + ")"
             for m, r in eff.iterrows()]
    worse = [m for m, r in eff.iterrows() if r["seeds"] >= 2 and r["mean"] < -r["ci95"]]
    return (f"{dataset}: tuned on the validation split against the preset's settings, held-out recall@100: "
            + "; ".join(parts) + "." + (f" The tuning's choice did worse than the preset's settings for "
                                        f"{', '.join(worse)}: a validation score that does not predict the held-out "
                                        "one (andromeda_nb.training.tuning says how its split and lengths were chosen)."
                                        if worse else ""))


#: the validation splits other tunings than the main table's used, by their rows' experiment
#: (:func:`~andromeda_nb.training.tuning.validation_view`)
TUNED_ON = {"tuned_session": "tuned on the validation split of each user's last training session",
            "tuned_last_click": "tuned on the validation split of each user's last training click"}


def split_tuning_line(frame: pd.DataFrame, dataset: str, experiment: str = "tuned_session") -> str:
    """Models tuned on another validation split than the main table's (``experiment``'s rows, one
    of :data:`TUNED_ON`) and trained at their points: held-out recall@100 with its 95 % interval
    over seeds, paired against the same model at the preset's settings and in the main table
    (``expert_count``); the models tuned there but not yet trained at their points are named. ''
    without such rows; rows of one preset only (ValueError otherwise)."""
    if "experiment" not in frame:
        return ""
    rows = frame[(frame["dataset"] == dataset) & (frame["experiment"] == experiment)]
    quality.one_preset(rows)
    rec = rows[(rows["metric"] == "recall@100") & pd.to_numeric(rows["value"], errors="coerce").notna()]
    trained = [m for m in quality.PROJECT_MODELS if m in set(rec["model"])]
    waiting = [m for m in quality.PROJECT_MODELS
               if m in set(rows.loc[rows["metric"] == "validation_recall@100", "model"]) and m not in trained]
    recall = frame[(frame["dataset"] == dataset) & (frame["metric"] == "recall@100")]
    parts = []
    for m in trained:
        mine = rec[rec["model"] == m]
        v = pd.to_numeric(mine["value"]).groupby(mine["seed"]).mean()  # a seed once, however many rows
        point = re.search(r"lr x[^,]+, steps x\S+", results.text(mine, "scorer").iloc[0])
        part = (f"{m} {v.mean():.4f}" + (f" ±{float(quality.ci95(v.std(), len(v))):.4f} (95 %)" if len(v) >= 2 else "")
                + f" over {len(v)} seed{'s' if len(v) > 1 else ''}" + (f" ({point.group(0)})" if point else ""))
        main = results.text(recall[(recall["model"] == m) & (recall["experiment"] == "expert_count")], "scorer")
        main_said = ("the `expert_count` rows" if not len(main) or not main.iloc[0].startswith("tuned") else
                     "the `expert_count` rows' session tuning" if "of last sessions" in main.iloc[0] else
                     "the `expert_count` rows' last-click tuning")
        for other, name in (("preset_settings", "the preset's settings"), ("expert_count", main_said)):
            p = quality.paired_experiments(frame, dataset, m, experiment, other)
            if p["seeds"] >= 2 and p["mean"] == 0 and p["ci95"] == 0:  # every seed equal: the same runs
                part += f"; its tuning chose the point of {name}, so these are the same runs"
            elif p["seeds"] >= 2:
                part += f"; against {name} " + _difference(
                    p, mine, recall[(recall["model"] == m) & (recall["experiment"] == other)])
        parts.append(part)
    if not parts and not waiting:
        return ""
    line = f"{dataset}, {TUNED_ON.get(experiment, 'tuned')} (`{experiment}` rows)"
    if not parts:
        return f"{line}: {', '.join(waiting)}, not yet trained at their points."
    return (f"{line}, held-out recall@100: {'; '.join(parts)}."
            + (f" Tuned there, not yet trained at their points: {', '.join(waiting)}." if waiting else ""))


def _gap_share(frame: pd.DataFrame, dataset: str, mixture: str, experiments) -> str:
    """``, x.xx of the gap to the ranking model``: on the seeds the mixture, the single tower and
    the ranking model all ran (rows of ``experiments``), the mixture's mean recall@100 gain over
    the single tower as a share of the ranking model's; only where the ranking model leads beyond
    its 95 % interval and the mixture gains at all, with ``(its gain within noise)`` where the
    mixture's own gain is inside its interval; else ''."""
    df = frame[(frame["dataset"] == dataset) & (frame["metric"] == "recall@100")
               & frame["experiment"].isin(experiments)]
    df = df.assign(value=pd.to_numeric(df["value"], errors="coerce")).dropna(subset=["value"])
    per = {m: df[df["model"] == m].groupby("seed")["value"].mean() for m in (mixture, "single_tower", "ranking")}
    seeds = per[mixture].index.intersection(per["single_tower"].index).intersection(per["ranking"].index)
    if len(seeds) < 2:
        return ""
    gain = per[mixture][seeds] - per["single_tower"][seeds]
    gap = per["ranking"][seeds] - per["single_tower"][seeds]
    if not gap.mean() > quality.ci95(gap.std(), len(seeds)) or not gain.mean() > 0:
        return ""
    noisy = gain.mean() <= quality.ci95(gain.std(), len(seeds))
    return (f", {gain.mean() / gap.mean():.2f} of the gap to the ranking model"
            + (" (its gain within noise)" if noisy else ""))


#: how the conclusions name the models of the experiments beside the main table
_SAID = {"preset_settings": "at the preset's settings", "tuned_session": "tuned on last sessions",
         "tuned_last_click": "tuned on last clicks"}
#: how :func:`against_single_tower_line` names the rows it compares
_TRAINED_AS = {e: f"{said} (`{e}` rows)" for e, said in _SAID.items()}
_TRAINED_AS["preset_settings"] = "at the preset's settings (`preset_settings` rows, not the tuning's choices)"


def against_single_tower_line(frame: pd.DataFrame, dataset: str, experiment: str = "preset_settings") -> str:
    """The models of one experiment's rows compared as the main table's are: each mixture and the
    ranking model against the single tower, paired over seeds, and the share of the single tower's
    gap to the ranking model that each mixture closes (the mixtures' claim: most of the way to
    ranking quality); '' without such rows of the single tower."""
    if "experiment" not in frame:
        return ""
    rows = frame[(frame["dataset"] == dataset) & (frame["experiment"] == experiment)
                 & (frame["metric"] == "recall@100")]
    quality.one_preset(rows)
    models = [m for m in (*MIXTURES, "ranking") if m in set(rows["model"])]
    if "single_tower" not in set(rows["model"]) or not models:
        return ""
    paired = {m: quality.paired_difference(frame, dataset, m, "single_tower", experiments=(experiment,))
              for m in models}
    paired = {m: p for m, p in paired.items() if p["seeds"] >= 2}
    parts = [f"{m} {_difference(p)}" + (_gap_share(frame, dataset, m, (experiment,)) if m != "ranking" else "")
             for m, p in paired.items()]
    return (f"{dataset} {_TRAINED_AS.get(experiment, f'(`{experiment}` rows)')}, recall@100 against the single "
            "tower: " + "; ".join(parts) + ".") if parts else ""


def _change(was: dict | None, now: dict | None) -> str:
    """What ``now``'s settings change from ``was``'s (:func:`.quality.scorer_settings`): "with a=1
    c=3 (was 4) without b=2"; '' where either is not an untuned row's or nothing differs."""
    if was is None or now is None:
        return ""
    added = [f"{k}={v}" for k, v in sorted(now.items()) if k not in was]
    changed = [f"{k}={v} (was {was[k]})" for k, v in sorted(now.items()) if k in was and was[k] != v]
    dropped = [f"{k}={v}" for k, v in sorted(was.items()) if k not in now]
    return " ".join([*(["with", *added, *changed] if added or changed else []),
                     *(["without", *dropped] if dropped else [])])


def variant_line(frame: pd.DataFrame, dataset: str) -> str:
    """Models trained at the preset's settings with changes (``variant_*`` rows, the changes read
    from their scorer against the same model's ``preset_settings`` rows): recall@100 against that
    model at the preset's settings, both means and their difference over the seeds both ran, and
    the devices where they differ; '' without such rows. Rows of one preset only (ValueError
    otherwise)."""
    if "experiment" not in frame:
        return ""
    rows = frame[(frame["dataset"] == dataset) & (frame["metric"] == "recall@100")]
    scorer = results.text(rows, "scorer")
    parts = []
    for (experiment, model), g in rows[rows["experiment"].astype(str).str.startswith("variant_")].groupby(
            ["experiment", "model"], sort=False):
        p = quality.paired_experiments(frame, dataset, model, experiment, "preset_settings")
        if p["seeds"] < 2:  # also where the model has no preset_settings rows
            continue
        base = rows[(rows["model"] == model) & (rows["experiment"] == "preset_settings")]
        change = (_change(quality.scorer_settings(scorer[base.index[0]]), quality.scorer_settings(scorer[g.index[0]]))
                  or f"({experiment})")
        parts.append(f"{model} {change}: {p['a']:.4f} against {p['b']:.4f}, {_difference(p, g, base)}")
    return (f"{dataset}, changes to the preset's settings (`variant_*` rows), recall@100 against the same "
            "model at the preset's settings: " + "; ".join(parts) + ".") if parts else ""


def ceiling_line(frame: pd.DataFrame, dataset: str) -> str:
    """The true click model, the same model with each user's interests estimated from their
    training clicks and the best project model against both; '' without the two generator rows.
    Rows of one preset only (ValueError otherwise)."""
    recall = frame[(frame["dataset"] == dataset) & (frame["metric"] == "recall@100")]
    experiment = recall["experiment"] if "experiment" in recall else pd.Series("expert_count", index=recall.index)
    rec = recall[experiment == "expert_count"]
    others = [(recall[(experiment == e) & recall["model"].isin(quality.PROJECT_MODELS)], said)
              for e, said in _SAID.items()]
    quality.one_preset(pd.concat([rec, *(rows for rows, _ in others)]))
    mean = rec.assign(value=rec["value"].astype(float)).groupby("model")["value"].mean()
    if not set(quality.GENERATOR_MODELS) <= set(mean.index):
        return ""
    true, est = mean["true_model"], mean["true_model_estimated"]
    line = (f"{dataset}: the true click model reaches recall@100 {true:.4f}; with each user's interests estimated "
            f"from their training clicks (every other parameter of the world known) {est:.4f}, {est / true:.3f} of it")
    ours = mean[[m for m in quality.PROJECT_MODELS if m in mean.index]]
    if len(ours):
        line += (f". The best project model of the tables (`expert_count` rows: {ours.idxmax()}, {ours.max():.4f}) "
                 f"reaches {ours.max() / est:.3f} of the estimated and {ours.max() / true:.3f} of the true model")
    clauses = []
    for rows, said in others:
        best = rows.assign(value=rows["value"].astype(float)).groupby("model")["value"].mean()
        if len(best):
            clauses.append(f"{said} ({best.idxmax()}, {best.max():.4f}) {best.max() / est:.3f} and "
                           f"{best.max() / true:.3f}")
    if clauses:
        more = "; ".join(clauses)
        line += f"; {more}" if len(ours) else f". {more[0].upper()}{more[1:]}"
    return line + "."


def findings(frame: pd.DataFrame, tables, datasets, scoring_csv=None) -> str:
    """The notebook's conclusions as Markdown, every number computed from the rows (and the
    newest kernel rates of ``scoring_csv``, :func:`kernel_cost_line`)."""
    lines = [line for ds in datasets for line in verdict(tables, ds, frame)]
    lines += [line for ds in datasets if (line := ceiling_line(frame, ds))]
    tuned = tuning_line(frame)
    if tuned:
        lines.append(tuned)
    lines += [line for ds in datasets if (line := tuning_effect_line(frame, ds))]
    lines += [line for ds in datasets for e in TUNED_ON if (line := split_tuning_line(frame, ds, e))]
    lines += [line for ds in datasets for e in (*TUNED_ON, "preset_settings")
              if (line := against_single_tower_line(frame, ds, e))]
    lines += [line for ds in datasets if (line := variant_line(frame, ds))]
    cost = kernel_cost_line(frame, scoring_csv)
    if cost:
        lines.append(f"Per ad, {cost}.")
    return "\n".join(line if line.startswith("  ") else f"* {line}" for line in lines)
