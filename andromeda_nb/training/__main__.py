"""``python -m andromeda_nb.training``: train and evaluate every model, seed and dataset of the
quality experiments (expert count K, precision; ``--baselines``: the tuned standard baselines) and
merge the rows into ``<out>/quality.csv``."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from ..provenance import is_committed_results

#: the exit status of a tuning that stopped at its --tune-budget with runs left (EX_TEMPFAIL: run again)
EXIT_TUNING_LEFT = 75


def _kept_runs_line(tuned) -> str:
    """What a tuning run with ``--tuned FILE`` starts from: the runs kept beside FILE (reused where a
    run of this tuning has the same model, settings and data), or none."""
    from ..training.tuning import read_runs, runs_file_of

    runs = runs_file_of(tuned)
    if not runs.exists():
        return f"tuning: no runs kept at {runs} yet: every run trains"
    n = len(read_runs(runs))
    return f"tuning: {n} run{'' if n == 1 else 's'} kept at {runs}: those this tuning asks for are not trained again"


def _parse_settings(ap, items) -> dict:
    """``--set KEY=VALUE ...`` as TrainConfig fields, each checked by building a configuration with it
    (a usage error naming the item, before anything trains)."""
    from dataclasses import fields

    from .train import TrainConfig

    names = {f.name for f in fields(TrainConfig)}
    defaults = {f.name: getattr(TrainConfig(), f.name) for f in fields(TrainConfig)}
    kv = {}
    for item in items:
        key, eq, text = item.partition("=")
        if key in kv:
            ap.error(f"--set names {key} twice")
        if not eq or key not in names:
            ap.error(f"--set takes KEY=VALUE with KEY a TrainConfig field ({', '.join(sorted(names))}), got {item!r}")
        try:
            value = int(text) if text.lstrip("-").isdigit() else float(text)
            if isinstance(defaults[key], int) and isinstance(value, float) and value.is_integer():
                value = int(value)  # a count written as 1e3 or 6000.0
            TrainConfig(**{key: value})
        except ValueError as e:
            ap.error(f"--set {item}: {e}")
        kv[key] = value
    try:  # together: settings that exclude each other (interest_experts and shared_inputs)
        TrainConfig(**kv)
    except ValueError as e:
        ap.error(f"--set {' '.join(items)}: {e}")
    return kv


#: a non-negative decimal number, as a command-line scale's numerator or denominator
_NUMBER = r"\s*(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*"


def _scale(text: str) -> float:
    """A grid scale from the command line: a positive number or fraction (``1/3``), at most
    :data:`~.tuning.MAX_SCALE` either way (:func:`~.tuning.scale_grid` checks the range)."""
    parts = text.split("/")
    if len(parts) > 2 or not all(re.fullmatch(_NUMBER, part) for part in parts):
        raise argparse.ArgumentTypeError(f"a scale is a positive number or a fraction like 1/3, got {text!r}")
    num, den = float(parts[0]), float(parts[1]) if len(parts) == 2 else 1.0
    if num == 0 or den == 0:
        raise argparse.ArgumentTypeError(f"a scale is finite and positive, got {text!r}")
    return num / den


def _given(ap, args, *flags) -> list[str]:
    """The ``flags`` the command line set to something other than their defaults."""
    def dest(flag):
        return flag.lstrip("-").replace("-", "_")

    return [f for f in flags if getattr(args, dest(f)) != ap.get_default(dest(f))]


def _profile(args, preset: str) -> int:
    """--profile-steps: each dataset's and model's step profile, printed and written to
    <out>/training_profile.csv (replaced whole: one run's table)."""
    from pathlib import Path

    import pandas as pd

    from ..analysis.quality import PRESETS, load_data
    from ..provenance import commit_id
    from .profiling import profile_steps
    from .train import MODELS

    rows = []
    for ds in args.datasets:
        data = load_data(ds, preset, data_dir=args.data_dir)
        for name in args.models or MODELS:
            r = profile_steps(name, data, PRESETS[preset].cfg(ds, name), steps=args.profile_steps, device=args.device)
            rows.append({"dataset": ds, "preset": preset, "settings": " ".join(args.set), **r})
            print(f"{ds} {name}: {r['wall_ms']:.2f} ms a step wall, {r['device_ms']:.2f} ms device "
                  f"({r['device_over_wall']:.2f}), {r['launches']:.0f} launches; {r['top_ops']}", flush=True)
    import torch

    frame = pd.DataFrame(rows).assign(torch=torch.__version__, commit=commit_id(),
                                      timestamp=pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds"))
    path = Path(args.out) / "training_profile.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, lineterminator="\r\n")
    print(f"{len(frame)} rows to {path}")
    return 0


def main(argv=None) -> int:
    from ..analysis.quality import DATASETS, PRESETS, SESSION_DATASETS, refresh_compute, run_all

    ap = argparse.ArgumentParser(prog="python -m andromeda_nb.training", description=__doc__.replace("``", ""))
    ap.add_argument("--preset", default="full", choices=sorted(PRESETS),
                    help="sizes and training settings (andromeda_nb.analysis.quality.PRESETS): smoke (tests, "
                         "seconds), demo (sized for a CPU), full (the committed rows, sized for a GPU); default full")
    ap.add_argument("--out", default="data/results",
                    help="folder of quality.csv (rows are merged by key); the default is the committed tables'")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS),
                    help="default: both")
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="model seeds (default: the preset's)")
    ap.add_argument("--models", nargs="+", default=None,
                    help="a subset of the models (default: all six: single_tower mixture_k1 mixture_k2 mixture_k4 "
                         "dense_mixture ranking)")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="override TrainConfig fields for every model, e.g. --set steps=10 batch=256")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--data-dir", default="data/ml-100k", help="MovieLens-100K's folder (fetched there if missing)")
    ap.add_argument("--scoring-csv", default="data/results/scoring.csv")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--tune", action="store_true",
                    help="tune every model's learning rate and length on the training part's validation split first "
                         "(the same grid each: andromeda_nb.training.tuning)")
    ap.add_argument("--tune-only", action="store_true", help="--tune, then no seed trains; needs --tuned FILE, "
                                                              "from which the seeds train in a later run")
    ap.add_argument("--tune-split", default=None, choices=["auto", "click", "session"],
                    help="with --tune: the validation holds back each user's last training click or last training "
                         "session (data with sessions: the synthetic world); auto (default): the session where the "
                         "data have them, else the click (InteractionData.resolve_split)")
    ap.add_argument("--tune-lengths", default=None, choices=["own", "checkpoints"],
                    help="with --tune: each grid point trained as its own run, the schedule its seeds train with "
                         "(default), or each length a checkpoint of one run a learning rate (about half the cost; "
                         "biased toward the longest length and low learning rates)")
    ap.add_argument("--workers", type=int, default=1,
                    help="with --tune: runs trained at once, each in its own process (CPU cores; on one GPU they "
                         "share it: 4 at once trained ~103 steps/s in all, one alone ~85 before losses were read "
                         "back every 50 steps)")
    ap.add_argument("--tune-budget", type=float, default=None, metavar="SECONDS",
                    help="with --tune or --tune-only and --tuned FILE: tuning runs start, longest first, only while "
                         "they can finish within SECONDS of the command's start (all datasets together; seeds are "
                         "not budgeted), their time predicted from the runs finished so far (the first --workers "
                         "runs start whatever it says: nothing is timed yet), so it stops between runs; "
                         f"with runs left it exits with status {EXIT_TUNING_LEFT} before any seed trains, and the same "
                         "command again resumes from FILE's runs")
    ap.add_argument("--tune-lrs", nargs="+", type=_scale, default=None, metavar="SCALE",
                    help="with --tune: the first stage's learning-rate scales, e.g. 1/3 1 3 (default 1/9 1/3 1 3 9)")
    ap.add_argument("--tune-steps", nargs="+", type=_scale, default=None, metavar="SCALE",
                    help="with --tune: the first stage's step scales, e.g. 0.5 1 2 (default 0.25 0.5 1 2 4; the "
                         "longest bounds one run's time)")
    ap.add_argument("--no-refine", action="store_true",
                    help="with --tune: the first stage only (learning rate x length); by default a second stage "
                         "scales each model's negatives, temperature, width and (sparse mixtures) load-balancing "
                         "weight down and up around the first stage's point, one at a time "
                         "(andromeda_nb.training.tuning.refine_grid)")
    ap.add_argument("--experiment", default="expert_count", metavar="NAME",
                    help="the trained and validation rows' experiment (default expert_count, the main table): "
                         "another name, e.g. tuned_session or variant_<change>, keeps a run's rows beside the main "
                         "ones instead of replacing them (quality.csv merges rows by key, experiment among it)")
    ap.add_argument("--tuned", default=None, metavar="FILE",
                    help="with --tune: keep the chosen configurations in FILE (JSON, merged) and each finished "
                         "run beside it (FILE's name .runs.json: a cut-off tuning run again resumes there); without: "
                         "train the configurations FILE keeps (a tuning run's seeds in a later session)")
    ap.add_argument("--save-tops", action="store_true",
                    help="keep each model's targeted top-100 per seed in <out>/tops (only overlap@100_ranking needs "
                         "them): models trained in separate runs get those rows from "
                         "andromeda_nb.analysis.quality.overlap_rows_from_tops([dirA/tops, dirB/tops], "
                         "pd.concat([load_results(dirA/quality.csv), load_results(dirB/quality.csv)])), "
                         "merged with write_rows")
    ap.add_argument("--compute-only", action="store_true",
                    help="only refresh the compute-per-ad rows (FLOPs, bytes, kernel ads/s from --scoring-csv); no training")
    ap.add_argument("--profile-steps", type=int, default=None, metavar="N",
                    help="no quality rows: time N training steps of each model (after 10 untimed ones), wall clock "
                         "beside its kernels' device time (torch.profiler), and write <out>/training_profile.csv "
                         "(andromeda_nb.training.profiling: whether a step waits on the GPU or on the host)")
    ap.add_argument("--baselines", nargs="*", default=None, metavar="NAME",
                    help="only the standard baselines (all, or those named: most_popular itemknn_cosine itemknn_bm25 "
                         "als bpr ease), tuned on the training part's validation split; CPU (the implicit library)")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be at least 1, got {args.workers}")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be at least 1, got {args.threads}")
    if args.seeds is not None and min(args.seeds) < 0:
        ap.error(f"--seeds must be non-negative, got {args.seeds}")
    if args.device != ap.get_default("device") and args.baselines is None and not args.compute_only:  # they refuse it
        from ..training.train import pick_device

        try:
            pick_device(args.device)
        except ValueError as e:
            ap.error(str(e))
    if (args.set and args.experiment == ap.get_default("experiment") and not args.baselines
            and is_committed_results(args.out)):
        ap.error("--set changes the models, and their rows would replace the main table's (quality.csv merges rows "
                 "by key, and the settings are not in it): name the run's experiment (--experiment variant_<change>) "
                 "or write elsewhere (--out build/q)")
    if args.tune_only and (args.seeds is not None or args.tuned is None):
        ap.error("--tune-only trains no seed and keeps its choices only in --tuned FILE: "
                 + ("drop --seeds" if args.seeds is not None else "give --tuned FILE"))
    if args.tune_budget is not None and not (args.tune_budget > 0 and args.tune_budget != float("inf")):
        ap.error(f"--tune-budget takes positive finite seconds, got {args.tune_budget}")
    if args.tune_budget is not None and not ((args.tune or args.tune_only) and args.tuned is not None):
        ap.error("--tune-budget goes with --tune or --tune-only and --tuned FILE (where the runs it leaves resume)")
    if args.no_refine and not (args.tune or args.tune_only):
        ap.error("--no-refine says how --tune tunes: give it with --tune or --tune-only")
    if (args.tune_lrs is not None or args.tune_steps is not None) and not (args.tune or args.tune_only):
        ap.error("--tune-lrs and --tune-steps say what --tune tries: give them with --tune or --tune-only")
    try:
        from ..training.tuning import scale_grid

        tune_grid = None if args.tune_lrs is None and args.tune_steps is None else scale_grid(args.tune_lrs,
                                                                                             args.tune_steps)
    except ValueError as e:
        ap.error(str(e))
    try:
        from ..analysis.quality_results import check_experiment

        check_experiment(args.experiment)
    except ValueError as e:
        ap.error(str(e))
    if args.tune_lengths is not None and not (args.tune or args.tune_only):
        ap.error("--tune-lengths says how --tune trains a length: give it with --tune or --tune-only")
    if args.tune_split is not None and not (args.tune or args.tune_only):
        ap.error("--tune-split says what --tune validates on: give it with --tune or --tune-only")
    without = [ds for ds in args.datasets if ds not in SESSION_DATASETS]
    if args.tune_split == "session" and without:
        ap.error(f"--tune-split session needs sessions, which {', '.join(without)} does not have: give --datasets "
                 + " ".join(SESSION_DATASETS))
    if args.tuned is not None and args.set and not (args.tune or args.tune_only):
        ap.error("--set changes the preset's settings, which a run from --tuned FILE does not use (the file's "
                 "configurations train whole): tune again with --tune --set ...")
    if args.profile_steps is not None:
        if args.profile_steps < 1:
            ap.error(f"--profile-steps must be at least 1, got {args.profile_steps}")
        given = _given(ap, args, "--tune", "--tune-only", "--tuned", "--seeds", "--workers", "--save-tops",
                       "--baselines", "--compute-only", "--experiment")
        if given:
            ap.error(f"--profile-steps times the preset's training steps (seed 0), so {', '.join(given)} would be "
                     "ignored: run them apart")
    only = "--baselines" if args.baselines is not None else "--compute-only" if args.compute_only else None
    if only is not None:  # neither trains a project model: options of that training would be ignored
        # the baselines run on the CPU with implicit's own threads and read no kernel speeds; the compute
        # rows train nothing, on no device
        given = _given(ap, args, "--set", "--tune", "--tune-only", "--tuned", "--models", "--workers", "--save-tops",
                       *(("--compute-only", "--scoring-csv") if only == "--baselines" else ("--seeds",)),
                       "--device", "--threads", "--experiment")
        if given:
            ap.error(f"{only} trains no project model, so {', '.join(given)} would be ignored: run them apart")
    if args.baselines is not None:
        from ..training.baselines import BASELINES, EASE_MAX_ITEMS

        unknown = [n for n in args.baselines if n not in BASELINES]
        if unknown:
            ap.error(f"unknown baselines {unknown}; choose from {', '.join(BASELINES)}")
        from ..analysis.quality import load_data, run_baselines, write_rows

        for ds in args.datasets:
            data = load_data(ds, args.preset, data_dir=args.data_dir)
            for name in args.baselines or BASELINES:  # rows written baseline by baseline: a cut-off run keeps them
                if name == "ease" and not args.baselines and data.n_ads > EASE_MAX_ITEMS:
                    print(f"{ds}: ease skipped ({data.n_ads:,} items > {EASE_MAX_ITEMS:,})")
                    continue
                frame = run_baselines(data, args.preset, seeds=args.seeds, names=[name], progress=not args.no_progress)
                print(f"{ds}: {name}: {len(frame)} rows to {write_rows(frame, Path(args.out) / 'quality.csv')}",
                      flush=True)
        return 0
    if args.compute_only:
        path = refresh_compute(args.preset, args.out, datasets=args.datasets, scoring_csv=args.scoring_csv)
        print(f"compute rows refreshed in {path}")
        return 0
    import torch

    from ..training.train import MODELS
    from ..training.tuning import check_tuned_use

    unknown = [m for m in args.models or () if m not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    if args.tuned is not None:  # a file that cannot serve: a usage error, before anything runs
        try:
            check_tuned_use(args.tuned, args.datasets, args.preset, args.models, args.tune or args.tune_only)
        except ValueError as e:
            ap.error(str(e))
        if args.tune or args.tune_only:  # say whether a tuning resumes: a mistyped path retrains everything
            print(_kept_runs_line(args.tuned))
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = args.preset
    if args.set:
        from dataclasses import replace

        kv = _parse_settings(ap, args.set)
        p = PRESETS[preset]
        PRESETS[preset] = replace(p, train={**p.train, **kv}, train_ml={**p.train_ml, **kv},
                                  ranking={**p.ranking, **kv}, ranking_ml={**p.ranking_ml, **kv})
    if args.profile_steps is not None:
        return _profile(args, preset)
    from ..training.tuning import TuningIncomplete

    t0 = time.perf_counter()
    try:
        run_all(preset, args.out, datasets=args.datasets, seeds=[] if args.tune_only else args.seeds,
                device=args.device, progress=not args.no_progress, data_dir=args.data_dir, scoring_csv=args.scoring_csv,
                models=args.models, tune=args.tune or args.tune_only, tuned_file=args.tuned, workers=args.workers,
                tune_lengths=args.tune_lengths or "own", save_tops=args.save_tops, tune_budget_s=args.tune_budget,
                tune_split=args.tune_split or "auto",
                refine=not args.no_refine, tune_grid=tune_grid, experiment=args.experiment,
                settings=" ".join(args.set) or None)
    except TuningIncomplete as e:  # the budget asked for it, and the runs are kept: run again
        print(f"{e} (after {time.perf_counter() - t0:.0f} s)")
        return EXIT_TUNING_LEFT
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
