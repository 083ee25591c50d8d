#!/usr/bin/env bash
# Here (a CPU machine with PyPI): fetch vLLM 0.26.0 and what its offline generation imports for the H200 into the
# git-ignored .vllm/, split the 290 MiB vllm wheel into parts, and plan the device calls that carry it all (the
# device tool carries <= 64 MiB a call, the working tree included). Recipe and reasons: docs/vllm-gpu.md.
#
#   workflow/scripts/vllm_fetch.sh          # idempotent: files already there with the pinned sha256 are kept
#
# Writes (layout read by workflow/scripts/vllm_install_h200.sh on the GPU machine):
#   .vllm/core/<vllm wheel>        whole (not carried; the parts are)
#   .vllm/parts/vllm.whl.part-NN   the vllm wheel in <= VLLM_PART_MIB MiB pieces
#   .vllm/whl/*.whl                the small wheels (cp312 manylinux / pure Python)
#   .vllm/calls/NN/                one folder per device call: hard links to the parts / wheels it carries,
#                                  first-fit into the per-call budget (64 MiB - the working tree - 2 MiB)
#   .vllm/MANIFEST                 "<kind> <name> <bytes> <sha256>" of the wheel, every part and small wheel
#   .vllm/PLAN                     the calls: "NN <MiB> <files>", and the totals
# Pins and sha256 hashes: workflow/scripts/vllm-wheels.txt (pip --require-hashes). Fails loudly on any mismatch.
set -euo pipefail
die() { echo "vllm_fetch: error: $*" >&2; exit 1; }
cd "$(git rev-parse --show-toplevel)" || die "run inside the repository"
DIR=${VLLM_DIR:-.vllm}
PART_MIB=${VLLM_PART_MIB:-50}  # <= 56 (the brief of the transfer); the call budget below is the real bound
CALL_MIB=${VLLM_CALL_MIB:-64}  # what one device call carries, working tree included
PIP=${PIP:-python3 -m pip}
PINS=workflow/scripts/vllm-wheels.txt
[ -f "$PINS" ] || die "missing $PINS"
git check-ignore -q "$DIR/x" || die "$DIR/ is not git-ignored (add /.vllm/ to .gitignore): it must not travel uncarried"
mkdir -p "$DIR"/{core,parts,whl}
PLATFORMS=(--platform manylinux2014_x86_64 --platform any)
for v in $(seq 17 39); do PLATFORMS+=(--platform "manylinux_2_${v}_x86_64"); done  # the image: glibc 2.39
BIN=(--only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}")

# 1. download, hash-checked; a file already there with its pinned sha256 is not fetched again
have() { local h; for f in "$1"/*; do [ -f "$f" ] || continue; h=$(sha256sum "$f" | cut -d' ' -f1); [ "$h" = "$2" ] && return 0; done; return 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
grep -E '^[a-z0-9-]+==' "$PINS" | while read -r pin; do
    name=${pin%%==*}; sha=${pin##*sha256:}
    dir=$DIR/whl; [ "$name" = vllm ] && dir=$DIR/core
    have "$dir" "$sha" && continue
    echo "$pin" > "$tmp/req.txt"
    $PIP download -q --no-deps --require-hashes "${BIN[@]}" -d "$dir" -r "$tmp/req.txt" || die "download failed: ${pin%% *}"
done
core=$(ls "$DIR"/core/vllm-*.whl)
[ "$(echo "$core" | wc -l)" = 1 ] || die "expected one vllm wheel in $DIR/core, found: $core"
[ "$(ls "$DIR"/whl/*.whl | wc -l)" = "$(grep -cE '^[a-z0-9-]+==' "$PINS" | awk '{print $1 - 1}')" ] \
    || die "$DIR/whl holds other wheels than $PINS pins (remove $DIR/whl and re-run)"

# 2. split the core wheel (parts rewritten when the wheel or the part size changed); they must reassemble
core_sha=$(sha256sum "$core" | cut -d' ' -f1)
if [ ! -f "$DIR/parts/SOURCE" ] || [ "$(cat "$DIR/parts/SOURCE")" != "$core_sha $PART_MIB" ]; then
    rm -f "$DIR"/parts/vllm.whl.part-*
    split -b "${PART_MIB}m" -d -a 2 "$core" "$DIR/parts/vllm.whl.part-"
    echo "$core_sha $PART_MIB" > "$DIR/parts/SOURCE"
fi
[ "$(cat "$DIR"/parts/vllm.whl.part-* | sha256sum | cut -d' ' -f1)" = "$core_sha" ] \
    || die "parts do not reassemble to $core (sha256 differs)"

# 3. manifest: one line per file, "<kind> <name> <bytes> <sha256>"
{
    echo "core $(basename "$core") $(stat -c %s "$core") $core_sha"
    for f in "$DIR"/parts/vllm.whl.part-* "$DIR"/whl/*.whl; do
        echo "$(basename "$(dirname "$f")") $(basename "$f") $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"
    done
} > "$DIR/MANIFEST.tmp" && mv "$DIR/MANIFEST.tmp" "$DIR/MANIFEST"

# 4. the calls: what travels besides the carried files is the working tree (tracked + untracked-not-ignored)
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
budget=$(( CALL_MIB * 1048576 - tree - 2 * 1048576 - $(stat -c %s "$DIR/MANIFEST") ))
rm -rf "$DIR/calls"
python3 - "$DIR" "$budget" <<'PY' || die "cannot plan the calls (a part larger than one call's budget? lower VLLM_PART_MIB)"
import os, sys
d, budget = sys.argv[1], int(sys.argv[2])
files = [ln.split() for ln in open(os.path.join(d, "MANIFEST")) if not ln.startswith("core ")]
# parts first (in order), then the small wheels largest first, each into the first call with room (first fit)
files = [f for f in files if f[0] == "parts"] + sorted((f for f in files if f[0] == "whl"), key=lambda f: -int(f[2]))
calls: list[list] = []
for kind, name, size, _ in files:
    size = int(size)
    if size > budget:
        raise SystemExit(f"{name} ({size / 2**20:.1f} MiB) exceeds one call's budget ({budget / 2**20:.1f} MiB)")
    for c in calls:
        if sum(s for _, _, s in c) + size <= budget:
            c.append((kind, name, size))
            break
    else:
        calls.append([(kind, name, size)])
total = sum(s for c in calls for _, _, s in c)
with open(os.path.join(d, "PLAN"), "w") as plan:
    for i, c in enumerate(calls, 1):
        folder = os.path.join(d, "calls", f"{i:02d}")
        os.makedirs(folder)
        for kind, name, _ in c:
            os.link(os.path.join(d, kind, name), os.path.join(folder, name))
        plan.write(f"{i:02d} {sum(s for _, _, s in c) / 2**20:.1f} {' '.join(n for _, n, _ in c)}\n")
    plan.write(f"# {len(calls)} calls, {total / 2**20:.1f} MiB carried ({total} bytes); per-call budget "
               f"{budget / 2**20:.1f} MiB = 64 MiB - working tree - 2 MiB - MANIFEST\n")
PY

n=$(grep -c '^[0-9]' "$DIR/PLAN")
echo "vllm_fetch: $(grep -c '^parts ' "$DIR/MANIFEST") parts of <= $PART_MIB MiB + $(ls "$DIR"/whl | wc -l) wheels in $DIR/; $(tail -1 "$DIR/PLAN" | sed 's/^# //')"
echo "vllm_fetch: on the GPU machine, call k = 1..$n: carry [\"$DIR/MANIFEST\", \"$DIR/calls/<k>\"], run: bash workflow/scripts/vllm_install_h200.sh (the last with --final)"
