"""The pool suite's measurements (:mod:`.pool`): ``Pool.apply`` end to end and on the device,
requests while update batches arrive, and updates interleaved with requests checked against a
rebuild, a host mirror of the table and the float64 oracle."""

from __future__ import annotations

import time

import numpy as np

from . import harness
from .pipeline import D, E, K, KE, _host_profile, _is_topk_of_scores, _log, _quantiles, _row, _timed, _verify

#: (ops a batch, batches timed) of the apply rows
APPLY_BATCHES = ((1_000, 20), (10_000, 10), (100_000, 5))

#: the request latency during updates (:func:`_during_rows`, on the 10^7-ad pool): updates offered
#: a second, their batch, timed requests (~1 s of requests, ~100 batches: 200 requests spanned ~20
#: batches, too few for a p99 that two runs agree on)
DURING_RATE, DURING_BATCH, DURING_CALLS = 100_000, 1_000, 1_000
#: the soak (:func:`_soak_rows`, on the 10^7-ad pool): updates, their batch, requests, their call
#: size and the checkpoints
SOAK_UPDATES, SOAK_BATCH, SOAK_REQUESTS, SOAK_REQUEST_BATCH, SOAK_CHECKPOINTS = 10 ** 6, 10_000, 10 ** 4, 25, 10
#: the soak's time budget: past it, it stops at its next checkpoint (each rebuilds the 10^7-ad index)
SOAK_SECONDS = 420
#: the largest pool whose index the checks rebuild, and that grows in the apply and during phases.
#: Above it (the 10^8-ad world) neither fits the GPU host's 128 GB: ten times what 10^7 ads took on
#: the host (rules 4.1 GB: a CSR per column, 8-byte pointers; the index's rules read back 3.8 GB;
#: a rebuild's rows 1.8 GB), the device's rows copied back and the updates' rules by slot come to
#: ~130 GB at 10^8. Its world gets spare slots instead
#: (:data:`SPARE_SLOTS`; growth is measured at 10^7) and its answers are checked by sampling
#: (:func:`_verify_sampled`)
REBUILD_MAX_SLOTS = 5 * 10 ** 7
#: a pool's spare slots above :data:`REBUILD_MAX_SLOTS`: the phases' batches retire as many ads as
#: they create (a third each), so the free slots drift by ~10^3 over ~1.5 x 10^6 ops
SPARE_SLOTS = 10 ** 6
#: slots whose match the sampled check compares with the oracle (rules read back, sets evaluated)
SAMPLE_SLOTS = 20_000


def _pool_row(*args, **kw) -> dict:
    """A row of the pool suite (:func:`.pipeline._row`'s columns)."""
    r = _row(*args, **kw)
    r["suite"] = "pool"
    return r


