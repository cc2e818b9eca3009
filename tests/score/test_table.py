"""The device ad table and the eligible bitsets the scoring calls take: layouts, the slot -> ad id
map, padding bits of device bitsets."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb import reference
from andromeda_nb.device import launch
from andromeda_nb.score.table import DeviceAdTable, DeviceRequest, check_slot_ids, resolve_layout
from andromeda_nb.targeting import bits_from_mask

from ..helpers import filter_path_only, small_seed_config


def test_auto_layout_is_the_scan_layout_and_bad_layouts_are_refused(rng):
    table = anb.AdTable.from_float(rng.standard_normal((40, 16)), dtype="fp16")
    assert DeviceAdTable(table).layout == resolve_layout("auto") == "tiles"
    assert DeviceAdTable(table, "rows").layout == "rows"
    with pytest.raises(ValueError, match="layout"):
        DeviceAdTable(table, "columns")


def test_slot_ids_free_slots_and_duplicates():
    assert check_slot_ids(np.array([5, -1, 3, -1], np.int64)) == 2
    with pytest.raises(ValueError, match="unique"):
        check_slot_ids(np.array([5, -1, 5], np.int64))
    with pytest.raises(ValueError, match="non-negative"):
        check_slot_ids(np.array([5, -2, 3], np.int64))


def test_from_device_checks_ad_ids_once(rng):
    n, d = 32, 16
    emb = launch.to_device(rng.standard_normal((n, d)).astype(np.float16))
    bias = launch.to_device(np.zeros(n, np.float32))
    ids = np.arange(n, dtype=np.int64)
    ids[7] = ids[3]
    with pytest.raises(ValueError, match="unique"):
        DeviceAdTable.from_device(emb, bias, "fp16", ad_ids=launch.to_device(ids))
    ids[7], ids[9] = -1, -1
    dt = DeviceAdTable.from_device(emb, bias, "fp16", ad_ids=launch.to_device(ids))
    assert dt.n_free == 2 and np.array_equal(dt.host_ad_ids, ids)


@pytest.mark.parametrize("layout", ["rows", "tiles"])
@pytest.mark.parametrize("path", ["auto", "block"])
def test_device_bitset_padding_bits_are_not_positions(rng, layout, path, monkeypatch):
    """A caller's device bitset may have bits set past n in its last word: they name no ad, and
    the answer is that of the bitset with them cleared (the kernels read no row past the table);
    "auto" takes the filter path (a seed from 256 items), "block" the block top-K."""
    n = 292  # the last word holds 36 positions and 28 padding bits
    table = anb.AdTable.from_float(rng.standard_normal((n, 16)), rng.standard_normal(n), dtype="fp16",
                                   ad_ids=rng.choice(10 * n, n, replace=False))
    req = anb.Request.random(16, 3, 2, rng)
    mask = rng.random(n) < 0.5
    bits = bits_from_mask(mask)
    bits[-1] |= np.uint64(0xFFFFFFF) << np.uint64(36)
    dt = DeviceAdTable(table, layout)
    if path == "auto":
        filter_path_only(monkeypatch)
    got = anb.score_topk(req, dt, 7, eligible=launch.to_device(bits), path=path,
                         topk_config=small_seed_config() if path == "auto" else None)
    scores = anb.score_ads(req, dt).copy_to_host()
    want = reference.topk(scores, 7, ids=table.ad_ids, eligible=mask)
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores)
    assert got.count == want.count == mask.sum()
    masked = anb.score_ads(req, dt, eligible=launch.to_device(bits)).copy_to_host()
    assert np.array_equal(np.isnan(masked), ~mask) and np.array_equal(masked[mask], scores[mask])


@pytest.mark.parametrize("access, weights", [("pool", "auto"), ("bitset", "auto"), ("candidates", "shared")])
def test_repeated_calls_replay_the_recorded_launches(rng, access, weights):
    """score_topk's seeded filter path records its launches on a table's first call and replays them
    bound on the next: each call's own request, eligible set and candidates answer (the replay
    points those arguments at the call's, never the recording's)."""
    from andromeda_nb.topk import TopKConfig, TopKTuning

    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))  # from 256 items
    n = 3000
    table = anb.AdTable.from_float(rng.standard_normal((n, 8)), rng.standard_normal(n), dtype="fp16",
                                   ad_ids=rng.choice(10 * n, n, replace=False))
    dt = DeviceAdTable(table, "rows")
    config = anb.KernelConfig(weights=weights)
    for call in range(3):  # recorded, then replayed twice (the staged weights' buffers reused)
        req = anb.Request.random(8, 2, 1, rng)
        kwargs, eligible, ids = {}, None, table.ad_ids
        scores = anb.score_ads(req, dt).copy_to_host()
        if access == "bitset":
            eligible = rng.random(n) < 0.5
            kwargs["eligible"] = launch.to_device(bits_from_mask(eligible))
        elif access == "candidates":
            cand = rng.choice(n, 2500, replace=False).astype(np.int32)
            kwargs["candidates"] = launch.to_device(cand)
            ids, scores = table.ad_ids[cand], scores[cand]
        got = anb.score_topk(req, dt, 9, config=config, topk_config=seeded, **kwargs)
        want = reference.topk(scores, 9, ids=ids, eligible=eligible)
        assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores), call
        assert got.count == want.count
    filters = [v for key, v in dt._workspaces.items() if key[0] == "filter"]
    assert len(filters) == 1 and len(filters[0].replays) == 1  # recorded once, then replayed


@pytest.mark.parametrize("options", [{}, {"math": "fp32", "weights": "shared"}, {"math": "fp32", "weights": "param"}])
def test_whole_pool_replays_run_as_one_graph(rng, monkeypatch, options):
    """From the second call on, score_topk over the whole pool with staged weights runs its replayed
    launches and the answer's copies as one CUDA graph, captured once: nothing in it may change by
    call but the staged weights' contents, so replaying the captured steps as they were answers each
    call's own request. The simulator captures no graph: a stand-in there reruns the steps with
    the arguments they had when captured. Bitset calls, a request whose weights already live on
    the device (the launches pointed at them, not at the staged buffer) and parameter weights (a
    launch's own values, by call) replay launch by launch, and the graph answers after them."""
    from andromeda_nb.topk import TopKConfig, TopKTuning

    captured = []
    if launch.backend.is_simulator():
        class Frozen:
            """A graph's stand-in: the replay's launches with the arguments and grids they had
            when captured (as a graph's kernel nodes keep theirs), then the answer's copies."""

            def __init__(self, steps):
                self.steps = list(steps)
                self.bound = steps[0].__self__.bound  # steps: the replay's _enqueue, the copies
                self.frozen = [(list(b.args), b.grid) for b in self.bound]

            def __call__(self):
                live = [(b.args, b.grid) for b in self.bound]
                for b, (args, grid) in zip(self.bound, self.frozen):
                    b.args, b.grid = list(args), grid
                try:
                    for step in self.steps:
                        step()
                finally:
                    for b, (args, grid) in zip(self.bound, live):
                        b.args, b.grid = args, grid

        monkeypatch.setattr(launch, "capture_graph", lambda steps: captured.append(Frozen(steps)) or captured[-1])
    else:
        capture = launch.capture_graph
        monkeypatch.setattr(launch, "capture_graph", lambda steps: captured.append(capture(steps)) or captured[-1])
    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))
    n, d = 600, 32
    table = anb.AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype="fp16",
                                   ad_ids=rng.choice(10 * n, n, replace=False))
    dt = DeviceAdTable(table)
    config = anb.KernelConfig(**options)
    fp32 = options.get("math") == "fp32"
    for call in range(4):  # recorded; captured and run; a call of another kind between; the graph again
        req = anb.Request.random(d, 4, 2, rng)
        scores = anb.score_ads(req, dt, config=config).copy_to_host()
        mask = rng.random(n) < 0.5 if call == 2 and fp32 else None  # a bitset call between: its own replay
        if call == 2 and not fp32:  # fp16 weights already on the device: the pool's replay, launch by launch
            req = DeviceRequest.of(req)
            req.mma_f16_image()
        got = anb.score_topk(req, dt, 9, config=config, topk_config=seeded, eligible=mask)
        want = reference.topk(scores, 9, ids=table.ad_ids, eligible=mask)
        np.testing.assert_array_equal(got.ids, want.ids, err_msg=str(call))
        np.testing.assert_array_equal(got.scores, want.scores, err_msg=str(call))
        assert got.count == want.count
    params = options.get("weights") == "param"
    assert len(captured) == (0 if params else 1) and None not in captured
    graphs = {key[3]: [r.graph for r in ws.replays.values()] for key, ws in dt._workspaces.items() if key[0] == "filter"}
    assert graphs == {"pool": [None if params else captured[0]], **({"bitset": [None]} if fp32 else {})}


