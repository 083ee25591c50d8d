#!/usr/bin/env bash
# Real vLLM 0.26.0 on the H200 (docs/vllm-gpu.md), each part one <= 10-minute call, after
# workflow/scripts/vllm_install_h200.sh --final (and, for `rl`, te_install_h200.sh --final) in the same hold:
#
#   h200_vllm.sh base      the SFT base model of experiments/h200.yaml (`minite pretrain` on the committed task
#                          data, into $WORK/results: /tmp survives the next calls of a warm machine), <= 5 min
#   h200_vllm.sh push      the weight-push check on it, bf16 and nvfp4 (a push of unchanged weights changes
#                          nothing; after a push of moved weights the engine equals a fresh one, bitwise)
#   h200_vllm.sh compare   vllm_measure compare on the base model: vLLM bf16 / nvfp4 (the kernel vLLM picks on
#                          sm_90, recorded) / nvfp4-emulation against our learner and sampler profiles
#   h200_vllm.sh bench     decode tokens/s, vLLM (CUDA graphs) beside our fast sampler, same model, prompts, batches
#   h200_vllm.sh rl start  GRPO te:nvfp4 (real TE) <-> vllm:nvfp4 (real vLLM), $RL_STEPS steps (100), under setsid
#   h200_vllm.sh rl status the run's last step line, exit code when done (seconds)
#   h200_vllm.sh collect   $OUT/vllm-gpu.tgz: results/h200/{vllm_gpu,rl/te:nvfp4__vllm:nvfp4__none} without
#                          checkpoints or state, + the logs
# Each writes its log and what it measured under $OUT too (<= 8 files). MINITE_COMMIT as h200_common.sh asks.
# Env: WORK (/tmp/minite-vllm), RL_STEPS (100), BATCHES (1,16,64,256), PROMPTS (64), NEW_TOKENS (64).
set -uo pipefail
. "$(dirname "$0")/h200_common.sh"
. /tmp/vllm/env.sh || { echo "h200_vllm.sh: no /tmp/vllm/env.sh: run vllm_install_h200.sh --final first" >&2; exit 1; }
WORK=${WORK:-/tmp/minite-vllm}
W=$WORK/results/$EXP
BASE=$W/pretrain/model
RUN_DIR=$W/rl/te:nvfp4__vllm:nvfp4__none
MEASURE="python3 -m minite_core.peers.vllm_measure"
# every vllm_measure command's inputs (after the command): the base model, held-out prompts, the static scales' data
ON_BASE=(--checkpoint "$BASE" --prompts $R/data/heldout.jsonl --calib $R/data/train.jsonl --experiment $EXP
         --work "$WORK/vllm-work")
mkdir -p "$W"
need_base() { [ -f "$BASE/model.safetensors" ] || { echo "h200_vllm.sh: no base model in $BASE: run 'h200_vllm.sh base' first (same hold)" >&2; exit 1; }; }

case ${1:?usage: h200_vllm.sh base|push|compare|bench|rl start|rl status|collect} in
base)
    if [ ! -f "$BASE/model.safetensors" ]; then
        timeout 300 python3 -m minite_core.cli pretrain --data $R/data --out $W/pretrain --state $W/pretrain/state \
            --no-progress $RUN --config-json "$(sec pretrain)" > "$OUT/pretrain.log" 2>&1
        echo "pretrain exit $?"; tail -2 "$OUT/pretrain.log"
    fi
    ls -la "$BASE"
    ;;
push)
    need_base
    for mode in bf16 nvfp4; do
        timeout 280 $MEASURE push-check "${ON_BASE[@]}" --mode "$mode" --num-prompts 16 --max-new-tokens 32 \
            --out "$W/vllm_gpu/push-$mode.json" \
            > "$OUT/push-$mode.log" 2>&1
        echo "push-check $mode exit $?"; tail -1 "$OUT/push-$mode.log"
    done
    ;;
compare)
    need_base
    timeout 560 $MEASURE compare "${ON_BASE[@]}" --num-prompts "${PROMPTS:-64}" --max-new-tokens "${NEW_TOKENS:-64}" \
        --out "$W" > "$OUT/compare.log" 2>&1
    echo "compare exit $?"; grep -E "k3=|Error|error" "$OUT/compare.log" | tail -20
    cp "$W/vllm_gpu/summary.md" "$OUT/" 2>/dev/null
    ;;
bench)
    need_base
    timeout 560 $MEASURE bench "${ON_BASE[@]}" --num-prompts "${PROMPTS:-64}" --max-new-tokens "${NEW_TOKENS:-64}" \
        --batches "${BATCHES:-1,16,64,256}" --modes bf16,nvfp4 --samplers bf16,vllm-marlin-w4a16 \
        --out "$W" > "$OUT/bench.log" 2>&1
    echo "bench exit $?"; grep -E "tok/s|Error|error" "$OUT/bench.log" | tail -20
    ;;
rl)
    case ${2:?rl start|status} in
    start)
        need_base
        . /tmp/te/env.sh || { echo "h200_vllm.sh: no /tmp/te/env.sh: run te_install_h200.sh --final first" >&2; exit 1; }
        mkdir -p "$RUN_DIR"
        setsid nohup python3 -m minite_core.cli rl --pretrained "$BASE" --data $R/data --out "$RUN_DIR" \
            --learner te:nvfp4 --sampler vllm:nvfp4 --no-progress $RUN \
            --config-json "$(sec rl "{\"steps\": ${RL_STEPS:-100}}")" > "$WORK/rl.log" 2>&1 < /dev/null &
        echo $! > "$WORK/rl.pid"
        echo "rl started (pid $(cat "$WORK/rl.pid")); poll: h200_vllm.sh rl status"
        ;;
    status)
        if kill -0 "$(cat "$WORK/rl.pid" 2>/dev/null)" 2>/dev/null; then echo "rl running"; else echo "rl not running"; fi
        tail -3 "$WORK/rl.log"
        python3 workflow/scripts/rl_status.py --results "$W" | grep -F "te:nvfp4"
        ;;
    esac
    ;;
collect)
    cp "$WORK/rl.log" "$OUT/" 2>/dev/null
    tar czf "$OUT/vllm-gpu.tgz" --exclude='*.safetensors' --exclude='state' --exclude='final' \
        -C "$WORK" "results/$EXP/vllm_gpu" "results/$EXP/rl" "results/$EXP/pretrain/pretrain.json" 2>/dev/null
    ls -la "$OUT"
    ;;
*) echo "h200_vllm.sh: unknown part $1" >&2; exit 2 ;;
esac