def _apply_rows(env, ceil, world, pool, reqs, profiles, out_dir, batches=APPLY_BATCHES, busy=None) -> list[dict]:
    """Pool.apply of random batches (:class:`~.targeting_world.UpdateStream`: a third creates, a
    third changes, a third retires, each create and change with a new fp16 row), built beforehand
    in the documented format (:class:`~andromeda_nb.pipeline.PoolUpdate`): ``apply_end_to_end`` is
    the wall time of the call with a final sync (then a request queued after it sees the batch),
    warm (a first batch grows the pool once: the world has no spare slots), beside the device time
    of the same batch sizes; ``apply_device`` is that device time alone: CUDA events around the
    batch's copies and kernels (``Pool.trace``) behind a busy kernel. Checked after the timed
    batches: the host index equals a rebuild of its rules, the device rows equal the host's on
    sampled words, the device table's ad ids equal the index's on every slot, and sampled requests
    equal the reference (CPU match on the index, top-k of the kernel's scores). Where the host time
    of a batch of the first two sizes goes: the sections ``apply_<slots>_<size>`` of :func:`.harness.host_profile_file`.
    ``batches``: (ops a batch, batches timed) a size; ``busy(ms)``: the kernel queued ahead of the
    events (default :func:`.harness.busy`)."""
    import types

    from ..device import launch
    from ..pipeline import PoolUpdate, StepTimes
    from ..targeting import RETIRE
    from .targeting_world import UpdateStream

    cuda = launch.cuda()
    stream = UpdateStream(world, seed=23)
    rng = np.random.default_rng(29)

    def update(size):
        batch = stream.batch(size)
        emb = (rng.standard_normal((size, D)) * 0.5).astype(np.float32)
        return PoolUpdate(batch, emb, rng.standard_normal(size).astype(np.float32), batch.ops != RETIRE).checked()

    busy = harness.busy if busy is None else busy
    pool.apply(update(batches[0][0]))  # warm: compiles the scatter, grows the pool once
    cuda.synchronize()
    measured = []
    for size, calls in batches:
        made = [update(size) for _ in range(2 * calls + 1)]
        pool.apply(made[0])
        cuda.synchronize()
        walls = []
        for b in made[1:calls + 1]:
            t0 = time.perf_counter()
            pool.apply(b)
            cuda.synchronize()
            walls.append(time.perf_counter() - t0)
        # the same sizes again, device time alone: the busy kernel must outlast the host's part of
        # the device step (the delta's concatenation, the pinned copies, the launches), or the
        # events time the host too: 1.5x the whole call's wall time covers it with room
        busy_ms = max(2.0, 1.5e3 * _quantiles(walls)[0])
        pool.trace = StepTimes(lambda: busy(busy_ms))
        try:
            for b in made[calls + 1:]:
                pool.apply(b)
            cuda.synchronize()
            device = [c["apply"] for c in pool.trace.calls]
        finally:
            pool.trace = None
        measured.append((size, calls, walls, device))
    for size, _ in batches[:2]:
        profiled = iter([update(size) for _ in range(10)])
        _host_profile(lambda: (pool.apply(next(profiled)), cuda.synchronize()), 10, out_dir,
                      f"apply_{pool.n_ads}_{size}")
    index = pool.index.index
    checks = []
    reqs, profs = reqs[:3], profiles[:3]
    if pool.n_ads <= REBUILD_MAX_SLOTS:
        why, ref = _index_vs_rebuild(pool)
        checks.append(f"FAILED {why}" if why else "index (device rows and lists, host rules) = rebuild")
    same_ids = np.array_equal(pool.table.ad_ids.copy_to_host(), index.ad_ids)
    checks.append("table ids = index ids" if same_ids else "FAILED table ids != index ids")
    if pool.n_ads <= REBUILD_MAX_SLOTS:
        shim = types.SimpleNamespace(index=ref, dev=pool.index, n=pool.n_ads)  # the CPU match runs on the rebuild
        checks.append(_verify(pool, shim, reqs, profs, pool.retrieve(reqs, profs, K)))
        del ref
    else:
        checks.append(_verify_sampled(pool, reqs, profs, pool.retrieve(reqs, profs, K)))
    ok = all(not c.startswith("FAILED") for c in checks)
    verified = ("ok: " if ok else "FAILED: ") + "; ".join(checks)
    spare = "" if pool.n_ads <= REBUILD_MAX_SLOTS else "; a world with spare slots (it does not grow at this size)"
    out = []
    for size, calls, walls, device in measured:
        wall, p99 = _quantiles(walls)
        dev, dev99 = _quantiles(device)
        r = _pool_row(env, ceil, "apply_end_to_end", pool.n_ads, size, wall, p99, dev, size, 0, verified,
                      notes=(f"{calls} batches of {size:,} mixed creates / changes / retires, wall with a final sync "
                             f"(updates a second = items_per_s); device_seconds: the median of {calls} more batches "
                             f"(apply_device){spare}"))
        r.update(requests_per_s="", achieved_TBps="", fraction_of_read_ceiling="", bytes_per_item="")
        out.append(r)
        r = _pool_row(env, ceil, "apply_device", pool.n_ads, size, dev, dev99, dev, size, 0, verified,
                      notes=(f"{calls} batches of {size:,}: the device time of the batch's copies and kernels (the "
                             "index's bit flips and list entries, the table's slots), CUDA events behind a busy kernel"))
        r.update(requests_per_s="", achieved_TBps="", fraction_of_read_ceiling="", bytes_per_item="")
        out.append(r)
    return out


