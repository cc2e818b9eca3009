#!/usr/bin/env bash
# One GPU-host session in one call (the device tool runs it in the repo root; results land in $OUT).
# Usage: bash data/gpu_session.sh STEP...   steps: info tests quickstart series bench:<suite>[:args] quality[:dataset]
#   qseeds[:dataset] ncu ptx
# Needs the carried wheelhouse .whl/ (shared/tools/gpu-wheelhouse .whl): papermill, ipykernel, numpy 2.4;
# bench:serving also needs distributed (the wheelhouse built with --dask; dask-cuda for --phases scaling).
set -uo pipefail
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# the rows' commit: the device's copy of .git may lag the working tree, so pass it from the checkout:
#   ANDROMEDA_COMMIT=$(git rev-parse --short HEAD) bash data/gpu_session.sh ...
[ -n "${ANDROMEDA_COMMIT:-}" ] || echo "warning: ANDROMEDA_COMMIT unset: rows take the commit of the device's .git copy"
SITE=/tmp/anb-site
if [ -d .whl ] && [ ! -d "$SITE" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || { echo "wheel install failed"; exit 3; }
fi
export PYTHONPATH="$SITE:$PWD"
export PATH="$SITE/bin:$PATH"
# The device tool brings back at most 8 files from $OUT. After every step the logs and host profiles
# go into one extras.tar (appended step by step), the tables (*.csv) and tuning files (tuned*.json)
# stay loose: a command stopped by its time limit mid-step still brings back every finished step's
# files and the rows its current step wrote so far.
pack_extras() {
  (cd "$OUT" && find . -type f ! -name '*.csv' ! -name 'tuned*.json' ! -name 'extras.tar' -print0 \
     | xargs -0 -r tar -rf extras.tar --remove-files) || echo "warning: could not pack $OUT's logs into extras.tar"
  find "$OUT" -mindepth 1 -type d -empty -delete
}
status=0
for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
      python3 -c "import numpy, numba, numba_cuda, cupy, torch; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__)" ;;
    tests)
      # PYTEST_ARGS replaces the default selection (the whole suite), e.g. "tests/topk/test_api.py"
      ANDROMEDA_TEST_BACKEND=cuda python3 -m pytest ${PYTEST_ARGS:-tests} -q -x -p no:cacheprovider \
        --deselect tests/device/test_ptx.py 2>&1 | tee "$OUT/tests.log" | tail -25 || status=1 ;;
    quickstart|series)
      only=(); [ "$step" = quickstart ] && only=(--only 01_quickstart)
      python3 -m andromeda_nb run --params full --backend cuda "${only[@]}" --out "$OUT/notebooks" \
        --figures "$OUT/figures" --no-progress 2>&1 | tail -30 || status=1 ;;
    bench:*)
      spec=${step#bench:}; suite=${spec%%:*}; extra=""; [ "$spec" != "$suite" ] && extra=${spec#*:}
      python3 -m andromeda_nb.bench "$suite" --out "$OUT" $extra 2>&1 | tee "$OUT/bench_$suite.log" | tail -40 || status=1 ;;
    quality|quality:*)
      ds=${step#quality}; ds=${ds#:}
      # QUALITY_SEEDS="2" runs only those model seeds (a cut-off run's missing seeds)
      # QUALITY_MODELS="mixture_k2" trains only those models (the precision experiment needs mixture_k2)
      # QUALITY_TUNE=1 tunes every model on the validation split first (andromeda_nb.training.tuning);
      # QUALITY_TUNE=only tunes and trains no seed (QUALITY_TUNED keeps its choices)
      # QUALITY_TUNED=FILE keeps the tuned configurations there (with QUALITY_TUNE) or trains them (without);
      #   finished tuning runs go beside it (FILE.runs.json): a cut-off tuning run again with that file resumes
      # QUALITY_TUNE_LRS="1/3 1 3", QUALITY_TUNE_STEPS="0.5 1 2": the first stage's scales (default the whole GRID)
      # QUALITY_NO_REFINE=1: the tuning's first stage only (learning rate x length), no second stage
      # QUALITY_TUNE_LENGTHS=checkpoints: lengths as checkpoints of one run a learning rate (default: own runs)
      # QUALITY_TUNE_SPLIT=session|click: the tuning validates on each user's last training session or click
      #   (default auto: the session where the data have them, the synthetic world)
      # QUALITY_TUNE_BUDGET=S starts tuning runs only while they can finish within S seconds (the first
      #   QUALITY_WORKERS start regardless), stopping between runs; run again to resume
      # QUALITY_WORKERS=N trains N tuning runs at once (one a model and grid point; 4 on one H200: ~103 steps/s in all)
      # QUALITY_SAVE_TOPS=1 keeps each model's targeted top-100 per seed in $OUT/quality/tops: models trained
      #   in separate runs (e.g. two processes sharing the GPU) then get their overlap@100_ranking rows from
      #   analysis.quality.overlap_rows_from_tops (python -m andromeda_nb.training --help gives the recipe)
      # QUALITY_SET="ad_features=1" changes TrainConfig fields of every model (with QUALITY_TUNE, or untuned)
      # QUALITY_EXPERIMENT=tuned_session names the trained and validation rows' experiment (default expert_count)
      # QUALITY_PROFILE=N trains nothing for rows: N steps of each model timed, wall beside its kernels'
      #   device time (--profile-steps: $OUT/quality/training_profile.csv)
      python3 -m andromeda_nb.training --preset full --out "$OUT/quality" --no-progress ${ds:+--datasets $ds} \
        ${QUALITY_SEEDS:+--seeds $QUALITY_SEEDS} ${QUALITY_MODELS:+--models $QUALITY_MODELS} ${QUALITY_TUNE:+--tune$([ "$QUALITY_TUNE" = only ] && echo -only)} \
        ${QUALITY_TUNED:+--tuned $QUALITY_TUNED} ${QUALITY_SET:+--set $QUALITY_SET} ${QUALITY_WORKERS:+--workers $QUALITY_WORKERS} \
        ${QUALITY_TUNE_BUDGET:+--tune-budget $QUALITY_TUNE_BUDGET} ${QUALITY_NO_REFINE:+--no-refine} \
        ${QUALITY_TUNE_LRS:+--tune-lrs $QUALITY_TUNE_LRS} ${QUALITY_TUNE_STEPS:+--tune-steps $QUALITY_TUNE_STEPS} \
        ${QUALITY_TUNE_LENGTHS:+--tune-lengths $QUALITY_TUNE_LENGTHS} ${QUALITY_TUNE_SPLIT:+--tune-split $QUALITY_TUNE_SPLIT} ${QUALITY_SAVE_TOPS:+--save-tops} ${QUALITY_PROFILE:+--profile-steps $QUALITY_PROFILE} \
        ${QUALITY_EXPERIMENT:+--experiment $QUALITY_EXPERIMENT} \
        2>&1 | tee "$OUT/quality.log" | tail -30 || status=1 ;;
    qseeds|qseeds:*)
      # the quality run's seeds (QUALITY_SEEDS, default 0-4) each in its own process, all at once on the
      # one GPU (in the tuning, 4 processes trained ~2.5x one process's steps a second), with
      # QUALITY_MODELS, QUALITY_TUNED, QUALITY_SET and QUALITY_EXPERIMENT as above; their rows joined into
      # $OUT/quality/quality.csv (a seed that fails is named, and the step fails); QSEEDS_TIMEOUT=S
      # stops each seed's process after S seconds, keeping the rows of every model it finished (rows
      # are written a model at a time) and leaving time for the join and the packing below
      ds=${step#qseeds}; ds=${ds#:}; mkdir -p "$OUT/qseeds"; pids=()
      for s in ${QUALITY_SEEDS:-0 1 2 3 4}; do
        ${QSEEDS_TIMEOUT:+timeout -k 30 $QSEEDS_TIMEOUT} python3 -m andromeda_nb.training --preset full --out "$OUT/qseeds/s$s" --no-progress ${ds:+--datasets $ds} \
          --seeds $s ${QUALITY_MODELS:+--models $QUALITY_MODELS} ${QUALITY_TUNED:+--tuned $QUALITY_TUNED} \
          ${QUALITY_SET:+--set $QUALITY_SET} ${QUALITY_EXPERIMENT:+--experiment $QUALITY_EXPERIMENT} \
          > "$OUT/qseeds/seed$s.log" 2>&1 &
        pids+=("$s:$!")
      done
      for p in "${pids[@]}"; do
        wait "${p#*:}"; rc=$?
        [ $rc -eq 124 ] && { echo "seed ${p%%:*} stopped at QSEEDS_TIMEOUT (its finished models' rows kept)"; status=1; }
        [ $rc -ne 0 ] && [ $rc -ne 124 ] && { echo "seed ${p%%:*} failed: $OUT/qseeds/seed${p%%:*}.log"; status=1; }
      done
      tail -n 3 "$OUT"/qseeds/seed*.log
      python3 -c "import glob, sys; from andromeda_nb.analysis.quality_results import join_rows
join_rows(sorted(glob.glob(sys.argv[1] + '/qseeds/s*/quality.csv')), sys.argv[1] + '/quality/quality.csv')" "$OUT" \
        || status=1 ;;
    ncu)
      # Nsight Compute on the scoring kernels of data/profile_scores.py (speed of light, issue, stall
      # reasons, occupancy, memory), at the card's own clocks (not ncu's base-clock lock, so rates
      # compare with the bench rows): $OUT/ncu_details.csv (the sections) and $OUT/ncu_raw.csv (their
      # metrics); NCU_N_ADS changes the table size
      NCU=$(command -v ncu || ls -d /usr/local/cuda/bin/ncu /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null \
            | sort -V | tail -1)
      if [ -z "$NCU" ]; then echo "ncu not found"; status=1; else
        "$NCU" --kernel-name regex:fused_ --clock-control none --section SpeedOfLight --section SchedulerStats \
          --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
          --section ComputeWorkloadAnalysis -f -o "$OUT/scores" python3 data/profile_scores.py ${NCU_N_ADS:-} 2>&1 \
          | tail -15 || status=1
        if [ -s "$OUT/scores.ncu-rep" ] \
           && "$NCU" --import "$OUT/scores.ncu-rep" --page details --csv > "$OUT/ncu_details.csv" \
           && "$NCU" --import "$OUT/scores.ncu-rep" --page raw --csv > "$OUT/ncu_raw.csv"; then
          rm -f "$OUT/scores.ncu-rep"
        else
          echo "ncu: no profile exported (the report, if any, stays in $OUT)"; rm -f "$OUT"/ncu_*.csv; status=1
        fi
      fi ;;
    ptx)
      NUMBA_ENABLE_CUDASIM=0 python3 -m andromeda_nb.device.ptxcheck 2>&1 | tail -5 || status=1 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
  pack_extras
done
[ -f "$OUT/extras.tar" ] && echo "logs and profiles: $OUT/extras.tar"
[ "$(find "$OUT" -type f | wc -l)" -le 8 ] || echo "warning: $OUT holds more than 8 files; the device tool brings back 8"
exit $status
