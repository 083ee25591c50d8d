#!/usr/bin/env bash
# The mismatch part of the H200 run in one <= 10-minute call, without snakemake (no wheels): task data, the SFT
# base model and `minite diagnose` on it — the same commands and config sections the DAG of experiments/h200.yaml
# runs (workflow/rules/{data,pretrain,diagnostics}.smk), with the fast sampler and the Triton kernels. Writes
# $OUT/diag.tgz (results/h200/{data,pretrain,diagnostics} without the checkpoint) and the logs. PRETRAIN_S /
# DIAG_S limit the stages; DIAG_EXTRA is merged into the diagnostics section (JSON), e.g. '{"attribution": false}'.
set -uo pipefail
. "$(dirname "$0")/h200_common.sh"
python3 -m minite_core.cli data --out $R/data --experiment h200 --seed 0 --config-json "$(sec data)" > "$OUT/data.log" 2>&1
echo "data exit $?"
timeout "${PRETRAIN_S:-200}" python3 -m minite_core.cli pretrain --data $R/data --out $R/pretrain --state $R/pretrain/state \
    --no-progress $RUN --config-json "$(sec pretrain)" > "$OUT/pretrain.log" 2>&1
echo "pretrain exit $?"; tail -3 "$OUT/pretrain.log"
timeout "${DIAG_S:-300}" python3 -m minite_core.cli diagnose --checkpoint $R/pretrain/model --prompts $R/data/heldout.jsonl \
    --calib $R/data/train.jsonl --out $R/diagnostics/mismatch.json --figures $R/diagnostics/figures $RUN \
    --config-json "$(sec diagnostics "${DIAG_EXTRA:-{\}}")" > "$OUT/diagnostics.log" 2>&1
echo "diagnose exit $?"; grep -E "k3|error" "$OUT/diagnostics.log" | tail -12
tar czf "$OUT/diag.tgz" --exclude='*.safetensors' --exclude='state' $R/data/data.json $R/pretrain $R/diagnostics 2>/dev/null
ls -la "$OUT"
