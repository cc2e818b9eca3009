"""The targeting suite's world (docs/design.md's benchmark world, :mod:`.targeting`) and the host-only
helpers of notebook 04: :class:`World` (rules, host and device index, profiles, an oracle sample),
:func:`check_results` (a request's bitset against the CPU baseline and the rule oracle),
:class:`UpdateStream` (random valid update batches), :func:`rows_equal` (device index = host copy),
:func:`memory_rows` (the index memory, ``targeting_memory.csv``); :func:`byte_model`,
:func:`check_small_world` and :func:`load_results` for the notebook."""

from __future__ import annotations

import gc
import platform
import time

import numpy as np

from . import harness
from ..device import launch
from .. import reference
from ..datasets import synthetic as syn
from ..targeting import RETIRE, CREATE, CHANGE, TargetingIndex, TargetingRules, UpdateBatch, make_profile

PROFILES = 8  # requests launched back to back per timed call
SAMPLE = 2048  # slots checked against the oracle per request
_clock = {"t0": time.time()}


def restart_clock() -> None:
    """The log's time origin: the start of a suite run."""
    _clock["t0"] = time.time()


def elapsed() -> float:
    return time.time() - _clock["t0"]


def log(msg: str) -> None:
    print(f"[targeting {elapsed():6.1f}s] {msg}", flush=True)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def layout_name(index: TargetingIndex) -> str:
    L = index.layout
    n_split = sum(1 for c in range(len(index.schema)) if index.cat_group[c] < 0)
    return (f"folded groups<={L.group_max} rows ({len(L.groups)} groups); {n_split} split: include rows for "
            f">={L.dense_min} ads, exclude rows for >={min(L.exclude_dense_min, 1 << 40)} ads, lists")


# ----------------------------------------------------------------------------- worlds


class World:
    """A generated world: rules, host index, device index (``host_bits``: as
    :class:`~andromeda_nb.match.DeviceTargetingIndex`), profiles, oracle sample."""

    def __init__(self, n: int, seed: int = 0, spare: int = 0, constrain_prob=0.3, exclude_prob=0.05,
                 index_kw=None, profiles: int = PROFILES, max_values: int = syn.MAX_USER_VALUES,
                 rules: TargetingRules | None = None, host_bits=True):
        from ..match.api import DeviceTargetingIndex

        t = time.time()
        self.schema = syn.benchmark_schema()
        self.rules = rules if rules is not None else syn.generate_rules(
            self.schema, n, constrain_prob=constrain_prob, exclude_prob=exclude_prob, seed=seed)
        t_gen = time.time() - t
        t = time.time()
        self.index = TargetingIndex(self.rules, n + spare, **(index_kw or {}))
        t_build = time.time() - t
        t = time.time()
        # host_bits=True (the benches' reference world): the host rows stay for the CPU checks
        self.dev = DeviceTargetingIndex(self.index, host_bits=host_bits)
        launch.cuda().synchronize()
        t_up = time.time() - t
        self.n = n
        self.profiles = syn.generate_profiles(self.schema, profiles, seed=seed + 101, max_values=max_values)
        rng = np.random.default_rng(seed + 7)
        self.sample = np.sort(rng.choice(n, min(SAMPLE, n), replace=False))
        log(f"world n={n:,} constrain={constrain_prob}: generated {t_gen:.1f}s, index {t_build:.1f}s "
            f"({self.index.n_rows} rows, {self.index.nbytes / 1e9:.1f} GB), uploaded {t_up:.1f}s")

    def free(self):
        self.dev = None
        self.index = None
        gc.collect()
        try:
            launch.cuda().current_context().deallocations.clear()
        except Exception:
            pass


# ----------------------------------------------------------------------------- checks


