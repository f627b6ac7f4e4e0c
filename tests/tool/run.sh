#!/usr/bin/env bash
# kshard-repair's refusals and errors at NP ranks, on small checkpoints make_cases.py writes
# (Python's standard library only) in a scratch folder under /tmp (removed at the end):
#
#     run.sh NP KSHARD_REPAIR
#
# Every case checks the exit code of EVERY rank (harness.sh's wrapper records each rank's) and,
# where the tool must not write, that nothing was written:
#   - a non-UTF-8 model name or --embed with --report: the report is written (valid JSON);
#   - a symbolic link loop in a checkpoint folder with --out: exit 2, no crash, no output
#     folder left;
#   - --out on a folder copies its subfolders (1_Pooling/);
#   - --out on a sharded folder whose second shard cannot be written: exit 2, no shard and no
#     copied file left, the folder as it was; --out --no-sync: the same files; --no-sync
#     without --out: exit 2;
#   - --report naming --out or MODEL: exit 2, the checkpoint untouched, no output;
#   - --undo on a copy of an in-place repaired folder: exit 2, neither folder restored;
#   - 1-D and 3-D embeddings, F16 and F64 LM heads next to an F32 embedding: exit 1;
#   - --dry-run where the real run refuses (no healthy rows, a damaged LM head, an LM head of
#     another shape): exit 1, as the real run;
#   - options that differ between ranks (an MPMD launch): exit 2 on every rank, no hang;
#   - a DCP folder (with KSHARD_CONVERT) repaired into DCP, per-rank shards and a consolidated
#     model, each the same tensors as the safetensors folder's repair;
#   - generated: every operation (--out, --in-place, --undo, --report) x every path it creates
#     x every spelling that makes it an input (same text, sub/.., symbolic and hard link): exit
#     2, rank 0 names the path, no file changed.
#
# Environment: KSHARD_TOOL_MPIEXEC (default mpiexec), KSHARD_TOOL_TIMEOUT (harness.sh).

set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 NP KSHARD_REPAIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=harness.sh
source "$here/harness.sh"
harness_begin "$1" "$2" kshard-tool
cases=$scratch/cases
python3 "$here/make_cases.py" "$cases" || { echo "make_cases.py failed" >&2; exit 1; }
cd "$scratch" || exit 1

good=$cases/good.safetensors

# D3: bytes that are not UTF-8 in paths and names reach the report (replaced, not a crash).
bad=$'bad\xffname.safetensors'
cp "$good" "$bad"
expect non_utf8_model 0 "$bad" --dry-run --report u1.json
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' u1.json 2>/dev/null ||
  fail "non_utf8_model: no valid report"
expect non_utf8_embed 1 "$good" --dry-run --embed $'x\xff' --report u2.json
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["status"] == "refused"' u2.json \
  2>/dev/null || fail "non_utf8_embed: the report does not say refused"
expect non_utf8_out 0 "$bad" --out $'out\xff.safetensors' --report u3.json
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["status"] == "done"' u3.json \
  2>/dev/null || fail "non_utf8_out: the report does not say done"

# D4: a link loop in the checkpoint folder is an error on every rank.
cp -r "$cases/folder" loopdir && ln -s loop loopdir/loop
expect symlink_loop 2 loopdir --out loop_out
[ -e loop_out ] && fail "symlink_loop: the output folder it made was left behind"

# D7: --out copies the folder's subfolders too.
expect folder_out 0 "$cases/folder" --out folder_out
for f in config.json tokenizer.json 1_Pooling/config.json; do
  cmp -s "$cases/folder/$f" "folder_out/$f" || fail "folder_out: $f not copied"
done

# D14: a sharded output is whole or absent: the second shard cannot be written (a folder holds
# its name), so the first, already written, and the copied index are removed again; the folder
# keeps what it had.
expect sharded_out 0 "$cases/sharded" --out sharded_out
# --no-sync writes the same files (nothing fsynced); it only goes with --out.
expect sharded_out_no_sync 0 "$cases/sharded" --out sharded_out_no_sync --no-sync
for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors; do
  cmp -s "sharded_out/$f" "sharded_out_no_sync/$f" || fail "sharded_out_no_sync: $f differs"
done
expect no_sync_in_place 2 "$cases/sharded" --in-place --no-sync
mkdir -p sharded_fail/model-00002-of-00002.safetensors
expect sharded_out_fails 2 "$cases/sharded" --out sharded_fail
[ -e sharded_fail/model-00001-of-00002.safetensors ] &&
  fail "sharded_out_fails: the first shard was left behind"
