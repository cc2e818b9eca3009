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

import functools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..device import launch
from ..targeting import (WORD_BITS, ProfileBatch, RuleError, TargetingIndex, UpdateBatch, UpdateDelta, make_profile,
                         mask_from_bits, table_slots)
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
    return _planner()[0]


@functools.lru_cache(maxsize=None)
def _planner() -> tuple:
    """(MAX_BATCH, OK, plan_batch_kernel, OP_FIRST, OP_CLOSE, OP_EXC, OP_ZERO), imported on first
    use (the kernels import numba; the package does not until then) and kept: a serving call plans
    a batch and should not pay for import statements."""
    from .kernels import MAX_BATCH, OP_CLOSE, OP_EXC, OP_FIRST, OP_ZERO
    from .plan_kernels import OK, plan_batch_kernel

    return MAX_BATCH, OK, plan_batch_kernel, OP_FIRST, OP_CLOSE, OP_EXC, OP_ZERO


#: the flat int64 arrays a batch's plan is made of, in the order the stager uploads them
PLAN_ARRAYS = ("req_cat", "inc_ptr", "inc_rows", "exc_ptr", "exc_rows", "p_start", "p_off", "p_dst",
               "q_start", "q_off", "q_op", "q_arg", "extra", "req_op", "op_row", "op_kind")


@dataclass
class BatchPlan:
    """A batch of requests planned on the host (:meth:`DeviceTargetingIndex.plan_batch`).

    ``flat``: the :data:`PLAN_ARRAYS` back to back, each padded to at least one element (a zero),
    as the match kernels take them (one upload); ``sizes``: their true lengths; ``arrays``: each
    as a view of ``flat``. ``n_words``, ``n_bits``: the bitset span matched (the pool or a prefix);
    ``n_prep`` / ``n_post``: list entries the prep and post passes read; ``n_scratch``: patch rows;
    ``version``: the index version planned for; ``prep_segments`` / ``post_segments``: the list
    passes' segments, how many and the longest (the segment-grid kernels' shape)."""

    n_words: int
    n_bits: int
    flat: np.ndarray
    sizes: np.ndarray
    n_prep: int
    n_post: int
    n_scratch: int
    version: int
    profiles: list
    prep_segments: tuple
    post_segments: tuple
    index: TargetingIndex  # the host index planned from (for :attr:`plans`)

    @property
    def batch(self) -> int:
        return len(self.profiles)

    @property
    def offsets(self) -> np.ndarray:
        """Where each array starts in ``flat`` (and its end): ``[len(PLAN_ARRAYS) + 1]``."""
        o = np.zeros(len(PLAN_ARRAYS) + 1, np.int64)
        np.cumsum(np.maximum(self.sizes, 1), out=o[1:])
        return o

    @property
    def arrays(self) -> dict:
        o = self.offsets
        return {name: self.flat[o[i]:o[i] + self.sizes[i]] for i, name in enumerate(PLAN_ARRAYS)}

    @property
    def plans(self) -> list:
        """Each request's :class:`~andromeda_nb.targeting.MatchPlan` (computed in Python on demand:
        the byte model and the benchmarks read them; the match needs only the arrays)."""
        return [self.index.plan(make_profile(self.index.schema, p)) for p in self.profiles]


@dataclass
class PreparedMatch:
    """A batch of requests planned and uploaded, ready to launch (:meth:`DeviceTargetingIndex.launch`):
    the host :class:`BatchPlan` (``plan``) and ``args``, its arrays on the device."""

    plan: BatchPlan
    args: dict

    batch = property(lambda self: self.plan.batch)
    plans = property(lambda self: self.plan.plans)
    profiles = property(lambda self: self.plan.profiles)
    n_words = property(lambda self: self.plan.n_words)
    n_bits = property(lambda self: self.plan.n_bits)
    n_prep = property(lambda self: self.plan.n_prep)
    n_post = property(lambda self: self.plan.n_post)
    n_scratch = property(lambda self: self.plan.n_scratch)
    version = property(lambda self: self.plan.version)
    prep_segments = property(lambda self: self.plan.prep_segments)
    post_segments = property(lambda self: self.plan.post_segments)


def _encode_profiles(schema, pos: dict, profiles: list) -> tuple[np.ndarray, np.ndarray]:
    """Profiles as ``(keys, values)``, int64: ``keys = request * n_categories + category``, one
    entry a value. The common containers (a dict of ints and lists of ints) are read directly;
    anything else goes through :func:`~andromeda_nb.targeting.make_profile`, which validates it
    (and raises on a malformed one). Ranges and single-valued categories are checked by the planner."""
    C = len(schema)
    keys: list = []
    vals: list = []
    for b, prof in enumerate(profiles):
        if type(prof) is not dict or not _encode_one(prof, pos, b * C, keys, vals):
            n = len(keys)
            while n and keys[n - 1] >= b * C:  # drop this request's partial entries
                n -= 1
            del keys[n:], vals[n:]
            _encode_one(make_profile(schema, prof), pos, b * C, keys, vals)
    try:
        return np.array(keys, np.int64), np.array(vals, np.int64)
    except OverflowError:  # a value past int64: make_profile names it
        for prof in profiles:
            make_profile(schema, prof)
        raise