def sample_bits(words: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Bits of some slots of a host bitset, without unpacking it."""
    return ((words[slots >> 6] >> (slots & 63).astype(np.uint64)) & np.uint64(1)).astype(bool)


def check_results(world: World, prepared, words_dev, counts_dev, n_words=None) -> tuple[bool, str, list]:
    """Each request of a prepared batch: the GPU words equal the CPU baseline's (full bitset), the
    count equals, and the oracle agrees on the sample slots (those inside the matched span).
    Returns (ok, message, counts)."""
    idx = world.index
    nw = idx.n_words if n_words is None else n_words
    n_bits = min(idx.n_ads, nw * 64)
    words = words_dev.copy_to_host()
    counts = counts_dev.copy_to_host()
    sample = world.sample[world.sample < n_bits]
    sample_rules = idx.rules_of_slots(sample)
    for b in range(prepared.batch):
        prof = prepared.profiles[b]
        cpu_words, cpu_count = idx.match_cpu(prof, n_words=nw)
        if not np.array_equal(words[b, :nw], cpu_words):
            bad = int(np.flatnonzero(words[b, :nw] != cpu_words)[0])
            return False, f"request {b}: GPU bitset differs from the CPU baseline at word {bad}", []
        pop = int(np.bitwise_count(words[b, :nw]).sum())
        if int(counts[b]) != cpu_count or pop != cpu_count:
            return False, f"request {b}: count {int(counts[b])} (bits set {pop}) != CPU {cpu_count}", []
        got = sample_bits(words[b, :nw], sample)
        want = reference.match(sample_rules, make_profile(idx.schema, prof))
        if not np.array_equal(got, want):
            return False, f"request {b}: oracle disagrees on {int((got != want).sum())} of {sample.size} sampled ads", []
    return True, (f"ok: {prepared.batch} requests = CPU baseline (full bitset, count) and oracle "
                  f"({sample.size} ads)"), counts[:prepared.batch].tolist()




# ----------------------------------------------------------------------------- updates


def batch_from_templates(schema, templates: TargetingRules, tmpl_idx, ops, ids, live) -> UpdateBatch:
    """An UpdateBatch whose create / change ops take the rules of template ads (retires: none)."""
    k = ops.size
    sub = templates.subset(tmpl_idx)
    keep = ops != RETIRE

    def strip(csr):
        out = {}
        for name, (ptr, vals) in csr.items():
            sizes = np.diff(ptr) * keep
            new_ptr = np.zeros(k + 1, np.int64)
            np.cumsum(sizes, out=new_ptr[1:])
            mask = np.repeat(keep, np.diff(ptr))
            out[name] = (new_ptr, vals[mask])
        return out

    return UpdateBatch.from_columns(schema, ops, ids, live & keep, strip(sub.include), strip(sub.exclude))


class UpdateStream:
    """Random valid update batches (1/3 creates of new ids, 1/3 changes, 1/3 retires of live ids)."""

    def __init__(self, world: World, seed: int = 11, n_templates: int = 100_000, max_creates: int = 1 << 20):
        self.world = world
        self.rng = np.random.default_rng(seed)
        self.templates = syn.generate_rules(world.schema, n_templates, seed=seed + 1000)
        ids = world.rules.ad_ids
        self.alive = np.empty(ids.size + max_creates, np.int64)  # live ids in [0, n_alive), swap-remove
        self.alive[:ids.size] = ids
        self.n_alive = ids.size
        self.next_id = int(ids.max()) + 1 if ids.size else 0

    def batch(self, size: int = 1000) -> UpdateBatch:
        rng = self.rng
        n_new = size // 3
        n_old = size - n_new
        pick = rng.choice(self.n_alive, n_old, replace=False)
        old_ids = self.alive[pick]
        n_ret = n_old // 2
        ops = np.concatenate([np.full(n_new, CREATE), np.full(n_old - n_ret, CHANGE), np.full(n_ret, RETIRE)])
        new_ids = np.arange(self.next_id, self.next_id + n_new)
        ids = np.concatenate([new_ids, old_ids])
        order = rng.permutation(size)
        ops, ids = ops[order].astype(np.int8), ids[order].astype(np.int64)
        live = rng.random(size) < 0.99
        tmpl = rng.integers(0, self.templates.n_ads, size)
        batch = batch_from_templates(self.world.schema, self.templates, tmpl, ops, ids, live)
        for i in sorted(pick[n_old - n_ret:].tolist(), reverse=True):  # retired ids leave
            self.n_alive -= 1
            self.alive[i] = self.alive[self.n_alive]
        self.alive[self.n_alive:self.n_alive + n_new] = new_ids  # created ids join
        self.n_alive += n_new
        self.next_id += n_new
        return batch




def rows_equal(world: World, words: np.ndarray, n_full: int = 16) -> bool:
    """Device rows equal the host copy on the given words of every row and on a few whole rows;
    the device list pool equals the host's on every live list segment."""
    idx = world.index
    words = words[words < idx.n_words]
    try:
        import cupy as cp

        dev_rows = cp.asarray(world.dev.rows)
        got = dev_rows[:, cp.asarray(words)].get()
        full = [(int(r), dev_rows[int(r)].get()) for r in
                np.random.default_rng(3).choice(idx.n_rows, min(n_full, idx.n_rows), replace=False)]
        pool = cp.asarray(world.dev.pool)[: idx.pool.size].get()
    except ImportError:  # the simulator (tests): small pools, copy everything
        host_rows = world.dev.rows.copy_to_host()
        got = host_rows[:, words]
        full = [(r, host_rows[r]) for r in range(idx.n_rows)]
        pool = world.dev.pool.copy_to_host()[: idx.pool.size]
    if not np.array_equal(got, idx.bitsets[:, words]):
        return False
    if not all(np.array_equal(row, idx.bitsets[r]) for r, row in full):
        return False
    mine, theirs = idx.list_sets(), idx._list_sets_of(pool)
    return mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)