def _free_slot_table(rng, n=64, d=16):
    ids = rng.choice(10 * n, n, replace=False).astype(np.int64)
    ids[::4] = -1
    emb = launch.to_device(rng.standard_normal((n, d)).astype(np.float16))
    bias = launch.to_device(rng.standard_normal(n).astype(np.float32))
    return ids, DeviceAdTable.from_device(emb, bias, "fp16", ad_ids=launch.to_device(ids))


@pytest.mark.parametrize("path,n,k", [("auto", 320, 10), ("block", 64, 64)])
def test_free_slots_are_never_scored_or_returned(rng, path, n, k, monkeypatch):
    """Free slots (ad id -1) score NaN and are never returned: "auto" takes the filter path (a seed
    from 256 items: its sample reads free slots too), "block" returns every live ad in order."""
    ids, dt = _free_slot_table(rng, n)
    req = anb.Request.random(16, 3, 2, rng)
    scores = anb.score_ads(req, dt).copy_to_host()
    assert np.isnan(scores[ids == -1]).all() and not np.isnan(scores[ids >= 0]).any()
    mask = rng.random(n) < 0.7
    if path == "auto":
        filter_path_only(monkeypatch)
    for eligible in (None, mask, launch.to_device(bits_from_mask(mask))):
        got = anb.score_topk(req, dt, k, eligible=eligible, path=path,
                             topk_config=small_seed_config() if path == "auto" else None)
        live = (ids >= 0) & (True if eligible is None else mask)
        want = reference.topk(scores, k, ids=ids, eligible=live)
        assert np.array_equal(got.ids, want.ids) and got.count == live.sum()
    with pytest.raises(ValueError, match="free"):
        anb.score_topk(req, dt, 5, candidates=np.array([0, 1, 2], np.int32))  # slot 0 is free


