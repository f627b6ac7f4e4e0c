#!/usr/bin/env bash
# kshard-convert at NP ranks on small checkpoints make_convert_cases.py writes (numpy and the
# safetensors package; exit 77 = skipped without them) in a scratch folder under /tmp (removed
# at the end), every output checked by check_convert.py against the reference safetensors
# reader, every launch's exit code checked on EVERY rank (harness.sh):
#
#     convert.sh NP KSHARD_CONVERT
#
#   (a) --to hf: a 4-rank job's per-rank shards (3-D BF16, I64 1-D, BOOL, empty pieces, a
#       replicated tensor kept once) and a consolidated model (a 0-d tensor, a subfolder) give
#       the input's tensors exactly, headers padded to 8 bytes, config.json and tokenizer.json
#       copied (from .hf_metadata/ for shards, the job's fqn maps left out); model.safetensors
#       alone, or split at --max-shard-size with a right model.safetensors.index.json, read
#       back as an indexed folder (a stale model.safetensors beside the index left out); a
#       single .safetensors file; IN and OUT with a trailing slash; --no-sync (also through a
#       4 KiB buffer): the same output;
#   (b) --to sharded: the shards resharded for --mesh 3 and 2x2 with --layout and --layout-for
#       (the first matching pattern wins), each file's boxes and DCP_SHARDING_INFO offsets the
#       torch.chunk arithmetic check_convert.py computes, then --to hf again: the same tensors;
#   (c) refusals, exit 2 on every rank with rank 0 naming the cause, no output and no temporary
#       folder left, the input unchanged (sha256 of every file): OUT exists, its temporary
#       folder exists, its parent is missing, a missing IN, shards whose pieces overlap, a
#       consolidated file among shards, a missing shard, --mesh/--layout-for without --to
#       sharded, a bad --max-shard-size, --to, --buffer-size, a Partial layout (also per
#       pattern), a layout that does not fit the mesh, a rule without PATTERN=, OUT that
#       differs between ranks (an MPMD launch); --version: exit 0, "kshard-convert VERSION";
#   (e) PyTorch DCP folders written by torch, consolidated to their ground truth (--verify: their
#       CRC-32s checked); a pickle that names os.system refused;
#   (d) progress, stderr not a terminal: the last line reports the bytes of the whole
#       conversion (a 24 MB tensor through a 4 KiB buffer: many updates, bytes not a multiple
#       of the ranks' shares); --quiet prints none; the summary on stdout.
#
# Environment: KSHARD_TOOL_MPIEXEC (default mpiexec), KSHARD_TOOL_TIMEOUT (harness.sh).

set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 NP KSHARD_CONVERT" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=harness.sh
source "$here/harness.sh"
need_reference_python
harness_begin "$1" "$2" kshard-convert-tool
export PYTHONDONTWRITEBYTECODE=1  # check_convert.py imports make_convert_cases.py: no __pycache__
version=$(sed -n 's/^project(kshard VERSION \([0-9.]*\).*/\1/p' "$here/../../CMakeLists.txt")
cases=$scratch/cases
python3 "$here/make_convert_cases.py" "$cases" || { echo "make_convert_cases.py failed" >&2; exit 1; }
cd "$scratch" || exit 1
inputs_before=$(snapshot "$cases")

# check NAME CHECK-ARGUMENTS...: check_convert.py holds for the last launch's output.
check() {
  local name=$1
  shift
  python3 "$here/check_convert.py" "$@" >"$dir/check.log" 2>&1 ||
    fail "$name: $(head -c 1200 "$dir/check.log")"
}

# converts_to_hf NAME IN OUT CASE [TOOL-OPTIONS...]: exit 0 on every rank, OUT consolidated and
# right.
converts_to_hf() {
  local name=$1 in=$2 out=$3 case=$4 size=5000000000
  shift 4
  [ "${1:-}" = --max-shard-size ] && size=$2
  expect "$name" 0 "$in" "$out" --quiet "$@" && check "$name" hf "$out" "$case" "$in" \
    --max-shard-size "$size"
}

# (a) consolidated output.
hf_cases() {
  converts_to_hf shards_to_hf "$cases/shards" shards_hf shards
  converts_to_hf shards_split "$cases/shards" shards_split shards --max-shard-size 1024
  converts_to_hf model_to_hf "$cases/model" model_hf model
  cmp -s "$cases/model/1_Pooling/config.json" model_hf/1_Pooling/config.json ||
    fail "model_to_hf: 1_Pooling/config.json not copied"
  converts_to_hf single_file_to_hf "$cases/big.safetensors" big_hf big
  converts_to_hf model_split "$cases/model" model_split model --max-shard-size 1500
  converts_to_hf indexed_to_hf model_split indexed_hf model
  # A weights file the index does not name (left by an earlier save) is not the checkpoint's:
  # it must not end up in the output, least of all in place of the converted weights.
  cp -r model_split stale && cp shards_hf/model.safetensors stale/
  converts_to_hf stale_weights_beside_index stale stale_hf model
  converts_to_hf trailing_slash "$cases/shards/" slash_hf/ shards
  converts_to_hf no_sync "$cases/shards" shards_hf_no_sync shards --no-sync
  converts_to_hf no_sync_small_buffer "$cases/big.safetensors" big_hf_no_sync big --no-sync \
    --buffer-size 4KiB
}