[ "$(ls -A sharded_fail)" = model-00002-of-00002.safetensors ] ||
  fail "sharded_out_fails: left behind: $(ls -A sharded_fail | tr '\n' ' ')"

# D12: a report that would overwrite the output or the checkpoint is refused, nothing written.
cp "$good" rg.safetensors && cp "$good" rg.orig
expect report_is_out 2 rg.safetensors --out rg_out.safetensors --report rg_out.safetensors
[ -e rg_out.safetensors ] && fail "report_is_out: rg_out.safetensors was written"
expect report_is_model 2 rg.safetensors --dry-run --report rg.safetensors
cmp -s rg.safetensors rg.orig || fail "report_is_model: the checkpoint was overwritten"
cp -r "$cases/folder" rgdir
expect report_in_model_folder 2 rgdir --dry-run --report rgdir/model.safetensors
cmp -s rgdir/model.safetensors "$cases/folder/model.safetensors" ||
  fail "report_in_model_folder: the weights were overwritten"
mkdir fo2
expect report_in_out_folder 2 "$cases/folder" --out fo2 --report fo2/config.json
[ -e fo2/model.safetensors ] && fail "report_in_out_folder: the output was written"
[ -e fo2/config.json ] && fail "report_in_out_folder: the report was written"

# D6: the undo file of a copied checkpoint names the original: refused, neither restored.
mkdir ipA && cp "$good" ipA/model.safetensors
expect in_place 0 ipA --in-place
cp ipA/model.safetensors ipA.repaired && cp -r ipA ipB
expect undo_copy 2 ipB --undo
cmp -s ipA/model.safetensors ipA.repaired || fail "undo_copy: the original was restored"
cmp -s ipB/model.safetensors ipA.repaired || fail "undo_copy: the copy was changed"
[ -e ipB/model.safetensors.kshard-undo ] || fail "undo_copy: the copy's undo file is gone"
expect undo_original 0 ipA --undo

# D17: a PyTorch DCP folder (the sharded case written as the DCP of a 2-rank job by
# kshard-convert, KSHARD_CONVERT) repairs into a DCP (its own form), per-rank shards and a
# consolidated model, each consolidating to the very bytes of the safetensors folder's repair.
if [ -n "${KSHARD_CONVERT:-}" ]; then
  consolidate() { timeout 120 "$mpiexec" -n "$np" "$KSHARD_CONVERT" "$@" --quiet >/dev/null 2>&1; }
  consolidate "$cases/sharded" dcp_in --to dcp --mesh 2 || fail "dcp: kshard-convert --to dcp failed"
  expect dcp_reference 0 "$cases/sharded" --out dcp_reference --to hf
  expect dcp_repair_as_stored 0 dcp_in --out dcp_out
  [ -f dcp_out/.metadata ] && [ -f dcp_out/__1_0.distcp ] || fail "dcp_repair_as_stored: not a DCP"
  expect dcp_repair_sharded 0 dcp_in --out dcp_sharded --to sharded
  expect dcp_repair_hf 0 dcp_in --out dcp_hf --to hf
  consolidate dcp_out dcp_out_hf && consolidate dcp_sharded dcp_sharded_hf ||
    fail "dcp: kshard-convert could not consolidate the repairs"
  for out in dcp_out_hf dcp_sharded_hf dcp_hf; do
    cmp -s dcp_reference/model.safetensors "$out/model.safetensors" ||
      fail "dcp: $out differs from the safetensors folder's repair"
  done
fi

# D11: tensors the tool cannot repair are refusals.
for c in embed_1d embed_3d lm_f16 lm_f64; do
  expect "$c" 1 "$cases/$c.safetensors" --dry-run
done

# D13: a dry run refuses where the real run refuses.
for c in all_damaged lm_damaged lm_shape; do
  expect "${c}_out" 1 "$cases/$c.safetensors" --out "$c.out.safetensors"
  expect "${c}_dry_run" 1 "$cases/$c.safetensors" --dry-run
done

# D15: options that differ between ranks: exit 2 everywhere instead of a hang.
others=$((np > 1 ? np - 1 : 1))
launch report_on_rank0_only $((others + 1)) -n 1 @TOOL "$good" --dry-run --report dv.json \
  : -n "$others" @TOOL "$good" --dry-run
codes_are report_on_rank0_only 2
launch strategy_differs $((others + 1)) -n 1 @TOOL "$good" --dry-run --strategy mean \
  : -n "$others" @TOOL "$good" --dry-run --strategy output