def _during_rows(env, ceil, world, pool, reqs, profiles, n, rate=DURING_RATE, calls=DURING_CALLS,
                 batch=DURING_BATCH, k=K) -> list[dict]:
    """One request at a time (``calls`` calls of Pool.retrieve, batch 1), first alone, then while
    update batches of ``batch`` random ops arrive at ``rate`` updates/s (generated beforehand):
    before each request the loop applies the next batch if it has arrived (at most one: updates
    and requests interleave, a backlog does not starve the requests), and the request's latency is
    its own call (the batch's device work precedes it in stream order). When apply cannot keep up,
    a batch precedes every request and the row reports the rate achieved. Answers: the last call's,
    against the reference."""
    from ..device import launch
    from ..pipeline import PoolUpdate
    from ..targeting import RETIRE
    from .targeting_world import UpdateStream

    cuda = launch.cuda()
    stream = UpdateStream(world, seed=53, n_templates=min(100_000, n))
    rng = np.random.default_rng(59)

    def update():
        tb = stream.batch(batch)
        emb = (rng.standard_normal((batch, D)) * 0.5).astype(np.float32)
        return PoolUpdate(tb, emb, rng.standard_normal(batch).astype(np.float32), tb.ops != RETIRE).checked()

    pool.apply(update())  # warm (a first batch may grow the pool: the world has no spare slots)
    for q in range(3):
        pool.retrieve(reqs[q], profiles[q], k)
    cuda.synchronize()
    alone = _timed(lambda: pool.retrieve(reqs[0], profiles[0], k), calls)
    pending = [update() for _ in range(calls)]  # at most one a request, made outside the timing
    lat, applied, t_apply = [], 0, 0.0
    t0 = time.perf_counter()
    for c in range(calls):
        if int(rate * (time.perf_counter() - t0)) // batch > applied:  # the next batch has arrived
            ta = time.perf_counter()
            pool.apply(pending[applied])
            t_apply += time.perf_counter() - ta
            applied += 1
        q = c % len(reqs)
        tr = time.perf_counter()
        out = pool.retrieve(reqs[q], profiles[q], k)
        lat.append(time.perf_counter() - tr)
    elapsed = time.perf_counter() - t0
    verified = (_verify(pool, _IndexView(pool), [reqs[q]], [profiles[q]], [out], k) if pool.n_ads <= REBUILD_MAX_SLOTS
                else _verify_sampled(pool, [reqs[q]], [profiles[q]], [out], k))
    achieved = applied * batch / elapsed
    rows = []
    for variant, xs in (("retrieve_alone", alone), ("retrieve_during_updates", lat)):
        p50, p99 = _quantiles(xs)
        notes = ("one request a call, no updates" if variant == "retrieve_alone" else
                 f"updates offered at {rate:,.0f}/s in batches of {batch:,}, applied {achieved:,.0f}/s "
                 f"({applied * batch:,} in {elapsed:.2f} s; {t_apply:.2f} s of it in apply); latency = the "
                 f"retrieve call alone; p50 {p50 / _quantiles(alone)[0]:.2f}x, p99 "
                 f"{p99 / _quantiles(alone)[1]:.2f}x the latency alone")
        r = _pool_row(env, ceil, variant, n, 1, p50, p99, float("nan"), 1, 0, verified, access="bitset", notes=notes)
        r.update(items_per_s="", achieved_TBps="", fraction_of_read_ceiling="", device_seconds="",
                 bytes_per_item="", math=pool.config.math)
        rows.append(r)
    return rows


class _IndexView:
    """What :func:`_verify` reads of a world, from a pool that has taken updates: its host index,
    or a rebuild of its rules where the device holds the only rows (the CPU match needs them)."""

    def __init__(self, pool):
        idx = pool.index.index
        self.index, self.dev, self.n = (idx if idx.host_bits else idx.rebuild()), pool.index, pool.n_ads