def _encode_one(prof: dict, pos: dict, base: int, keys: list, vals: list) -> bool:
    """Append one profile's values; False where a key or value needs :func:`make_profile`."""
    for cat, vs in prof.items():
        ci = pos.get(cat) if type(cat) is str else None
        if ci is None:
            return False
        tv = type(vs)
        if tv is int:
            keys.append(base + ci)
            vals.append(vs)
            continue
        if tv is not list and tv is not tuple and tv is not set and tv is not frozenset:
            return False
        for v in vs:
            if type(v) is not int:
                return False
            keys.append(base + ci)
            vals.append(v)
    return True


def flip_grid(n_rows: int, n_slots: int, block: int, per: int = 16, max_y: int = 65535) -> tuple[tuple, int]:
    """:func:`~.kernels.flip_kernel`'s launch: ``((row blocks, slot blocks), slots a thread)``, at
    least ``per`` slots a thread and more where the slot blocks would pass ``max_y`` (CUDA's
    limit on a grid's second dimension)."""
    per = max(per, -(-n_slots // max_y))
    return (-(-n_rows // block), -(-n_slots // per)), per


class DeviceTargetingIndex:
    """A :class:`~andromeda_nb.targeting.TargetingIndex` with its rows and lists on the device.

    Updates go through :meth:`apply` (host index first, then one kernel on the stream); updating
    the host index directly afterwards makes this copy stale (it then raises).

    ``host_bits``: whether the host index keeps its bitset rows beside this copy. ``"auto"``
    (default) keeps them until the first update that applies (``TargetingIndex.apply(...,
    keep_host_bits=False)``), then drops them
    (:meth:`~andromeda_nb.targeting.TargetingIndex.drop_host_bits`): from there the device works
    out every update's bits from the touched slots' rules (a few codes an ad sent instead of
    ~400 bit flips an ad worked out on the host and sent), and the host saves the rows' memory.
    ``True`` keeps them (updates flip bits on both sides: the host's CPU match and
    :meth:`~andromeda_nb.targeting.TargetingIndex.assert_same` keep working); ``False`` drops
    them now.
    """

    def __init__(self, index: TargetingIndex, staging_regions: int = 4, host_bits="auto"):
        if not isinstance(index, TargetingIndex):
            raise TypeError(f"index must be a TargetingIndex, got {type(index).__name__}")
        if isinstance(host_bits, (bool, np.bool_)):
            host_bits = bool(host_bits)
        elif not (isinstance(host_bits, str) and host_bits == "auto"):
            raise ValueError(f"host_bits must be 'auto', True or False, got {host_bits!r}")
        self.index = index
        self.host_bits = host_bits
        if index.host_bits:
            self.rows = launch.to_device(index.bitsets)
        else:  # its rows live on another device copy only: a rebuild's (the same layout: the same rows)
            rebuilt = index.rebuild()
            self.rows = launch.to_device(rebuilt.bitsets)
            index.adopt_counts(rebuilt)
        if host_bits is False:
            index.drop_host_bits()
        self.pool = launch.to_device(index.pool)
        self._version = index.version
        self._scratch = None
        self._stager = Stager(staging_regions)
        self._schema_view = None
        self._flip = None  # the row meanings and popcounts flip_kernel needs, made on the first rules delta
        self._apply_launch = None  # apply_kernel, bound on the first delta with bit codes or list writes

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

    def check_fresh(self) -> None:
        """RuntimeError when the host index holds updates this device copy has not applied."""
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
        self.check_fresh()
        delta = self.index.apply(batch, keep_host_bits=self.host_bits is True)
        self.apply_delta(delta)
        return delta

    def apply_delta(self, delta: UpdateDelta, also=()) -> tuple:
        """Enqueue one delta returned by ``self.index.apply`` (deltas must come in order: a
        pipeline may run the host side ahead and feed the device later).

        ``also``: int64 arrays staged in the same asynchronous copy as the delta (a pool's table
        rows and slots: one copy a batch, each copy's host overhead paid once). Returns
        ``(buffer, starts)``: ``also[i]`` is on the device at ``buffer[starts[i]:]``, valid until
        the staging ring comes round again (work launched after it on the same stream is ordered
        before any later copy into the same buffer). The delta's kernels are bound launches
        (:class:`~andromeda_nb.device.launch.BoundLaunch`): no Numba dispatch a batch."""
        if delta.version != self._version + 1:
            raise RuntimeError(f"delta for version {delta.version} but the device copy is at {self._version}")
        cuda = launch.cuda()
        if delta.pool_size > self.pool.shape[0]:
            grown = cuda.device_array(delta.pool_size, self.pool.dtype)
            grown[:self.pool.shape[0]].copy_to_device(self.pool, stream=self._stager.stream)
            self._stager.retain(self.pool)
            self.pool = grown
        n_bits, n_pos = delta.bit_codes.size, delta.list_pos.size
        flips = delta.rules is not None and delta.rules[0].size > 0
        parts = ([np.concatenate([delta.bit_codes, delta.list_pos, delta.list_vals])] if n_bits + n_pos else [])
        if flips:
            parts.append(self._flip_payload(*delta.rules))
        also = [np.asarray(a, np.int64) for a in also]
        buf, starts = self._stager.upload_spans(parts + also) if parts or also else (None, [])
        if n_bits + n_pos:
            run = self._bound_apply()
            run.set_array(2, buf, starts[0], n_bits + 2 * n_pos)
            run.set_scalar(3, n_bits)
            run.set_scalar(4, n_pos)
            run.set_grid(launch.grid_for(max(n_bits, n_pos), run.block))
            run()
        if flips:
            self._flip_rows(buf, starts[len(parts) - 1], *delta.rules, delta.version)
        self._version = delta.version
        return buf, starts[len(parts):]

    def _bound_apply(self) -> "launch.BoundLaunch":
        """:func:`~.kernels.apply_kernel` bound to the rows and the current list pool (bound again
        when the pool grows); its buffer, counts and grid are set a batch."""
        from .kernels import apply_kernel

        if self._apply_launch is None or self._apply_launch.args[1] is not self.pool:
            self._apply_launch = launch.BoundLaunch(apply_kernel(), 1, launch.default_block(),
                                                    (self.rows, self.pool, launch.dummy(np.int64), 0, 0, 0))
        return self._apply_launch

    #: touched slots a thread of :func:`~.kernels.flip_kernel` evaluates its row on (more where the
    #: grid's second dimension would pass CUDA's 65,535 blocks), and the pinned buffers the row
    #: popcount changes come back through
    FLIP_SLOTS_PER_THREAD, MAX_GRID_Y, COUNT_BUFFERS = 16, 65535, 4

    def _flip_payload(self, slots, ptr, codes, live) -> np.ndarray:
        """What :meth:`_flip_rows` reads, as one int64 array: the rules, then a zero a row that
        the kernel adds the row's popcount change to."""
        return np.concatenate([slots, live.astype(np.int64), ptr, codes, np.zeros(self.index.n_rows, np.int64)])

    def _flip_rows(self, buf, start, slots, ptr, codes, live, version) -> None:
        """The device half of a batch whose host keeps no bitset rows: the touched slots' bits
        from their final rules (:func:`~.kernels.flip_kernel`, reading ``buf[start:]``, the device
        copy of :meth:`_flip_payload`), and each row's popcount change, copied back
        asynchronously for the host index (:meth:`TargetingIndex.row_count`)."""
        from .kernels import flip_kernel

        cuda, idx = launch.cuda(), self.index
        if self._flip is None:
            f = self._flip = {
                "meaning": launch.to_device(idx.row_meanings()), "group_ptr": launch.to_device(idx.group_ptr),
                "members": launch.to_device(idx.group_members), "cat_m": launch.to_device(idx.cat_m),
                "host": [cuda.pinned_array(idx.n_rows, np.int64) for _ in range(self.COUNT_BUFFERS)],
                "version": [0] * self.COUNT_BUFFERS, "next": 0}
            one = launch.dummy(np.int64)
            f["launch"] = launch.BoundLaunch(flip_kernel(), (1, 1), launch.default_block(), (
                self.rows, one, f["meaning"], f["group_ptr"], f["members"], f["cat_m"], idx.layout.carrier, one, 0, 1))
        f = self._flip
        n, R = int(slots.size), idx.n_rows
        size = 3 * n + 1 + codes.size + R
        change = start + 3 * n + 1 + codes.size  # the rows' popcount changes: the payload's last R
        run = f["launch"]
        grid, per = flip_grid(R, n, run.block, self.FLIP_SLOTS_PER_THREAD, self.MAX_GRID_Y)
        run.set_array(1, buf, change, R)
        run.set_array(7, buf, start, size)
        run.set_scalar(8, n)
        run.set_scalar(9, per)
        run.set_grid(grid)
        run()
        i = f["next"]
        f["next"] = (i + 1) % self.COUNT_BUFFERS
        idx._fold_counts(wait=True, through=f["version"][i])  # the buffer's last change is folded in first
        host = f["host"][i]
        launch.copy_async(host, buf, 8 * R, src_offset=8 * change)
        ev = cuda.event() if launch.backend.is_simulator() else cuda.event(timing=False)
        ev.record(self._stager.stream)
        f["version"][i] = version

        def landed(wait: bool):
            """The batch's popcount changes once their copy landed (waiting with ``wait``), else None."""
            if not (wait or launch.backend.is_simulator() or ev.query()):  # (the simulator runs in order)
                return None
            ev.synchronize()
            return host.copy()

        idx._count_changes.append((version, landed))

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
        arrays = plan.arrays
        views = self._stager.upload([arrays[name] for name in PLAN_ARRAYS])
        args = dict(zip(PLAN_ARRAYS, views))
        # empty segment tables: a zero-length table still needs seg_off[0] == 0 and length-0 dst
        args["p_dst"] = args["p_dst"][:arrays["p_dst"].size]
        args["q_op"] = args["q_op"][:arrays["q_op"].size]
        return PreparedMatch(plan=plan, args=args)

    def _schema_tables(self) -> tuple[dict, np.ndarray]:
        """The planner's view of the schema: its category positions (the schema's own name ->
        index map), and which categories take several values."""
        if self._schema_view is None:
            schema = self.index.schema
            self._schema_view = (schema._pos, np.array([c.multi_valued for c in schema], np.bool_))
        return self._schema_view

    def plan_batch(self, profiles: Sequence[Mapping], exclude_slots=None, n_words: int | None = None,
                   grouped: bool = True) -> "BatchPlan":
        """The host half of :meth:`prepare`: the batch's plans as flat int64 arrays (:data:`PLAN_ARRAYS`),
        not uploaded (a serving loop uploads them into its own buffers). Same arguments and errors;
        ``profiles`` may also be a :class:`~andromeda_nb.targeting.ProfileBatch` (columns, read
        without a Python loop over their values); ``grouped=False`` leaves the grouped match kernel's op arrays empty (``req_op`` all zero).

        Each request's rows are those of :meth:`~andromeda_nb.targeting.TargetingIndex.plan`, laid
        out by a compiled planner (:mod:`.plan_kernels`) from the index's current tables."""
        _, OK, plan_batch_kernel, OP_FIRST, OP_CLOSE, OP_EXC, OP_ZERO = _planner()
        idx = self.index
        columns = isinstance(profiles, ProfileBatch)
        if columns and profiles.schema != idx.schema:
            raise RuleError("profile batch was built for another schema")
        profiles = profiles if columns else list(profiles)
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
        pos, multi = self._schema_tables()
        if columns:  # validated when built: the planner reads the columns
            keys = np.repeat(np.arange(B, dtype=np.int64), np.diff(profiles.ptr)) * len(idx.schema) + profiles.category
            vals = profiles.value
        else:
            keys, vals = _encode_profiles(idx.schema, pos, profiles)
        excl = [None if e is None else table_slots(e, idx.n_ads) for e in excl]
        excl_ptr = np.zeros(B + 1, np.int64)
        np.cumsum([0 if e is None else e.size for e in excl], out=excl_ptr[1:])
        excl_vals = (np.concatenate([e for e in excl if e is not None]).astype(np.int64, copy=False)
                     if excl_ptr[-1] else np.zeros(0, np.int64))
        status, bad, flat, sizes, stats = plan_batch_kernel(
            keys, vals, B, len(idx.schema), idx.cat_m, multi, idx.n_ads, idx.n_rows, idx.layout.carrier, idx.group_ptr,
            idx.group_members, idx.group_base, idx.constrained, idx.cat_group, idx.planning_counts(), idx._vrow,
            idx._vrow_ptr, idx._list_ptr, idx.l_live, idx.l_start, idx.l_len, idx.unc_row, excl_ptr, excl_vals,
            grouped, OP_FIRST, OP_CLOSE, OP_EXC, OP_ZERO)
        if status != OK:
            make_profile(idx.schema, profiles.profile(bad) if columns else profiles[bad])  # raises, naming them
            raise AssertionError(f"the planner refused request {bad} but make_profile accepts it")
        return BatchPlan(n_words=nw, n_bits=n_bits, flat=flat, sizes=sizes, n_prep=int(stats[0]),
                         n_post=int(stats[1]), n_scratch=int(stats[2]), version=self.index.version,
                         profiles=profiles, prep_segments=(int(stats[3]), int(stats[4])),
                         post_segments=(int(stats[5]), int(stats[6])), index=idx)

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
    index.check_fresh()
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
    index.check_fresh()
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
