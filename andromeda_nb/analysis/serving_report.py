"""The serving notebook's tables, figure and findings (``notebooks/08_serving.ipynb``): the two
topologies and the sharded pool served live on a local Dask cluster (any backend), the byte model
at the benchmark pool's size, and the GPU rows of ``data/results/serving.csv`` where committed
(``python -m andromeda_nb.bench serving``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import plots, results

#: the serving issue's targets (H200, 10^8-ad pool, 0.5-2 % eligible)
TARGET_BYTES_RATIO = 100
TARGET_COLOCATED_OVER_INPROCESS_S = 2e-3


def run_live(n_ads: int, k: int, calls: int, n_shards: int, seed: int = 0, workers: int = 2) -> pd.DataFrame:
    """Serve the same requests on a :func:`~andromeda_nb.serving.cluster.demo_world` pool in the
    caller's process, co-located, by remote scoring and sharded in ``n_shards``, on a local cluster
    of ``workers`` processes (TCP comms); a row per topology (:func:`~andromeda_nb.serving.measure.measure`)."""
    from distributed import Client, LocalCluster

    from ..datasets import synthetic
    from ..model import Request
    from ..pipeline import Pool
    from ..serving import cluster as C
    from ..serving.measure import measure

    table, index = C.demo_world(n_ads, seed)
    opts = dict(max_batch=1, max_k=k)
    reference = Pool(table, index, **opts)
    rng = np.random.default_rng(seed + 1)
    profiles = synthetic.generate_profiles(index.schema, 4, seed=seed + 2, max_values=synthetic.MAX_USER_VALUES)
    profiles[-1] = {}  # a broad request: only the unconstrained categories
    pairs = [(Request.random(64, 6, 2, rng), p) for p in profiles]
    rows = []
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc, direct_to_workers=True) as client:
        w = list(client.scheduler_info()["workers"])
        topologies = {
            "inprocess_retrieve": (reference, None, None),
            "colocated": (C.Colocated(client, C.demo_world, (n_ads, seed), worker=w[0], **opts), client, "colocated"),
            "remote_scoring": (C.RemoteScoring(client, C.demo_world, (n_ads, seed), cpu_worker=w[1 % len(w)],
                                               gpu_worker=w[0], **opts), client, "remote"),
            "sharded": (C.ShardedPool(client, C.demo_shard, n_shards, (n_ads, seed), workers=w, **opts), client, None),
        }
        for name, (topo, cl, model) in topologies.items():
            got = measure(cl, topo, pairs, k, calls, reference=reference, model=model)
            rows.append({"topology": name, "p50_ms": got.p50_s * 1e3, "p99_ms": got.p99_s * 1e3,
                         "requests_per_s": got.requests_per_s, "bytes_per_request": got.bytes_per_request,
                         "model_bytes_per_request": got.model_bytes_per_request if model else np.nan,
                         "mean_eligible": got.mean_eligible, "equal_to_in_process": got.ok})
    return pd.DataFrame(rows).set_index("topology")


def byte_model_table(n_ads: int = 10 ** 8, fractions=(0.005, 0.01, 0.02), k: int = 1000, E: int = 6,
                     d: int = 64) -> pd.DataFrame:
    """The byte model per request at the benchmark pool's size: co-located, remote scoring, and
    their ratio, against the eligible fraction."""
    from ..model import Request
    from ..serving.cluster import byte_model

    req = Request.random(d, E, 2, np.random.default_rng(0))
    rows = []
    for f in fractions:
        n_elig = int(f * n_ads)
        co, rs = byte_model("colocated", req, n_elig, k), byte_model("remote", req, n_elig, k)
        rows.append({"eligible_fraction": f, "eligible": n_elig, "colocated_bytes": co, "remote_bytes": rs,
                     "remote_over_colocated": rs / co})
    return pd.DataFrame(rows)


def bytes_figure(live: pd.DataFrame, model: pd.DataFrame, source: str):
    """Bytes per request by topology (counted on the live cluster, beside the byte model) and the
    model's remote / co-located ratio against the eligible fraction at 10^8 ads."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    shown = live.drop(index="inprocess_retrieve", errors="ignore")
    x = np.arange(len(shown))
    a.bar(x - 0.2, shown["bytes_per_request"], 0.4, label="counted on every comm")
    a.bar(x + 0.2, shown["model_bytes_per_request"].fillna(0), 0.4, label="byte model (payload)")
    a.set_xticks(x, shown.index)
    a.set_ylabel("bytes per request")
    a.set_title(f"live cluster: {live['mean_eligible'].mean():,.0f} eligible ads a request on average")
    a.legend()
    b.plot(model["eligible_fraction"] * 100, model["remote_over_colocated"], marker="o")
    b.axhline(TARGET_BYTES_RATIO, ls="--", c="grey", label=f"the source's ~{TARGET_BYTES_RATIO}x")
    b.set_xlabel("eligible ads (% of 10^8)")
    b.set_ylabel("remote / co-located bytes (model)")
    b.set_yscale("log")
    b.legend()
    plots.source_note(fig, source)
    fig.tight_layout()
    return fig


