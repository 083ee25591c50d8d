#!/usr/bin/env bash
# On the GPU machine (repo root): install Transformer Engine 2.20.2 from what workflow/scripts/te_fetch.sh put in
# .te/, carried over several device calls (each carries <= 64 MiB; the machine reaches no network).
#
#   bash workflow/scripts/te_install_h200.sh           # once per call; every call carries .te/MANIFEST plus
#                                                      # any of .te/parts/core.whl.part-NN, .te/whl, .te/sdist, .te/built
#   bash workflow/scripts/te_install_h200.sh --final   # the same, but fails unless TE is installed at the end
#   . /tmp/te/env.sh                                   # then: PYTHONPATH=/tmp/site..., NVTE_FRAMEWORK=pytorch,
#                                                      # CUDNN_HOME and LD_LIBRARY_PATH at torch's cuDNN
#
# Each call copies what it carries into /tmp/te/ (sha256-checked against the MANIFEST; /tmp survives between the
# calls of a warm machine, ~30 s). The call that completes the set: cats the parts into the core wheel (sha256
# checked), `pip install --no-index --no-deps --target /tmp/site` it and the small wheels, extracts only the
# `.dist-info` of the transformer-engine meta wheel (TE's import asserts that distribution exists and matches the
# core's version: transformer_engine/common/__init__.py, load_framework_extension), then installs the torch
# extension: a carried .te/built/transformer_engine_torch-*.whl if there is one, else builds it from the sdist
# (NVTE_PYTORCH_FORCE_BUILD=TRUE; C++ only, ~105 s on 16 cores) and copies the built wheel to $OUT, to be put
# in .te/built/ here so no later install rebuilds it. Finally imports transformer_engine.pytorch. Idempotent:
# a finished install is only re-verified. Every failure exits 1 with "te_install: error: <what>".
set -euo pipefail
die() { echo "te_install: error: $*" >&2; exit 1; }
FINAL=0
[ "${1:-}" = "--final" ] && FINAL=1
[ $# -le 1 ] && { [ $# -eq 0 ] || [ $FINAL = 1 ]; } || die "usage: te_install_h200.sh [--final]"
TE_DIR=${TE_DIR:-.te}
STAGE=${TE_STAGE:-/tmp/te}
SITE=${TE_SITE:-/tmp/site}
PY=${PYTHON:-python3}
mkdir -p "$STAGE"/{parts,whl,sdist,built,core} "$SITE"

# ---- the manifest: carried in every call, identical across calls
if [ -f "$TE_DIR/MANIFEST" ]; then
    if [ -f "$STAGE/MANIFEST" ] && ! cmp -s "$TE_DIR/MANIFEST" "$STAGE/MANIFEST"; then
        die "the carried $TE_DIR/MANIFEST differs from the one of earlier calls in $STAGE (a re-fetch?): rm -rf $STAGE and carry again"
    fi
    cp "$TE_DIR/MANIFEST" "$STAGE/MANIFEST"
fi
[ -f "$STAGE/MANIFEST" ] || die "no $TE_DIR/MANIFEST: run workflow/scripts/te_fetch.sh here and carry .te/MANIFEST in every call"
CORE_NAME=$(awk '$1 == "core" {print $2}' "$STAGE/MANIFEST")
CORE_SHA=$(awk '$1 == "core" {print $4}' "$STAGE/MANIFEST")
VERSION=$(echo "$CORE_NAME" | sed -E 's/^transformer_engine_cu[0-9]+-([^-]+)-.*/\1/')
[ -n "$CORE_NAME" ] && [ -n "$VERSION" ] || die "$STAGE/MANIFEST has no core line"

# TE's import loads the first cuDNN it finds ($CUDNN_HOME, ..., the loader's path) with RTLD_GLOBAL; any other
# version than torch's (the image's /usr/lib has 9.14, torch 2.11 bundles 9.19) leaves torch's cuDNN unusable in
# that process and moves its attention off the cuDNN kernel (minite_core/peers/te_cudnn.py): point both at torch's
CUDNN_DIR=$("$PY" -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2>/dev/null || true)
env_lines() {
    echo "export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH} NVTE_FRAMEWORK=pytorch"
    if [ -n "$CUDNN_DIR" ]; then
        echo "export CUDNN_HOME=$CUDNN_DIR LD_LIBRARY_PATH=$CUDNN_DIR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    fi
}
write_env() {
    env_lines > "$STAGE/env.sh.tmp"
    mv "$STAGE/env.sh.tmp" "$STAGE/env.sh"
}
verify_import() {
    ( eval "$(env_lines)"; "$PY" - "$VERSION" <<'PY' ) || die "import transformer_engine.pytorch, or torch's cuDNN after it, failed (above): an incomplete install in /tmp/site, or a cuDNN torch cannot use"
import sys, torch
import transformer_engine, transformer_engine.pytorch as te
from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef  # noqa: F401
assert transformer_engine.__version__ == sys.argv[1], (transformer_engine.__version__, sys.argv[1])
# quantization.py is_*_available(return_reason=True) -> (bool, reason)
avail = {n: getattr(te, f"is_{n}_available")(return_reason=True) for n in ("fp8", "fp8_block_scaling", "nvfp4")}
cudnn = torch.backends.cudnn.version()  # raises where TE's import loaded a cuDNN torch cannot use
print(f"te_install: transformer_engine {transformer_engine.__version__} on {torch.cuda.get_device_name()} "
      f"(sm_{''.join(map(str, torch.cuda.get_device_capability()))}), torch {torch.__version__}, cuDNN {cudnn} "
      "after TE's import; " + "; ".join(f"{n}: {ok}{' (' + why + ')' if why else ''}" for n, (ok, why) in avail.items()))
PY
}

if [ -f "$STAGE/INSTALLED" ]; then
    verify_import
    write_env
    echo "te_install: already installed in $SITE (rm $STAGE/INSTALLED to reinstall)"
    exit 0
fi

# ---- accumulate what this call carries (checked against the manifest before it is kept)
sha() { sha256sum "$1" | cut -d' ' -f1; }
while read -r kind name size hash; do
    [ "$kind" = core ] && continue
    src=$TE_DIR/$kind/$name dst=$STAGE/$kind/$name
    [ -f "$src" ] || continue
    [ -f "$dst" ] && [ "$(sha "$dst")" = "$hash" ] && continue
    [ "$(stat -c %s "$src")" = "$size" ] && [ "$(sha "$src")" = "$hash" ] || die "carried $src does not match the MANIFEST (size/sha256): re-run te_fetch.sh"
    cp "$src" "$dst.tmp" && mv "$dst.tmp" "$dst"
    echo "te_install: kept $kind/$name"
done < "$STAGE/MANIFEST"
for w in "$TE_DIR"/built/transformer_engine_torch-"$VERSION"*.whl; do
    [ -f "$w" ] || continue
    "$PY" -m zipfile -t "$w" > /dev/null || die "carried $w is not a valid wheel"
    cp "$w" "$STAGE/built/$(basename "$w").tmp" && mv "$STAGE/built/$(basename "$w").tmp" "$STAGE/built/$(basename "$w")"
    echo "te_install: kept built/$(basename "$w")"
done

# ---- complete?
built=$(ls "$STAGE"/built/transformer_engine_torch-"$VERSION"*.whl 2>/dev/null | head -1 || true)
missing=()
while read -r kind name size hash; do
    [ "$kind" = core ] && continue
    [ "$kind" = sdist ] && [ -n "$built" ] && continue  # a built extension wheel replaces the sdist
    [ -f "$STAGE/$kind/$name" ] || missing+=("$TE_DIR/$kind/$name")
done < "$STAGE/MANIFEST"
if [ ${#missing[@]} -gt 0 ]; then
    msg="still missing (carry them in the next calls, within ~30 s so the machine stays warm): ${missing[*]}"
    [ $FINAL = 1 ] && die "--final: $msg"
    echo "te_install: $msg"
    exit 0
fi

# ---- assemble the core wheel, install core + small wheels + the meta .dist-info
core=$STAGE/core/$CORE_NAME
if [ ! -f "$core" ] || [ "$(sha "$core")" != "$CORE_SHA" ]; then
    cat "$STAGE"/parts/core.whl.part-* > "$core.tmp"
    [ "$(sha "$core.tmp")" = "$CORE_SHA" ] || die "the parts in $STAGE/parts do not reassemble to $CORE_NAME (sha256): rm -rf $STAGE and carry again"
    mv "$core.tmp" "$core"
fi
meta=$(ls "$STAGE"/whl/transformer_engine-"$VERSION"-*.whl) || die "no transformer_engine-$VERSION meta wheel in $STAGE/whl"
small=()
for w in "$STAGE"/whl/*.whl; do [ "$w" = "$meta" ] || small+=("$w"); done
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$core" "${small[@]}" \
    || die "pip install of the core wheel + small wheels into $SITE failed"
"$PY" - "$meta" "$SITE" <<'PY' || die "cannot extract the .dist-info of $meta"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.split("/")[0].endswith(".dist-info")]
    assert names, "no .dist-info in the meta wheel"
    z.extractall(sys.argv[2], members=names)
PY

# ---- the torch extension: carried wheel, else build it once and send it back
if [ -z "$built" ]; then
    sdist=$(ls "$STAGE"/sdist/transformer_engine_torch-"$VERSION".tar.gz) || die "no transformer_engine_torch-$VERSION sdist in $STAGE/sdist"
    cuda_home=${CUDA_HOME:-/usr/local/cuda}
    [ -x "$cuda_home/bin/nvcc" ] || cuda_home=$(dirname "$(dirname "$(command -v nvcc || echo /nonexistent/bin/nvcc)")")
    [ -d "$cuda_home/include" ] || die "no CUDA toolkit found (set CUDA_HOME; tried /usr/local/cuda and nvcc on PATH)"
    echo "te_install: building transformer_engine_torch $VERSION from the sdist (CUDA_HOME=$cuda_home, MAX_JOBS=${MAX_JOBS:-$(nproc)}) ..."
    start=$(date +%s)
    # FORCE_BUILD: no attempt to download a prebuilt wheel (setup.py CachedWheelsCommand); NO_LOCAL_VERSION: the
    # version stays "2.20.2" even if a git repo encloses the build dir (build_tools/te_version.py appends +<sha>,
    # and TE's import asserts the extension's version equals the core's)
    if ! NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_NO_LOCAL_VERSION=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} CUDA_HOME=$cuda_home PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} \
        "$PY" -m pip wheel --no-build-isolation --no-deps --no-index --no-cache-dir -w "$STAGE/built" "$sdist" > "$STAGE/build.log" 2>&1; then
        tail -40 "$STAGE/build.log" >&2
        die "building the torch extension failed (log: $STAGE/build.log)"
    fi
    built=$(ls "$STAGE"/built/transformer_engine_torch-"$VERSION"*.whl | head -1) || die "the build wrote no wheel into $STAGE/built"
    echo "te_install: built $(basename "$built") in $(( $(date +%s) - start )) s ($(du -h "$built" | cut -f1))"
    if [ -n "${OUT:-}" ]; then
        cp "$built" "$OUT/" && echo "te_install: copied to \$OUT — put it in .te/built/ here and carry .te/built next time (no rebuild)"
    fi
fi
# unzipped into $SITE, not `pip install --target --upgrade`: that replaces the whole top-level transformer_engine/
# of the core wheel with this wheel's (which holds only transformer_engine/wheel_lib/<extension>.so)
"$PY" - "$built" "$SITE" <<'PY' || die "cannot unpack $built into $SITE"
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY

verify_import
write_env
touch "$STAGE/INSTALLED"
echo "te_install: done; now: . $STAGE/env.sh"
