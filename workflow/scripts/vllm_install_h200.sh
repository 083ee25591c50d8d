#!/usr/bin/env bash
# On the GPU machine (repo root): install vLLM 0.26.0 from what workflow/scripts/vllm_fetch.sh put in .vllm/,
# carried over several device calls (each carries <= 64 MiB; the machine reaches no network). docs/vllm-gpu.md.
#
#   bash workflow/scripts/vllm_install_h200.sh           # once per call; call k carries .vllm/MANIFEST and
#                                                        # .vllm/calls/<k> (the plan: .vllm/PLAN)
#   bash workflow/scripts/vllm_install_h200.sh --final   # the same, but fails unless vLLM is installed at the end
#   . /tmp/vllm/env.sh                                   # then: PYTHONPATH=/tmp/site..., vLLM's offline settings
#
# Each call copies what it carries into /tmp/vllm/ (sha256-checked against the MANIFEST; /tmp survives between
# the calls of a warm machine, ~30 s). The call that completes the set cats the parts into the vllm wheel (sha256
# checked) and runs `pip install --no-index --no-deps --target /tmp/site` on it and the small wheels: the image's
# torch 2.11.0+cu130 (the one vllm 0.26.0 pins) and every other package of the image stay as they are. Then it
# imports the offline-generation path (LLM, SamplingParams, the GPU worker and model runner, Qwen3-MoE, the
# compressed-tensors NVFP4 scheme) and reports any declared requirement of the installed wheels that the image
# does not meet (a report, not a failure: only what is imported matters, and the import just succeeded).
# Idempotent: a finished install is only re-verified. Every failure exits 1 with "vllm_install: error: <what>".
set -euo pipefail
die() { echo "vllm_install: error: $*" >&2; exit 1; }
FINAL=0
[ "${1:-}" = "--final" ] && FINAL=1
[ $# -le 1 ] && { [ $# -eq 0 ] || [ $FINAL = 1 ]; } || die "usage: vllm_install_h200.sh [--final]"
DIR=${VLLM_DIR:-.vllm}
STAGE=${VLLM_STAGE:-/tmp/vllm}
SITE=${VLLM_SITE:-/tmp/site}
PY=${PYTHON:-python3}
mkdir -p "$STAGE"/{parts,whl,core} "$SITE"

# ---- the manifest: carried in every call, identical across calls
if [ -f "$DIR/MANIFEST" ]; then
    if [ -f "$STAGE/MANIFEST" ] && ! cmp -s "$DIR/MANIFEST" "$STAGE/MANIFEST"; then
        die "the carried $DIR/MANIFEST differs from the one of earlier calls in $STAGE (a re-fetch?): rm -rf $STAGE and carry again"
    fi
    cp "$DIR/MANIFEST" "$STAGE/MANIFEST"
fi
[ -f "$STAGE/MANIFEST" ] || die "no $DIR/MANIFEST: run workflow/scripts/vllm_fetch.sh here and carry .vllm/MANIFEST in every call"
CORE_NAME=$(awk '$1 == "core" {print $2}' "$STAGE/MANIFEST")
CORE_SHA=$(awk '$1 == "core" {print $4}' "$STAGE/MANIFEST")
VERSION=$(echo "$CORE_NAME" | sed -E 's/^vllm-([^-]+)-.*/\1/')
[ -n "$CORE_NAME" ] && [ -n "$VERSION" ] || die "$STAGE/MANIFEST has no core line"

write_env() {
    # usage stats off and every hub lookup offline: the machine reaches no network
    echo "export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH} VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1" \
        > "$STAGE/env.sh.tmp"
    mv "$STAGE/env.sh.tmp" "$STAGE/env.sh"
}
verify_import() {
    PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} VLLM_NO_USAGE_STATS=1 "$PY" - "$VERSION" "$STAGE/MANIFEST" <<'PY' \
        || die "importing vLLM's offline-generation path failed (above); the install in $SITE is incomplete"
import importlib, importlib.metadata as md, sys
import torch
import vllm
from vllm import LLM, SamplingParams  # noqa: F401
assert vllm.__version__ == sys.argv[1], (vllm.__version__, sys.argv[1])
for m in ("vllm.v1.engine.core", "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
          "vllm.model_executor.models.qwen3_moe", "vllm.model_executor.models.qwen3",
          "vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w4a4_nvfp4",
          "vllm.model_executor.layers.fused_moe.oracle.nvfp4", "vllm.v1.attention.backends.flash_attn"):
    importlib.import_module(m)
from packaging.requirements import Requirement
unmet = []
for line in open(sys.argv[2]):
    kind, name = line.split()[:2]
    if kind == "parts":
        continue
    dist = md.distribution(name.split("-")[0].replace("_", "-"))
    for req in map(Requirement, dist.requires or ()):
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{dist.metadata['Name']} needs {req} (here: {have or 'absent'})")
print(f"vllm_install: vllm {vllm.__version__} imports (offline-generation path) with torch {torch.__version__} on "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
if unmet:
    print(f"vllm_install: {len(unmet)} declared requirements not met (left out on purpose: docs/vllm-gpu.md): "
          + "; ".join(sorted(set(unmet))))
PY
}

if [ -f "$STAGE/INSTALLED" ]; then
    verify_import
    write_env
    echo "vllm_install: already installed in $SITE (rm $STAGE/INSTALLED to reinstall)"
    exit 0
fi

# ---- accumulate what this call carries (checked against the manifest before it is kept)
sha() { sha256sum "$1" | cut -d' ' -f1; }
while read -r kind name size hash; do
    [ "$kind" = core ] && continue
    dst=$STAGE/$kind/$name
    [ -f "$dst" ] && [ "$(sha "$dst")" = "$hash" ] && continue
    for src in "$DIR"/calls/*/"$name" "$DIR/$kind/$name"; do
        [ -f "$src" ] || continue
        [ "$(stat -c %s "$src")" = "$size" ] && [ "$(sha "$src")" = "$hash" ] || die "carried $src does not match the MANIFEST (size/sha256): re-run vllm_fetch.sh"
        cp "$src" "$dst.tmp" && mv "$dst.tmp" "$dst"
        echo "vllm_install: kept $kind/$name"
        break
    done
done < "$STAGE/MANIFEST"

# ---- complete?
missing=()
while read -r kind name size hash; do
    [ "$kind" = core ] && continue
    [ -f "$STAGE/$kind/$name" ] || missing+=("$name")
done < "$STAGE/MANIFEST"
if [ ${#missing[@]} -gt 0 ]; then
    msg="${#missing[@]} files still missing (carry the next .vllm/calls/<k> within ~30 s so the machine stays warm): ${missing[*]}"
    [ $FINAL = 1 ] && die "--final: $msg"
    echo "vllm_install: $msg"
    exit 0
fi

# ---- assemble the vllm wheel, install it and the small wheels into $SITE (no dependency resolution)
core=$STAGE/core/$CORE_NAME
if [ ! -f "$core" ] || [ "$(sha "$core")" != "$CORE_SHA" ]; then
    cat "$STAGE"/parts/vllm.whl.part-* > "$core.tmp"
    [ "$(sha "$core.tmp")" = "$CORE_SHA" ] || die "the parts in $STAGE/parts do not reassemble to $CORE_NAME (sha256): rm -rf $STAGE and carry again"
    mv "$core.tmp" "$core"
fi
start=$(date +%s)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$core" "$STAGE"/whl/*.whl \
    || die "pip install of the vllm wheel + small wheels into $SITE failed"
echo "vllm_install: installed into $SITE in $(( $(date +%s) - start )) s"
verify_import
write_env
touch "$STAGE/INSTALLED"
echo "vllm_install: done; now: . $STAGE/env.sh"
