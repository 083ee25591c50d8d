# Sourced by the one-call H200 scripts (h200_bench.sh, h200_diag.sh, h200_rl_probe.sh): the outputs folder, the
# commit the results record, the import path, and `sec NAME [JSON]` — section NAME of $CONFIG (default
# experiments/h200.yaml) as JSON (its `runs` list left out: each script passes its own pairs; `pretrain` is the RL
# base model's SFT config, experiment.py pretrain_section), with JSON merged over it; R = results/<its experiment>.
OUT=${OUT:?set OUT to a folder for the outputs}
export MINITE_COMMIT=${MINITE_COMMIT:?pass MINITE_COMMIT=$(git rev-parse --short HEAD) from the checkout: the git metadata of the device copy is not the commit that runs}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
CONFIG=${CONFIG:-experiments/h200.yaml}
EXP=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['experiment'])" "$CONFIG")
R=results/$EXP
RUN="--experiment $EXP --seed 0 --device cuda --kernels auto --sampler-engine auto"
sec() { python3 -c "import json, sys, yaml; from minite_core.experiment import pretrain_section; c = yaml.safe_load(open('$CONFIG')); s = pretrain_section(c) if '$1' == 'pretrain' else c.get('$1', {}); s.pop('runs', None); s.update(json.loads(sys.argv[1])); print(json.dumps(s))" "${2:-{\}}"; }