# ----------------------------------------------------------------------------- index memory


def memory_rows(env, world: World, label: str, n_at: int) -> list[dict]:
    """Index memory per storage unit (a folded group or a split category) at ``n_at`` ads, as
    rows of the results schema (``variant`` = memory_<layout>_<unit>; timing columns empty)."""
    out = []
    for u in world.index.memory_by_category(n_at):
        r = {c: "" for c in harness.SCHEMA + harness.EXTRA}
        r.update(env, suite="targeting", variant=f"memory_{label}_{u['unit']}", n_ads=n_at,
                 verified="n/a (memory accounting of the host index)", layout=label, pool_ads=n_at)
        r.update(u)  # unit, categories, rows, storage, bytes, ...
        out.append(r)
    return out


def write_memory(rows: list[dict], out_dir: str) -> None:
    import csv
    from pathlib import Path

    if not rows:
        return
    path = Path(out_dir) / "targeting_memory.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys([*harness.SCHEMA, *harness.EXTRA, *(k for r in rows for k in r)]))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    log(f"wrote {len(rows)} rows to {path}")


# ----------------------------------------------------------------------------- notebook helpers
#: Layout variants of the byte model (name -> TargetingIndex keyword arguments; None: default).
MODEL_LAYOUTS = {
    "default (groups <= 512 rows)": {},
    "one folded row per category": {"group_max": 1},
    "groups <= 1024 rows": {"group_max": 1024},
    "high-cardinality: lists only": "high_lists",
    "dense exclude rows (>= n/1024)": "dense_excl",
}