def _verify_sampled(pool, reqs, profiles, outs, k: int = K, n_sample: int = SAMPLE_SLOTS, seed: int = 0) -> str:
    """:func:`.pipeline._verify` for a pool whose index no rebuild fits (above
    :data:`REBUILD_MAX_SLOTS`): the sampled requests' answers against the reference over the
    device's own match (the top-k of the kernel's scores among the slots it matched, and its
    count), and that match against the oracle on ``n_sample`` random slots (their current rules read
    back from the host index, the sets evaluated: :func:`~andromeda_nb.reference.match`). The full
    index = rebuild check runs on the 10^7-ad pool (apply phase, soak)."""
    from .. import reference
    from ..match import match_eligible
    from ..targeting import make_profile

    index = pool.index.index
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(index.n_ads, min(n_sample, index.n_ads), replace=False))
    rules = index.rules_of_slots(sample)
    bad = []
    sampled = sorted({0, len(outs) // 2, len(outs) - 1})
    for b in sampled:
        eligible = match_eligible(pool.index, profiles[b])
        elig = eligible.to_mask()
        oracle = reference.match(rules, make_profile(index.schema, profiles[b]))
        if not np.array_equal(elig[sample], oracle):
            bad.append(f"request {b}: the match differs from the oracle at {int((elig[sample] != oracle).sum())} "
                       f"of {sample.size} sampled slots")
            continue
        if not _is_topk_of_scores(pool, reqs[b], outs[b], elig, eligible.count, k):
            bad.append(f"request {b}: its answer differs from the top-k of the kernel's scores over its match")
    head = (f"ok: {len(sampled)}/{len(sampled)} sampled requests" if not bad else
            f"FAILED: {len(sampled) - len(bad)}/{len(sampled)} sampled requests")
    return (f"{head} equal the reference over the device's match (top-k of the kernel's scores), the match = the "
            f"oracle on {sample.size:,} sampled slots" + (f" ({'; '.join(bad)})" if bad else ""))


def _index_vs_rebuild(pool) -> tuple[str, object]:
    """The pool's index against a rebuild of its rules: the device's rows and lists, the host's
    rules, lists and popcounts (the device's, where it works out the bits), and the host's rows
    where it keeps them. Returns (what differs or '', the rebuild)."""
    host = pool.index.index
    ref = host.rebuild()
    try:
        if host.host_bits:
            host.assert_same(ref)
        rows, lists = pool.index.snapshot()
        host.assert_same(ref, bitsets=rows, pool=lists)
    except AssertionError as e:
        return f"index != rebuild ({e})", ref
    return "", ref


class _HostMirror:
    """What the device table must hold, kept on the host from the updates alone: each slot's row
    words, bias and ad id (-1 free), started from a copy of the table."""

    def __init__(self, table):
        self.words = table.words.copy_to_host()
        self.bias = table.bias.copy_to_host()
        self.ids = table.ad_ids.copy_to_host()

    def follow(self, update, slots) -> None:
        """An applied :class:`~andromeda_nb.pipeline.PoolUpdate`, op by op in order (``slots``: each
        op's slot, the delta's): a create or a change with a row writes it, a retire zeroes the slot."""
        from ..targeting import RETIRE

        top = int(slots.max(initial=-1)) + 1
        if top > self.ids.size:  # the pool grew: new slots are free and zero
            extra = max(top, 2 * self.ids.size) - self.ids.size
            self.words = np.concatenate([self.words, np.zeros((extra, self.words.shape[1]), np.uint64)])
            self.bias = np.concatenate([self.bias, np.zeros(extra, np.float32)])
            self.ids = np.concatenate([self.ids, np.full(extra, -1, np.int64)])
        rows = update.embeddings.astype(np.float16).view(np.uint64).reshape(len(update), -1)
        ops, ids = update.targeting.ops, update.targeting.ad_ids
        for j in range(len(update)):
            s = slots[j]
            if ops[j] == RETIRE:
                self.words[s], self.bias[s], self.ids[s] = 0, 0.0, -1
                continue
            self.ids[s] = ids[j]
            if update.sets_row[j]:
                self.words[s], self.bias[s] = rows[j], update.bias[j]

    def check(self, pool) -> str:
        """'' when the device table equals the mirror (every word, bias and id), else what differs."""
        t = pool.table
        n = t.ad_ids.shape[0]
        if n > self.ids.size:
            return f"the device table has {n:,} slots, the mirror {self.ids.size:,}"
        for name, dev, host in (("ad ids", t.ad_ids, self.ids[:n]), ("biases", t.bias, self.bias[:n]),
                                ("rows", t.words, self.words[:n])):
            got = dev.copy_to_host()
            if not np.array_equal(got, host):
                bad = np.flatnonzero((got != host).reshape(n, -1).any(axis=1))
                return f"{name} differ at {bad.size:,} slots (first {bad[:4].tolist()})"
        return ""


def _float64_check(index, mirror, req, profile, out, k: int = K) -> str:
    """'' when ``out`` (one request's answer) is the float64 oracle's top-k over the live eligible
    ads (the CPU match on ``index``, a rebuild of the pool's, scores in float64 from the mirror's
    rows), up to near-ties; else why not."""
    from .. import checks, reference
    from ..model import AdTable

    words, count = index.match_cpu(profile)
    elig = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:mirror.ids.size])
    elig = elig[mirror.ids[elig] >= 0]
    if out.n_eligible != elig.size:
        return f"n_eligible {out.n_eligible} != {elig.size} live eligible ads"
    emb = mirror.words[elig].view(np.float16).reshape(elig.size, -1)
    sub = AdTable(embeddings=emb, bias=mirror.bias[elig], scale=None, ad_ids=mirror.ids[elig], dtype="fp16")
    ref = reference.score(req, sub)
    got = checks.compare_topk_float64(out.ids, ref, k, sub.ad_ids, swappable=checks.near_tie_ads(req, sub))
    return "" if got.ok else got.message


