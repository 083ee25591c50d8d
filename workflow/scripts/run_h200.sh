#!/usr/bin/env bash
# The command that made results/h200/: the whole DAG of experiments/h200.yaml on one H200, plus the `gpu`-marked
# tests, in one <= 10-minute call of the GPU machine (which starts bare and reaches no network).
# Needs the snakemake + lm-eval wheels for cp312 in .whl/ (docs/offline-gpu.md).
# Writes $OUT/h200.tgz (results/h200 without checkpoints and resume state), gpu-tests.log, snakemake.log.
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the outputs}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec python3 -m minite_core.cli "$@"\n' > /tmp/bin/minite && chmod +x /tmp/bin/minite
ln -sf "$(command -v python3)" /tmp/bin/python
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/nvidia-smi.txt" 2>&1
echo "== gpu tests"; timeout "${TEST_S:-50}" python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/ > "$OUT/gpu-tests.log" 2>&1
tail -3 "$OUT/gpu-tests.log"
echo "== DAG"; timeout "${DAG_S:-300}" python3 -m snakemake --cores 16 --resources gpu=4 --configfile experiments/h200.yaml \
    --keep-going --rerun-incomplete > "$OUT/snakemake.log" 2>&1
echo "snakemake exit $?"; grep -E "steps \(|Error in rule|Exiting" "$OUT/snakemake.log" | tail -5
[ -f results/h200/report.md ] && [ results/h200/report.md -nt results/h200/logs ] || minite report --results results/h200 --out results/h200/report.md
tar czf "$OUT/h200.tgz" --exclude='*.safetensors' --exclude='state' --exclude='*.pt' results/h200 .snakemake/log
ls -la "$OUT"