# resharded NAME IN OUT CASE TOOL-OPTIONS...: --to sharded gives the expected shards, and
# --to hf of them the case's tensors.
resharded() {
  local name=$1 in=$2 out=$3 case=$4 source=$2
  shift 4
  expect "$name" 0 "$in" "$out" --to sharded --quiet "$@" &&
    check "$name" sharded "$out" "$case" "$source" "$@" &&
    converts_to_hf "${name}_to_hf" "$out" "$out.hf" "$case"
}

# (b) per-rank output; the first --layout-for pattern a name matches wins (o_proj by columns,
# the other projections whole on the first rank).
sharded_cases() {
  resharded shards_to_mesh3 "$cases/shards" mesh3 shards --mesh 3 \
    --layout-for '*o_proj*=Shard(1)' --layout-for '*proj*=Replicate()'
  resharded shards_to_mesh2x2 "$cases/shards" mesh2x2 shards --mesh 2x2 \
    --layout 'Shard(0), Shard(1)' --layout-for '*o_proj*=Replicate(), Shard(0)'
  resharded model_to_mesh3 "$cases/model" model_mesh3 model --mesh 3
  resharded model_to_mesh1 "$cases/model" model_mesh1 model
}

# refused NAME TEXT TOOL-ARGUMENTS...: exit 2 on every rank, rank 0 says TEXT, and the output
# (the second argument, where one is given) and its temporary folder are absent.
refused() {
  local name=$1 text=$2 out=${4:-}
  shift 2
  expect "$name" 2 "$@" || return
  grep -qF -- "$text" "$dir/out.0" || fail "$name: rank 0 does not say \"$text\": $(head -c 400 "$dir/out.0")"
  if [ -n "$out" ] && [ "${out#-}" = "$out" ]; then
    [ -e "$out" ] && fail "$name: '$out' was written"
    [ -e "$out.kshard-partial" ] && fail "$name: '$out.kshard-partial' was left behind"
  fi
  return 0
}

# (c) refusals of the paths and the input: nothing written, the input and OUT unchanged.
path_refusals() {
  local before
  before=$(snapshot "$cases/shards")
  mkdir out_exists && echo keep >out_exists/file
  expect out_exists 2 "$cases/shards" out_exists &&
    { grep -qF "'out_exists' exists" "$dir/out.0" || fail "out_exists: rank 0 does not name it"; }
  if [ "$(ls -A out_exists)" != file ] || [ "$(cat out_exists/file)" != keep ]; then
    fail "out_exists: the existing folder changed"
  fi
  [ -e out_exists.kshard-partial ] && fail "out_exists: a temporary folder was left behind"
  mkdir left.kshard-partial
  expect partial_exists 2 "$cases/shards" left &&
    { grep -qF "'left.kshard-partial' exists" "$dir/out.0" || fail "partial_exists: not named"; }
  [ -e left ] && fail "partial_exists: 'left' was written"
  refused no_parent "'no_such_folder'" "$cases/shards" no_such_folder/out
  refused missing_input "'$cases/missing'" "$cases/missing" missing_out
  [ "$(snapshot "$cases/shards")" = "$before" ] || fail "path refusals: the input folder changed"
}

# (c) folders of per-rank shards that do not make a checkpoint: refused, unchanged.
input_refusals() {
  local before
  cp -r "$cases/shards" stray && cp "$cases/model/model.safetensors" stray/extra.safetensors
  cp -r "$cases/shards" gap && rm gap/shard-00002-model-00001-of-00001.safetensors
  before=$(snapshot "$cases/lying")$(snapshot stray)$(snapshot gap)
  refused lying_shards "overlap" "$cases/lying" lying_out
  refused stray_consolidated_file "has no DCP_SHARDING_INFO" stray stray_out
  refused missing_shard "a piece is missing" gap gap_out
  [ "$before" = "$(snapshot "$cases/lying")$(snapshot stray)$(snapshot gap)" ] ||
    fail "input refusals: an input changed"
}

# (c) refusals of the options.
option_refusals() {
  refused mesh_without_sharded "need --to sharded" "$cases/shards" u_mesh --mesh 2
  refused layout_for_without_sharded "need --to sharded" "$cases/shards" u_rule \
    --layout-for '*=Shard(1)'
  refused bad_max_shard_size "'5XB'" "$cases/shards" u_size --max-shard-size 5XB
  refused bad_to "--to" "$cases/shards" u_to --to gguf
  refused small_buffer "below the 4096" "$cases/shards" u_buffer --buffer-size 1KiB
  refused partial_layout "Partial(sum)" "$cases/shards" u_partial --to sharded \
    --layout 'Partial(sum)'
  refused partial_layout_for "Partial(max)" "$cases/shards" u_partial_for --to sharded \
    --layout-for '*norm*=Partial(max)'
  refused layout_misfit "1 placements for a mesh of 2" "$cases/shards" u_misfit --to sharded \
    --mesh 2x2 --layout 'Shard(0)'
  refused rule_without_pattern "PATTERN=LAYOUT" "$cases/shards" u_rule2 --to sharded \
    --layout-for 'Shard(1)'
  expect version 0 --version &&
    { grep -qx "kshard-convert $version" "$dir/stdout.0" ||
      fail "version: rank 0 printed '$(head -c 200 "$dir/out.0")', not 'kshard-convert $version'"; }
  local others=$((np > 1 ? np - 1 : 1))
  launch out_differs $((others + 1)) -n 1 @TOOL "$cases/shards" d_one : \
    -n "$others" @TOOL "$cases/shards" d_two
  codes_are out_differs 2 &&
    { grep -q "OUT differs" "$dir/out.0" || fail "out_differs: the message names no argument"; }
  [ -e d_one ] || [ -e d_two ] && fail "out_differs: an output was written"
}

