#!/usr/bin/env bash
# kshard-repair on a real checkpoint (sentence-transformers/all-MiniLM-L6-v2) at NP ranks.
#
#     run.sh NP KSHARD_REPAIR
#
# Fetches the model (scripts/deps.sh: kshard_fetch_model; exit 77 = skipped when it cannot be
# fetched or python3 lacks numpy and safetensors), builds damaged copies with make_damaged.py
# in a scratch folder under /tmp (removed at the end, on failure too), and at NP ranks:
#   - a dry run over the pristine model: exit 0, nothing found, nothing written;
#   - a dry run over a damaged copy: the damaged rows listed, nothing written;
#   - refusals: --max-rows 1 (exit 1, with --out and --in-place: nothing written), a missing
#     model (exit 2), a read-only weights file with --in-place (exit 2, unchanged), --undo
#     without an undo file (exit 2);
#   - for each damaged copy (f32, bf16, lmhead, unaligned, sharded, f16): --out to a new folder,
#     checked by check_repair.py; --in-place on a copy of it, checked; --undo, after which
#     every file equals the damaged copy again byte for byte (diff -r: cmp of every file);
#   - a single .safetensors file (no config: --keep 0) with --out to a file, checked.
# Layouts: Shard(0) over all ranks, except: NP=2 lmhead "Shard(1)" (columns split, directions
# from the LM head), NP=3 bf16 "Shard(1)", NP=2 f16 "StridedShard(0, sf=2)", NP=4 sharded
# --mesh 2x2 "Replicate(), Shard(0)".
#
# Environment: KSHARD_REALDATA_MPIEXEC (default mpiexec), KSHARD_REALDATA_CXX (default c++:
# builds the FNV-1a helper check_repair.py uses; pure Python without it, much slower).

set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 NP KSHARD_REPAIR" >&2
  exit 2
fi
np=$1
tool=$(realpath "$2")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
mpiexec=${KSHARD_REALDATA_MPIEXEC:-mpiexec}
cxx=${KSHARD_REALDATA_CXX:-c++}
start=$(date +%s.%N)

say() {
  printf '[realdata np%s %5.1fs] %s\n' "$np" \
    "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$*"
}
fail() {
  say "FAIL: $*"
  exit 1
}

# shellcheck source=../../scripts/deps.sh
source "$root/scripts/deps.sh"
if ! python3 -c 'import numpy, safetensors' 2>/dev/null; then
  say "skipped: python3 cannot import numpy and safetensors (pip install numpy safetensors)"
  exit 77
fi
if ! kshard_fetch_model; then
  say "skipped: the real test model could not be fetched into $KSHARD_MODEL_DIR"
  exit 77
fi
kshard_mpi_environment
# Open MPI waits a second or two before it tears down a job whose rank exited non-zero (the
# refusals below); not needed here. MPICH ignores it.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
[ -x "$tool" ] || fail "no kshard-repair at $tool"

scratch=$(mktemp -d /tmp/kshard-realdata-np"$np".XXXXXX)
cleanup() {
  chmod -R u+w "$scratch" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

copies=$scratch/copies
log=$scratch/last.log
if "$cxx" -O2 -shared -fPIC -o "$scratch/libfnv1a64.so" "$here/fnv1a64.cpp" 2>"$log"; then
  export KSHARD_REALDATA_FNV_LIB=$scratch/libfnv1a64.so
else
  say "note: could not build the FNV-1a helper with '$cxx' (pure Python instead):"
  cat "$log"
fi
export PYTHONDONTWRITEBYTECODE=1  # keep the source tree clean of __pycache__

python3 "$here/make_damaged.py" "$KSHARD_MODEL_DIR" "$copies" || fail "make_damaged.py failed"
say "damaged copies made in $copies"

repair() { "$mpiexec" -n "$np" "$tool" "$@"; }

# expect CODE COMMAND...: runs COMMAND (its output in $log), fails unless it exits with CODE.
expect() {
  local want=$1 rc=0
  shift
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne "$want" ]; then
    cat "$log"
    fail "exit code $rc, expected $want: $*"
  fi
}