def findings(live: pd.DataFrame, model: pd.DataFrame, gpu_rows: pd.DataFrame | None) -> str:
    """What the live run and the byte model show, and the GPU rows where committed."""
    co, rs = live.loc["colocated"], live.loc["remote_scoring"]
    lines = [f"- Live cluster ({int(rs['mean_eligible']):,} eligible ads a request on average): remote scoring "
             f"moved {rs['bytes_per_request']:,.0f} bytes a request on the wire, co-location "
             f"{co['bytes_per_request']:,.0f} ({rs['bytes_per_request'] / co['bytes_per_request']:.1f}x); at this "
             "size Dask's own messages are most of both.",
             "- Every topology, the sharded pool included, answered every request as the in-process Pool did: "
             + ("yes." if bool(live["equal_to_in_process"].all()) else "**no**."),
             "- Byte model at 10^8 ads: remote scoring moves "
             + ", ".join(f"{r.remote_over_colocated:,.0f}x co-location's bytes at {r.eligible_fraction:.1%} eligible"
                         for r in model.itertuples())
             + f" (the source reports about {TARGET_BYTES_RATIO}x)."]
    table = gpu_table(gpu_rows)
    if table.empty:
        lines.append("- No GPU rows are committed yet (`python -m andromeda_nb.bench serving` on a GPU host writes "
                     "`data/results/serving.csv`): the targets (>= 100x fewer bytes co-located, co-located latency "
                     "within 2 ms of the in-process Pool's at 10^8 ads) are not measured.")
        return "\n".join(lines)
    for n_ads, part in table.groupby("n_ads", sort=True):
        part = part.set_index("variant")
        commits = dict.fromkeys(part["commit"])
        where = f"{part['device'].iloc[0]}, " + (
            f"commit {next(iter(commits))}" if len(commits) == 1 else
            "commits " + ", ".join(f"{c} ({', '.join(dict.fromkeys(part.index[part['commit'] == c]))})" for c in commits)
        ) + f", {int(n_ads):,} ads"
        if not {"inprocess_retrieve", "colocated"} <= set(part.index):
            lines.append(f"- GPU rows ({where}): only " + ", ".join(part.index) + " measured; the targets at this "
                         "size are not.")
            continue
        ip, co = part.loc["inprocess_retrieve"], part.loc["colocated"]
        extra = co["p50_ms"] - ip["p50_ms"]
        text = (f"- GPU rows ({where}): co-located through Dask {co['p50_ms']:.2f} ms p50 against the in-process "
                f"Pool's {ip['p50_ms']:.2f} ms: {extra:+.2f} ms (target within {TARGET_COLOCATED_OVER_INPROCESS_S * 1e3:.0f} "
                f"ms: {'met' if extra <= TARGET_COLOCATED_OVER_INPROCESS_S * 1e3 else 'missed'})")
        if "remote_scoring" in part.index:
            rs = part.loc["remote_scoring"]
            ratio = rs["bytes_per_request"] / co["bytes_per_request"]
            text += (f"; remote scoring {rs['p50_ms']:.1f} ms and {ratio:.1f}x co-location's bytes on the wire "
                     f"(the byte model: {rs['model_bytes'] / co['model_bytes']:.1f}x; target >= {TARGET_BYTES_RATIO}x)")
        lines.append(text + ".")
        shards = part.loc[["sharded"]].sort_values("n_workers") if "sharded" in part.index else None
        if shards is not None and len(shards):
            walls = ", ".join(f"{int(r.n_workers)} shard{'s' if r.n_workers > 1 else ''} {r.p50_ms:.2f} ms"
                              for r in shards.itertuples())
            # the co-located call of the sharded rows' own run (runs differ by tenths of a ms)
            same = gpu_table(gpu_rows[gpu_rows["commit"].astype(str).str[:7] == shards["commit"].iloc[0]])
            same = same[(same["variant"] == "colocated") & (same["n_ads"] == n_ads)]
            text = (f"- Sharded ({part['device'].iloc[0]}, commit {shards['commit'].iloc[0]}, {int(n_ads):,} ads; "
                    f"every answer exact, merged on the caller; the shards share one GPU): p50 {walls}")
            if len(same):
                text += (f": one shard {shards['p50_ms'].iloc[0] - same['p50_ms'].iloc[0]:+.2f} ms over the co-located "
                         f"call of the same run ({same['p50_ms'].iloc[0]:.2f} ms; the fan-out and the merge)")
            if len(shards) > 1:
                a, b = shards.iloc[0], shards.iloc[-1]
                text += (f", {(b['p50_ms'] - a['p50_ms']) / (b['n_workers'] - a['n_workers']):+.2f} ms for each shard "
                         "past the first")
            lines.append(text + ".")
    for n_ads, part in eligible_table(gpu_rows).groupby("n_ads", sort=True):
        if not {"colocated_p50_ms", "remote_over_colocated"} <= set(part.columns):
            continue
        points = "; ".join(
            f"{r.eligible_fraction:.2%} eligible: co-located {r.colocated_p50_ms:.2f} ms"
            + (f" ({r.colocated_p50_ms - r.inprocess_retrieve_p50_ms:+.2f} ms over in-process)"
               if "inprocess_retrieve_p50_ms" in part.columns and pd.notna(r.inprocess_retrieve_p50_ms) else "")
            + (f", remote scoring {r.remote_over_colocated:,.0f}x its bytes (model {r.model_remote_over_colocated:,.0f}x)"
               if pd.notna(r.remote_over_colocated) else ", no remote-scoring row at this fraction")
            for r in part.itertuples())
        lines.append(f"- Against the eligible fraction ({int(n_ads):,} ads): {points}.")
    if table["n_ads"].max() < 1e8 or "colocated" not in set(table.loc[table["n_ads"] >= 1e8, "variant"]):
        lines.append("- The targets are stated at 10^8 ads, where no co-located GPU row is committed: not measured.")
    return "\n".join(lines)