# (d) progress on rank 0's stderr, not a terminal; the summary on stdout.
progress_cases() {
  expect progress 0 "$cases/big.safetensors" big_progress --buffer-size 4KiB &&
    check progress progress "$dir/stderr.0" big
  grep -qF "wrote 1 file to big_progress: 24.0 MB" "$dir/stdout.0" ||
    fail "progress: rank 0's summary: $(head -c 300 "$dir/stdout.0")"
  local r
  for ((r = 1; r < np; r++)); do
    [ -s "$dir/out.$r" ] && fail "progress: rank $r printed: $(head -c 200 "$dir/out.$r")"
  done
  expect quiet 0 "$cases/big.safetensors" big_quiet --buffer-size 4KiB --quiet &&
    { grep -q " GB, " "$dir/stderr.0" && fail "quiet: a progress line was printed"; }
  expect split_summary 0 "$cases/model" model_split_summary --max-shard-size 1500 --quiet &&
    { grep -qF "wrote 3 files to model_split_summary" "$dir/stdout.0" ||
      fail "split_summary: $(head -c 300 "$dir/stdout.0")"; }
}

# (e) PyTorch DCP folders torch wrote (tests/io/fixtures/torch_dcp): consolidated, each tensor
# the bytes of the ground truth; a .metadata whose pickle names os.system: refused, nothing run.
dcp_cases() {
  local fixtures=$here/../io/fixtures/torch_dcp name
  for name in fsdp2_adamw_4rank transposed_2rank per_rank_metadata_2rank; do
    expect "dcp_$name" 0 "$fixtures/$name/checkpoint" "dcp_$name" --quiet &&
      { python3 "$here/check_convert.py" same "dcp_$name/model.safetensors" \
          "$fixtures/$name/expected.safetensors" >"$dir/check.log" 2>&1 ||
          fail "dcp_$name: $(head -c 600 "$dir/check.log")"; }
  done
  # The last case's one bytes item (saved by both ranks, named once).
  grep -qF "left out 1 item that is not a tensor (a Hugging Face model and per-rank shards hold tensors only): 'step'" \
    "$dir/stdout.0" || fail "dcp: the item left out is not named: $(head -c 300 "$dir/stdout.0")"
  # Written as another job's DCP (its bytes items carried), then consolidated: the same tensors.
  expect dcp_to_dcp 0 "$fixtures/fsdp2_adamw_4rank/checkpoint" dcp_as_dcp --to dcp --mesh 2x2 \
    --layout "Shard(1), Shard(0)" --quiet &&
    { grep -qF "left out" "$dir/stdout.0" && fail "dcp_to_dcp: the bytes items were left out"; }
  expect dcp_to_dcp_to_hf 0 dcp_as_dcp dcp_as_dcp_hf --verify --quiet &&
    { python3 "$here/check_convert.py" same dcp_as_dcp_hf/model.safetensors \
      "$fixtures/fsdp2_adamw_4rank/expected.safetensors" >"$dir/check.log" 2>&1 ||
      fail "dcp_to_dcp_to_hf: $(head -c 600 "$dir/check.log")"; }
  expect dcp_verify 0 "$fixtures/tp_2rank/checkpoint" dcp_verified --verify --quiet &&
    { grep -qF "verified 7 checksum(s)" "$dir/stdout.0" ||
      fail "dcp_verify: $(head -c 300 "$dir/stdout.0")"; }
  cp -r "$fixtures/tp_2rank/checkpoint" evil_dcp
  cp "$here/../io/fixtures/dcp_pickles/evil_os_system.pkl" evil_dcp/.metadata
  rm -f /tmp/kshard-pwn  # what the pickle's command would make
  refused dcp_evil_pickle "os.system" evil_dcp evil_dcp_out
  [ -e /tmp/kshard-pwn ] && fail "dcp_evil_pickle: the pickle's command ran"
}

hf_cases
sharded_cases
dcp_cases
path_refusals
input_refusals
option_refusals
progress_cases
leftovers=$(find . -maxdepth 1 -name '*.kshard-partial' ! -name left.kshard-partial)
[ -z "$leftovers" ] || fail "temporary folders left behind: $leftovers"
[ "$(snapshot "$cases")" = "$inputs_before" ] || fail "an input checkpoint was changed"
harness_end kshard-convert
