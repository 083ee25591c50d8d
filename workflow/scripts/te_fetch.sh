#!/usr/bin/env bash
# Here (a CPU machine with PyPI): fetch Transformer Engine 2.20.2 for the H200 into the git-ignored .te/, and
# split its 264 MiB core wheel into parts that each fit one device call (the device tool carries <= 64 MiB).
#
#   workflow/scripts/te_fetch.sh            # idempotent: files already there with the pinned sha256 are kept
#
# Writes (layout read by workflow/scripts/te_install_h200.sh on the GPU machine):
#   .te/core/<core wheel>          transformer-engine-cu13, whole (not carried; the parts are)
#   .te/parts/core.whl.part-NN     the core wheel in <= TE_PART_MIB MiB pieces (carry one per call)
#   .te/whl/*.whl                  the transformer-engine meta wheel + pydantic's closure (cp312 manylinux)
#   .te/sdist/transformer_engine_torch-<v>.tar.gz   the torch extension, built on the GPU machine
#   .te/MANIFEST                   name, size, sha256 of the core wheel and of every part/wheel/sdist
#   .te/src/transformer_engine/pytorch/custom_recipes/*.py   TE's pure-torch reference quantizers, extracted
#                                  for the CPU tests (tests/test_te_reference.py)
# Pins and sha256 hashes: workflow/scripts/te-wheels.txt (pip --require-hashes). Fails loudly on any mismatch.
set -euo pipefail
die() { echo "te_fetch: error: $*" >&2; exit 1; }
cd "$(git rev-parse --show-toplevel)" || die "run inside the repository"
TE_DIR=${TE_DIR:-.te}
PART_MIB=${TE_PART_MIB:-40}  # + the ~10 MiB working tree that travels with every call: <= 64 MiB
PIP=${PIP:-python3 -m pip}
PINS=workflow/scripts/te-wheels.txt
[ -f "$PINS" ] || die "missing $PINS"
git check-ignore -q "$TE_DIR/x" || die "$TE_DIR/ is not git-ignored (add /.te/ to .gitignore): it must not travel uncarried"
mkdir -p "$TE_DIR"/{core,parts,whl,sdist,src}
BIN=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

# 1. download, hash-checked (pip verifies every file against te-wheels.txt); a file already there with its
#    pinned sha256 is not fetched again
have() { local h; for f in "$1"/*; do [ -f "$f" ] || continue; h=$(sha256sum "$f" | cut -d' ' -f1); [ "$h" = "$2" ] && return 0; done; return 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
grep -E '^[a-z0-9-]+==' "$PINS" | while read -r pin; do
    name=${pin%%==*}; sha=${pin##*sha256:}
    case $name in
        transformer-engine-cu13) dir=$TE_DIR/core; how=("${BIN[@]}") ;;
        # the sdist: pip prepares its metadata in an isolated build env (setuptools, torch): about 2 minutes
        transformer-engine-torch) dir=$TE_DIR/sdist; how=(--no-binary=transformer-engine-torch) ;;
        *) dir=$TE_DIR/whl; how=("${BIN[@]}") ;;
    esac
    have "$dir" "$sha" && continue
    echo "$pin" > "$tmp/req.txt"
    $PIP download -q --no-deps --require-hashes "${how[@]}" -d "$dir" -r "$tmp/req.txt" || die "download failed: ${pin%% *}"
done

core=$(ls "$TE_DIR"/core/transformer_engine_cu13-*.whl)
[ "$(echo "$core" | wc -l)" = 1 ] || die "expected one core wheel in $TE_DIR/core, found: $core"

# 2. split the core wheel (parts rewritten when the wheel or the part size changed)
core_sha=$(sha256sum "$core" | cut -d' ' -f1)
if [ ! -f "$TE_DIR/parts/SOURCE" ] || [ "$(cat "$TE_DIR/parts/SOURCE")" != "$core_sha $PART_MIB" ]; then
    rm -f "$TE_DIR"/parts/core.whl.part-*
    split -b "${PART_MIB}m" -d -a 2 "$core" "$TE_DIR/parts/core.whl.part-"
    echo "$core_sha $PART_MIB" > "$TE_DIR/parts/SOURCE"
fi
max=$((PART_MIB * 1024 * 1024))
for p in "$TE_DIR"/parts/core.whl.part-*; do
    [ "$(stat -c %s "$p")" -le "$max" ] || die "$p is larger than $PART_MIB MiB"
done
# the parts must reassemble to the same bytes
[ "$(cat "$TE_DIR"/parts/core.whl.part-* | sha256sum | cut -d' ' -f1)" = "$core_sha" ] \
    || die "parts do not reassemble to $core (sha256 differs)"

# 3. manifest: one line per file, "<kind> <name> <bytes> <sha256>"
{
    echo "core $(basename "$core") $(stat -c %s "$core") $core_sha"
    for f in "$TE_DIR"/parts/core.whl.part-* "$TE_DIR"/whl/*.whl "$TE_DIR"/sdist/*.tar.gz; do
        echo "$(basename "$(dirname "$f")") $(basename "$f") $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"
    done
} > "$TE_DIR/MANIFEST.tmp" && mv "$TE_DIR/MANIFEST.tmp" "$TE_DIR/MANIFEST"

# 4. TE's pure-torch reference quantizers, for the CPU tests (no CUDA, no TE extension needed to read them)
rm -rf "$TE_DIR/src/transformer_engine"
python3 - "$core" "$TE_DIR/src" <<'PY' || die "cannot extract custom_recipes/ from $core"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("transformer_engine/pytorch/custom_recipes/")]
    assert names, "no transformer_engine/pytorch/custom_recipes/ in the core wheel"
    z.extractall(sys.argv[2], members=names)
PY

echo "te_fetch: $(grep -c '^parts ' "$TE_DIR/MANIFEST") core parts of <= $PART_MIB MiB, $(ls "$TE_DIR"/whl | wc -l) wheels, 1 sdist in $TE_DIR/"
du -sh "$TE_DIR"/parts/core.whl.part-* "$TE_DIR"/whl "$TE_DIR"/sdist | sed 's/^/  /'
