"""One-launch top-K of one request of up to about a million scores (the scores of one request
right after scoring: L2-resident, where three launches' fixed costs dominate). Host side:
:mod:`~andromeda_nb.topk.onelaunch`.

:func:`onelaunch_topk_kernel`, every block of one launch:

1. **loads** its share of the scores (``per_thread`` a thread, coalesced) into registers first, so
   they are in flight during the seed;
2. **seeds** a threshold from a stratified sample of the whole array, each block the same sample
   and the same answer (no sync between blocks): a lower bound of the r-th best of the threads'
   best sample keys, found bit by bit from the top with one ``syncthreads_count`` (a hardware
   block reduction) a bit (:func:`~andromeda_nb.topk.seed_kernels.best_key_seed`);
3. **filters**: its eligible scores at or above the seed staged in shared memory, one global atomic
   a block for their place in the candidate buffer;
4. the **last block** to finish (a ticket after a ``threadfence``, as the seed kernel of
   :mod:`~andromeda_nb.topk.seed_kernels`) sorts the candidates in shared memory (bitonic, the sort
   final's device functions), writes the top k, the counts, and zeroes the accumulators and the
   ticket for the next call.

Exact when at least ``min(k, eligible)`` and at most ``cap`` scores reached the seed (the counts
say which; the host reruns otherwise), as the three-launch path. The simulator runs blocks one
after another, so the same code runs with the last block last.

Measured on the H200 (data/results/topk_diagnostics.md): the last block starts early, but its sort
of the kept scores on one SM takes longer than the whole batched path on a batch of one. So
``topk_scores`` does not take it; it stays for a final that spreads the sort over the GPU.
"""

import functools
import math

from numba import cuda, float32, int32, int64, uint32, uint64
from numba.cuda.core import config as numba_config

from ..device.bits import test_bit
from .block import NEG_INF
from .filter_kernels import REGISTER_FILE, add_totals
from .final_kernels import _sort_funcs
from .seed_kernels import best_key_seed, sample_key

#: threads of a block on a GPU (one block an SM), samples and scores a thread
ONELAUNCH_BLOCK = 1024
ONELAUNCH_SAMPLES = 8
ONELAUNCH_SCORES = 8
#: sample runs are this many contiguous scores (a warp reads one 128-byte line a run)
ONELAUNCH_RUN = 32
#: candidates the last block sorts in shared memory (8-byte keys: 32 KiB)
ONELAUNCH_CAP = 4096
#: kept scores a block stages in shared memory before its one global atomic; more go one by one
ONELAUNCH_STAGE = 1024
#: accumulator slots (int64): candidates appended, eligible scores, NaN among them, kept scores
ACC_FILL, ACC_ELIGIBLE, ACC_NAN, ACC_KEPT = 0, 1, 2, 3
ACC_SIZE = 4


