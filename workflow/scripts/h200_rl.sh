#!/usr/bin/env bash
# Runs longer than one 10-minute command of the GPU machine, in chunks. The machine keeps /tmp and
# background processes between commands that come within ~30 s of each other (for at most 30 minutes held), and
# results come back only through $OUT (<= 8 files, <= 16 MiB each). So: the DAG runs under setsid in a copy of the
# working tree in $WORK (/tmp), later commands poll it, and the last one packs the results into $OUT.
#
#   h200_rl.sh start [TARGET...]  copy the working tree to $WORK/repo (its results/ survive: a second start
#                                 resumes), install the wheels of .whl/ (once), start `snakemake --keep-going
#                                 --rerun-incomplete` on $CONFIG (default target: all); returns at once
#   h200_rl.sh sweep SWEEP.yaml   the same, but the job is: the DAG up to the base model, then `minite sweep`
#   h200_rl.sh wait SECONDS       return when the job ends or after SECONDS (keep it < 600 - start-up); a line of
#                                 progress a minute, then `status`, then `collect` when $OUT is set: every
#                                 command brings back what is finished, so a machine given back before the next
#                                 command (it takes /tmp with it) loses only the runs still going
#   h200_rl.sh status             job alive / exit code, snakemake's progress and errors, one line per RL run
#                                 (step, reward, held-out, s/step, ETA); answers in about a second
#   h200_rl.sh collect            $OUT/<exp>-results.tgz (results/<exp> and results/sweeps without checkpoints,
#                                 resume state or eval samples), $OUT/snakemake.log, $OUT/status.txt
#   h200_rl.sh stop               kill the job's process group (what a lost command does); `start` resumes it
#
# Exact resume: a killed RL job restarts from its last checkpoint under results/<exp>/rl/<run>/state/ (not a rule
# output, so --rerun-incomplete keeps it) and replays the remaining steps bit for bit (tests/test_rl_loop.py;
# tests/test_h200_rl.py stops and restarts this script's job). If the machine itself is lost, /tmp goes with it:
# the state (fp32 model + AdamW, ~160 MB a run) cannot travel under the 64 MiB carry limit, so a new machine
# starts the experiment over; what `collect` brought back of finished runs is the record.
# Env: WORK (/tmp/minite-rl), CONFIG (experiments/h200.yaml), CORES (16), GPU_SLOTS (the config's
#      gpu_slots: jobs that claim them all, the benchmarks, run alone), PYTHON (python3),
#      FRESH=1 (start over: drop $WORK/repo/results/<exp>), OUT (collect), MINITE_COMMIT (default: git of $PWD),
#      TE_ENV (/tmp/te/env.sh: sourced by the job when it exists, i.e. after te_install_h200.sh),
#      ANY_GPU=1 (start on a GPU other than the config's `gpu_name`: its results would be labeled as the other's).
set -uo pipefail
MODE=${1:?usage: h200_rl.sh start|sweep|wait|status|collect|stop [args]}
shift
SRC=$PWD
WORK=${WORK:-/tmp/minite-rl}
REPO=$WORK/repo
CONFIG=${CONFIG:-experiments/h200.yaml}
TE_ENV=${TE_ENV:-/tmp/te/env.sh}
PYTHON=$(command -v "${PYTHON:-python3}") || { echo "h200_rl.sh: no ${PYTHON:-python3} on PATH" >&2; exit 1; }
# the copy in $WORK may have no git: results record the working tree's commit (results.env_info reads it)
MINITE_COMMIT=${MINITE_COMMIT:-$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)}
export MINITE_COMMIT PYTHONPATH=$WORK/site:$REPO PATH=$WORK/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
mkdir -p "$WORK/bin"

exp_name() { cfg_key experiment; }
cfg_key() { (cd "$SRC" && "$PYTHON" -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]])" "$CONFIG" "$1"); }
alive() { [ -f "$WORK/job.pid" ] && kill -0 "$(cat "$WORK/job.pid")" 2>/dev/null; }

