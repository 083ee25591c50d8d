#!/usr/bin/env bash
# The decode part of the H200 run in one <= 10-minute call of the GPU machine: the packed decode GEMMs' `gpu`
# tests, `minite bench kernels --only decode` (SWEEP=1: the tile / split-K sweep too) and `minite bench sampler`
# on the weight-bound shape with the plain-PyTorch baseline and a kernel profile of one decode step. Writes under
# $OUT: decode-kernels.json, sampler-wb.json and decode.tgz (logs, CSV). SAMPLER_ARGS adds arguments.
set -uo pipefail
. "$(dirname "$0")/h200_common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/env.txt" 2>&1
echo "== gpu tests (decode)"
timeout "${TEST_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 ${TESTS:-tests/test_packed_decode.py tests/test_decode_mma.py} \
    > "$OUT/decode-tests.log" 2>&1
echo "pytest exit $?"; tail -4 "$OUT/decode-tests.log"
echo "== bench kernels --only decode"
timeout "${KERNELS_S:-300}" python3 -m minite_core.cli bench kernels --only decode ${SWEEP:+--sweep} \
    --json "$OUT/decode-kernels.json" --csv "$OUT/decode-kernels.csv" --commit "$MINITE_COMMIT" > "$OUT/decode-kernels.log" 2>&1
echo "kernels exit $?"; grep -E "d2d|decode-(bf16|w4a16-packed|w4a4-packed|moe)|FAILED" "$OUT/decode-kernels.log" | grep -v cfg | cut -c1-160
echo "== bench sampler (weight-bound)"
timeout "${SAMPLER_S:-240}" python3 -m minite_core.cli bench sampler --config h200 --device cuda --experiment h200 \
    --shapes weight-bound --op-profile --budget-s 200 --out "$OUT/sampler-wb.json" ${SAMPLER_ARGS:-} \
    > "$OUT/sampler-wb.log" 2>&1
echo "sampler exit $?"; grep -E "tokens/s|decode step" "$OUT/sampler-wb.log" | cut -c1-200
extras=$(cd "$OUT" && ls *.csv *.txt *.log 2>/dev/null | sort -u)
tar czf "$OUT/decode.tgz" -C "$OUT" $extras && (cd "$OUT" && rm -f $extras)