def gpu_table(rows: pd.DataFrame | None) -> pd.DataFrame:
    """The topologies' GPU rows on the benchmark world's own requests (~1 % eligible), the newest
    verified of each (variant, pool size, workers): wall p50 / p99 (ms), requests a second, bytes a
    request on the wire and the byte model's count."""
    if rows is not None and not rows.empty:
        rows = rows[~_picked(rows)]
    return _table(rows)


def _picked(rows: pd.DataFrame) -> pd.Series:
    """The rows of requests picked for an eligible fraction (the bench's eligible phase)."""
    return rows["notes"].astype(str).str.contains("requests picked for")


def eligible_table(rows: pd.DataFrame | None) -> pd.DataFrame:
    """The topologies against the eligible fraction (the bench's eligible phase, requests picked
    for 0.5 % and 2 %, and the world's own ~1 %): per pool size and measured fraction, the newest
    verified row of each topology, and remote scoring's bytes over co-location's, counted and modelled."""
    empty = pd.DataFrame(columns=["n_ads", "eligible_fraction"])
    if rows is None or rows.empty or "eligible_fraction" not in rows or not _picked(rows).any():
        return empty
    ok = rows[rows["ok"] & rows["variant"].isin(["inprocess_retrieve", "colocated", "remote_scoring"])].copy()
    ok["picked"] = _picked(ok)
    ok = results.in_time_order(ok).groupby(["variant", "n_ads", "picked", "eligible_fraction"], as_index=False).last()
    picked = ok[ok["picked"]]
    if picked.empty:
        return empty
    # the world's own requests' rows of the same run and pool size, for the ~1 % point between them
    runs = set(zip(picked["commit"], picked["n_ads"]))
    own = ok[~ok["picked"] & pd.Series([x in runs for x in zip(ok["commit"], ok["n_ads"])], index=ok.index)]
    t = _table(pd.concat([picked, own]), newest=False)
    t["eligible_fraction"] = pd.to_numeric(pd.concat([picked, own])["eligible_fraction"], errors="coerce").to_numpy()
    wide = t.pivot_table(index=["n_ads", "eligible_fraction"], columns="variant",
                         values=["p50_ms", "bytes_per_request", "model_bytes"], aggfunc="first")
    out = pd.DataFrame(index=wide.index)
    for v in ("inprocess_retrieve", "colocated", "remote_scoring"):
        if ("p50_ms", v) in wide:
            out[f"{v}_p50_ms"] = wide[("p50_ms", v)]
    if ("bytes_per_request", "remote_scoring") in wide and ("bytes_per_request", "colocated") in wide:
        out["remote_over_colocated"] = wide[("bytes_per_request", "remote_scoring")] / wide[("bytes_per_request", "colocated")]
        out["model_remote_over_colocated"] = wide[("model_bytes", "remote_scoring")] / wide[("model_bytes", "colocated")]
    return out.reset_index()