check() {
  python3 "$here/check_repair.py" --np "$np" "$@" || fail "check_repair.py $*"
}

# same DIR_A DIR_B: the same files with the same bytes (diff -r compares every file, like cmp).
same() {
  diff -r "$1" "$2" >"$log" 2>&1 || {
    cat "$log"
    fail "$2 differs from $1"
  }
}

# 1. Dry runs.
expect 0 repair "$KSHARD_MODEL_DIR" --dry-run --report "$scratch/pristine.json"
check --mode dry-run --damaged "$KSHARD_MODEL_DIR" --report "$scratch/pristine.json"
say "dry run over the pristine model: nothing found, nothing written"
expect 0 repair "$copies/f32" --dry-run --report "$scratch/dry.json"
check --mode dry-run --damaged "$copies/f32" --report "$scratch/dry.json" \
  --manifest "$copies/f32.manifest.json"
say "dry run over the damaged F32 copy: its rows listed, nothing written"

# 2. Refusals: nothing written.
expect 1 repair "$copies/f32" --max-rows 1 --out "$scratch/refused"
[ ! -e "$scratch/refused" ] || fail "--max-rows 1 (refused) created $scratch/refused"
grep -q "max_rows" "$log" || fail "--max-rows 1: the refusal does not say why"
work=$scratch/work
cp -a "$copies/f32" "$work"
expect 1 repair "$work" --max-rows 1 --in-place
same "$copies/f32" "$work"
expect 2 repair "$scratch/no-such-model" --out "$scratch/refused"
[ ! -e "$scratch/refused" ] || fail "a missing model created $scratch/refused"
chmod 0444 "$work/model.safetensors"
expect 2 repair "$work" --in-place
[ "$(stat -c %a "$work/model.safetensors")" = 444 ] || fail "the read-only file's mode changed"
same "$copies/f32" "$work"
expect 2 repair "$copies/f32" --undo
rm -rf "$work"
say "refusals: --max-rows 1 exit 1, missing model exit 2, read-only --in-place exit 2," \
  "--undo without an undo file exit 2; nothing written"

# 3. Every damaged copy: --out, --in-place, --undo.
for name in f32 bf16 lmhead unaligned sharded f16; do
  layout=()
  case "$np:$name" in
    2:lmhead | 3:bf16) layout=(--layout "Shard(1)") ;;
    2:f16) layout=(--layout "StridedShard(0, sf=2)") ;;
    4:sharded) layout=(--mesh 2x2 --layout "Replicate(), Shard(0)") ;;
  esac
  manifest=$copies/$name.manifest.json
  out=$scratch/out-$name
  expect 0 repair "$copies/$name" --out "$out" --report "$scratch/$name-out.json" "${layout[@]}"
  check --mode out --damaged "$copies/$name" --repaired "$out" \
    --report "$scratch/$name-out.json" --manifest "$manifest"
  rm -rf "$out"
  cp -a "$copies/$name" "$work"
  expect 0 repair "$work" --in-place --report "$scratch/$name-in-place.json" "${layout[@]}"
  check --mode in-place --damaged "$copies/$name" --repaired "$work" \
    --report "$scratch/$name-in-place.json" --manifest "$manifest"
  expect 0 repair "$work" --undo
  same "$copies/$name" "$work"
  rm -rf "$work"
  say "$name: --out, --in-place and --undo checked ${layout[*]}"
done

# 4. A single file: no config.json, so the pad row is kept by --keep.
expect 0 repair "$copies/f32/model.safetensors" --out "$scratch/single.safetensors" --keep 0 \
  --report "$scratch/single.json"
check --mode out --damaged "$copies/f32/model.safetensors" \
  --repaired "$scratch/single.safetensors" --report "$scratch/single.json" \
  --manifest "$copies/f32.manifest.json" --kept 0
say "single file: --out to a file checked"

leftovers=$(find "$scratch" -name '*.kshard-partial' -o -name '*.kshard-undo')
[ -z "$leftovers" ] || fail "left behind: $leftovers"
say "all checks passed"
