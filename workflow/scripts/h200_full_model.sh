#!/usr/bin/env bash
# Qwen3-30B-A3B at its full shape on one H200, one call of < 8 minutes: `minite bench full-model` (bench/full_model.py)
# builds the 48-layer, 128-expert, 151,936-token model on the meta device and draws its bf16 weights on the GPU (no
# checkpoint file), checks its memory plan against the free memory (~132 GB planned: 61 GB of weights + one NVFP4
# profile's 60 GB of dequantized operands at a time), decodes with the fast sampler under bf16, vllm-nvfp4 and minite
# (tokens/s, peak memory per profile) and runs the diagnostics on bf16:bf16 and minite:minite (random weights:
# numerics only). The result JSON is rewritten after every phase, so a timeout keeps what finished.
# Writes results/<experiment>/full_model/qwen3-30b-a3b.json (to commit) and $OUT/full_model.{json,log}.
#   MINITE_COMMIT=<commit> OUT=<dir> bash workflow/scripts/h200_full_model.sh
# FULL_MODEL_S caps the run (default 450 s); FULL_MODEL_ARGS adds flags (e.g. "--batch 32 --new-tokens 64").
set -uo pipefail
. "$(dirname "$0")/h200_common.sh"
mkdir -p "$R/full_model"
timeout "${FULL_MODEL_S:-450}" python3 -m minite_core.cli bench full-model --model qwen3-30b-a3b \
    --out "$R/full_model/qwen3-30b-a3b.json" $RUN ${FULL_MODEL_ARGS:-} > "$OUT/full_model.log" 2>&1
echo "full-model exit $?"; tail -20 "$OUT/full_model.log"
cp "$R/full_model/qwen3-30b-a3b.json" "$OUT/full_model.json" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