def layout_kwargs(name: str, n: int, schema) -> dict:
    kw = MODEL_LAYOUTS[name]
    high = [c.name for c in schema if c.cardinality >= 10_000]
    if kw == "high_lists":
        return {"dense_min": {h: 1 << 60 for h in high}, "exclude_dense_min": {h: 1 << 60 for h in high}}
    if kw == "dense_excl":
        return {"exclude_dense_min": max(64, n // 1024)}
    return dict(kw)


def byte_model(n_ads: int, n_profiles: int = 20, seed: int = 0, layouts=None, scale_to: int = 10**8):
    """Count first: bytes per ad of each layout on an ``n_ads`` copy of the benchmark world
    (host only, :func:`andromeda_nb.match.read_model`), and the index memory scaled to
    ``scale_to`` ads. Returns ``(per-layout DataFrame, per-unit memory DataFrame)``."""
    import pandas as pd

    from ..match import read_model

    schema = syn.benchmark_schema()
    rules = syn.generate_rules(schema, n_ads, seed=seed)
    profiles = syn.generate_profiles(schema, n_profiles, seed=seed + 101)
    rows, mem = [], []
    for name in (layouts or MODEL_LAYOUTS):
        index = TargetingIndex(rules, **layout_kwargs(name, n_ads, schema))
        models = [read_model(index, index.plan(make_profile(schema, p))) for p in profiles]
        units = index.memory_by_category(scale_to)
        rows.append({"layout": name, "rows": index.n_rows,
                     "row_bits_per_ad": float(np.mean([m["bits_per_ad"] for m in models])),
                     "bytes_per_ad": float(np.mean([m["bytes_per_ad"] for m in models])),
                     "rows_read": float(np.mean([m["rows_read"] for m in models])),
                     "memory_GB_at_scale": sum(u["bytes"] for u in units) / 1e9,
                     "eligible_fraction": float(np.mean([index.match_cpu(p)[1] for p in profiles]) / n_ads)})
        mem += [{"layout": name, **u} for u in units]
    return pd.DataFrame(rows), pd.DataFrame(mem)


def check_small_world(n_ads: int, n_profiles: int = 4, n_batches: int = 3, batch_size: int = 50, seed: int = 0):
    """Correctness on whatever backend is active: a benchmark-schema world of ``n_ads`` ads; every
    profile through ``match_eligible`` and ``match_batch`` against the oracle; then update batches
    (creates, changes, retires) through the default device copy (the device works out the bits),
    after each: the device's rows and lists and the host's rules = a rebuild from the rule map, and
    a request against the oracle on the current rules. Returns a DataFrame, one row per check."""
    import pandas as pd

    from ..match.api import DeviceTargetingIndex, match_batch, match_eligible

    schema = syn.benchmark_schema()
    rules = syn.generate_rules(schema, n_ads, seed=seed, constrain_prob=0.3)
    host = TargetingIndex(rules, capacity=n_ads + 4 * batch_size, dense_min=max(2, n_ads // 200))
    dev = DeviceTargetingIndex(host)
    profiles = syn.generate_profiles(schema, n_profiles, seed=seed + 1)
    out = []
    batch = match_batch(dev, profiles)
    current = host.current_rules()  # the pool's slots, the spare ones free (never eligible)
    for b, p in enumerate(profiles):
        want = reference.match(current, make_profile(schema, p))
        got = match_eligible(dev, p)
        out.append({"check": f"request {b}", "eligible": int(want.sum()),
                    "ok": bool(np.array_equal(got.to_mask(), want) and got.count == want.sum()
                               and np.array_equal(batch[b].to_mask(), want))})
    world = type("W", (), {})()
    world.schema, world.rules, world.dev, world.index = schema, rules, dev, host
    stream = UpdateStream(world, seed=seed + 5, n_templates=500)
    for k in range(n_batches):
        delta = dev.apply(stream.batch(batch_size))
        try:
            ref = host.rebuild()
            if host.host_bits:  # (the default device copy drops them at the first update)
                host.assert_same(ref)
            rows, pool = dev.snapshot()
            host.assert_same(ref, bitsets=rows, pool=pool)
            same = True
        except AssertionError:
            same = False
        p = profiles[k % len(profiles)]
        want = reference.match(host.current_rules(), make_profile(schema, p))
        ok = bool(np.array_equal(match_eligible(dev, p).to_mask(), want))
        flips = "bits worked out on the device" if delta.rules is not None else f"{delta.bits_changed} bits flipped"
        out.append({"check": f"update batch {k} ({batch_size} ops, {flips})",
                    "eligible": int(want.sum()), "ok": same and ok})
    return pd.DataFrame(out)


def load_results(path="data/results/targeting.csv"):
    """The committed targeting results (None when missing), with the ``key=value`` pairs of the
    ``notes`` column (``bits_per_ad``, ...) as numeric columns."""
    import pandas as pd
    from pathlib import Path

    from ..analysis.results import text

    if not Path(path).exists():
        return None
    df = pd.read_csv(path)
    parsed = text(df, "notes").str.findall(r"(\w+)=([-0-9.eE+]+)")
    for key in ("bits_per_ad", "rows_per_request", "patches_per_request", "list_bytes_per_ad"):
        df[key] = [float(dict(p).get(key, "nan")) for p in parsed]
    return df
