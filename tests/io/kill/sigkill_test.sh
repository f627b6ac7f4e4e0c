#!/usr/bin/env bash
# A rank killed with SIGKILL in the middle of a write leaves the checkpoint intact: a new
# checkpoint never appears under its name and the source is unchanged; an in-place write is
# undone byte for byte from its undo file; with KSHARD_CONVERT (kshard-convert's path), a
# conversion killed mid-write leaves no output folder, the shards unchanged, and its temporary
# folder, which the next run refuses to touch.
# usage: sigkill_test.sh KILL_TARGET MPIEXEC [MPIEXEC FLAGS...]
set -uo pipefail
target=$1
shift
mpiexec=("$@")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
model="$scratch/model.safetensors"
out="$scratch/out.safetensors"
rows=${KSHARD_KILL_ROWS:-32768}  # 128 MiB: the writes take long enough to be caught

fail() { echo "FAIL: $*"; exit 1; }

# Runs PROGRAM ($2) on 2 ranks, waits for the file $1 to appear, SIGKILLs rank 1 and waits.
kill_when() {
  local sign=$1 program=$2
  shift 2
  "${mpiexec[@]}" -n 2 "$program" "$@" >"$scratch/log" 2>&1 &
  local job=$! waited=0
  until [ -e "$sign" ]; do
    sleep 0.01
    waited=$((waited + 1))
    kill -0 "$job" 2>/dev/null || { cat "$scratch/log"; fail "the writer ended before $sign appeared"; }
    [ "$waited" -lt 6000 ] || fail "$sign never appeared"
  done
  local victim
  victim=$(pgrep -f "$program $*" | while read -r pid; do
    [ "$(cat /proc/"$pid"/environ 2>/dev/null | tr '\0' '\n' | grep -E '^(OMPI_COMM_WORLD_RANK|PMI_RANK)=1$')" ] && echo "$pid"
  done | head -n 1)
  [ -n "$victim" ] || fail "rank 1 not found"
  kill -KILL "$victim"
  wait "$job" && fail "the job survived the loss of rank 1"
  return 0
}

"${mpiexec[@]}" -n 1 "$target" make "$model" "$rows" || fail "making the model"
before=$(sha256sum <"$model")

kill_when "$out.kshard-partial" "$target" copy "$model" "$out"
[ "$(sha256sum <"$model")" = "$before" ] || fail "the source changed"
[ ! -e "$out" ] || fail "an incomplete $out appeared under its name"
echo "new checkpoint: rank 1 killed during the write; source intact, no $out"

kill_when "$model.undo" "$target" rows "$model"
"${mpiexec[@]}" -n 2 "$target" undo "$model" || fail "undo failed"
[ "$(sha256sum <"$model")" = "$before" ] || fail "undo did not restore every byte"
[ ! -e "$model.undo" ] || fail "the undo file stayed"
echo "in place: rank 1 killed after the undo file was written; undo restored every byte"

[ -n "${KSHARD_CONVERT:-}" ] || exit 0
shards="$scratch/shards" hf="$scratch/hf"
"${mpiexec[@]}" -n 2 "$KSHARD_CONVERT" "$model" "$shards" --to sharded --mesh 2 --quiet >/dev/null ||
  fail "making the shards"
before=$(cat "$shards"/*.safetensors | sha256sum)
# A small buffer keeps the writers busy long enough to be caught.
kill_when "$hf.kshard-partial" "$KSHARD_CONVERT" "$shards" "$hf" --buffer-size 4KiB --quiet
[ "$(cat "$shards"/*.safetensors | sha256sum)" = "$before" ] || fail "the shards changed"
[ ! -e "$hf" ] || fail "an incomplete $hf appeared under its name"
"${mpiexec[@]}" -n 2 "$KSHARD_CONVERT" "$shards" "$hf" --quiet >"$scratch/log" 2>&1 &&
  fail "a conversion wrote over the killed one's temporary folder"
grep -q "exists (an interrupted conversion left it?)" "$scratch/log" || { cat "$scratch/log"; fail "no reason given"; }
echo "conversion: rank 1 killed during the write; shards intact, no $hf, its temporary refused"