codes_are strategy_differs 2
grep -q -- '--strategy differs' "$dir/out.0" || fail "strategy_differs: the message names no option"
launch parse_differs $((others + 1)) -n 1 @TOOL "$good" --dry-run \
  : -n "$others" @TOOL "$good" --dry-run --no-such-option
codes_are parse_differs 2

# D16 (generated): no run writes over a file it reads, however the path is spelled. Each row
# is an operation, a path it creates (or truncates, renames, removes) and an input; each
# spelling makes that path name the input: the same text, a path through sub/.., a symbolic
# link and a hard link at it. Every rank must exit 2, rank 0 name the path, and no regular file
# of the case's folder change (sha256 of each, before and after).
generated=0
skipped=0
# clash_case NAME DIR MADE TOOL-ARGUMENTS...
clash_case() {
  local name=$1 case_dir=$2 made=$3 before
  shift 3
  before=$(snapshot "$case_dir")
  expect "$name" 2 "$@"
  grep -qF -- "'$made'" "$dir/out.0" || fail "$name: rank 0 does not name '$made': $(head -c 400 "$dir/out.0")"
  [ "$(snapshot "$case_dir")" = "$before" ] || fail "$name: a file in $case_dir changed"
  generated=$((generated + 1))
}
# made_of MADE ARG MODEL: the path the run creates, from the argument that names it or the model.
made_of() {
  case $1 in
    output | report) echo "$2" ;;
    temporary) echo "$2.kshard-partial" ;;
    undo) echo "$3.kshard-undo" ;;
    undo_temporary) echo "$3.kshard-undo.kshard-partial" ;;
  esac
}
# generated_case OP MADE INPUT SPELLING
generated_case() {
  local op=$1 made=$2 input=$3 sp=$4 d=$scratch/gen.$generated.$skipped
  local name=gen_${op}_${made}_is_${input}_by_$sp model arg argpath at
  mkdir -p "$d/sub"
  model=$d/m.safetensors
  arg=$d/o.safetensors                         # the argument --out or --report is given
  [ "$sp" = dotdot ] && argpath=$d/sub/../o.safetensors || argpath=$arg
  if [ "$input" = undo_file ]; then             # --undo's input: the model's undo file
    cp "$good" "$model"
    launch "${name}_setup" "$np" -n "$np" @TOOL "$model" --in-place
    codes_are "${name}_setup" 0
    arg=$model.kshard-undo
    [ "$sp" = dotdot ] && argpath=$d/sub/../m.safetensors.kshard-undo || argpath=$arg
    [ "$sp" = symlink ] || [ "$sp" = hardlink ] && { arg=$d/o.json && argpath=$arg; }
    at=$model.kshard-undo
  else
    at=$(made_of "$made" "$arg" "$model")      # where the input must lie to be that path
    case $made in undo | undo_temporary)
      [ "$sp" = same ] || [ "$sp" = dotdot ] && { skipped=$((skipped + 1)); return; } ;;
    esac
    if [ "$sp" = same ] || [ "$sp" = dotdot ]; then model=$at; fi
    cp "$good" "$model"
    at=$model                                   # what a link names
  fi
  [ "$sp" = symlink ] && ln -s "$(realpath "$at")" "$(made_of "$made" "$arg" "$model")"
  [ "$sp" = hardlink ] && ln "$at" "$(made_of "$made" "$arg" "$model")"
  local args=("$model")
  case $op in
    out) [ "$made" = report ] && args+=(--out "$d/x.safetensors" --report "$argpath") ||
      args+=(--out "$argpath") ;;
    in_place) args+=(--in-place) && [ "$made" = report ] && args+=(--report "$argpath") ;;
    undo) args+=(--undo --report "$argpath") ;;
    dry_run) args+=(--dry-run --report "$argpath") ;;
  esac
  clash_case "$name" "$d" "$(made_of "$made" "$argpath" "$model")" "${args[@]}"
}
table=(
  "out output model" "out temporary model" "out report model"
  "in_place undo model" "in_place undo_temporary model" "in_place report model"
  "undo report model" "undo report undo_file"
  "dry_run report model"
)
for row in "${table[@]}"; do
  read -r op made input <<<"$row"
  for sp in same dotdot symlink hardlink; do generated_case "$op" "$made" "$input" "$sp"; done
done
[ "$generated" -eq 32 ] || fail "generated $generated clash cases (skipped $skipped), expected 32"
echo "ok   [np$np] $generated generated clash cases ($skipped not spellable: the undo paths derive from MODEL)"

harness_end kshard-repair