def _table(rows: pd.DataFrame | None, newest: bool = True) -> pd.DataFrame:
    cols = ["variant", "n_ads", "n_workers", "p50_ms", "p99_ms", "requests_per_s", "bytes_per_request", "model_bytes",
            "device", "commit"]
    if rows is None or rows.empty:
        return pd.DataFrame(columns=cols)
    ok = rows[rows["ok"] & rows["variant"].isin(["inprocess_retrieve", "colocated", "remote_scoring", "sharded"])]
    if newest:
        ok = results.in_time_order(ok).groupby(["variant", "n_ads", "n_workers"], as_index=False).last()
    num = {c: pd.to_numeric(ok[c], errors="coerce") for c in ("seconds_median", "seconds_p99", "requests_per_s",
                                                               "transport_bytes_per_request", "n_workers")}
    model = ok["notes"].str.extract(r"byte model ([\d,]+) bytes")[0].str.replace(",", "").astype(float)
    out = pd.DataFrame({"variant": ok["variant"], "n_ads": ok["n_ads"], "n_workers": num["n_workers"].astype(int),
                        "p50_ms": num["seconds_median"] * 1e3, "p99_ms": num["seconds_p99"] * 1e3,
                        "requests_per_s": num["requests_per_s"], "bytes_per_request": num["transport_bytes_per_request"],
                        "model_bytes": model, "device": ok["device"], "commit": ok["commit"].astype(str).str[:7]})
    if not newest:
        return out.reset_index(drop=True)
    order = {"inprocess_retrieve": 0, "colocated": 1, "remote_scoring": 2, "sharded": 3}
    return out.sort_values(["n_ads", "variant", "n_workers"], key=lambda c: c.map(order) if c.name == "variant" else c
                           ).reset_index(drop=True)


