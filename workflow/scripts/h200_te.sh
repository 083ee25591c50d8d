#!/usr/bin/env bash
# On the GPU machine, once workflow/scripts/te_install_h200.sh --final has run: the Transformer Engine checks,
# in the background beside the DAG (`h200_rl.sh start`; none of this is timed). Writes the layout
# results/<exp>/te/ that the report reads (minite_core/report/te.py) into $TE_OUT (default /tmp/minite-te):
# te-tests.log, agreement.json + summary.md (te_compare on a random model of the RL shape), checkpoint/ (te_compare
# on the DAG's SFT base model), diag-4over6/ (diagnostics of the 4over6 profile on that model: the reference
# kernels, the only backend with 4over6; the eager fast sampler: the reference kernels sync with the host, so no
# CUDA graph), diag-te/ (diagnostics with real TE as the learner: te:nvfp4 ↔ vllm-nvfp4 beside our emulated
# te-nvfp4 ↔ vllm-nvfp4, and te:bf16 ↔ bf16 beside bf16 ↔ bf16 as the floor, on that model and the same prompts;
# reference kernels and the eager fast sampler as diag-4over6, the kernels te/checkpoint compared TE with),
# h200_te.log; `done` when finished. Copy it to results/<exp>/te/ here.
#
#   setsid nohup bash workflow/scripts/h200_te.sh > /dev/null 2>&1 &      # repo root; MINITE_COMMIT set
# Env: TE_OUT, BASE (the base model; default the h200_rl.sh copy's results/h200/pretrain/model: waited for),
#      DATA (its task data, default beside it).
set -uo pipefail
OUT_DIR=${TE_OUT:-/tmp/minite-te}
WORK_RESULTS=${WORK_RESULTS:-/tmp/minite-rl/repo/results/h200}
BASE=${BASE:-$WORK_RESULTS/pretrain/model}
DATA=${DATA:-$WORK_RESULTS/data}
mkdir -p "$OUT_DIR" && rm -f "$OUT_DIR/done"
exec > "$OUT_DIR/h200_te.log" 2>&1
. /tmp/te/env.sh || { echo "h200_te.sh: no /tmp/te/env.sh: run te_install_h200.sh --final first"; exit 1; }
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%T) $*"; "$@"; echo "== rc=$?"; }
step python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_te_peer.py -rs > "$OUT_DIR/te-tests.log" 2>&1
step python3 -m minite_core.peers.te_compare run --out "$OUT_DIR"
for _ in $(seq 120); do [ -f "$WORK_RESULTS/pretrain/pretrain.json" ] && break; sleep 5; done   # the DAG's base model, finished
step python3 -m minite_core.peers.te_compare run --out "$OUT_DIR/checkpoint" --checkpoint "$BASE" --skip-probe
step python3 -m minite_core.cli diagnose --checkpoint "$BASE" --prompts "$DATA/heldout.jsonl" --calib "$DATA/train.jsonl" \
    --pairs bf16:bf16,minite:minite,minite-4over6:minite-4over6 --num-prompts 64 --max-new-tokens 64 \
    --device cuda --kernels reference --sampler-engine fast-eager --experiment h200 \
    --out "$OUT_DIR/diag-4over6/mismatch.json"
step python3 -m minite_core.cli diagnose --checkpoint "$BASE" --prompts "$DATA/heldout.jsonl" --calib "$DATA/train.jsonl" \
    --pairs te:nvfp4:vllm-nvfp4,te-nvfp4:vllm-nvfp4,te:bf16:bf16,bf16:bf16 --num-prompts 64 --max-new-tokens 64 \
    --device cuda --kernels reference --sampler-engine fast-eager --experiment h200 \
    --out "$OUT_DIR/diag-te/mismatch.json"
touch "$OUT_DIR/done"
