#!/usr/bin/env bash
# A timed RL probe in one call (no snakemake): data + SFT base model (as h200_diag.sh), then the RL runs of
# experiments/h200.yaml side by side on the one GPU, RL_STEPS steps each (the rl section otherwise as configured) —
# per-step sampling / learner times and the first reward and held-out numbers with the fast engines. Writes
# $OUT/rl.tgz (results/<exp>/{pretrain,rl} without checkpoints and state) and the logs. CONFIG: another
# experiment (default experiments/h200.yaml).
set -uo pipefail
. "$(dirname "$0")/h200_common.sh"
python3 -m minite_core.cli data --out $R/data --experiment h200 --seed 0 --config-json "$(sec data)" > "$OUT/data.log" 2>&1
timeout "${PRETRAIN_S:-150}" python3 -m minite_core.cli pretrain --data $R/data --out $R/pretrain --state $R/pretrain/state \
    --no-progress $RUN --config-json "$(sec pretrain)" > "$OUT/pretrain.log" 2>&1
echo "pretrain exit $?"; tail -1 "$OUT/pretrain.log"
CFG=$(sec rl "{\"steps\": ${RL_STEPS:-40}, \"eval_every\": ${RL_STEPS:-40}, \"checkpoint_every\": ${RL_STEPS:-40}}")
for pair in ${RL_PAIRS:-bf16:bf16 te-nvfp4:vllm-nvfp4 te-nvfp4:vllm-marlin-w4a16 minite:minite}; do
  l=${pair%%:*}; s=${pair##*:}; name=${l}__${s}__none
  timeout "${RL_S:-240}" python3 -m minite_core.cli rl --pretrained $R/pretrain/model --data $R/data --out $R/rl/$name \
      --learner $l --sampler $s --correction none --no-progress $RUN --config-json "$CFG" > "$OUT/rl-$name.log" 2>&1 &
done
wait
for f in "$OUT"/rl-*.log; do echo "== $f"; tail -2 "$f"; done
tar czf "$OUT/rl.tgz" --exclude='*.safetensors' --exclude='state' $R/pretrain $R/rl $OUT/*.log 2>/dev/null