def gpu_rows(results_dir="data/results") -> pd.DataFrame | None:
    """The committed GPU rows of the serving bench, or None where no run has written them."""
    try:
        return results.measurements("serving", results_dir).rows
    except FileNotFoundError:
        return None


def headline_metrics(live: pd.DataFrame, model: pd.DataFrame) -> dict:
    co, rs = live.loc["colocated"], live.loc["remote_scoring"]
    return {"all_equal_to_in_process": bool(live["equal_to_in_process"].all()),
            "colocated_bytes_per_request": float(co["bytes_per_request"]),
            "remote_bytes_per_request": float(rs["bytes_per_request"]),
            "model_ratio_1e8_1pct": float(model.set_index("eligible_fraction").loc[0.01, "remote_over_colocated"])}


def scaling_table(rows: pd.DataFrame | None) -> pd.DataFrame:
    """The sharded pool against its GPU count (the serving bench's scaling rows, newest run): per
    scaling mode and GPU count, requests a second at batches of 32, single-request p50, and pool ads
    considered a second per GPU relative to one GPU's (the weak-scaling target: >= 0.9)."""
    cols = ["scaling", "n_gpus", "n_ads", "batch_requests_per_s", "one_p50_ms", "ads_per_s_per_gpu",
            "relative_to_one_gpu", "commit"]
    if rows is None or rows.empty or "n_gpus" not in rows:
        return pd.DataFrame(columns=cols)
    r = rows[(rows["variant"] == "sharded") & rows["ok"] & rows["notes"].astype(str).str.contains("scaling")]
    if r.empty:
        return pd.DataFrame(columns=cols)
    r = r[r["commit"] == results.newest_commit(r)]
    out = []
    for (mode, g), grp in r.groupby([r["notes"].str.split(" ").str[0], "n_gpus"]):
        by = grp.set_index(grp["batch"].astype(int))
        n = float(grp["n_ads"].iloc[0])
        rps = float(by.loc[max(by.index), "requests_per_s"]) if len(by) else np.nan
        out.append({"scaling": mode, "n_gpus": int(g), "n_ads": int(n), "batch_requests_per_s": rps,
                    "one_p50_ms": float(by.loc[1, "seconds_median"]) * 1e3 if 1 in by.index else np.nan,
                    "ads_per_s_per_gpu": rps * n / int(g), "commit": grp["commit"].iloc[0]})
    t = pd.DataFrame(out)
    base = t[t["n_gpus"] == 1].set_index("scaling")["ads_per_s_per_gpu"]
    t["relative_to_one_gpu"] = t["ads_per_s_per_gpu"] / t["scaling"].map(base)
    return t[cols].sort_values(["scaling", "n_gpus"]).reset_index(drop=True)


def scaling_figure(table: pd.DataFrame, source: str):
    """Weak scaling (pool ads a second per GPU, relative to one GPU) and strong scaling
    (single-request latency) against the GPU count; a note where no rows are committed."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    weak, strong = table[table["scaling"] == "weak"], table[table["scaling"] == "strong"]
    a.plot(weak["n_gpus"], weak["relative_to_one_gpu"], marker="o")
    a.axhline(0.9, ls="--", c="grey", label="target 0.9")
    a.set_xlabel("GPUs (10^8 ads each)")
    a.set_ylabel("pool ads a second per GPU / one GPU's")
    a.set_title("weak scaling, batches of 32")
    a.legend()
    b.plot(strong["n_gpus"], strong["one_p50_ms"], marker="o")
    b.set_xlabel("GPUs (10^8 ads in all)")
    b.set_ylabel("one request, p50 (ms)")
    b.set_title("strong scaling")
    if table.empty:
        for ax in (a, b):
            ax.text(0.5, 0.5, "no multi-GPU rows committed yet", ha="center", va="center", transform=ax.transAxes)
    plots.source_note(fig, source)
    fig.tight_layout()
    return fig
