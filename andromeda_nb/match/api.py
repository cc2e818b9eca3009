"""Host wrappers of the match kernels (:mod:`andromeda_nb.match.kernels`): the device index, one
request or a batch to eligible bitsets (and optionally compacted candidate slots), real-time
updates on the device, and the CPU baseline. How a batch is launched is a
:class:`~andromeda_nb.match.config.MatchConfig`; the bytes it moves, :mod:`~andromeda_nb.match.byte_model`.

Ordering: every upload (request plans, update deltas) goes through pinned staging buffers with
asynchronous copies on the default stream, and every kernel runs on that stream, so the device
executes updates and requests in the order the host issued them: a request sees every update
applied before it was issued and none after, and the host never waits for the device except to
read a result (``Eligible.count``, ``to_mask``, ``candidates``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..device import launch
from ..targeting import (WORD_BITS, TargetingIndex, UpdateBatch, UpdateDelta, make_profile, mask_from_bits,
                         table_slots)
from .config import MatchConfig
from .staging import Stager

#: The match kernel's default words per thread (``MatchConfig().words_per_thread``), for tables
#: that name the default kernel shape; launches read their :class:`MatchConfig`.
WORDS_PER_THREAD = MatchConfig().words_per_thread
#: The kernels :meth:`DeviceTargetingIndex.launch` enqueues (a subset: benchmark stage timing).
KERNELS = ("prep", "match", "post")


def plan_ops(inc_ptr, inc_rows, exc_ptr, exc_rows) -> tuple[np.ndarray, np.ndarray]:
    """A match plan flattened into row ops for the grouped match kernel, in reading order: per
    category its include rows (the first flagged OP_FIRST, the last OP_CLOSE; none: one OP_ZERO op),
    then its exclude rows (OP_EXC). Args as :class:`~andromeda_nb.targeting.MatchPlan`'s arrays
    (include row ids already mapped to device row ids). Returns ``(op_row, op_kind)``, int64."""
    from .kernels import OP_CLOSE, OP_EXC, OP_FIRST, OP_ZERO

    rows, kinds = [], []
    for c in range(len(inc_ptr) - 1):
        inc = inc_rows[inc_ptr[c]:inc_ptr[c + 1]]
        if len(inc) == 0:
            rows.append(0)
            kinds.append(OP_ZERO)
            continue  # the set is empty: its excludes change nothing
        for q, r in enumerate(inc):
            rows.append(int(r))
            kinds.append((OP_FIRST if q == 0 else 0) | (OP_CLOSE if q == len(inc) - 1 else 0))
        for r in exc_rows[exc_ptr[c]:exc_ptr[c + 1]]:
            rows.append(int(r))
            kinds.append(OP_EXC)
    return np.array(rows, np.int64), np.array(kinds, np.int64)


def _max_batch() -> int:
    from .kernels import MAX_BATCH

    return MAX_BATCH


#: the flat int64 arrays a batch's plan is made of, in the order the stager uploads them
PLAN_ARRAYS = ("req_cat", "inc_ptr", "inc_rows", "exc_ptr", "exc_rows", "p_start", "p_off", "p_dst",
               "q_start", "q_off", "q_op", "q_arg", "extra", "req_op", "op_row", "op_kind")


@dataclass
class BatchPlan:
    """A batch of requests planned on the host (:meth:`DeviceTargetingIndex.plan_batch`): ``arrays``
    maps each of :data:`PLAN_ARRAYS` to a host int64 array; the other fields as :class:`PreparedMatch`."""

    plans: list
    n_words: int
    n_bits: int
    arrays: dict
    n_prep: int
    n_post: int
    n_scratch: int
    version: int
    profiles: list
    prep_segments: tuple
    post_segments: tuple

    @property
    def batch(self) -> int:
        return len(self.plans)


@dataclass
class PreparedMatch:
    """A batch of requests planned and uploaded, ready to launch (:meth:`DeviceTargetingIndex.launch`).

    ``plans``: the host plans; ``n_words``, ``n_bits``: the bitset span matched (the pool or a
    prefix); ``args``: device arrays; ``version``: the index version the plans were made for.
    """

    plans: list
    n_words: int
    n_bits: int
    args: dict
    n_prep: int
    n_post: int
    n_scratch: int
    version: int
    profiles: list = None
    #: the list passes' segments: how many, and the longest (the segment-grid kernels' shape)
    prep_segments: tuple = (0, 0)
    post_segments: tuple = (0, 0)

    @property
    def batch(self) -> int:
        return len(self.plans)


class DeviceTargetingIndex:
    """A :class:`~andromeda_nb.targeting.TargetingIndex` with its rows and lists on the device.

    Updates go through :meth:`apply` (host index first, then one kernel on the stream); updating
    the host index directly afterwards makes this copy stale (it then raises).

    ``host_bits=False`` drops the host index's bitset rows once they are on the device
    (:meth:`~andromeda_nb.targeting.TargetingIndex.drop_host_bits`): the rows then live here only,
    the host saves their memory and every update's host bit flips.
    """

    def __init__(self, index: TargetingIndex, staging_regions: int = 4, host_bits: bool = True):
        if not isinstance(index, TargetingIndex):
            raise TypeError(f"index must be a TargetingIndex, got {type(index).__name__}")
        self.index = index
        self.rows = launch.to_device(index._need_bits("a device copy"))
        if not host_bits:
            index.drop_host_bits()
        self.pool = launch.to_device(index.pool)
        self._version = index.version
        self._scratch = None
        self._stager = Stager(staging_regions)

    n_ads = property(lambda self: self.index.n_ads)
    n_words = property(lambda self: self.index.n_words)
    schema = property(lambda self: self.index.schema)

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.pool.nbytes)

    @property
    def version(self) -> int:
        """The host index version this device copy holds (as enqueued on the stream)."""
        return self._version

    def _check_fresh(self):
        if self.index.version != self._version:
            raise RuntimeError("the host index holds updates this device copy has not applied (apply updates "
                               "through DeviceTargetingIndex.apply, or apply_delta each delta in order)")

    def scratch(self, rows: int):
        """The patch rows (all zero between requests), grown to at least ``rows``."""
        rows = max(int(rows), 1)
        if self._scratch is None or self._scratch.shape[0] < rows:
            from .kernels import fill_kernel

            old = self._scratch
            new = launch.cuda().device_array((rows, max(self.n_words, 1)), np.uint64)
            fill_kernel()[launch.grid_for(new.size, launch.default_block()), launch.default_block()](new, np.uint64(0))
            self._scratch = new
            self._old_scratch = old
        return self._scratch

    # ------------------------------------------------------------------ updates

    def apply(self, batch: UpdateBatch) -> UpdateDelta:
        """Apply an update batch (create / change / retire) to the host index and, in one kernel
        on the stream, to the device copy. Validation errors change nothing (host or device).

        Returns the :class:`~andromeda_nb.targeting.UpdateDelta` (bits changed, list writes).
        """
        self._check_fresh()
        delta = self.index.apply(batch)
        self.apply_delta(delta)
        return delta

    def apply_delta(self, delta: UpdateDelta) -> None:
        """Enqueue one delta returned by ``self.index.apply`` (deltas must come in order: a
        pipeline may run the host side ahead and feed the device later)."""
        from .kernels import apply_kernel

        if delta.version != self._version + 1:
            raise RuntimeError(f"delta for version {delta.version} but the device copy is at {self._version}")
        cuda = launch.cuda()
        if delta.pool_size > self.pool.shape[0]:
            grown = cuda.device_array(delta.pool_size, self.pool.dtype)
            grown[:self.pool.shape[0]].copy_to_device(self.pool, stream=self._stager.stream)
            self._stager.retain(self.pool)
            self.pool = grown
        n_bits, n_pos = delta.bit_codes.size, delta.list_pos.size
        if n_bits + n_pos:
            (buf,) = self._stager.upload([np.concatenate([delta.bit_codes, delta.list_pos, delta.list_vals])],
                                         owned=False)
            block = launch.default_block()
            apply_kernel()[launch.grid_for(max(n_bits, n_pos), block), block](
                self.rows, self.pool, buf, n_bits, n_pos, 0)
        self._version = delta.version

    # ------------------------------------------------------------------ requests

    def prepare(self, profiles: Sequence[Mapping], exclude_slots=None, n_words: int | None = None) -> PreparedMatch:
        """Plan and upload a batch of requests (at most ``MAX_BATCH``; see :func:`match_batch`).

        Args:
            profiles: one profile per request (validated with :func:`make_profile`).
            exclude_slots: None, or one slot list (or None) per request.
            n_words: match only the first ``n_words`` words of the pool (pool-size sweeps).

        The plans follow the host index's current state; launch them after the device copy has
        applied the same updates (its :attr:`version`).

        Raises:
            RuleError: a malformed profile. ValueError: exclude slots out of range, too many requests.
        """
        plan = self.plan_batch(profiles, exclude_slots, n_words)
        views = self._stager.upload([plan.arrays[name] for name in PLAN_ARRAYS])
        args = dict(zip(PLAN_ARRAYS, views))
        # empty segment tables: a zero-length table still needs seg_off[0] == 0 and length-0 dst
        args["p_dst"] = args["p_dst"][:plan.arrays["p_dst"].size]
        args["q_op"] = args["q_op"][:plan.arrays["q_op"].size]
        return PreparedMatch(plans=plan.plans, n_words=plan.n_words, n_bits=plan.n_bits, args=args,
                             n_prep=plan.n_prep, n_post=plan.n_post, n_scratch=plan.n_scratch, version=plan.version,
                             profiles=plan.profiles, prep_segments=plan.prep_segments,
                             post_segments=plan.post_segments)

    def plan_batch(self, profiles: Sequence[Mapping], exclude_slots=None, n_words: int | None = None,
                   grouped: bool = True) -> "BatchPlan":
        """The host half of :meth:`prepare`: the batch's plans as flat int64 arrays (:data:`PLAN_ARRAYS`),
        not uploaded (a serving loop uploads them into its own buffers). Same arguments and errors;
        ``grouped=False`` leaves the grouped match kernel's op arrays empty (``req_op`` all zero)."""
        idx = self.index
        profiles = list(profiles)
        B = len(profiles)
        if not 1 <= B <= _max_batch():
            raise ValueError(f"a prepared batch holds 1..{_max_batch()} requests, got {B}")
        excl = [None] * B if exclude_slots is None else list(exclude_slots)
        if len(excl) != B:
            raise ValueError(f"{B} profiles but {len(excl)} exclude lists")
        nw = idx.n_words if n_words is None else int(n_words)
        if not (0 < nw <= idx.n_words or nw == idx.n_words == 0):  # an empty pool matches nothing
            raise ValueError(f"n_words must be in 1..{idx.n_words}")
        n_bits = min(idx.n_ads, nw * WORD_BITS)
        plans = [idx.plan(make_profile(idx.schema, p)) for p in profiles]
        excl = [None if e is None else table_slots(e, idx.n_ads) for e in excl]
        nr = idx.n_rows
        req_cat, inc_ptr, exc_ptr, inc_rows, exc_rows = [0], [0], [0], [], []
        p_start, p_len, p_dst = [], [], []
        q_start, q_len, q_op, q_arg = [], [], [], []
        extra, n_extra, scratch_base = [], 0, 0
        req_op, op_row, op_kind = [0], [], []
        for b, plan in enumerate(plans):
            req_cat.append(req_cat[-1] + plan.n_categories)
            inc_ptr.extend((plan.inc_ptr[1:] + len(inc_rows)).tolist())
            exc_ptr.extend((plan.exc_ptr[1:] + len(exc_rows)).tolist())
            mapped = np.where(plan.inc_rows < 0, nr + scratch_base - 1 - plan.inc_rows, plan.inc_rows)
            inc_rows.extend(mapped.tolist())
            exc_rows.extend(plan.exc_rows.tolist())
            if grouped:
                r, kd = plan_ops(plan.inc_ptr, mapped, plan.exc_ptr, plan.exc_rows)
                op_row.extend(r.tolist())
                op_kind.extend(kd.tolist())
            req_op.append(len(op_row))
            for k, lids in enumerate(plan.patch_lists):
                s, ln = idx.segments(lids)
                p_start += s.tolist()
                p_len += ln.tolist()
                p_dst += [scratch_base + k] * s.size
                q_start += s.tolist()
                q_len += ln.tolist()
                q_op += [2] * s.size
                q_arg += [scratch_base + k] * s.size
            s, ln = idx.segments(plan.exclude_lists)
            q_start += s.tolist()
            q_len += ln.tolist()
            q_op += [0] * s.size
            q_arg += [b] * s.size
            if excl[b] is not None and excl[b].size:
                q_start.append(n_extra)
                q_len.append(int(excl[b].size))
                q_op.append(1)
                q_arg.append(b)
                extra.append(excl[b])
                n_extra += int(excl[b].size)
            scratch_base += plan.n_patches

        def off(lengths):
            o = np.zeros(len(lengths) + 1, np.int64)
            np.cumsum(lengths, out=o[1:])
            return o

        p_off, q_off = off(p_len), off(q_len)
        arrays = [np.array(req_cat, np.int64), np.array(inc_ptr, np.int64), np.array(inc_rows, np.int64),
                  np.array(exc_ptr, np.int64), np.array(exc_rows, np.int64),
                  np.array(p_start, np.int64), p_off, np.array(p_dst, np.int64),
                  np.array(q_start, np.int64), q_off, np.array(q_op, np.int64), np.array(q_arg, np.int64),
                  np.concatenate(extra) if extra else np.zeros(0, np.int64),
                  np.array(req_op, np.int64), np.array(op_row, np.int64), np.array(op_kind, np.int64)]
        return BatchPlan(plans=plans, n_words=nw, n_bits=n_bits, arrays=dict(zip(PLAN_ARRAYS, arrays)),
                         n_prep=int(p_off[-1]), n_post=int(q_off[-1]), n_scratch=scratch_base,
                         version=self.index.version, profiles=profiles,
                         prep_segments=(len(p_len), int(max(p_len, default=0))),
                         post_segments=(len(q_len), int(max(q_len, default=0))))

    def launch(self, prepared: PreparedMatch, out=None, counts=None, config: MatchConfig | None = None, *,
               kernels: Sequence[str] = KERNELS):
        """Enqueue a prepared batch (prep, match, post kernels; no host synchronisation).

        Args:
            prepared: from :meth:`prepare`, for this device copy's version.
            out: device ``uint64[B, >= n_words]`` for the eligible bitsets (allocated if None).
            counts: device ``int64[>= B]`` for the eligible counts (allocated if None).
            config: the match kernel's shape and variant and the list passes
                (:class:`~andromeda_nb.match.config.MatchConfig`; default ``MatchConfig()``).
                Every config gives the same bitsets and counts.
            kernels: which of the three kernels to enqueue (benchmark stage timing only: a subset
                leaves the results incomplete).

        Returns:
            ``(out, counts)``.

        Raises:
            TypeError: ``prepared`` or ``config`` of the wrong type. ValueError: ``out`` or
            ``counts`` too small or of the wrong dtype, an unknown kernel name. RuntimeError: the
            batch was prepared for another version of the index.
        """
        from .kernels import (SEG_LOADS, match_grouped_kernel, match_kernel, post_kernel, post_segment_kernel,
                              prep_kernel, prep_segment_kernel)

        if not isinstance(prepared, PreparedMatch):
            raise TypeError(f"prepared must be a PreparedMatch (from prepare), got {type(prepared).__name__}")
        cfg = _config(config)
        if isinstance(kernels, str) or not set(kernels) <= set(KERNELS):
            raise ValueError(f"kernels must be a subset of {KERNELS}, got {kernels!r}")
        if prepared.version != self._version:
            raise RuntimeError(f"batch prepared for index version {prepared.version}, device copy at "
                               f"{self._version}: prepare it again (or apply the pending deltas first)")
        cuda = launch.cuda()
        B, nw, a = prepared.batch, prepared.n_words, prepared.args
        if out is None:
            out = cuda.device_array((B, nw), np.uint64)
        if counts is None:
            counts = cuda.device_array(B, np.int64)
        if out.ndim != 2 or out.shape[0] < B or out.shape[1] < nw or out.dtype != np.uint64:
            raise ValueError(f"out must be uint64 [>= {B}, >= {nw}]")
        if counts.ndim != 1 or counts.shape[0] < B or counts.dtype != np.int64:
            raise ValueError(f"counts must be int64 [>= {B}]")
        scratch = self.scratch(prepared.n_scratch)
        sim = launch.backend.is_simulator()
        blk = cfg.block_size(sim)
        U = cfg.words_per_thread
        G = cfg.group
        small = launch.default_block()
        by_segment = cfg.list_pass(max(prepared.prep_segments[0], prepared.post_segments[0])) == "segment"
        if "prep" in kernels and by_segment:
            n_seg, longest = prepared.prep_segments
            prep_segment_kernel(small)[(max(1, -(-longest // (small * SEG_LOADS))), max(1, n_seg)), small](
                counts, B, self.pool, a["p_start"], a["p_off"], a["p_dst"], scratch, 0)
        elif "prep" in kernels:
            prep_kernel()[launch.grid_for(max(prepared.n_prep, B), small), small](
                counts, B, self.pool, a["p_start"], a["p_off"], a["p_dst"], scratch, 0)
        tiles = -(-nw // (blk * U))
        cap = launch.SIM_MAX_BLOCKS if sim else launch.sm_count() * cfg.blocks_per_sm
        gx = max(1, min(tiles, max(1, cap // B)))
        min_blocks = cfg.launch_bounds(sim)
        if "match" not in kernels:
            pass
        elif G:
            match_grouped_kernel(blk, U, G, min_blocks)[(gx, B), blk](
                self.rows, scratch, prepared.n_bits, nw, a["req_op"], a["op_row"], a["op_kind"], out, counts)
        else:
            match_kernel(blk, U, min_blocks, cfg.prefetch)[(gx, B), blk](
                self.rows, scratch, prepared.n_bits, nw, a["req_cat"], a["inc_ptr"], a["inc_rows"], a["exc_ptr"],
                a["exc_rows"], out, counts)
        if prepared.n_post and "post" in kernels and by_segment:
            n_seg, longest = prepared.post_segments
            post_segment_kernel(small)[(-(-longest // (small * SEG_LOADS)), n_seg), small](
                out, counts, nw, self.pool, a["extra"], a["q_start"], a["q_off"], a["q_op"], a["q_arg"], scratch, 0)
        elif prepared.n_post and "post" in kernels:
            post_kernel(small)[launch.grid_for(prepared.n_post, small), small](
                out, counts, nw, self.pool, a["extra"], a["q_start"], a["q_off"], a["q_op"], a["q_arg"], scratch, 0)
        return out, counts

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the device rows and list pool (tests: compare with the host index)."""
        return self.rows.copy_to_host(), self.pool.copy_to_host()


@dataclass
class Eligible:
    """A request's eligible set on the device: ``words`` (uint64 bitset) and its ``count``.

    ``count`` is read from the device when asked for (one 8-byte copy)."""

    words: object
    n_ads: int
    _count: object
    _keep: object = None  # the prepared plan's device arrays, alive while kernels may read them

    @property
    def count(self) -> int:
        return int(self._count.copy_to_host()[0])

    def to_mask(self) -> np.ndarray:
        """The eligible set as a host bool ``[n_ads]`` mask (copies the bitset; for checks)."""
        return mask_from_bits(self.words.copy_to_host(), self.n_ads)

    def candidates(self, dtype=np.int32):
        """The eligible slots, ascending, as a device array (``int32``, as the scoring kernels'
        ``candidates`` take, or ``int64``); reads the count (a synchronisation)."""
        return compact(self.words, self.n_ads, self.count, dtype)


@dataclass
class EligibleBatch:
    """Eligible sets of a batch: ``words`` device ``uint64[B, n_words]``, ``counts`` device ``int64[B]``."""

    words: object
    n_ads: int
    _counts: object
    _keep: object = None

    @property
    def counts(self) -> np.ndarray:
        return self._counts.copy_to_host()

    def __len__(self):
        return int(self.words.shape[0])

    def __getitem__(self, b: int) -> Eligible:
        return Eligible(words=self.words[b], n_ads=self.n_ads, _count=self._counts[b:b + 1], _keep=self)

    def to_masks(self) -> np.ndarray:
        host = self.words.copy_to_host()
        return np.stack([mask_from_bits(host[b], self.n_ads) for b in range(host.shape[0])])


def _config(config) -> MatchConfig:
    cfg = MatchConfig() if config is None else config
    if not isinstance(cfg, MatchConfig):
        raise TypeError(f"config must be a MatchConfig, got {type(cfg).__name__}")
    return cfg


def match_eligible(index: DeviceTargetingIndex, profile: Mapping, exclude_slots=None,
                   config: MatchConfig | None = None) -> Eligible:
    """Eligible bitset of one request: live, and every category's rule satisfied by ``profile``.

    Args:
        index: the device index.
        profile: ``{category: value or values}`` (validated with
            :func:`~andromeda_nb.targeting.make_profile`).
        exclude_slots: optional int slots to remove afterwards (e.g. ads the user already
            converted on); out-of-range slots raise.
        config: how the match is launched (:class:`~andromeda_nb.match.config.MatchConfig`;
            default ``MatchConfig()``).

    Returns:
        :class:`Eligible` (device bitset and count).

    Raises:
        RuleError: malformed profile. ValueError: exclude slots out of range. TypeError: an index
        or config of the wrong type.
    """
    if not isinstance(index, DeviceTargetingIndex):
        raise TypeError(f"index must be a DeviceTargetingIndex, got {type(index).__name__}")
    cfg = _config(config)
    index._check_fresh()
    prepared = index.prepare([profile], None if exclude_slots is None else [exclude_slots])
    out, counts = index.launch(prepared, config=cfg)
    return Eligible(words=out[0], n_ads=index.n_ads, _count=counts, _keep=prepared)


def match_batch(index: DeviceTargetingIndex, profiles: Sequence[Mapping], exclude_slots=None,
                config: MatchConfig | None = None) -> EligibleBatch:
    """Eligible bitsets of a batch of requests in as few launches as possible (``MAX_BATCH``
    requests per launch of each kernel).

    Args:
        index, config: as :func:`match_eligible`.
        profiles: one profile per request (at least one).
        exclude_slots: None, or one slot list (or None) per request.

    Returns:
        :class:`EligibleBatch` (``words [B, n_words]``, ``counts [B]`` on the device).
    """
    if not isinstance(index, DeviceTargetingIndex):
        raise TypeError(f"index must be a DeviceTargetingIndex, got {type(index).__name__}")
    cfg = _config(config)
    profiles = list(profiles)
    B = len(profiles)
    if B == 0:
        raise ValueError("match_batch needs at least one profile")
    excl = [None] * B if exclude_slots is None else list(exclude_slots)
    if len(excl) != B:
        raise ValueError(f"{B} profiles but {len(excl)} exclude lists")
    index._check_fresh()
    cuda = launch.cuda()
    out = cuda.device_array((B, max(index.n_words, 1)), np.uint64)
    counts = cuda.device_array(B, np.int64)
    step = _max_batch()
    prepared = [index.prepare(profiles[i:i + step], excl[i:i + step]) for i in range(0, B, step)]
    for j, p in enumerate(prepared):
        i = j * step
        index.launch(p, out[i:i + p.batch], counts[i:i + p.batch], config=cfg)
    return EligibleBatch(words=out, n_ads=index.n_ads, _counts=counts, _keep=prepared)


def compact(words, n_ads: int, count: int, dtype=np.int32):
    """Ascending slots of the set bits of a device bitset ``words uint64[n_words]`` (``count`` of
    them) as a device ``int32`` or ``int64`` array."""
    from .kernels import chunk_count_kernel, compact_kernel

    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"candidates dtype must be int32 or int64, got {dtype}")
    if dtype == np.int32 and n_ads > np.iinfo(np.int32).max:
        raise ValueError("pools beyond 2^31 slots need int64 candidates")
    cuda = launch.cuda()
    w2 = words.reshape(1, words.shape[0]) if words.ndim == 1 else words
    n_words = int(w2.shape[1])
    block = launch.default_block()
    chunk = block * 4
    n_chunks = max(1, -(-n_words // chunk))
    counts = cuda.device_array(n_chunks, np.int64)
    out = cuda.device_array(max(int(count), 1), dtype)
    grid = launch.grid_for(n_chunks, 1)
    chunk_count_kernel(block)[grid, block](w2, 0, n_words, chunk, counts)
    compact_kernel(block)[grid, block](w2, 0, n_words, chunk, counts, out, 0)
    return out[:int(count)]


def match_cpu(index: TargetingIndex, profile: Mapping, exclude_slots=None) -> tuple[np.ndarray, int]:
    """The CPU baseline: the same plan and rows, Numba-parallel over words on the host's cores.

    Returns ``(words uint64[n_words], count)``.
    """
    if isinstance(index, DeviceTargetingIndex):
        index = index.index
    return index.match_cpu(profile, exclude_slots)
