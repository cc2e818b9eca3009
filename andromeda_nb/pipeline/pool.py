"""``Pool``: one GPU's ad pool, built once, serving requests one at a time or in batches.

The request path of a batch of B requests, all on the device, in stream order::

    match (prep, match, post: eligible bitsets [B, words])
        --H2D--> weights (B images, checked and built on the host while the match runs)
        -> reset -> gather candidates (each bitset to a list of its eligible slots)
        -> score a sample of each list -> seed (the r-th best sample, r from the list's length)
        -> filter pass (each list scored once; scores at or above the seed kept)
        -> final (each request's exact top-k of the kept scores, by ad id)
        --D2H-->  ids, scores and counts of every request, into pinned host buffers; one sync

Everything a call touches is allocated when the pool is built (bitsets, candidate lists, the
seed's sample, the filter's buffers, pinned host buffers) and every launch after the match is
bound once per batch size (:class:`~andromeda_nb.device.launch.BoundLaunch`) and, on a GPU,
captured with the copies around it as one CUDA graph (``launches``), so a call allocates nothing
on the device, makes one driver call for everything after the match, and synchronises the host
once. Without a targeting index a request scores the whole pool
(:func:`~andromeda_nb.score.score_topk`'s fused filter path, its buffers kept).

A request whose answer the seeded path cannot guarantee (its seed above its k-th score, more
scores at or above the seed than the buffer holds, or more eligible ads than its candidate list
holds: ties, dense targeting) is answered again, exactly, by :func:`~andromeda_nb.score.score_topk`
over its eligible bitset. Free slots (ad id -1) are never eligible, so never scored or returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..device import launch
from ..model import AdTable, Request
from ..score.config import KernelConfig, check_config
from ..score.table import FREE, DeviceAdTable, DeviceRequest, check_kernel_shape, rows_max_abs
from ..score.launches import RefusedRequest, check_range, request_images
from ..score.weights import fma_dequant_exact, image_size, mma_f16_image, mma_f16_words
from ..targeting import WORD_BITS, ProfileBatch, TargetingIndex, UpdateDelta, table_slots
from ..topk.api import check_k
from .bound_match import BoundMatch

#: the seed is the r-th best of a 4,096-score sample of a request's candidates, r chosen so that
#: about SEED_MARGIN_X2 / 2 * k candidates reach it, and r at least SEED_MIN_RANK. The kept count
#: is about n / 4,096 * Gamma(r): at 3 k and r >= 16 it falls below k (an exact rerun) on about
#: 3e-5 of requests; at 2.5 k and r = 11 (10^6 candidates, k = 1000) it did on a few in a thousand
#: on the H200
SEED_MARGIN_X2 = 6
SEED_MIN_RANK = 16


@dataclass(frozen=True)
class Retrieved:
    """One request's answer: ``ids [k]`` int64 ad ids (pads -1), ``scores [k]`` float32 (pads -inf),
    best first; ``n_eligible`` ads passed targeting; ``n_scored`` of them got a non-NaN score."""

    ids: np.ndarray
    scores: np.ndarray
    n_eligible: int
    n_scored: int


class Pool:
    """An ad pool on one GPU: the ad table and the targeting index on the device, with every buffer
    a request needs, serving :meth:`retrieve` for one request or a batch.

    Args:
        table: a host :class:`~andromeda_nb.model.AdTable` or a :class:`~andromeda_nb.score.DeviceAdTable`.
            With an index, the pool's slots are the index's: a host table is placed slot by slot by
            ad id (an index slot whose ad the table lacks is an error; the index's free slots become
            free table slots), a device table must already hold the index's ad id in every slot.
        index: a :class:`~andromeda_nb.targeting.TargetingIndex`, a
            :class:`~andromeda_nb.match.DeviceTargetingIndex`, or None (every request scores the
            whole pool). A host index gets a device copy with ``host_bits="auto"``
            (:class:`~andromeda_nb.match.DeviceTargetingIndex`): the first :meth:`apply` drops the
            host's bitset rows and the device works out every update's bits; the host index
            keeps its rules, lists and popcounts (its CPU match then needs ``index.rebuild()``).
        max_batch: requests per call the buffers hold (a larger batch is served in chunks).
        max_k: the largest k a call may ask for (1..4096).
        layout: the device table's layout for a host table: ``"auto"`` takes ``rows`` with an index
            (candidates are gathered: a row is 4 sectors) and ``tiles`` without (a scan).
        candidate_fraction: the longest candidate list a request keeps, as a fraction of the
            pool (``"auto"``: 1/8); a request with more eligible ads is answered over its bitset.
        filter_capacity: scores a request's filter pass may keep (``"auto"``: ``max(4096, 64 *
            max_k)``; the seed aims at about SEED_MARGIN_X2 / 2 * k = 3 k); more (ties at the seed)
            and it is answered again.
        config: the scoring kernels' :class:`~andromeda_nb.score.KernelConfig`.
        launches: how a call enqueues its steps after the match: ``"graph"`` (one CUDA graph a
            request shape, batch size and k, captured on first use and replayed by one driver call),
            ``"bound"`` (each launch and copy bound once, enqueued one by one), or ``"auto"``
            (graphs on a GPU; the simulator has none).

    Raises:
        TypeError / ValueError: mismatched table and index (sizes, ad ids), bad arguments.
    """

    def __init__(self, table, index=None, *, max_batch: int = 64, max_k: int = 1000, layout: str = "auto",
                 candidate_fraction="auto", filter_capacity="auto", config: KernelConfig | None = None,
                 launches: str = "auto"):
        from ..match import DeviceTargetingIndex

        self._sim = launch.backend.is_simulator()
        if launches not in ("auto", "graph", "bound"):
            raise ValueError(f"launches must be 'auto', 'graph' or 'bound', got {launches!r}")
        if launches == "graph" and self._sim:
            raise ValueError("launches='graph' needs a GPU (the simulator has no CUDA graphs)")
        self.launches = ("bound" if self._sim else "graph") if launches == "auto" else launches

        if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) or not 1 <= max_batch <= 4096:
            raise ValueError(f"max_batch must be an int in 1..4096, got {max_batch!r}")
        if isinstance(max_k, bool) or not isinstance(max_k, (int, np.integer)) or not 1 <= max_k <= 4096:
            raise ValueError(f"max_k must be an int in 1..4096 (the largest k a call may ask for), got {max_k!r}")
        self.max_k = int(max_k)
        self.max_batch = int(max_batch)
        self.config = check_config(config)
        if self.config.naive or self.config.tensor_cores:
            raise ValueError("a Pool serves with the generated kernels (fp32 math on the CUDA cores, or "
                             "math='fp16' on the tensor cores): naive and tensor_cores=True are score_topk options")
        if isinstance(index, TargetingIndex):
            index = DeviceTargetingIndex(index)
        if index is not None and not isinstance(index, DeviceTargetingIndex):
            raise TypeError(f"index must be a TargetingIndex, a DeviceTargetingIndex or None, got {type(index).__name__}")
        self.index = index
        # the table and bound launches follow the index through apply(); an update applied to the
        # index directly (slots reused, lists moved) makes the pool stale (retrieve refuses)
        self._index_version = None if index is None else index.version
        self._failed = ""  # why the pool cannot serve any more (an update's device part failed)
        self._scatter = None  # (table, its scale pairs, their bound scatter launch) of Pool.apply, made at the first batch
        if layout == "auto":
            layout = "rows" if index is not None else "tiles"
        self.table = _device_table(table, index, layout)
        if self.config.math == "fp16" and self.table.dtype not in ("fp16", "int8"):
            raise ValueError(f"math='fp16' scores fp16 and int8 tables, this one is {self.table.dtype}")
        self.config.resolved_dequant(self.table)  # dequant="fma" refused up front where it cannot serve
        frac = 1 / 8 if candidate_fraction == "auto" else candidate_fraction
        if isinstance(frac, (bool, np.bool_)) or not isinstance(frac, (int, float, np.integer, np.floating)) or not (
                0 < frac <= 1):
            raise ValueError(f"candidate_fraction must be 'auto' or in (0, 1], got {candidate_fraction!r}")
        cap = max(4096, 64 * self.max_k) if filter_capacity == "auto" else filter_capacity
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
            raise ValueError(f"filter_capacity must be 'auto' or a positive int, got {filter_capacity!r}")
        self._candidate_fraction, self._filter_capacity = float(frac), int(cap)
        self._size()
        #: a :class:`StepTimes` to time each step of the targeted path with events (benchmarks), or
        #: None; a traced call launches its steps one by one (the graph's kernels, between events)
        self.trace = None

    def _size(self) -> None:
        """The sizes that follow the pool's slots, and the state sized by them (dropped: rebuilt on
        the next call), at construction and after the pool grows."""
        self.n_ads = self.table.n_ads
        self.n_words = -(-self.n_ads // WORD_BITS)
        self.candidate_capacity = max(1, min(self.n_ads, int(np.ceil(self._candidate_fraction * self.n_ads))))
        self.filter_capacity = min(self._filter_capacity, max(self.n_ads, 1))  # more than the pool could never fill
        self._buffers = None  # allocated on the first targeted call (sizes known then)
        self._groups: dict = {}  # per request shape: weight images and bound launches
        self._matchers: dict = {}  # per chunk of a batch: the bound match (pipeline.bound_match)
        self._bound_lists = None if self.index is None else self.index.pool  # the list pool they read

    # ------------------------------------------------------------------ public

    @property
    def n_free(self) -> int:
        """Free slots (ad id -1): never scored, never returned."""
        return self.table.n_free

    def retrieve(self, requests, profiles=None, k: int = 100, exclude_slots=None):
        """Top-k ads of one request or a batch: targeting match, fused scoring, top-K, on the device.

        Args:
            requests: a :class:`~andromeda_nb.model.Request` (the gated model), a 1-D user vector
                (the two-tower dot product), or a sequence of them (a batch).
            profiles: with an index, one profile ``{category: values}`` per request (one mapping for
                one request), or a :class:`~andromeda_nb.targeting.ProfileBatch` of them (columns:
                the planner reads them without a Python loop over every value); ignored without an
                index.
            k: ``1 <= k <= max_k``.
            exclude_slots: per request, slots to drop after matching (e.g. ads already seen), or None.

        Returns:
            :class:`Retrieved` for one request, a list for a batch (in request order).

        Raises:
            TypeError / ValueError / RuleError: bad requests, profiles, k or slots, before any launch
                that reads them (arguments, profiles and request shapes before any launch at all; a
                request's weights may be range-checked while its batch's match runs).
        """
        launch.ensure_context()  # this thread may not be the one that built the pool
        k = check_k(k)
        if k > self.max_k:
            raise ValueError(f"k={k} exceeds this pool's max_k={self.max_k} (its buffers' width)")
        # a batch is a list or tuple of requests; a list of numbers is one user vector
        single = not isinstance(requests, (list, tuple)) or (
            len(requests) > 0 and all(isinstance(x, (int, float, np.number)) for x in requests))
        reqs = [requests] if single else list(requests)
        if not reqs:
            raise ValueError("retrieve needs at least one request")
        excl = [exclude_slots] if single else ([None] * len(reqs) if exclude_slots is None else list(exclude_slots))
        if len(excl) != len(reqs):
            raise ValueError(f"{len(reqs)} requests but {len(excl)} exclude lists")
        excl = [None if e is None else table_slots(e, self.n_ads) for e in excl]
        if self.index is None:
            dreqs = [self._device_request(r) for r in reqs]
            out = [self._whole_pool(dr, k, ex) for dr, ex in zip(dreqs, excl)]
            return out[0] if single else out
        if self._failed:
            raise RuntimeError(f"{self._failed}: build a new Pool")
        if self.index.version != self._index_version or self.index.index.version != self._index_version:
            raise RuntimeError("the targeting index was updated after this pool was built (its table would not "
                               "follow the new slots): build a new Pool")
        if profiles is None:
            raise ValueError("a pool with a targeting index needs one profile per request")
        columns = isinstance(profiles, ProfileBatch)
        if not single and not columns and isinstance(profiles, Mapping):
            raise ValueError("a batch of requests takes a list of profiles (one mapping a request) or a ProfileBatch, "
                             "not one mapping")
        profs = profiles if columns else [profiles] if single else list(profiles)
        if len(profs) != len(reqs):
            raise ValueError(f"{len(reqs)} requests but {len(profs)} profiles")
        kinds = self._request_shapes(reqs)  # types, sizes and kernel shapes: no weights read yet
        if self.n_ads == 0:  # nothing to match or score: every answer is pads
            self._request_images(reqs, kinds)  # still refuses a bad request
            self._prepare_match(profs if columns else list(profs), excl)  # and a bad profile
            pad = Retrieved(ids=np.full(k, -1, np.int64), scores=np.full(k, -np.inf, np.float32), n_eligible=0,
                            n_scored=0)
            return pad if single else [pad] * len(reqs)
        # The match reads only the profiles. A batch of one request shape in one chunk (the usual
        # call) has it planned and enqueued first: the requests' weight images are then built and
        # checked on the host while it runs, before any launch that reads them (a refused request
        # leaves only the match's writes to this pool's own buffers, which the next call rewrites).
        early = None
        if self.trace is None and len(kinds) == 1 and len(reqs) <= self.max_batch:
            early = self._prepare_match(profs if columns else list(profs), excl)
            self._ensure_buffers()
            self._launch_match(early)
        shapes = self._request_images(reqs, kinds)
        whole = list(range(len(reqs)))
        chunks = []  # (group, members, images, fp16 images, plans): every profile planned before scoring
        for key, (members, images, f16) in shapes.items():
            group = self._group(key, reqs[members[0]])
            for i in range(0, len(members), self.max_batch):
                part = members[i:i + self.max_batch]
                if early is not None and part == whole:  # matched already (a math split re-plans)
                    plans, matched = early, True
                else:
                    plans, matched = self._prepare_match(profs.take(part) if columns else [profs[j] for j in part],
                                                         [excl[j] for j in part]), False
                chunks.append((group, part, images[i:i + self.max_batch],
                               None if f16 is None else f16[i:i + self.max_batch], plans, matched))
        out: list = [None] * len(reqs)
        for group, part, images, f16, plans, matched in chunks:
            for j, a in zip(part, self._targeted(group, [reqs[j] for j in part], images, f16, plans, k, matched)):
                out[j] = a
        return out[0] if single else out

    def apply(self, update) -> UpdateDelta:
        """Apply a batch of ad creates, changes and retires to the index and the table together.

        The targeting index allocates the slots (a retired ad's slot is reused by a later create);
        each touched slot's ad id, row, bias (and int8 scale) are written on the device in stream
        order, so the next request sees the whole batch. A retired slot gets ad id -1: never
        scored, never returned. When the creates need more slots than are free, the pool first
        grows to twice its slots (or what the batch needs): the one case where the index and the
        table are copied, every slot keeping its place.

        Args:
            update: a :class:`~andromeda_nb.pipeline.PoolUpdate` (the columnar batch format).

        Returns:
            The index's :class:`~andromeda_nb.targeting.UpdateDelta` (``slots``: each op's slot).

        Raises:
            TypeError: not a PoolUpdate. ValueError: a pool without an index, rows of another
            width, rows beyond the table's storage dtype (fp16 overflow). RuleError: the targeting
            ops (a create of a live ad, a change or retire of an unknown one, a retire twice, a
            malformed rule, another schema); all before the pool's contents or capacity change.
            RuntimeError: the index was updated outside the pool.
        """
        from .updates import apply_update

        launch.ensure_context()
        return apply_update(self, update)

    def check(self, update) -> None:
        """Raise what :meth:`apply` would raise for ``update``, changing nothing (a sharded pool
        checks every shard's part before any shard applies one)."""
        from .updates import check_update

        check_update(self, update)

    def _grow(self, n_slots: int) -> None:
        """The pool with ``n_slots`` slots: the index rebuilt from its current rules at that
        capacity (every slot in place, the new ones free) and uploaded, the table copied into the
        prefix of a larger one; the buffers and bound launches rebuilt on the next call."""
        from ..match import DeviceTargetingIndex

        old_dev, old_index = self.index, self.index.index
        table = _grown_table(self.table, n_slots)
        # the old index's options carry over (an int32 list entry type only while the slots fit it)
        list_dtype = old_index.list_dtype if old_index.list_dtype == np.int64 else "auto"
        index = DeviceTargetingIndex(TargetingIndex(old_index.current_rules(), n_slots, layout=old_index.layout,
                                                    list_dtype=list_dtype),
                                     staging_regions=len(old_dev._stager.regions), host_bits=old_dev.host_bits)
        self.index, self.table, self._index_version = index, table, index.version
        self._size()

    # ------------------------------------------------------------------ requests

    def _device_request(self, r) -> DeviceRequest:
        if not isinstance(r, (Request, DeviceRequest, np.ndarray, list, tuple)):
            raise TypeError(f"a request is a Request or a 1-D user vector, got {type(r).__name__}")
        dr = DeviceRequest.of(r) if not isinstance(r, DeviceRequest) else r
        if dr.d != self.table.d:
            raise ValueError(f"request d={dr.d} does not match the pool's d={self.table.d}")
        check_range(dr, self.table, self.config.math)
        return dr

    def _whole_pool(self, dreq: DeviceRequest, k: int, excl) -> Retrieved:
        from ..score.api import score_topk

        eligible = None  # score_topk never scores a free slot
        if excl is not None and excl.size:
            mask = self.table.host_ad_ids != FREE
            mask[excl] = False
            eligible = mask
        top = score_topk(dreq, self.table, k, eligible=eligible, config=self.config)
        n_elig = self.n_ads - self.n_free if eligible is None else int(eligible.sum())
        return Retrieved(ids=top.ids, scores=top.scores, n_eligible=n_elig, n_scored=top.count)

    # ------------------------------------------------------------------ the targeted path

    def _request_shapes(self, reqs: list) -> dict:
        """The requests' kernel shapes ``(model, E, K)`` -> their positions, every request's type and
        size checked (1-D user vectors become :class:`DeviceRequest` in ``reqs``, range-checked)."""
        shapes: dict = {}
        for i, r in enumerate(reqs):
            if type(r) is Request:
                if r.d != self.table.d:
                    raise ValueError(f"request d={r.d} does not match the pool's d={self.table.d}")
                check_kernel_shape(r.d, r.experts)
                shapes.setdefault(("gated", r.experts, r.k_experts), []).append(i)
            else:
                reqs[i] = dr = self._device_request(r)
                shapes.setdefault((dr.model, dr.experts, dr.k_experts), []).append(i)
        return shapes

    def _request_images(self, reqs: list, shapes: dict) -> dict:
        """The requests (of :meth:`_request_shapes`) grouped by shape and math ``(model, E, K, math)``,
        each group's weight images stacked (float32 ``[n, size]``) and, in fp16 math, its per-lane
        fp16 images; every request's weights checked for the ranges its math holds. ``math="auto"``
        serves a request in fp16 math where the mode applies to its shape and it stays within
        fp16's range, else in fp32 (:meth:`~andromeda_nb.score.KernelConfig.with_math`). Gated
        :class:`Request` objects of one shape build their images and range checks in one compiled
        pass over the whole group (:func:`~andromeda_nb.score.launches.request_images`)."""
        cfg, table = self.config, self.table
        out = {}
        for shape, members in shapes.items():
            group = [reqs[j] for j in members]
            images = np.empty((len(group), image_size(shape[0], table.d, shape[1])), np.float32)
            if all(type(r) is Request for r in group):
                try:
                    fp16, f16 = request_images(group, table, cfg, images)
                except RefusedRequest as e:
                    raise ValueError(f"request {members[e.index]} of the batch: {e}") from None
            else:
                drs = [DeviceRequest.of(r) for r in group]
                for b, dr in enumerate(drs):
                    images[b] = dr.image_on_host()
                if cfg.math == "fp16" and any(dr.request is None for dr in drs):
                    raise ValueError("math='fp16' serves the gated model (Requests), not user vectors")
                fp16 = np.array([cfg.with_math(dr, table).math == "fp16" for dr in drs])
                f16 = np.stack([mma_f16_image(dr.request) for dr, m in zip(drs, fp16) if m]) if fp16.any() else None
            # a group splits by math; f16 holds the fp16 members' images, in member order
            if fp16.all():
                out[(*shape, "fp16")] = (members, images, f16)
            elif not fp16.any():
                out[(*shape, "fp32")] = (members, images, None)
            else:
                out[(*shape, "fp32")] = ([m for m, h in zip(members, fp16) if not h], images[~fp16], None)
                out[(*shape, "fp16")] = ([m for m, h in zip(members, fp16) if h], images[fp16], f16)
        return out

    def _targeted(self, group: "_Group", reqs: list, images: np.ndarray, f16, plans: list, k: int,
                  matched: bool = False) -> list:
        """One chunk's answers: its match (unless ``matched``: already enqueued), scoring, top-K and
        answers enqueued, one synchronisation."""
        B = len(reqs)
        buf = self._ensure_buffers()
        stream = buf.stream
        trace = self.trace
        group.stage(B, images, f16)
        graph = group.graph(B, k) if trace is None and self.launches == "graph" else None
        if graph is not None:
            if not matched:
                self._launch_match(plans)
            graph()
        else:
            steps = [("weights", lambda: group.copy_weights(B)),
                     *(() if matched else [("match", lambda: self._launch_match(plans))]),
                     *group.steps(B, k),
                     ("answers", lambda: buf.copy_answers(B))]
            if trace is None:
                for _, step in steps:
                    step()
            else:
                trace.run(steps)
        stream.synchronize()
        counts, elig = buf.host_counts[:B].tolist(), buf.host_elig[:B].tolist()
        ids, scores = buf.host_ids[:B, :k].copy(), buf.host_scores[:B, :k].copy()  # each answer a row of these
        answers = []
        for b in range(B):
            n_elig, (n_scored, kept) = elig[b], counts[b]
            exact = kept >= min(k, n_scored) and kept <= buf.filter_cap and n_elig <= self.candidate_capacity
            if exact:
                answers.append(Retrieved(ids=ids[b], scores=scores[b], n_eligible=n_elig, n_scored=n_scored))
            else:
                answers.append(self._rerun(DeviceRequest.of(reqs[b]), b, k, n_elig, group.config))
        return answers

    def _prepare_match(self, profiles: list, excl: list) -> list:
        """The batch's match plans on the host, a chunk of the match kernels' largest batch each."""
        from ..match.kernels import MAX_BATCH  # here, not at import: the kernels import numba.cuda

        return [self.index.plan_batch(profiles[i:i + MAX_BATCH], excl[i:i + MAX_BATCH], grouped=False)
                for i in range(0, len(profiles), MAX_BATCH)]

    def _launch_match(self, plans: list) -> None:
        from ..match.kernels import MAX_BATCH

        buf = self._buffers
        if self.index.pool is not self._bound_lists:  # an update grew the device list pool
            self._matchers, self._bound_lists = {}, self.index.pool
        for c, plan in enumerate(plans):
            if c not in self._matchers:
                self._matchers[c] = BoundMatch(self.index, buf.bits, buf.elig_counts, c * MAX_BATCH)
            self._matchers[c].run(plan)

    def _rerun(self, dreq: DeviceRequest, b: int, k: int, n_elig: int, config: KernelConfig) -> Retrieved:
        """The exact answer over request b's eligible bitset (the seeded path could not promise one)."""
        from ..score.api import score_topk

        top = score_topk(dreq, self.table, k, eligible=self._buffers.bits[b], config=config)
        return Retrieved(ids=top.ids, scores=top.scores, n_eligible=n_elig, n_scored=top.count)

    def _ensure_buffers(self) -> "_Buffers":
        if self._buffers is None:
            self._buffers = _Buffers(self)
        return self._buffers

    def _group(self, key: tuple, request) -> "_Group":
        """The group of a request shape and math ``(model, E, K, math)``, built on its first request."""
        if key not in self._groups:
            self._groups[key] = _Group(self, DeviceRequest.of(request), key[3])
        return self._groups[key]


def _device_table(table, index, layout: str) -> DeviceAdTable:
    """The pool's device table: ``table`` as it is, or placed on the index's slots by ad id."""
    if isinstance(table, DeviceAdTable):
        if index is not None:
            if table.n_ads != index.n_ads:
                raise ValueError(f"the index has {index.n_ads} slots but the table {table.n_ads}")
            if table.host_ad_ids is not None and not np.array_equal(index.index.ad_ids, table.host_ad_ids):
                raise ValueError("the device table and the index disagree on the ad id of some slot (a pool built "
                                 "from a host AdTable places it on the index's slots)")
        return table
    if not isinstance(table, AdTable):
        raise TypeError(f"table must be an AdTable or a DeviceAdTable, got {type(table).__name__}")
    if index is None:
        return DeviceAdTable(table, layout)
    ids = index.index.ad_ids
    live = ids != FREE
    try:
        rows = table.slots_of(ids[live])
    except KeyError as e:
        raise ValueError(f"the index holds ads the table lacks: {e.args[0]}") from None
    if rows.size != table.n_ads:
        missing = np.setdiff1d(table.ad_ids, ids[live])[:10].tolist()
        raise ValueError(f"the table holds ads the index does not (they could never be served): {missing}")
    if live.all() and np.array_equal(rows, np.arange(table.n_ads)):
        return DeviceAdTable(table, layout)
    n = ids.size
    emb = np.zeros((n, table.d), table.embeddings.dtype)
    emb[live] = table.embeddings[rows]
    bias = np.zeros(n, np.float32)
    bias[live] = table.bias[rows]
    scale = None
    if table.scale is not None:
        scale = np.zeros(n, np.float32)
        scale[live] = table.scale[rows]
    if layout == "tiles":
        from ..score.table import PER_WORD

        W = PER_WORD[table.dtype]
        emb = np.ascontiguousarray(emb.reshape(n, table.d // W, W).transpose(1, 0, 2))
    # free slots hold a zero row and ad id -1: never eligible, never returned
    placed = DeviceAdTable.from_device(launch.to_device(emb), launch.to_device(bias), table.dtype, layout,
                                       scale=None if scale is None else launch.to_device(scale),
                                       ad_ids=launch.to_device(ids.copy()))
    placed._max_abs = placed._max_abs_bound = rows_max_abs(table)  # its finite |a|, without a device pass
    placed._fma_dequant = table.dtype == "int8" and fma_dequant_exact(table.scale)  # (free slots: scale 0)
    return placed


def _grown_table(table: DeviceAdTable, n_slots: int) -> DeviceAdTable:
    """``table`` in ``n_slots`` slots: its slots in place (device-to-device copies), the new ones
    free (a zero row and bias, ad id -1)."""
    from ..match.kernels import fill_kernel

    cuda = launch.cuda()
    n, e = table.n_ads, table.embeddings
    block = launch.default_block()

    def grown(old, shape, value):
        new = cuda.device_array(shape, old.dtype)
        flat = new.reshape(1, new.size)
        fill_kernel()[launch.grid_for(new.size, block), block](flat, value)
        return new

    if table.layout == "rows":
        emb = grown(e, (n_slots, table.d), e.dtype.type(0))
        if n:
            emb[:n].copy_to_device(e)
    else:
        emb = grown(e, (e.shape[0], n_slots, e.shape[2]), e.dtype.type(0))
        for p in range(e.shape[0] if n else 0):
            emb[p, :n].copy_to_device(e[p])
    bias = grown(table.bias, (n_slots,), np.float32(0))
    ids = grown(table.ad_ids, (n_slots,), np.int64(FREE))
    scale = grown(table.scale, (n_slots,), np.float32(0)) if table.dtype == "int8" else None
    if n:
        bias[:n].copy_to_device(table.bias)
        ids[:n].copy_to_device(table.ad_ids)
        if scale is not None:
            scale[:n].copy_to_device(table.scale)
    out = DeviceAdTable.from_device(emb, bias, table.dtype, table.layout, scale=scale, ad_ids=ids)
    out._max_abs, out._max_abs_bound = getattr(table, "_max_abs", None), table.max_abs_bound()
    out._fma_dequant = getattr(table, "_fma_dequant", None)  # the new slots' scale 0 is exact
    return out


class _Buffers:
    """The device and pinned host buffers of the targeted path, sized by the pool."""

    def __init__(self, pool: Pool):
        from ..topk.api import FilterWorkspace

        cuda = launch.cuda()
        B, k = pool.max_batch, pool.max_k
        self.stream = cuda.default_stream()
        self.bits = cuda.device_array((B, max(pool.n_words, 1)), np.uint64)
        self.elig_counts = cuda.device_array(B, np.int64)
        self.cand = cuda.device_array((B, pool.candidate_capacity), np.int32)
        self.cand_counts = cuda.device_array(B, np.int64)
        self.sample_size = _seed_shape()[0] * _seed_shape()[1]
        self.sample = cuda.device_array((B, self.sample_size), np.float32)
        self.sample_offsets = cuda.to_device(np.arange(B + 1, dtype=np.int64) * self.sample_size)
        self.ranks = cuda.device_array(B, np.int64)
        self.filter_cap = pool.filter_capacity
        self.fws = FilterWorkspace.batched(np.zeros(B + 1, np.int64), np.full(B, k, np.int64), cap=self.filter_cap)
        self.host_ids = cuda.pinned_array((B, k), np.int64)
        self.host_scores = cuda.pinned_array((B, k), np.float32)
        self.host_counts = cuda.pinned_array((B, 2), np.int64)
        self.host_elig = cuda.pinned_array(B, np.int64)

    def copy_answers(self, B: int) -> None:
        """Enqueue the copies of B requests' answers and counts into the pinned host buffers (the
        first B rows of each array are contiguous)."""
        f = self.fws
        for dev, host in ((f.out_id, self.host_ids), (f.out_s, self.host_scores), (f.counts, self.host_counts),
                          (self.elig_counts, self.host_elig)):
            launch.copy_async(host, dev, B * (dev.nbytes // dev.shape[0]))


def _seed_shape() -> tuple[int, int]:
    """(threads, samples a thread) of the pool's seed: the batched seed's shape on a GPU (4,096
    samples a request); 32 x 8 in the simulator, which runs every thread as a Python thread (and
    whose tests then reach the sampled seed with a few hundred candidates)."""
    from ..topk.seed_kernels import BATCH_SEED_BLOCK, BATCH_SEED_PER_THREAD

    return (32, 8) if launch.backend.is_simulator() else (BATCH_SEED_BLOCK, BATCH_SEED_PER_THREAD)


class _Group:
    """Per request shape and math (model, E, K, math): the weight images and the bound launches of
    a batch size."""

    def __init__(self, pool: Pool, dreq: DeviceRequest, math: str):
        check_kernel_shape(dreq.d, dreq.experts)
        cuda = launch.cuda()
        self.pool, self.dreq = pool, dreq
        self.config = replace(pool.config, math=math)
        # a batch of B requests' weights, staged as one block of 32-bit words and copied at once:
        # B float32 images, then (fp16 math) B per-lane fp16 images, which the filter pass reads (the
        # sample is scored in fp32 on the CUDA cores: its seed only needs to be close; exactness is
        # checked after). The launches of a batch size are bound to that size's two spans.
        self.size = image_size(dreq.model, dreq.d, dreq.experts)
        self.f16_words = 0
        if math == "fp16":
            if dreq.request is None:
                raise ValueError("math='fp16' serves the gated model (Requests), not user vectors")
            self.f16_words = mma_f16_words(dreq.d, dreq.experts)
        row = self.size + self.f16_words
        self.stage_dev = cuda.device_array(pool.max_batch * row, np.uint32)
        self.stage_host = cuda.pinned_array(pool.max_batch * row, np.uint32)
        self._steps: dict = {}
        self._graphs: dict = {}
        # compile the exact rerun's kernels now, not on the first request that needs them (a rare
        # event whose first occurrence would otherwise stall that call for the compilation)
        from ..score.api import score_topk

        none = launch.cuda().to_device(np.zeros(max(pool.n_words, 1), np.uint64))
        score_topk(dreq, pool.table, pool.max_k, eligible=none, config=self.config)

    def _spans(self, words, B: int) -> tuple:
        """B requests' float32 images ``[B, size]`` and fp16 images ``[B, f16_words]`` (or None) in
        a staging buffer (host or device)."""
        n = B * self.size
        images = words[:n].view(np.float32).reshape(B, self.size)
        return images, (words[n:n + B * self.f16_words].reshape(B, self.f16_words) if self.f16_words else None)

    def stage(self, B: int, images: np.ndarray, f16) -> None:
        """B requests' images into the pinned staging buffer (copied by :meth:`copy_weights`)."""
        host32, host16 = self._spans(self.stage_host, B)
        host32[...] = images
        if host16 is not None:
            host16[...] = f16

    def copy_weights(self, B: int) -> None:
        launch.copy_async(self.stage_dev, self.stage_host, 4 * B * (self.size + self.f16_words))

    def steps(self, B: int, k: int) -> list:
        key = (B, k, self.config.resolved_dequant(self.pool.table))  # a live pool's updates may end "fma"
        if key not in self._steps:
            self._steps[key] = self._bind(B, k)
        return self._steps[key]

    def graph(self, B: int, k: int):
        """The weights' copy, the bound steps and the answers' copies of B requests as one CUDA
        graph (:func:`~andromeda_nb.device.launch.capture_graph`), or None where none is captured."""
        key = (B, k, self.config.resolved_dequant(self.pool.table))
        if key not in self._graphs:
            buf = self.pool._buffers
            steps = self.steps(B, k)
            self._graphs[key] = launch.capture_graph(
                [lambda: self.copy_weights(B), *(step for _, step in steps), lambda: buf.copy_answers(B)])
        return self._graphs[key]

    def _bind(self, B: int, k: int) -> list:
        """The launches after the match for B requests and top-k, bound once."""
        from ..score.fused import fused_kernel
        from .kernels import GATHER_BLOCK, GATHER_WORDS, gather_candidates_kernel, pool_seed_kernel, reset_kernel

        pool, dreq, buf = self.pool, self.dreq, self.pool._buffers
        table, cfg = pool.table, self.config.resolved(dreq, 0, False)
        images32, images16 = self._spans(self.stage_dev, B)
        if cfg.weights == "param":  # a batch's weights differ by request: shared memory, a row each
            cfg = replace(cfg, weights="shared", max_registers=128)
        sample_cfg = replace(cfg, math="fp32")
        block = cfg.threads()
        sim = launch.backend.is_simulator()
        gblock = launch.default_block() if sim else GATHER_BLOCK
        seed_block, per_thread = _seed_shape()
        total = launch.SIM_MAX_BLOCKS if sim else launch.sm_count() * cfg.blocks_per_sm

        def per_request(n_items: int, threads: int) -> int:
            return max(1, min(-(-n_items // threads), max(1, total // B)))

        dummy = launch.dummy
        n_items = buf.cand_counts
        fws = _batch_view(buf.fws, B)
        reset = launch.BoundLaunch(reset_kernel(), 1, gblock, (buf.cand_counts, buf.fws.ks, B, k))
        # the gather: a tile a block where the tiles of the batch fit the resident blocks (one load
        # round and two barriers a block); more tiles than that, each block strides over several
        tiles = -(-pool.n_words // (gblock * GATHER_WORDS))
        resident = launch.SIM_MAX_BLOCKS if sim else launch.sm_count() * max(1, 2048 // gblock)
        gather = launch.BoundLaunch(gather_candidates_kernel(gblock, GATHER_WORDS),
                                    (max(1, min(tiles, resident // B)), B), gblock,
                                    (buf.bits, pool.n_words, buf.cand, buf.cand_counts))
        common = (dreq.model, dreq.d, dreq.experts, dreq.k_experts, table.dtype, table.layout, "candidates", block)
        sample_kernel = fused_kernel(*common, 0, True, sample_cfg.values, sample_cfg.max_registers, 1, 1, False,
                                     "shared", sample_cfg.guard, False, batched=True, sample=buf.sample_size)
        sample = launch.BoundLaunch(sample_kernel, (per_request(buf.sample_size, block), B), block,
                                    (table.words, table.scale, table.bias, images32, dummy(np.uint64), buf.cand,
                                     n_items, table.ad_ids, 0, buf.sample, dummy(np.float32), dummy(np.int32),
                                     dummy(np.int64)))
        seed = launch.BoundLaunch(pool_seed_kernel(seed_block, per_thread, SEED_MARGIN_X2, SEED_MIN_RANK), B,
                                  seed_block, (buf.sample.ravel(), buf.sample_offsets, n_items,
                                               pool.candidate_capacity, k, buf.ranks, buf.fws.seeds, buf.fws.counts,
                                               buf.fws.fill))
        filter_kernel = fused_kernel(*common, 0, True, cfg.values, cfg.max_registers, 1, 1, True, "shared", cfg.guard,
                                     False, batched=True, **{**cfg.kernel_options(table.dtype),  # batches
                                     "dequant": cfg.resolved_dequant(table), "scale_pairs": False})  # read float scales
        images = images16 if images16 is not None else images32
        filt = launch.BoundLaunch(filter_kernel, (per_request(pool.candidate_capacity, block), B), block,
                                  (table.words, table.scale, table.bias, images, dummy(np.uint64), buf.cand,
                                   n_items, table.ad_ids, buf.fws.seeds, buf.fws.buf_s, buf.fws.buf_i, buf.fws.fill,
                                   buf.fws.counts))
        finals = _bound_final(fws, k, table.ad_ids)
        return [("reset", reset), ("gather", gather), ("sample", sample), ("seed", seed), ("filter", filt),
                *((f"final{i}", f) for i, f in enumerate(finals))]


def _bound_final(fws, k: int, ids) -> list:
    """The top-K final's launches (:func:`~andromeda_nb.topk.api.launch_final`), recorded without
    running and bound."""
    from ..topk.api import launch_final

    with launch.Recorder(run=False) as rec:
        launch_final(k, fws, ids)
    return launch.bind_all(rec.launches)


def _batch_view(fws, B: int):
    """The batched filter workspace seen as a batch of its first B requests (the same buffers)."""
    view = object.__new__(type(fws))
    view.__dict__.update(fws.__dict__)
    view.batch = B
    return view

