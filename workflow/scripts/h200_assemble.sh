#!/usr/bin/env bash
# The report of an experiment run as machine holds (config `holds`; results/h200/PLAN.md), here, on CPU: unpack
# every hold's results (what `h200_rl.sh collect` brought back: <exp>-results.tgz, or its .partNN pieces) into
# results/, in the order given, then draw the RL curves over every run and build the report from the files — the
# two steps `snakemake report` would take on one machine. A file more than one hold writes comes from the last
# tarball given that has it: data/ (the same bytes in every hold), kernels/check.json, pretrain/ (the RL base model:
# give the hold whose diagnostics measured it last).
#   workflow/scripts/h200_assemble.sh hold-sweep/h200-results.tgz hold-rl_b/h200-results.tgz hold-rl_a/...
# Env: CONFIG (experiments/h200.yaml: the experiment's name), PYTHON (python3).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: h200_assemble.sh HOLD-RESULTS.tgz... (in the order to unpack)" >&2; exit 2; }
CONFIG=${CONFIG:-experiments/h200.yaml}
PYTHON=${PYTHON:-python3}
EXP=$("$PYTHON" -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['experiment'])" "$CONFIG")
R=results/$EXP
for tgz in "$@"; do
    if [ -f "$tgz" ]; then tar -xzf "$tgz"
    elif ls "$tgz".part* > /dev/null 2>&1; then cat "$tgz".part* | tar -xzf -
    else echo "h200_assemble.sh: no $tgz (nor $tgz.partNN): what \`h200_rl.sh collect\` wrote to \$OUT" >&2; exit 1; fi
    echo "unpacked $tgz"
done
runs=$(ls -d "$R"/rl/*/ 2>/dev/null | while read -r d; do [ -f "$d/summary.json" ] && echo "$d"; done)
if [ -n "$runs" ]; then
    # shellcheck disable=SC2086  # one argument a run directory (no spaces in run names)
    "$PYTHON" -m minite_core.rl.figures --runs $runs --out "$R/rl/curves.png"
fi
"$PYTHON" -m minite_core.cli report --results "$R" --out "$R/report.md"
