"""fp16 math's loop over rounds in two (KernelConfig(loop="auto"), the generator's split_loop):
the rounds whose next round is whole run with no bounds check, then the last rounds checked. The
same scores and filter-path answers as one checked loop, the fp16 model's within its tolerance;
with the 8- and 16-byte result hand-off, for every width of its reads (E = 1, 3, 5, 6, 8)."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb import checks, reference
from andromeda_nb.device import launch
from andromeda_nb.score import DeviceAdTable
from andromeda_nb.score import fused as FK

from ..helpers import small_seed_config

SPLIT, CHECKED = anb.KernelConfig(math="fp16", block=32), anb.KernelConfig(math="fp16", block=32, loop="checked")


# every dtype and layout, every width of the hand-off's reads (the E logits in 4-, 2- and 1-float
# loads: E = 1, 5, 6, 8 in the default tier), without the full cross product (~10 s a case)
@pytest.mark.parametrize("dtype, layout, E, K, ring", [("fp16", "rows", 1, 1, 0), ("fp16", "tiles", 5, 2, 0),
                                                       ("int8", "rows", 8, 4, 0), ("int8", "tiles", 6, 2, 0),
                                                       pytest.param("int8", "tiles", 3, 2, 0, marks=pytest.mark.slow),
                                                       # the ring (off by default; the default tier's ring test
                                                       # splits its loop too, one round of one block unchecked)
                                                       pytest.param("int8", "tiles", 5, 2, 3, marks=pytest.mark.slow)])
def test_the_split_loop_answers_as_the_checked_one(rng, dtype, layout, E, K, ring, monkeypatch):
    """Blocks of 32 over the launch's whole grid (a stride of 128 ads on the simulator's 4
    blocks): at 2 strides + 45 ads (301 there) each block runs its first rounds in the unchecked
    loop (those up to n - stride - 32) and the rest, the partial last one included, in the checked
    loop; at 2 strides + 32 the pool ends exactly on a round; below a stride the unchecked loop
    never runs. With a ring of 3 the unchecked rounds are those whose copies, two rounds on, fall
    on a whole round: one stride more each."""
    built = []
    real = FK.fused_kernel
    monkeypatch.setattr(FK, "fused_kernel", lambda *a, **kw: built.append(kw.get("split_loop")) or real(*a, **kw))
    req = anb.Request.random(32, E, K, rng)
    split, checked = (cfg.replaced("ring_stages", ring) for cfg in (SPLIT, CHECKED))
    stride = 32 * launch.grid_for(10 ** 9, 32, SPLIT.blocks_per_sm)  # a grid that fills the GPU
    ahead = max(1, ring - 1)
    for n in ((ahead + 1) * stride + 45, (ahead + 1) * stride + 32, stride - 28):
        t = anb.AdTable.from_float(rng.standard_normal((n, 32)), rng.standard_normal(n), dtype=dtype,
                                   ad_ids=rng.choice(10 * n, n, replace=False))
        dt = DeviceAdTable(t, layout)
        got = anb.score_ads(req, dt, config=split).copy_to_host()
        np.testing.assert_array_equal(got, anb.score_ads(req, dt, config=checked).copy_to_host())
        if ring:  # and as the register loads
            np.testing.assert_array_equal(got, anb.score_ads(req, dt, config=CHECKED).copy_to_host())
        bad = ~checks.near_tie_ads(req, t, "fp16") & (np.abs(got - reference.score(req, t, math="fp16"))
                                                        > checks.score_tolerance(req, t, "fp16"))
        assert not bad.any()
        seeded = small_seed_config()
        for kw in ({}, {"eligible": rng.random(n) < 0.7}):
            a = anb.score_topk(req, dt, 9, config=split, path="filter", topk_config=seeded, **kw)
            b = anb.score_topk(req, dt, 9, config=checked, path="filter", topk_config=seeded, **kw)
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.scores, b.scores)
            assert a.count == b.count
    assert True in built and False in built  # the setting reached the generator both ways


def test_only_the_full_pool_of_simple_rounds_splits_its_loop():
    """The generated source: one unchecked loop (no row test, zero fill or conditional store) then
    the checked one, for scores to memory and the filter pass over the pool, with the register
    loads or the ring (whose unchecked copies fill the round ring - 1 strides on); other access
    paths, two rounds ahead, the block top-K and fp32 math keep one checked loop."""
    def source(**kw):
        args = dict(model="gated", d=32, E=5, K=2, dtype="int8", layout="tiles", access="pool", fused=False,
                    block=32, math="fp16", dequant="fma", split_loop=True)
        return FK._source(**{**args, **kw})

    for seed_filter in (False, True):
        src = source(seed_filter=seed_filter)
        unchecked = src.split("    while b0 <= last_whole:")[1].split("    for base0 in range(b0, n_items, stride):")
        assert len(unchecked) == 2
        assert "okr" not in unchecked[0] and "if j < n_items" not in unchecked[0] and "ok = True" in unchecked[0]
        assert "okr0 = " in unchecked[1] and "ok = j < n_items" in unchecked[1]
    for ring in (2, 3, 4):
        src = source(ring_stages=ring)
        head, rest = src.split("    while b0 <= last_whole:")
        unchecked = rest.split("    for base0 in range(b0, n_items, stride):")
        assert f"last_whole = n_items - {'' if ring == 2 else f'{ring - 1} * '}stride - 32" in head
        assert "rok" not in unchecked[0] and "rb = 8\n" in unchecked[0] and "ok = True" in unchecked[0]
        assert "rok = ra < n_items" in unchecked[1] and "ok = j < n_items" in unchecked[1]
    for kw in ({"access": "candidates"}, {"access": "bitset"}, {"rows_ahead": 2},
               {"fused": True}, {"math": "fp32", "mma": True, "dequant": "mul", "dtype": "fp16"}, {"split_loop": False}):
        assert "last_whole" not in source(**kw), kw
    with pytest.raises(ValueError, match="split_loop"):
        FK.fused_kernel("gated", 32, 5, 2, "int8", "tiles", "pool", 32, math="fp16", split_loop=1)
    for bad in ("yes", None, True):
        with pytest.raises(ValueError, match="loop"):
            anb.KernelConfig(loop=bad)
    assert SPLIT.kernel_split_loop() and not CHECKED.kernel_split_loop()
    assert not anb.KernelConfig(math="fp32").kernel_split_loop()


def test_the_unchecked_rounds_load_tiles_rows_at_stepped_offsets():
    """On ``tiles`` the unchecked rounds load each lane's 8-byte words at byte offsets from one base
    a round (``ld_u64``), the checked rounds by element index; the simulator's load refuses an
    offset outside the array or off 8 bytes, where the device would read garbage."""
    from andromeda_nb.device.memory_ops import ld_u64
    from andromeda_nb.score.fused import _source

    for dtype, words in (("int8", 2), ("fp16", 4)):  # a lane's words of a row at d = 64: d/32, d/16
        src = _source("gated", 64, 6, 2, dtype, "tiles", "pool", False, 128, math="fp16", split_loop=True)
        whole, checked = src.split("    for base0 in range(b0")
        assert whole.count("ld_u64(words, ra") == 2 * 2 * words and "ld_u64(" not in checked  # 2 tiles x 2 rows
    words = np.arange(6, dtype=np.uint64).reshape(2, 3) * np.uint64(0x100000001)
    assert ld_u64(words, 8 * 4) == words[1, 1] and ld_u64(words, 8 * 5) == words[1, 2]
    for bad in (-8, 48, 4, 40 + 4):  # before, past the end, off 8 bytes
        with pytest.raises(IndexError):
            ld_u64(words, bad)
