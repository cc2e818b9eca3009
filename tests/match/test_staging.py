"""The staging ring of small uploads (match.staging.Stager): what lands on the device equals what
was staged, in either mode, and a batch larger than any before grows every region at once."""

import numpy as np

from andromeda_nb.device import launch
from andromeda_nb.match.staging import Stager


def _arrays(rng, sizes):
    return [rng.integers(-(1 << 62), 1 << 62, n, dtype=np.int64) for n in sizes]


def test_staged_spans_and_views_equal_their_arrays(rng):
    """upload_spans: array i at buffer[starts[i]:] (an empty one a single zero); upload: views
    the caller owns, equal to the arrays after later uploads reuse the ring."""
    stager = Stager(regions=3, capacity=8)
    assert stager.upload([]) == []  # nothing to upload: no views
    owned = stager.upload(arrays := _arrays(rng, [5, 0, 3]))
    for sizes in ([4, 0, 9], [1], [33, 2], [0, 0], [7, 70]):  # past the first capacity: growth
        want = _arrays(rng, sizes)
        buf, starts = stager.upload_spans(want)
        launch.cuda().synchronize()
        host = buf.copy_to_host()
        for a, s in zip(want, starts):
            np.testing.assert_array_equal(host[s:s + max(a.size, 1)], a if a.size else [0])
    for a, v in zip(arrays, owned):
        np.testing.assert_array_equal(v.copy_to_host(), a if a.size else [0])


def test_a_larger_batch_grows_every_region_once(rng):
    """The first upload past the regions' size grows all of them (host and, in ring mode, device
    buffers); a whole turn of the ring afterwards allocates nothing."""
    stager = Stager(regions=4, capacity=16)
    stager.upload_spans(_arrays(rng, [3]))
    stager.upload_spans(_arrays(rng, [100, 20]))  # 120 > 16: every region to 128
    bufs = [(r["host"], r["dev"]) for r in stager.regions]
    assert all(h.size == 128 and d is not None and d.size == 128 for h, d in bufs)
    for _ in range(2 * len(bufs)):
        stager.upload_spans(_arrays(rng, [60, 60]))
    assert all(r["host"] is h and r["dev"] is d for r, (h, d) in zip(stager.regions, bufs))