def _soak_run(env, ceil, n: int, updates=SOAK_UPDATES, batch=SOAK_BATCH, requests=SOAK_REQUESTS,
              request_batch=SOAK_REQUEST_BATCH, checkpoints=SOAK_CHECKPOINTS, k=K) -> dict:
    """The soak (:func:`_soak_rows`, its sizes) on its own world of ``n`` ads with spare slots (its
    batches never grow the pool: the checkpoints' rebuilds stay at ``n`` slots) and a pool built
    from a host table in fp32 math."""
    from ..datasets import synthetic as syn
    from ..model import AdTable, Request
    from ..pipeline import Pool
    from ..score import KernelConfig
    from .targeting_world import World

    _log(f"soak world of {n:,} ads")
    world = World(n, spare=2 * batch, host_bits="auto")  # as a user's pool: the device works out the bits
    try:
        rng = np.random.default_rng(47)
        table = AdTable.from_float(rng.standard_normal((n, D), np.float32), rng.standard_normal(n, np.float32),
                                   dtype="fp16", ad_ids=world.rules.ad_ids)
        pool = Pool(table, world.dev, max_batch=request_batch, max_k=k, config=KernelConfig(math="fp32"))
        del table
        profiles = syn.generate_profiles(world.schema, 64, seed=203)
        reqs = [Request.random(D, E, KE, rng) for _ in range(64)]
        return _soak_rows(env, ceil, world, pool, reqs, profiles, n, updates=updates, batch=batch, requests=requests,
                          request_batch=request_batch, checkpoints=checkpoints, k=k, templates=min(100_000, n),
                          seconds=SOAK_SECONDS)
    finally:
        world.free()


