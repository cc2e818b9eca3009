"""The project's models tuned like the baselines: on a validation split of the training part only,
the same budget for every model.

The split (:meth:`~.data.InteractionData.held_back_start`, the baselines' too; ``split``): with
``"click"`` every user with at least two training clicks loses the last one, which becomes that
user's validation target, requested just before it (its own request context); with ``"session"``
(data with sessions: the synthetic world) every user loses the last training session, requested
with its first click's context, as the held-out part is a new session, and keeps at least one
click. ``"auto"`` (the default) is the session where the data have sessions, else the click. The
popularity the sampler corrects for drops the held-back clicks too. A model trains on what remains,
and the grid point with the best validation recall@100 (targeting applied, the user's remaining
training clicks excluded) wins. The held-out part is never read.

Why the choice: a held-back last click has its own session's earlier clicks in its history, and two
thirds or more of a synthetic session's clicks come from its session's interest, so that split
scores continuing a session, an easier task than the held-out part's new one (demo size, CPU:
single tower 0.430 on the last click, 0.342 on the last session, 0.358 held out). At preset full
the last-click split's choices did worse on the held-out part than the preset's settings (the
ranking model by 0.8 point in two tunings). But at the demo size the session split chose worse
still: on four grid points and two seeds it picked the shorter training both times, 0.8 point
below the held-out part's best, where the last-click split's pick was 0.3 below
(data/results/quality_diagnostics.md). At preset full the session split then chose well: the
ranking model's choice did 0.38 point better held out than the preset's settings and 1.2 better
than the last click's (5 seeds), so it is the default where the data have sessions.

The budget: every model tries the same grid (:data:`GRID`: learning rate x training length); each
point's other settings are the preset's. A second stage (:func:`refine_grid`, on by default in
:func:`~andromeda_nb.analysis.quality.tune_models`) then trains, at the chosen learning rate and
length, each of :data:`REFINE_AXES` scaled down and up with the others kept (negatives, the sampled
softmax's temperature, the width, and a sparse mixture's load-balancing weight: 6 runs a model, 8
for a mixture choosing fewer experts than it has), and keeps the best of those and the first
stage's point. By default (``lengths="own"``) each point trains its own
run with its own schedule (warm-up, cosine decay over that length), so the model validated is the
model the seeds then train (seed 0 against the others): 7.75 preset lengths a learning rate on the
grid's 1/4x-4x. ``lengths="checkpoints"`` is about half the cost: one run a learning rate follows
the longest length's schedule and is validated at each length on the way, so a point ``(lr,
length)`` scores a model whose learning rate had not decayed yet, while the seeds train the point
with its own, decayed schedule. The two differ: at the demo size (single tower, CPU, 300 users)
every shorter length's checkpoint scored above its own run (lr x1/3: 0.077 against 0.063 at x1, 0.040
against 0.037 at x1/2; lr x3: 0.273 against 0.250 and 0.147 against 0.143; data/results/
quality_diagnostics.md): at that step the long run's learning rate has not decayed, and a model
still far from converged gains from it. So checkpoints overrate short lengths, and the seeds then
train a weaker model than the one chosen. On the synthetic world (preset full, ``ad_features=1
weight_decay=1e-4``, H200, 5 seeds, held-out recall@100) the points chosen that way did worse than
the preset's own settings for the single tower (lr x1/3 steps x1: 0.190 against 0.197) and the
ranking model (lr x1/9 steps x1: 0.192 against 0.206), beyond the seeds' 95 % interval, and no
better for the K = 2 mixture (lr x1/3 steps x4, the longest length, whose checkpoint is its own
run's end: 0.200 against 0.207, within it).

Tuning runs with seed 0; the chosen point is then trained with every seed on the whole training
part and evaluated on the held-out part (:func:`~andromeda_nb.analysis.quality.tune_models`, then
``run_expert_count(..., tuned=...)``).

Why lengths from 1/4x to 4x the preset's, chosen on validation: on the synthetic world at the demo
size (10,000 users and ads, 200,000 training clicks, batch 256, CPU, seed 0, 500 users, each length
its own cosine schedule) the K = 2 mixture's recall@100 went from 0.096 after 400 steps (half an
epoch) to 0.345 after 2,000, the single tower's from 0.137 to 0.281, and then back down to 0.187
after 6,000 (training loss 4.2 -> 2.2: it memorises); the true click model scores 0.530. A fixed
length either stops far short of what the data allow or overfits. (2,000 steps at the demo size
are 2.6 epochs; the full preset's 1/4x-4x are 0.375-6 epochs of the 50,000-user world.)

A tuning run's choices can be kept (:func:`save_tuned`, ``python -m andromeda_nb.training --tune
--tuned FILE``) and trained from later (:func:`load_tuned`, ``--tuned FILE`` without ``--tune``), so
the seeds of a long experiment can run in other sessions than its tuning.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import numpy as np

from .data import InteractionData

#: the metric tuning maximises: validation recall at this k (the baselines' too)
TUNE_METRIC_K = 100
#: every model's grid: the preset's learning rate x 1/9 .. 9 and its steps x 1/4 .. 4 (a model's tuning
#: trains 5 x 7.75 preset lengths, each point its own run; 5 x 4 with ``lengths="checkpoints"``).
#: Wide because the narrower 3 x 3 grid (lr x 1/3 .. 3, steps x 1 .. 4) put all three of
#: MovieLens-100K's project models on its edges (lr x3 or x1/3, steps x1; H200, preset full), and
#: then lr x 1/9 .. 9 with steps x 1/2 .. 4 put its ranking model and single tower at steps x1/2
#: (lr x3)
GRID = tuple({"lr_scale": lr, "steps_scale": st} for lr in (1 / 9, 1 / 3, 1.0, 3.0, 9.0)
             for st in (0.25, 0.5, 1, 2, 4))


#: the widest scale :func:`scale_grid` takes either way (1/100x to 100x the preset's)
MAX_SCALE = 100.0


def scale_grid(lr_scales=None, steps_scales=None) -> tuple:
    """The first stage's grid over these learning-rate and step scales (None: :data:`GRID`'s), every
    pair once: a narrower grid for a tuning that must fit a time limit (the longest length bounds one
    run's time). Raises ValueError on a scale outside 1 / :data:`MAX_SCALE` .. :data:`MAX_SCALE`
    (or not a number), or one given twice."""
    lrs = tuple(dict.fromkeys(p["lr_scale"] for p in GRID)) if lr_scales is None else tuple(lr_scales)
    steps = tuple(dict.fromkeys(p["steps_scale"] for p in GRID)) if steps_scales is None else tuple(steps_scales)
    for name, values in (("learning-rate", lrs), ("step", steps)):
        if len(set(values)) != len(values):
            raise ValueError(f"{name} scales given twice: {values}")
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))
               or not 1 / MAX_SCALE <= v <= MAX_SCALE]
        if bad:
            raise ValueError(f"{name} scales must lie within 1/{MAX_SCALE:g} .. {MAX_SCALE:g}, got {bad}")
    return check_grid({"lr_scale": lr, "steps_scale": st} for lr in lrs for st in steps)


#: TrainConfig fields added after configurations were first kept, with the value that gives a
#: configuration (or a run key) kept without them the model it was tuned as (``ad_features``: id
#: embeddings alone; ``interest_experts``: experts reading signal groups)
LEGACY_FIELDS = {"ad_features": 0, "interest_experts": 0, "shared_inputs": 0, "temperature": 1.0, "route_coef": 0.0,
                 "session_history": 0}

#: the second stage (:func:`refine_grid`): around the first stage's point, one setting at a time
#: scaled down and up (TrainConfig fields as ``<field>_scale``; the load-balancing weight only where
#: the model has one: a mixture choosing fewer experts than it has)
REFINE_AXES = {"negatives": (1 / 4, 4.0), "temperature": (1 / 2, 2.0), "width": (1 / 2, 2.0),
               "lb_coef": (1 / 10, 10.0)}

#: how a grid point's length is trained when tuning (:func:`tune_many`)
LENGTHS = ("own", "checkpoints")
#: what the validation holds back (:func:`validation_view`)
SPLITS = ("click", "session")


def validation_view(data: InteractionData, split: str = "auto") -> InteractionData:
    """``data`` without each user's held-back clicks (:meth:`~.data.InteractionData.held_back_start`:
    the last training click, or with ``split="session"`` the last training session; ``"auto"``:
    :meth:`~.data.InteractionData.resolve_split`), which become
    the evaluated users' held-out clicks, requested with the context of the first of them; the other
    fields follow (sequence lengths, the evaluation request's context, popularity, evaluated rows).
    A new object: ``data`` is unchanged."""
    L, start = data.seq_len, data.held_back_start(split)
    rows = np.flatnonzero(start >= 0)
    pos = np.arange(data.seq.shape[1])[None, :]
    held = (pos >= start[:, None]) & (pos < L[:, None]) & (start >= 0)[:, None]
    seq, seq_len, req_ctx = data.seq.copy(), L.copy(), data.req_ctx.copy()
    seq[held] = data.n_ads  # the pad
    seq_len[rows] = start[rows]
    req_ctx[rows] = data.seq_ctx[rows, start[rows]]  # the request just before the first held-back click
    popularity = data.popularity - np.bincount(data.seq[held], minlength=data.n_ads)
    eval_rows = data.eval_rows[start[data.eval_rows] >= 0]
    return replace(data, seq=seq, seq_len=seq_len, req_ctx=req_ctx, popularity=popularity, eval_rows=eval_rows,
                   heldout={r: data.seq[r, start[r]: L[r]].copy() for r in eval_rows.tolist()})


def validation_users(data: InteractionData, n_users: int | None = None, split: str = "auto") -> int:
    """How many users :func:`tune` evaluates (those with held-back clicks, at most ``n_users``)."""
    n = int(np.count_nonzero(data.held_back_start(split)[data.eval_rows] >= 0))
    return n if n_users is None else min(n, int(n_users))


_SCALED = {f"{field}_scale": field for field in ("lr", "steps", *REFINE_AXES)}


def check_grid(grid) -> tuple:
    """``grid`` as a tuple of points, each ``{"lr_scale": s, "steps_scale": t}`` and optionally a
    scale of a :data:`REFINE_AXES` field (``"negatives_scale": 4``), all finite and positive (raises
    ValueError, before anything trains)."""
    if isinstance(grid, (dict, str)) or not hasattr(grid, "__iter__"):
        raise ValueError(f"a grid is a sequence of points {{'lr_scale': .., 'steps_scale': ..}}, got {grid!r}")
    grid = tuple(grid)
    if not grid:
        raise ValueError("an empty grid")
    for point in grid:
        if not isinstance(point, dict) or not {"lr_scale", "steps_scale"} <= set(point) or not set(point) <= set(
                _SCALED):
            raise ValueError(f"a grid point is {{'lr_scale': .., 'steps_scale': ..}} and optionally scales of "
                             f"{', '.join(REFINE_AXES)} ('<field>_scale'), got {point!r}")
        for key, v in point.items():
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not (
                    0 < v and (v < 1e300 if isinstance(v, int) else float(v) < 1e300)):
                raise ValueError(f"{key} must be a finite positive number, got {v!r}")
    return grid


def check_first_stage(grid) -> tuple:
    """``grid`` as a first stage's points (:func:`check_grid`), each of a learning-rate and a step
    scale only: the second stage (:func:`refine_grid`) scales the other settings, and the scorer
    note (:func:`describe`) names a first-stage point by those two (raises ValueError)."""
    grid = check_grid(grid)
    other = sorted({k for p in grid for k in p} - {"lr_scale", "steps_scale"})
    if other:
        raise ValueError(f"a first stage scales the learning rate and the length only, got {', '.join(other)} "
                         "(the second stage, refine_grid, scales the others)")
    return grid


def grid_config(cfg, point: dict):
    """The preset's :class:`~.train.TrainConfig` at a grid point (learning rate, steps and any other
    field the point names scaled; an int field rounded, at least 1)."""
    check_grid([point])
    changes = {}
    for key, scale in point.items():
        field = _SCALED[key]
        v = getattr(cfg, field) * scale
        changes[field] = max(1, int(round(v))) if isinstance(getattr(cfg, field), int) else float(v)
    return replace(cfg, **changes)


def refine_grid(model: str) -> tuple:
    """The second stage's points around a first-stage point: that point itself (``{}``'s scales
    all 1), then each :data:`REFINE_AXES` field scaled down and up, the others kept (the
    load-balancing weight for a mixture choosing fewer experts than it has)."""
    from .train import MODELS

    E, K = MODELS[model]
    axes = [f for f in REFINE_AXES if f != "lb_coef" or (E is not None and K < E)]
    return ({"lr_scale": 1.0, "steps_scale": 1.0},
            *({"lr_scale": 1.0, "steps_scale": 1.0, f"{f}_scale": s} for f in axes for s in REFINE_AXES[f]))


def tune(name: str, data: InteractionData, cfg, n_users: int | None = None, grid=GRID, device="auto",
         progress: bool = False, workers: int = 1, lengths: str = "own", split: str = "auto") -> tuple[dict, list]:
    """The grid point of model ``name`` with the best validation recall@100 (seed 0, at most
    ``n_users`` evaluated users; ties to the point nearest the preset's settings). Returns (best
    point, [(point, validation recall@100), ...] in the grid's order). ``workers``, ``lengths``,
    ``split``: as :func:`tune_many`."""
    return tune_many({name: cfg}, data, n_users, grid=grid, device=device, progress=progress, workers=workers,
                     lengths=lengths, split=split)[name]


def check_budget(budget_s, runs_file) -> None:
    """Refuse a tuning time budget that is not positive seconds, or one without a runs file (the runs
    a budget leaves are resumed from it)."""
    if budget_s is None:
        return
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float, np.integer, np.floating)) \
            or not budget_s > 0:
        raise ValueError(f"budget_s must be None or positive seconds, got {budget_s!r}")
    if runs_file is None:
        raise ValueError("budget_s needs a runs_file: the runs a budget leaves are resumed from it")


class TuningIncomplete(RuntimeError):
    """A tuning stopped at its time budget (:func:`tune_many`'s ``budget_s``) with runs left: the finished
    ones are kept in its runs file, and the same call again resumes there."""


def tune_many(configs: dict, data: InteractionData, n_users: int | None = None, grid=GRID, device="auto",
              progress: bool = False, workers: int = 1, runs_file=None, lengths: str = "own",
              budget_s: float | None = None, split: str = "auto") -> dict:
    """:func:`tune` for each ``{model: preset TrainConfig}`` of ``configs``: ``{model: (best point,
    trials)}``.

    ``split``: what the validation holds back (:func:`validation_view`): each user's last training
    click (``"click"``) or last training session (``"session"``, data with sessions); ``"auto"``
    (default): the session where the data have them (:meth:`~.data.InteractionData.resolve_split`).

    ``lengths``: ``"own"`` trains each grid point as its own run, with the schedule the seeds then
    train it with; ``"checkpoints"`` trains one run a learning rate over the longest length and
    validates the shorter lengths on the way (about half the cost, biased: see the module's notes).

    ``runs_file``: a JSON file that keeps each finished run's validation values as it finishes
    (:func:`run_key` names a run: model, configuration, checkpoints and a digest of the data), so a
    tuning cut off part-way (a time limit) resumes where it stopped: runs found there are not
    trained again. Delete the file to train them again (e.g. after the training code changed). An
    own-length point is also found as the end of a kept run of the same configuration (the longest
    length's run of a ``"checkpoints"`` tuning: training is the same with or without checkpoints).

    ``workers`` > 1 trains that many of the runs (one a model and grid point, or a model and learning
    rate with ``lengths="checkpoints"``) at once, each in its own process (on a CPU's cores, or
    sharing one GPU). A run's result does not depend on where it ran: each trains from seed 0 with
    the calling process's torch thread count. On one GPU the gain is small at preset full: 4 runs at
    once trained the ranking model's runs at ~103 steps/s in all (H200), against ~85 for one run
    alone before its losses were read back every 50 steps (the two changes not measured apart);
    15 at once kept the GPU busy without finishing sooner than one after another.

    ``budget_s``: seconds this call may train (a machine lent for a while). Runs start longest first,
    and a run starts only while it can still finish in time, its time predicted from the runs
    finished so far (:func:`_predicted_seconds`), so a call stops between runs instead of losing the
    runs it cut off; the first ``workers`` runs start whatever the budget, since nothing has been
    timed yet. With runs left, it raises :class:`TuningIncomplete` once the started ones have
    finished and been kept (needs ``runs_file``).
    """
    from ..analysis.quality import eval_rows

    grid = check_grid(grid)
    if n_users is not None and (isinstance(n_users, bool) or not isinstance(n_users, (int, np.integer))
                                or n_users < 1):
        raise ValueError(f"n_users must be None or a positive int, got {n_users!r}")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if lengths not in LENGTHS:
        raise ValueError(f"lengths must be one of {LENGTHS}, got {lengths!r}")
    check_budget(budget_s, runs_file)
    from .train import MODELS

    unknown = [name for name in configs if name not in MODELS]
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    view = validation_view(data, split)
    if not view.eval_rows.size:
        raise ValueError(f"{data.name}: no evaluated user has training clicks to hold back for validation "
                         "with one left to learn from")
    if lengths == "checkpoints" and any(set(p) - {"lr_scale", "steps_scale"} for p in grid):
        raise ValueError("lengths='checkpoints' trains one run a learning rate: a grid scaling other settings "
                         "(refine_grid's) needs lengths='own'")
    rows = eval_rows(view, n_users, seed=0)
    longest = max(p["steps_scale"] for p in grid)
    jobs = []  # (model, its grid points, the run's config, its checkpoints): one a model and point, or model and lr
    for name, cfg in configs.items():
        if lengths == "own":
            for p in grid:
                run = grid_config(cfg, p)
                jobs.append((name, [p], run, [run.steps]))
            continue
        for lr in dict.fromkeys(p["lr_scale"] for p in grid):  # in the grid's order
            points = [p for p in grid if p["lr_scale"] == lr]
            jobs.append((name, points, grid_config(cfg, {"lr_scale": lr, "steps_scale": longest}),
                         [grid_config(cfg, p).steps for p in points]))
    kept = read_runs(runs_file) if runs_file is not None else {}
    digest = data_digest(view, rows)
    keys = [run_key(name, digest, run, stops) for name, _, run, stops in jobs]
    ends = {}  # (model, config, data) -> the value at the end of a kept run (its own schedule's model)
    for key, values in kept.items():
        k = json.loads(key)
        end = str(k["config"]["steps"])
        if end in values:
            ends[json.dumps([k["model"], k["config"], k["data"]], sort_keys=True)] = values[end]
    for (name, _, run, stops), key in zip(jobs, keys):
        end = ends.get(json.dumps([name, asdict(run), digest], sort_keys=True))
        if key not in kept and lengths == "own" and end is not None:
            kept[key] = {str(stops[0]): end}
    # a kept run lacking one of its checkpoints (a file edited by hand) trains again; a run two
    # points share (lengths that round to the same steps) trains once
    todo, seen = [], set()
    for i, key in enumerate(keys):
        if key not in seen and not {str(s) for s in jobs[i][3]} <= set(kept.get(key, ())):
            todo.append(i)
        seen.add(key)

    def write():  # replaced whole: a run killed while writing leaves the last file
        path = Path(runs_file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".part")
            part.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
            part.replace(path)
        except OSError as e:
            raise ValueError(f"cannot keep tuning runs at {path}: {e}") from None

    def keep(i, validation):  # written run by run: a cut-off tuning keeps every finished run
        kept[keys[i]] = {str(k): v for k, v in validation.items()}
        if runs_file is not None:
            write()

    if runs_file is not None:
        write()  # a file that cannot be written refused before anything trains

    todo.sort(key=lambda i: -jobs[i][2].steps)  # longest first: a budget's end is filled by short runs
    start, seen = time.monotonic(), []  # (steps, seconds) of every run finished, failed ones too

    def fits(i) -> bool:  # nothing timed yet: no estimate to go by, the run starts
        return budget_s is None or not seen or (
            time.monotonic() - start + _predicted_seconds(seen, jobs[i][2].steps) <= budget_s)

    def timed(i, began, validation=None):
        seen.append((jobs[i][2].steps, time.monotonic() - began))
        if validation is not None:
            keep(i, validation)

    left = []  # runs the budget did not start
    if workers == 1 or len(todo) <= 1:
        for i in todo:
            if not fits(i):
                left.append(i)
                continue
            name, _, run, stops = jobs[i]
            began = time.monotonic()
            timed(i, began, _validated_run(name, view, rows, run, stops, device, progress))
    else:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        import torch

        # spawn: a forked child cannot use a CUDA context its parent made; the data go to each worker
        # once (a full world's validation view pickles to ~200 MB), not with each run
        with ProcessPoolExecutor(min(workers, len(todo)), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_start_worker, initargs=(torch.get_num_threads(), view, rows)) as pool:
            waiting, running, failed = list(todo), {}, []

            def submit():  # keep `workers` runs going, each one that still fits the budget
                while waiting and len(running) < workers:
                    i = waiting.pop(0)
                    if fits(i):
                        running[pool.submit(_worker_run, jobs[i][0], *jobs[i][2:], device)] = (i, time.monotonic())
                    else:
                        left.append(i)

            submit()
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:  # every finished run kept, even after another one failed
                    i, began = running.pop(f)
                    try:
                        timed(i, began, f.result())
                    except Exception as e:  # noqa: BLE001 (raised below, once the other runs are kept)
                        timed(i, began)  # its time still counts toward the estimate
                        failed.append(e)
                submit()
            if failed:
                raise failed[0]
    if left:
        raise TuningIncomplete(f"tuning stopped at its time budget ({budget_s:.0f} s left to this stage): "
                               f"{len(left)} of the {len(todo)} runs this stage had to train left; "
                               f"{len(todo) - len(left)} finished and kept in "
                               f"{runs_file}: the same call again resumes there")
    done = [{int(k): v for k, v in kept[key].items()} for key in keys]
    out = {}
    for name in configs:
        value = {}
        for (job_name, points, _, stops), validation in zip(jobs, done):
            if job_name == name:
                for p, stop in zip(points, stops):
                    value[id(p)] = validation[stop]
        trials = [(p, value[id(p)]) for p in grid]
        # ties (e.g. two lengths that round to the same steps in a tiny preset) go to the point
        # nearest the preset's settings
        best = max(trials, key=lambda t: (t[1], -sum(abs(np.log(v)) for v in t[0].values())))
        out[name] = best[0], trials
    return out


def _predicted_seconds(seen, steps: int) -> float:
    """A run's seconds as a fixed cost (set-up, validation) plus a rate times its steps, from the
    ``(steps, seconds)`` of the runs finished so far: the rate, the lowest seconds a step among them
    (the longest runs', where the fixed cost is spread thinnest); the fixed cost, the most any of
    them took beyond that rate. So it predicts at least each finished run's own time at its length
    (runs slowed by others sharing the device included)."""
    rate = min(t / max(s, 1) for s, t in seen)
    return max(t - rate * s for s, t in seen) + rate * steps


def data_digest(view: InteractionData, rows) -> str:
    """A digest of the validation data and the users a tuning's runs are scored on."""
    import hashlib

    h = hashlib.sha1(view.name.encode())
    for a in (view.seq, view.seq_len, view.seq_ctx, view.req_ctx, view.demo, view.ad_cats, np.asarray(rows),
              *(view.heldout[r] for r in np.asarray(rows))):
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


#: TrainConfig fields that change only a mixture (what its experts read, how its gate is trained): a
#: model without experts (the single tower, the ranking model) trains the same run whatever they say
MIXTURE_FIELDS = ("interest_experts", "shared_inputs", "route_coef")


def run_key(name: str, digest: str, run, stops) -> str:
    """The name a tuning run is kept under in a runs file: the model, its whole configuration (the
    mixture-only fields at their defaults for a model without experts: the same run), its checkpoints and the
    digest of its data (:func:`data_digest`)."""
    from .train import MODELS

    config = asdict(run)
    if MODELS.get(name, (None,))[0] in (None, 1):  # the ranking model, the single tower
        config.update({f.name: f.default for f in fields(run) if f.name in MIXTURE_FIELDS})
    return json.dumps({"model": name, "config": config, "stops": [int(s) for s in stops], "data": digest},
                      sort_keys=True)


def runs_file_of(tuned_file) -> Path:
    """Where a tuning that keeps its choices in ``tuned_file`` keeps its finished runs:
    ``<name>.runs.json`` beside it (``tuned.json`` -> ``tuned.runs.json``)."""
    path = Path(tuned_file)
    return path.with_name(path.stem + ".runs.json")


def read_runs(path) -> dict:
    """The runs kept in a runs file (``{}`` for no file yet), checked: ValueError naming the file
    unless it is one (``{run key: {steps: validation value}}``)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder: name a file to keep tuning runs in")
    if not path.exists():
        return {}
    try:
        kept = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read tuning runs from {path}: {e}") from None
    if not (isinstance(kept, dict) and all(_is_run_key(k) for k in kept) and all(
            isinstance(v, dict) and v and all(k.isascii() and k.isdigit() and k == str(int(k))
                                              and isinstance(x, (int, float)) and not isinstance(x, bool)
                                              and 0 <= x <= 1 for k, x in v.items())
            for v in kept.values())):
        raise ValueError(f"{path} is not a file of tuning runs ({{run key: {{steps: validation recall in 0..1}}}}, "
                         "each key a run_key)")
    return {_with_legacy_fields(k): v for k, v in kept.items()}


def _fill_legacy_fields(config: dict) -> bool:
    """Give a configuration kept before a TrainConfig field existed that field at its
    :data:`LEGACY_FIELDS` value (its old behaviour), in place; whether any was missing."""
    missing = {f: v for f, v in LEGACY_FIELDS.items() if f not in config}
    config.update(missing)
    return bool(missing)


def _with_legacy_fields(key: str) -> str:
    """A run key kept before a TrainConfig field existed, as :func:`run_key` writes it now."""
    k = json.loads(key)
    return json.dumps(k, sort_keys=True) if _fill_legacy_fields(k["config"]) else key


def _is_run_key(key: str) -> bool:
    """Whether ``key`` has :func:`run_key`'s form (a JSON object naming a model, a configuration with
    its steps, the checkpoints and the data's digest)."""
    try:
        k = json.loads(key)
    except json.JSONDecodeError:
        return False
    return (isinstance(k, dict) and isinstance(k.get("model"), str) and isinstance(k.get("data"), str)
            and isinstance(k.get("config"), dict) and isinstance(k["config"].get("steps"), int)
            and isinstance(k.get("stops"), list) and all(isinstance(s, int) for s in k["stops"]))


_WORKER = {}  # a tuning worker process's validation data (_start_worker)


def _start_worker(threads: int, view: InteractionData, rows) -> None:
    import torch

    torch.set_num_threads(threads)  # the caller's count: the same arithmetic as one process
    _WORKER.update(view=view, rows=rows)


def _worker_run(name: str, run, stops, device) -> dict:
    return _validated_run(name, _WORKER["view"], _WORKER["rows"], run, stops, device, False)


def _validated_run(name: str, view: InteractionData, rows, run, stops, device, progress) -> dict:
    """``{steps: validation recall@100}`` of one run of model ``name`` on the validation view at each of
    ``stops`` (seed 0)."""
    from ..analysis.quality import recalls, retrieve_top
    from .train import train_model

    def validate(tm) -> float:
        return recalls(view, rows, retrieve_top(tm, rows, TUNE_METRIC_K), [TUNE_METRIC_K])[f"recall@{TUNE_METRIC_K}"]

    tm = train_model(name, view, run, seed=0, device=device, progress=progress, checkpoints=stops, validate=validate)
    return dict(tm.validation)


def describe(point: dict, grid=GRID, lengths: str = "own", refined: dict | None = None,
             split: str | None = None) -> str:
    """The tuned point for a results row's scorer column (``lengths``: how the tuning trained its
    lengths, :func:`tune_many`), and which of its axes (of three values or more: with two, either is
    an edge) sit at the grid's edge (a better point may lie past it); ``refined``: the second
    stage's point (:func:`refine_grid`), where one was trained; ``split``: what the validation held
    back (:func:`validation_view`: ``"click"`` or ``"session"``; None: not said)."""
    from .baselines import grid_edges

    edges = [e for e in grid_edges(point, grid) if len({p[e] for p in grid}) >= 3]
    longest = max(p["steps_scale"] for p in grid)
    if lengths not in LENGTHS:
        raise ValueError(f"lengths must be one of {LENGTHS}, got {lengths!r}")
    how = "each length its own run" if lengths == "own" else f"length by early stopping in a x{longest:g} run"
    more = ""
    if refined is not None:  # the second stage's point (refine_grid): its one field scaled, or none
        check_grid([{**point, **refined}])
        scaled = {k: v for k, v in refined.items() if k not in ("lr_scale", "steps_scale") and v != 1}
        more = "; second stage: " + (", ".join(f"{_SCALED[k]} x{v:g} (grid edge)" for k, v in scaled.items())
                                     or "kept (no setting scaled down or up did better)")
    said = "" if split is None else f" of last {split}s"
    return (f"tuned on the validation split{said}: lr x{point['lr_scale']:.3g}, steps x{point['steps_scale']:g} ({how})"
            + (f" (grid edge: {', '.join(edges)})" if edges else "") + more)


def _config_fields() -> dict:
    from .train import TrainConfig

    return {f.name: f.type for f in fields(TrainConfig)}


def read_tuned(path) -> dict:
    """The whole file of kept tuned configurations, ``{dataset: {"preset": name, "models": {model:
    {"config": TrainConfig fields, "scorer": note}}}}``, checked: ValueError naming the file and
    what is wrong (unreadable, not this format, a configuration of another version)."""
    path = Path(path)
    try:
        kept = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read tuned configurations from {path}: {e}") from None
    types = _config_fields()

    def bad(what):
        return ValueError(f"{path} is not a file of tuned configurations: {what}")

    if not isinstance(kept, dict):
        raise bad("its top level is not an object")
    for ds, entry in kept.items():
        if not (isinstance(entry, dict) and set(entry) == {"preset", "models"} and isinstance(entry["preset"], str)
                and isinstance(entry["models"], dict)):
            raise bad(f"{ds!r} is not {{'preset': name, 'models': {{...}}}}")
        for m, v in entry["models"].items():
            if not (isinstance(v, dict) and set(v) == {"config", "scorer"} and isinstance(v["scorer"], str)
                    and isinstance(v["config"], dict)):
                raise bad(f"{ds}/{m} is not {{'config': {{...}}, 'scorer': note}}")
            _fill_legacy_fields(v["config"])
            if set(v["config"]) != set(types):
                raise bad(f"{ds}/{m}'s configuration has fields {sorted(v['config'])}, this version's TrainConfig "
                          f"{sorted(types)}")
            for k, x in v["config"].items():
                ok = (isinstance(x, int) and not isinstance(x, bool)) if types[k] == "int" else (
                    isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x))
                if not ok:
                    raise bad(f"{ds}/{m}'s {k} is {x!r}, not a finite {types[k]}")
    return kept


def check_tuned_file(path) -> dict:
    """What :func:`read_tuned` holds at ``path`` (``{}`` for no file yet), or ValueError unless
    tuned configurations can be kept there (before a tuning run spends its time): not a folder, in
    a folder that exists or can be made, a file of this format if it exists."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder: name a file to keep tuned configurations in")
    parent = next((q for q in (path.parent, *path.parent.parents) if q.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"cannot keep tuned configurations at {path}: {parent} is a file")
    return read_tuned(path) if path.exists() else {}


def check_tuned_use(path, datasets, preset: str, models, tune: bool) -> None:
    """ValueError unless the file ``path`` can serve a run over ``datasets`` at ``preset``: a
    tuning run (``tune``) must be able to keep its choices there; any other run must find every
    model of ``models`` (None: all of :data:`~.train.MODELS`) tuned there (:func:`load_tuned`)."""
    from .train import MODELS

    if tune:
        check_tuned_file(path)
        read_runs(runs_file_of(path))
        return
    for ds in datasets:
        load_tuned(path, ds, preset, tuple(MODELS) if models is None else tuple(models))


def save_tuned(path, dataset: str, preset: str, tuned: dict) -> Path:
    """Keep ``tuned`` (:func:`~andromeda_nb.analysis.quality.tune_models`' ``{model: (TrainConfig,
    scorer note)}``, tuned at ``preset``) in the JSON file ``path`` under ``dataset``: merged with
    the models kept there for the same preset, replacing an entry of another preset. Returns the
    path."""
    path = Path(path)
    kept = check_tuned_file(path)
    entry = kept.get(dataset)
    if entry is None or entry["preset"] != preset:
        entry = kept[dataset] = {"preset": preset, "models": {}}
    entry["models"].update({m: {"config": asdict(c), "scorer": note} for m, (c, note) in tuned.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    return path


def load_tuned(path, dataset: str, preset: str, models) -> dict:
    """The tuned configurations of ``models`` on ``dataset`` that :func:`save_tuned` kept at
    ``preset``: ``{model: (TrainConfig, scorer note)}``. Raises ValueError for a missing or
    malformed file, another preset, or a model it does not hold (a model trained from it must
    have been tuned)."""
    from .train import TrainConfig

    path = Path(path)
    if not path.exists():
        raise ValueError(f"no tuned configurations at {path} (tune first: --tune --tuned {path})")
    entry = read_tuned(path).get(dataset)
    if entry is None:
        raise ValueError(f"{path} holds no tuned configuration on {dataset}")
    if entry["preset"] != preset:
        raise ValueError(f"{path} holds {dataset}'s configurations tuned at preset {entry['preset']!r}, not {preset!r}")
    kept = entry["models"]
    missing = [m for m in models if m not in kept]
    if missing:
        raise ValueError(f"{path} holds no tuned configuration of {missing} on {dataset} (it has {sorted(kept)})")
    return {m: (TrainConfig(**kept[m]["config"]), kept[m]["scorer"]) for m in models}