prepare() {  # the working tree -> $WORK/repo (code replaced, results kept), wheels, the `minite` / `python` shims
    mkdir -p "$REPO"
    tar -C "$SRC" --exclude=./results --exclude=./.snakemake --exclude=./.whl --exclude=./.venv --exclude=./.git -cf - . \
        | tar -C "$REPO" -xf -
    mkdir -p "$REPO/results"
    [ -d "$SRC/results/vllm-cpu" ] && [ ! -d "$REPO/results/vllm-cpu" ] && cp -r "$SRC/results/vllm-cpu" "$REPO/results/"
    if [ "${FRESH:-0}" = 1 ]; then rm -rf "$REPO/results/$EXP" "$REPO/.snakemake"; fi
    if ! "$PYTHON" -c "import snakemake, lm_eval" 2>/dev/null; then
        ls "$SRC"/.whl/*.whl > /dev/null 2>&1 || { echo "h200_rl.sh: no snakemake / lm-eval here and no .whl/ to install (docs/offline-gpu.md)" >&2; exit 1; }
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$SRC"/.whl/*.whl || exit 1
    fi
    # wrappers, not symlinks: a venv's python finds its venv by the path it was started as
    printf '#!/bin/sh\nexec %s -m minite_core.cli "$@"\n' "$PYTHON" > "$WORK/bin/minite"
    printf '#!/bin/sh\nexec %s "$@"\n' "$PYTHON" > "$WORK/bin/python"
    chmod +x "$WORK/bin/minite" "$WORK/bin/python"
}

launch() {  # $1: the job's shell command, run in $REPO under setsid; its pid (= process group) in job.pid
    alive && { echo "h200_rl.sh: a job is running (pid $(cat "$WORK/job.pid")); \`stop\` it first" >&2; exit 1; }
    rm -f "$WORK/job.rc"
    if [ -n "$(ls -A "$REPO/.snakemake/locks" 2>/dev/null)" ]; then  # a killed job leaves its locks
        (cd "$REPO" && "$PYTHON" -m snakemake --unlock --configfile "$CONFIG" > /dev/null 2>&1)
    fi
    echo "== job $(date -u +%FT%TZ): $1" | tee -a "$WORK/jobs.txt" >> "$WORK/snakemake.log"
    date +%s > "$WORK/job.start"
    # Transformer Engine, once workflow/scripts/te_install_h200.sh finished (the bench's te:* learner rows need it)
    local te=""
    [ -f "$TE_ENV" ] && { te=". '$TE_ENV';"; echo "h200_rl.sh: with Transformer Engine ($TE_ENV)"; }
    setsid nohup bash -c "echo \$\$ > '$WORK/job.pid'; $te cd '$REPO' && { $1; }; echo \$? > '$WORK/job.rc'" \
        >> "$WORK/snakemake.log" 2>&1 < /dev/null &
    for _ in $(seq 50); do [ -s "$WORK/job.pid" ] && break; sleep 0.1; done
    echo "started job $(cat "$WORK/job.pid") in $REPO (log $WORK/snakemake.log)"
}

GPU_SLOTS=${GPU_SLOTS:-$(cfg_key gpu_slots 2>/dev/null || echo 4)}
SNAKE="$PYTHON -m snakemake --cores ${CORES:-16} --resources gpu=$GPU_SLOTS --configfile $CONFIG --keep-going --rerun-incomplete"

status() {
    if alive; then echo "job $(cat "$WORK/job.pid"): running for $(( $(date +%s) - $(cat "$WORK/job.start") )) s"
    elif [ -f "$WORK/job.rc" ]; then echo "job: finished, exit $(cat "$WORK/job.rc")"
    else echo "job: not running (no exit code: never started here, or killed)"; fi
    if [ -f "$WORK/snakemake.log" ]; then  # this job's part of the log: after the last "== job" line
        awk '/^== job /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$WORK/snakemake.log" > "$WORK/job.log"
        grep -E "steps \([0-9]+%\) done" "$WORK/job.log" | tail -1
        grep -E "^Error in rule|Exiting because" "$WORK/job.log" | sort | uniq -c | tail -8
    fi
    [ -d "$REPO/results/$EXP" ] && (cd "$REPO" && "$PYTHON" workflow/scripts/rl_status.py --results "results/$EXP" --config "$CONFIG" --sweeps)
}

check_gpu() {  # the config's `gpu_name` (optional) must be in the GPU's name: one experiment, one kind of GPU
    local want have
    want=$(cfg_key gpu_name 2>/dev/null) || return 0
    [ -n "$want" ] && [ "$want" != None ] || return 0
    have=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    if [ -n "$have" ] && [ "${ANY_GPU:-0}" != 1 ] && [[ "$have" != *"$want"* ]]; then
        echo "h200_rl.sh: $CONFIG is for $want GPUs and this one is $have: run it on an $want (ANY_GPU=1 runs it anyway)" >&2
        exit 1
    fi
}

collect() {
    OUT=${OUT:?set OUT to a folder for the outputs}
    status > "$OUT/status.txt" 2>&1
    cp "$WORK/snakemake.log" "$OUT/" 2>/dev/null
    dirs=$(cd "$REPO" && ls -d "results/$EXP" results/sweeps .snakemake/log 2>/dev/null)
    tar -C "$REPO" -czf "$OUT/$EXP-results.tgz" --exclude='*.safetensors' --exclude='state' --exclude='*.pt' \
        --exclude='samples' --exclude='*.pt.stale' $dirs
    size=$(stat -c %s "$OUT/$EXP-results.tgz")
    if [ "$size" -gt $(( 16 * 1024 * 1024 )) ]; then  # at most 16 MiB a file comes back: split (cat to join)
        split -b 15m -d "$OUT/$EXP-results.tgz" "$OUT/$EXP-results.tgz.part" && rm "$OUT/$EXP-results.tgz"
    fi
    ls -la "$OUT"
}

case "$MODE" in
  start|sweep)
    EXP=$(exp_name) || exit 1
    check_gpu
    prepare
    if [ "$MODE" = start ]; then
        launch "$SNAKE ${*:-all}"
    else
        SWEEP=${1:?usage: h200_rl.sh sweep experiments/sweeps/<name>.yaml}
        launch "$SNAKE results/$EXP/pretrain/pretrain.json && minite sweep $SWEEP --jobs $GPU_SLOTS"
    fi ;;
  wait)
    EXP=$(exp_name) || exit 1
    limit=${1:?usage: h200_rl.sh wait SECONDS}; t0=$(date +%s); next=60
    while alive && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
        sleep 5
        if [ $(( $(date +%s) - t0 )) -ge $next ]; then
            echo "[$(( $(date +%s) - t0 )) s] $(grep -E "steps \([0-9]+%\) done" "$WORK/snakemake.log" | tail -1)"; next=$(( next + 60 ))
        fi
    done
    status
    if [ -n "${OUT:-}" ]; then echo "collecting into $OUT"; collect > /dev/null; fi ;;
  status)
    EXP=$(exp_name) || exit 1
    status ;;
  collect)
    EXP=$(exp_name) || exit 1
    collect ;;
  stop)
    if alive; then
        pg=$(cat "$WORK/job.pid"); kill -TERM -- "-$pg"
        for _ in $(seq 20); do kill -0 "$pg" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pg" 2>/dev/null && kill -KILL -- "-$pg"
        echo "stopped job $pg"
    else echo "no job running"; fi ;;
  *) echo "h200_rl.sh: unknown mode $MODE (start|sweep|wait|status|collect|stop)" >&2; exit 2 ;;
esac