@functools.lru_cache(maxsize=None)
def onelaunch_topk_kernel(block: int, samples: int, per_thread: int, has_elig: bool, cap: int,
                          warp_sync: bool = False):
    """Launch ``[grid, block]`` with ``grid = ceil(n / (block * per_thread))`` (a power-of-two
    ``block``; every block of the grid resident or not: no block waits for another).

    Args: ``scores float32[n]`` (``n >= 2 * block * samples``), ``elig uint64[ceil(n / 64)]``
    (read when ``has_elig``), ``r int32`` (the seed's rank in the sample of ``block * samples``
    scores; 0: no seed, every eligible score is kept), ``k int32`` (1..``out_s.shape[1]``),
    ``buf_s float32[>= cap]`` / ``buf_i int32[>= cap]`` (the candidate buffer), ``acc
    int64[ACC_SIZE]`` and ``ticket uint32[1]`` (zero before the first call; the last block zeroes
    them again), ``counts int64[1, 2]`` (written: eligible non-NaN scores, those at or above the
    seed), ``out_s float32[1, k']``, ``out_slot int32[1, k']``, ``out_id int64[1, k']`` (the best
    ``min(k, kept)`` in the contract's order, ids = positions, then pads; written only when the
    kept scores fit ``cap``: otherwise the counts tell the caller to rerun).

    Sample j of ``M = block * samples`` is score ``(j // RUN) * step + (step - RUN) // 2 + j % RUN``
    with ``step = n // (M / RUN)``: runs of RUN contiguous scores, each centred in its stratum.
    NaN, -inf and ineligible samples never seed.

    The seed is :func:`~andromeda_nb.topk.seed_kernels.best_key_seed` of the threads' best sample
    keys (the r-th best sample itself, four block reductions a key bit, took twice as long to the
    seed on the H200; data/results/topk_diagnostics.md). ``warp_sync``: the sort's steps of stride
    <= 32 end with warp barriers (:func:`~andromeda_nb.topk.final_kernels._sort_funcs`)."""
    M = block * samples
    RUNS = M // ONELAUNCH_RUN
    B = uint32(block)
    sort_buffer, write_top = _sort_funcs(block, False, warp_sync)

    @cuda.jit(device=True, inline=True)
    def stage(s, i, st_s, st_i, st_n, buf_s, buf_i, acc):
        p = cuda.atomic.add(st_n, 0, int32(1))
        if p < ONELAUNCH_STAGE:
            st_s[p] = s
            st_i[p] = int32(i)
        else:
            pos = cuda.atomic.add(acc, ACC_FILL, int64(1))
            if pos < cap:
                buf_s[pos] = s
                buf_i[pos] = int32(i)

    def kernel(scores, elig, r, k, buf_s, buf_i, acc, ticket, counts, out_s, out_slot, out_id):
        st_s = cuda.shared.array(ONELAUNCH_STAGE, float32)
        st_i = cuda.shared.array(ONELAUNCH_STAGE, int32)
        sk = cuda.shared.array(cap, uint64)
        dummy_id = cuda.shared.array(1, int64)
        dummy_slot = cuda.shared.array(1, int32)
        st_n = cuda.shared.array(1, int32)
        red = cuda.shared.array(3, int32)  # block totals: eligible, NaN among them, kept
        flag = cuda.shared.array(2, int64)  # the block's place in the buffer; last block or not
        tid = uint32(cuda.threadIdx.x)
        n = uint32(scores.shape[0])
        if tid == 0:
            st_n[0] = 0
            red[0] = 0
            red[1] = 0
            red[2] = 0
        cuda.syncthreads()  # zeroed before any thread stages (without a seed, no barrier comes first)
        # 1. this block's scores, in flight during the seed
        mine = cuda.local.array(per_thread, float32)
        base = uint32(cuda.blockIdx.x) * B * uint32(per_thread) + tid
        for j in range(per_thread):
            i = base + uint32(j) * B
            mine[j] = scores[i] if i < n else NEG_INF
        # 2. the seed: the same sample and the same answer in every block
        keys = cuda.local.array(samples, uint32)
        step = n // uint32(RUNS)
        for j in range(samples):
            idx = uint32(j) * B + tid
            i = (idx // uint32(ONELAUNCH_RUN)) * step + (step - uint32(ONELAUNCH_RUN)) // uint32(2) \
                + idx % uint32(ONELAUNCH_RUN)
            key = sample_key(scores[i])
            if has_elig and test_bit(elig, i) == 0:
                key = uint32(0)
            keys[j] = key
        seed = NEG_INF
        if r > 0:
            top = keys[0]
            for j in range(1, samples):
                top = max(top, keys[j])
            seed = best_key_seed(top, r)
            if math.isnan(seed):  # uniform: fewer than r threads hold a real sample, keep them all
                seed = NEG_INF
        # 3. the filter
        el = int32(0)
        nan = int32(0)
        kept = int32(0)
        for j in range(per_thread):
            i = base + uint32(j) * B
            if i < n and (not has_elig or test_bit(elig, i) != 0):
                s = mine[j]
                el += 1
                if math.isnan(s):
                    nan += 1
                elif s >= seed:
                    kept += 1
                    stage(s, i, st_s, st_i, st_n, buf_s, buf_i, acc)
        add_totals(red, el, nan, kept)
        cuda.syncthreads()
        staged = min(st_n[0], ONELAUNCH_STAGE)
        if tid == 0:
            cuda.atomic.add(acc, ACC_ELIGIBLE, int64(red[0]))
            cuda.atomic.add(acc, ACC_NAN, int64(red[1]))
            cuda.atomic.add(acc, ACC_KEPT, int64(red[2]))
            flag[0] = cuda.atomic.add(acc, ACC_FILL, int64(staged)) if staged else int64(0)
        cuda.syncthreads()
        j = tid
        while j < uint32(staged):
            pos = flag[0] + int64(j)
            if pos < cap:
                buf_s[pos] = st_s[j]
                buf_i[pos] = st_i[j]
            j += B
        # 4. the last block to finish answers
        cuda.threadfence()
        cuda.syncthreads()
        if tid == 0:
            flag[1] = int64(cuda.atomic.add(ticket, 0, uint32(1)) == uint32(cuda.gridDim.x - 1))
        cuda.syncthreads()
        if flag[1] == 0:
            return  # uniform
        cuda.threadfence()
        m = acc[ACC_FILL]
        eligible = acc[ACC_ELIGIBLE] - acc[ACC_NAN]
        total_kept = acc[ACC_KEPT]
        cuda.syncthreads()  # every thread has read the accumulators before they are zeroed
        if tid == 0:
            counts[0, 0] = eligible
            counts[0, 1] = total_kept
            for q in range(ACC_SIZE):
                acc[q] = 0
            ticket[0] = uint32(0)
        if m > cap:
            return  # uniform: the caller reruns
        sort_buffer(sk, dummy_id, dummy_slot, buf_s, buf_i, m, dummy_id, 0)
        write_top(sk, dummy_id, dummy_slot, scores, 0, uint32(min(int64(k), m)), 0, out_s, out_slot, out_id)

    # 1,024 threads fit the register file at 64 registers a thread (sm_90: 52, 60 with a bitset)
    if block * 64 <= REGISTER_FILE < block * 255 and not numba_config.ENABLE_CUDASIM:
        return cuda.jit(kernel, max_registers=REGISTER_FILE // block)
    return cuda.jit(kernel)
