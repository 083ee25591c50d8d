#!/usr/bin/env bash
# The throughput part of the H200 run in one <= 10-minute call of the GPU machine: the `gpu`-marked tests, then
# `minite bench learner --config h200`, `minite bench sampler --config h200` and the DAG's kernels stage
# (`minite kernels`: checks + `bench kernels`), each baseline measured in the same run. Needs no wheels (the image
# has torch, triton, pytest, xdist). Writes under $OUT: learner.json, sampler.json, check.json, kernels.json and
# extra.tgz (logs, CSVs, nvidia-smi). Stage time limits (seconds): TEST_S, LEARNER_S, SAMPLER_S, KERNELS_S;
# TESTS, LEARNER_ARGS, SAMPLER_ARGS add arguments; NCU=1 profiles one quantizer launch.
set -uo pipefail
. "$(dirname "$0")/h200_common.sh"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/env.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
echo "== gpu tests"
# the image has no jsonschema (minite_core.experiment): the two modules that import it hold no gpu tests
# tests that assert a speed (marker `timing`) run after the others, alone on the GPU
TESTS=${TESTS:-tests/ --ignore=tests/test_sweep.py --ignore=tests/test_workflow.py}
timeout "${TEST_S:-200}" python3 -m pytest -q -m "gpu and not timing" -n 8 -p no:cacheprovider $TESTS \
    > "$OUT/gpu-tests.log" 2>&1
echo "pytest exit $?"; tail -4 "$OUT/gpu-tests.log"
timeout 120 python3 -m pytest -q -m "gpu and timing" -p no:cacheprovider $TESTS >> "$OUT/gpu-tests.log" 2>&1
echo "pytest (timing) exit $?"; tail -2 "$OUT/gpu-tests.log"
echo "== learner bench"
timeout "${LEARNER_S:-240}" python3 -m minite_core.cli bench learner --config h200 --experiment h200 --device cuda \
    --out "$OUT/learner.json" --csv "$OUT/learner.csv" ${LEARNER_ARGS:-} \
    > "$OUT/learner.log" 2>&1
echo "learner exit $?"; tail -12 "$OUT/learner.log"
echo "== sampler bench"
timeout "${SAMPLER_S:-420}" python3 -m minite_core.cli bench sampler --config h200 --device cuda --experiment h200 \
    --budget-s "${SAMPLER_BUDGET_S:-330}" --out "$OUT/sampler.json" ${SAMPLER_ARGS:-} > "$OUT/sampler.log" 2>&1
echo "sampler exit $?"; tail -20 "$OUT/sampler.log"
echo "== kernels stage (checks + micro-benchmarks)"
CFG=$(python3 -c "import json, yaml; from minite_core.experiment import pretrain_section; c = yaml.safe_load(open('experiments/h200.yaml')); c['pretrain'] = pretrain_section(c); print(json.dumps(c))")
timeout "${KERNELS_S:-200}" python3 -m minite_core.cli kernels --experiment-config "$CFG" --device cuda \
    --experiment h200 --out "$OUT/check.json" --bench "$OUT/kernels.json" > "$OUT/kernels.log" 2>&1
echo "kernels exit $?"; grep -E "checks on|moe|linear-w4a4|quantize-1x16-row|d2d|FAILED|error" "$OUT/kernels.log" | head -40
if [ -n "${NCU:-}" ]; then
  echo "== ncu: quantizer"
  timeout 90 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section LaunchStats --section Occupancy -k regex:_quantize_kernel -s 2 -c 1 python3 workflow/scripts/ncu_quantize.py \
      > "$OUT/ncu-quantize.txt" 2>&1
  echo "ncu exit $?"; grep -E "Throughput|Duration|Registers|Achieved Occupancy|Stall|Warp Cycles" "$OUT/ncu-quantize.txt" | head -30
fi
# at most 8 files come back from a call: the CSV/markdown copies travel in one tarball
extras=$(cd "$OUT" && ls *.csv *.md *.txt *.log 2>/dev/null | sort -u)
tar czf "$OUT/extra.tgz" -C "$OUT" $extras && (cd "$OUT" && rm -f $extras)
