#!/usr/bin/env bash
# Here (a CPU machine with PyPI): the wheels the whole DAG needs on the offline GPU machine (snakemake, lm-eval and
# their closure), named in workflow/scripts/h200-wheels.txt, into the git-ignored .whl/ (docs/offline-gpu.md).
#
#   workflow/scripts/whl_fetch.sh        # idempotent: pip keeps what is already in .whl/
#
# cp312 manylinux / pure-Python wheels by download; the three that exist only as sdists (connection_pool,
# sqlitedict, word2number) are built here with `pip wheel --no-deps`. Fails unless .whl/ then holds exactly the
# listed files.
set -euo pipefail
die() { echo "whl_fetch: error: $*" >&2; exit 1; }
cd "$(git rev-parse --show-toplevel)" || die "run inside the repository"
LIST=workflow/scripts/h200-wheels.txt
PIP=${PIP:-python3 -m pip}
SDIST_ONLY="connection-pool|sqlitedict|word2number"
git check-ignore -q .whl/x || die ".whl/ is not git-ignored: it must not travel uncarried"
mkdir -p .whl
reqs=$(mktemp); trap 'rm -f "$reqs"' EXIT
# file name -> name==version (the wheel-name rule: name, version, then tags, '-'-separated)
grep -v '^#' "$LIST" | awk 'NF {split($1, p, "-"); n = p[1]; gsub("_", "-", n); print n "==" p[2]}' > "$reqs"
grep -Ev "^($SDIST_ONLY)==" "$reqs" | $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl -r /dev/stdin
grep -E "^($SDIST_ONLY)==" "$reqs" | $PIP wheel -q --no-deps -w .whl -r /dev/stdin
missing=$(comm -23 <(grep -v '^#' "$LIST" | awk 'NF {print $1}' | sort) <(ls .whl | sort))
[ -z "$missing" ] || die "not fetched: $missing"
echo "whl_fetch: $(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/ (carry: [\".whl\"])"
