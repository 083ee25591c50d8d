#!/usr/bin/env bash
# The scale-out learner's 1-GPU check in one <= 10-minute call of the GPU machine: `minite bench learner --config h200` under
# `torchrun --standalone --nproc-per-node ${NPROC:-1}` — the scale-out learner (FSDP2 + expert parallelism,
# bench.learner_dist) and, in the same invocation on rank 0, the plain 1-process learner on the same config and
# per-GPU batch. Writes $OUT/learner_dist.json (throughput/v1 rows + per_gpu_tokens_per_s, plain_tokens_per_s,
# scaling_efficiency) and $OUT/learner_dist.log; prints distributed/plain per profile and whether each is within
# 5%. PROFILES (default bf16,te-nvfp4,minite), BUDGET_S (per part, default 100), DIST_S (time limit, default 540).
set -uo pipefail
. "$(dirname "$0")/h200_common.sh"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout "${DIST_S:-540}" python3 -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-1}" \
    -m minite_core.cli bench learner --config h200 --experiment h200 --device cuda \
    --profiles "${PROFILES:-bf16,te-nvfp4,minite}" --budget-s "${BUDGET_S:-100}" \
    --out "$OUT/learner_dist.json" > "$OUT/learner_dist.log" 2>&1
echo "bench exit $?"; grep -v Warning "$OUT/learner_dist.log" | tail -12
python3 - "$OUT/learner_dist.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    e = r["scaling_efficiency"]
    print(f"{r['profile']}: distributed {r['per_gpu_tokens_per_s']:,.0f} tokens/s per GPU x {d['config']['world_size']}, "
          f"plain {r['plain_tokens_per_s']:,.0f}; ratio {e:.3f} ({'within' if e >= 0.95 else 'NOT within'} 5%)")
PY