def test_from_device_refuses_host_arrays_bad_layouts_and_bad_scales(rng):
    emb = rng.standard_normal((8, 16)).astype(np.float16)
    with pytest.raises(TypeError, match="device arrays"):
        DeviceAdTable.from_device(emb, np.zeros(8, np.float32), "fp16")
    dev = launch.to_device(emb)
    with pytest.raises(ValueError, match="layout"):
        DeviceAdTable.from_device(dev, launch.to_device(np.zeros(8, np.float32)), "fp16", layout="cols")
    q = launch.to_device(np.ones((8, 16), np.int8))
    for bad in (np.nan, -1.0, np.inf):
        scale = np.ones(8, np.float32)
        scale[3] = bad
        with pytest.raises(ValueError, match="scales"):
            DeviceAdTable.from_device(q, launch.to_device(np.zeros(8, np.float32)), "int8",
                                      scale=launch.to_device(scale))


@pytest.mark.parametrize("layout", ["rows", "tiles"])
def test_device_max_abs_is_the_host_tables_row_by_row(rng, layout):
    """An int8 table's largest |q * scale| from its device arrays (from_device tables, a pool's
    recount after a retire) equals the host table's: each row's largest |q| times its own scale,
    not the table's largest |q| times its largest scale (which refused valid tables for fp16
    math); in float64, so a scale that takes a product past fp32's range still counts."""
    from andromeda_nb.score.table import _device_max_abs, rows_max_abs

    n, d = 45, 16  # 45: rows off the block and warp sizes
    q = rng.integers(-3, 4, (n, d)).astype(np.int8)
    q[0] = 127
    q[7] = -128
    s = (rng.random(n) * 0.02).astype(np.float32)
    s[1], q[1] = 600.0, 1  # the largest scale on a row of small values
    host = anb.AdTable(embeddings=q, bias=np.zeros(n, np.float32), dtype="int8", scale=s, ad_ids=np.arange(n))
    dt = DeviceAdTable(host, layout)
    assert _device_max_abs(dt) == rows_max_abs(host) == max(600.0, 127 * float(s[0]), 128 * float(s[7]))
    s2 = s.copy()
    s2[7] = 3e38  # 128 x 3e38 passes fp32's range
    big = anb.AdTable(embeddings=q, bias=np.zeros(n, np.float32), dtype="int8", scale=s2, ad_ids=np.arange(n))
    assert _device_max_abs(DeviceAdTable(big, layout)) == rows_max_abs(big) == 128 * float(np.float32(3e38))
    if layout == "rows":  # the public path: a table wrapped from device arrays answers in fp16 math
        wrapped = DeviceAdTable.from_device(launch.to_device(q), launch.to_device(np.zeros(n, np.float32)), "int8",
                                            "rows", scale=launch.to_device(s))
        assert wrapped.max_abs() == dt.max_abs() == 600.0
        req = anb.Request.random(d, 3, 2, rng)
        cfg = anb.KernelConfig(math="fp16")
        got, want = (anb.score_topk(req, t, 5, config=cfg) for t in (wrapped, dt))
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores, want.scores)


def test_float_max_abs_kernel_refuses_int8():
    # |q| alone is not an int8 table's stored value (its row scale multiplies it)
    from andromeda_nb.score.table_kernels import max_abs_kernel

    with pytest.raises(ValueError, match="int8_max_abs_kernel"):
        max_abs_kernel("int8")
