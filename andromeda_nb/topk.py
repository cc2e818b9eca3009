"""Host wrappers of the block top-K kernels (kernels/topk.py)."""

from __future__ import annotations

import numpy as np

from . import launch
from .model import TopK
from .targeting import WORD_BITS, bits_from_mask

#: Largest k the block top-K supports: its shared buffer of next_pow2(k + 256) entries of 8 bytes
#: must stay within Numba's 48 KiB of shared memory per block.
MAX_K = 2048
#: Item counts are int32 slots inside the kernels.
MAX_ITEMS = 2**31 - 1


def check_k(k) -> int:
    """Validate ``k`` (an int in ``1..MAX_K``) and return it as int.

    Raises:
        TypeError: not an integer.
        ValueError: ``k < 1`` or ``k > MAX_K``.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k={k} is out of range: the block top-K supports 1 <= k <= {MAX_K}")
    return int(k)


def eligible_bitset(eligible, n: int):
    """Accept an eligible set as a bool mask ``[n]`` or a uint64 bitset ``[ceil(n/64)]`` (host or
    device) and return a device bitset. A host bitset must have no bits set past ``n``.

    Raises:
        TypeError / ValueError: wrong dtype, shape or contiguity, or padding bits set.
    """
    n_words = (n + WORD_BITS - 1) // WORD_BITS
    if isinstance(eligible, np.ndarray) and eligible.dtype == np.bool_:
        launch.check_array("eligible", eligible, np.bool_, shape=(n,))
        return launch.to_device(bits_from_mask(eligible))
    launch.check_array("eligible", eligible, np.uint64, shape=(n_words,))
    if isinstance(eligible, np.ndarray) and n % WORD_BITS and n_words:
        if int(eligible[-1]) >> (n % WORD_BITS):
            raise ValueError(f"eligible bitset has bits set past n={n} (padding bits must be 0)")
    return launch.to_device(eligible)


#: A merge block reduces at most MERGE_FANIN lists of k candidates; more lists merge in a tree.
MERGE_FANIN = 16


def launch_merge(cand_s, cand_i, k: int, ids=None, block: int | None = None):
    """Enqueue the merge of per-block candidate lists (device ``float32[m]`` scores, ``int32[m]``
    slots, -1 = empty) into the exact top-k (no host copies): a tree of merge launches, each block
    reducing up to ``MERGE_FANIN`` lists, ending in one block.

    Returns:
        Device ``(ids int64[k], scores float32[k])``; ids are ``ids[slot]`` when ``ids`` (device
        int64) is given, else slots; pads -1 / -inf.
    """
    from .kernels.topk import buffer_capacity, merge_kernel

    cuda = launch.cuda()
    block = block or launch.default_block()
    has_ids = ids is not None
    kern = merge_kernel(buffer_capacity(k, block), block, has_ids)
    ids_arg = ids if has_ids else launch.dummy(np.int64)
    m = cand_s.shape[0]
    seg = MERGE_FANIN * k
    while True:
        grid = max(1, -(-m // seg))
        final = grid == 1
        out_s = cuda.device_array(grid * k, np.float32)
        out_slot = cuda.device_array(grid * k, np.int32)
        out_id = cuda.device_array(k if final else 1, np.int64)
        kern[grid, block](cand_s, cand_i, m, seg, k, ids_arg, out_s, out_slot, out_id, 1 if final else 0)
        if final:
            return out_id, out_s
        cand_s, cand_i, m = out_s, out_slot, grid * k


def launch_topk(d_scores, n: int, k: int, elig=None, d_ids=None, block: int | None = None):
    """Enqueue block top-K + merge over device scores (no validation, no host copies).

    Returns:
        Device ``(ids int64[k], scores float32[k], count int64[1])``.
    """
    from .kernels.topk import buffer_capacity, topk_scores_kernel

    cuda = launch.cuda()
    block = block or launch.default_block()
    grid = launch.grid_for(n, block)
    cand_s = cuda.device_array(grid * k, np.float32)
    cand_i = cuda.device_array(grid * k, np.int32)
    counts = cuda.to_device(np.zeros(1, np.int64))
    kern = topk_scores_kernel(buffer_capacity(k, block), block, elig is not None, d_ids is not None)
    kern[grid, block](d_scores, elig if elig is not None else launch.dummy(np.uint64),
                      d_ids if d_ids is not None else launch.dummy(np.int64), n, k, cand_s, cand_i, counts)
    ids, scores = launch_merge(cand_s, cand_i, k, d_ids, block)
    return ids, scores, counts


def topk_scores(scores, k: int, eligible=None, ids=None, block: int | None = None) -> TopK:
    """Exact top-k of a score array on the device (block top-K, then a merge on the device).

    Contract (DESIGN.md): score descending, ties to the lower id, NaN never selected, fewer than k
    candidates padded with id -1 and score -inf.

    Args:
        scores: ``float32[n]``, host or device, C-contiguous, ``n < 2**31``.
        k: ``1 <= k <= MAX_K``.
        eligible: optional bool ``[n]`` mask or uint64 ``[ceil(n/64)]`` bitset.
        ids: optional ``int64[n]`` ids (unique) reported and used for tie-breaks; default the index.
        block: threads per block (default: 256 on a GPU, 32 in the simulator).

    Returns:
        :class:`~andromeda_nb.model.TopK` with host arrays and the count of eligible non-NaN scores.

    Raises:
        TypeError / ValueError: bad dtype, shape, contiguity or k (before any launch).
    """
    from .kernels.topk import topk_scores_kernel

    k = check_k(k)
    launch.check_array("scores", scores, np.float32, ndim=1)
    n = int(scores.shape[0])
    if n > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} scores per call, got {n}")
    if ids is not None:
        launch.check_array("ids", ids, np.int64, shape=(n,))
    elig = None if eligible is None else eligible_bitset(eligible, n)
    d_ids = None if ids is None else launch.to_device(ids)
    out_ids, out_scores, counts = launch_topk(launch.to_device(scores), n, k, elig, d_ids, block)
    return TopK(ids=out_ids.copy_to_host(), scores=out_scores.copy_to_host(), count=int(counts.copy_to_host()[0]))