def _soak_rows(env, ceil, world, pool, reqs, profiles, n, updates=SOAK_UPDATES, batch=SOAK_BATCH,
               requests=SOAK_REQUESTS, request_batch=SOAK_REQUEST_BATCH, checkpoints=SOAK_CHECKPOINTS, k=K,
               templates=100_000, seconds=SOAK_SECONDS) -> dict:
    """Random update batches (:class:`~.targeting_world.UpdateStream`) interleaved with requests
    on one pool: ``updates`` updates in batches of ``batch``, ``requests`` requests in calls of
    ``request_batch`` spread evenly between them. At ``checkpoints`` evenly spaced points the host
    index and its device copy equal a rebuild of its rules, the device table equals a host mirror
    kept from the updates alone (every row word, bias, ad id), the table's ad ids equal the index's, and the last call's
    first and last requests equal the float64 oracle over the live eligible ads (fp32 math; the
    CPU match on the host index), up to near-ties. A run past ``seconds`` stops at its next
    checkpoint (the row says how far it got). One row: updates/s and requests/s over the run."""
    from ..device import launch
    from ..pipeline import PoolUpdate
    from ..targeting import RETIRE
    from .targeting_world import UpdateStream

    cuda = launch.cuda()
    stream = UpdateStream(world, seed=41, n_templates=templates)
    rng = np.random.default_rng(43)
    mirror = _HostMirror(pool.table)
    n_batches = max(1, updates // batch)
    calls_per_batch = max(1, requests // request_batch // n_batches)
    every = max(1, n_batches // checkpoints)
    failures, passed, sampled, t_apply, t_req, t_check, served = [], 0, 0, 0.0, 0.0, 0.0, 0
    start, done = time.perf_counter(), 0
    for i in range(n_batches):
        tb = stream.batch(batch)
        emb = (rng.standard_normal((batch, D)) * 0.5).astype(np.float32)
        update = PoolUpdate(tb, emb, rng.standard_normal(batch).astype(np.float32), tb.ops != RETIRE).checked()
        t0 = time.perf_counter()
        delta = pool.apply(update)
        cuda.synchronize()
        if i:  # the first batch and calls compile their kernels: timed apart
            t_apply += time.perf_counter() - t0
        else:
            first = time.perf_counter() - t0
        mirror.follow(update, delta.slots)
        for c in range(calls_per_batch):
            pick = rng.integers(0, len(reqs), request_batch)
            t0 = time.perf_counter()
            outs = pool.retrieve([reqs[q] for q in pick], [profiles[q] for q in pick], k)
            if i:
                t_req += time.perf_counter() - t0
                served += request_batch
            else:
                first += time.perf_counter() - t0
        done = i + 1
        if done % every == 0 or done == n_batches:
            t0 = time.perf_counter()
            differs, ref = _index_vs_rebuild(pool)
            t_index = time.perf_counter() - t0
            why = [differs] if differs else []
            if not np.array_equal(pool.table.ad_ids.copy_to_host(), pool.index.index.ad_ids):
                why.append("table ids != index ids")
            table = mirror.check(pool)
            if table:
                why.append(f"table != mirror: {table}")
            for b in sorted({0, request_batch - 1}):
                sampled += 1
                msg = _float64_check(ref, mirror, reqs[pick[b]], profiles[pick[b]], outs[b], k)
                if msg:
                    why.append(f"request {b}: {msg}")
            del ref  # (a whole index: its rows are gigabytes at 10^7 ads)
            if why:
                failures.append(f"after batch {done}: " + "; ".join(why))
            else:
                passed += 1
            t_check += time.perf_counter() - t0
            _log(f"soak: {done * batch:,} updates ({t_apply:.1f}s in apply), {served:,} requests ({t_req:.1f}s), "
                 f"checkpoint {passed + len(failures)} {'ok' if not why else 'FAILED'} ({t_check:.1f}s in checks, "
                 f"this one's index against its rebuild {t_index:.1f}s)")
            if time.perf_counter() - start > seconds and done < n_batches:
                break
    n_checks = passed + len(failures)
    verified = (f"ok: {passed}/{n_checks} checkpoints (index and its device copy = rebuild, device table = host "
                f"mirror of the updates, table ids = index ids, {sampled} sampled requests = float64 oracle over the live ads)"
                if not failures else "FAILED: " + " | ".join(failures[:3]))
    total = done * batch
    cut = (f"; stopped at the {seconds:.0f} s budget after {total:,} of {n_batches * batch:,} updates"
           if done < n_batches else "")
    timed = done - 1  # the rates leave out the first batch and its calls (compilation)
    if not timed:  # a one-batch run: its only batch, compilation included
        t_apply, t_req, timed, served = first, first, 1, calls_per_batch * request_batch
    r = _pool_row(env, ceil, "soak", n, batch, t_apply / timed, t_apply / timed, float("nan"), batch, 0,
             verified, notes=(f"{total:,} updates in batches of {batch:,} ({timed * batch / t_apply:,.0f} updates/s "
                              f"in apply), {done * calls_per_batch * request_batch:,} requests in calls of "
                              f"{request_batch} ({served / t_req:,.0f} requests/s), {n_checks} checkpoints; rates "
                              f"without the first batch and its calls ({first:.1f} s: compilation); pool {n:,} -> "
                              f"{pool.n_ads:,} slots, fp32 math{cut}"))
    r.update(requests_per_s=f"{served / t_req:.6e}", achieved_TBps="", fraction_of_read_ceiling="", device_seconds="",
             bytes_per_item="", seconds_p99="", math=pool.config.math)
    return r
