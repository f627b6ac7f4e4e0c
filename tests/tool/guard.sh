#!/usr/bin/env bash
# No command writes over anything a checkpoint reads, every rank reads the same bytes, and no
# input blocks: kshard-convert and kshard-repair at NP ranks on every input form (a single
# file, a Hugging Face folder, an indexed folder, per-rank shards, a PyTorch DCP folder, each with
# its side files), on small checkpoints make_convert_cases.py writes (numpy and safetensors;
# exit 77 = skipped without them):
#
#     guard.sh NP KSHARD_CONVERT KSHARD_REPAIR
#
#   (a) every file of every form x every path a command writes (convert's OUT and its temporary
#       folder, repair's --out, --report and undo file), the spelling of that path taken in turn
#       (the same text, through `..`, a symbolic link, a hard link): exit 2 on every rank, every
#       input byte unchanged; OUT inside a folder the run copies (a Hugging Face folder and its
#       subfolders, .hf_metadata/): refused;
#   (b) an empty OUT or --report, and a --report in a missing folder: exit 2, nothing written;
#   (c) every input form x a FIFO, a socket, a folder or a link to /dev/zero in place of one of
#       its files: exit 2 within 5 s;
#   (d) at NP >= 2, an MPMD launch where the last rank works in its own folder (a node-local
#       copy) whose copy of a file of the checkpoint differs: in size or in a byte that
#       describes the contents, exit 2 on every rank naming the file; a tensor byte of a
#       safetensors file, exit 0 (the docs: tensor bytes are compared by --verify's checksums
#       only);
#   (e) per-rank shards whose last rank's file is missing: with a config, exit 2 naming the
#       embedding's shape against vocab_size; without one, exit 0 and a warning that says so.
#
# Environment: KSHARD_TOOL_MPIEXEC (default mpiexec), KSHARD_TOOL_TIMEOUT (harness.sh).

set -uo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 NP KSHARD_CONVERT KSHARD_REPAIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=harness.sh
source "$here/harness.sh"
need_reference_python
harness_begin "$1" "$2" kshard-guard-tool
convert=$tool
repair=$(realpath "$3")
export PYTHONDONTWRITEBYTECODE=1
cases=$scratch/cases
python3 "$here/make_convert_cases.py" "$cases" >/dev/null ||
  { echo "make_convert_cases.py failed" >&2; exit 1; }
cd "$scratch" || exit 1
"$mpiexec" -n 1 "$convert" --quiet "$cases/model" "$cases/indexed" --max-shard-size 1500 >/dev/null &&
  "$mpiexec" -n 1 "$convert" --quiet "$cases/shards" "$cases/dcp" --to dcp >/dev/null ||
  { echo "making the indexed and DCP forms failed" >&2; exit 1; }
mkdir links
# Each form: the path a command is given, and the files a run over it reads or copies.
forms=(single model indexed shards dcp)
form_path() { if [ "$1" = single ]; then echo "$cases/model/model.safetensors"; else echo "$cases/$1"; fi; }
form_files() {
  if [ "$1" = single ]; then
    printf '%s\n' "$cases/model/model.safetensors" "$cases/model/config.json"
  else
    find "$cases/$1" -type f | sort
  fi
}
before=$(snapshot "$cases")
unchanged() { [ "$(snapshot "$cases")" = "$before" ] || fail "$1: an input file changed"; }

# spelled N FILE: FILE spelled the N-th way (mod 4), made in links/ where it is a link.
spelled() {
  local n=$1 file=$2 link=$scratch/links/l$RANDOM$RANDOM
  case $((n % 4)) in
    0) echo "$file" ;;
    1) echo "$(dirname "$file")/../$(basename "$(dirname "$file")")/$(basename "$file")" ;;
    2) ln -s "$file" "$link" && echo "$link" ;;
    3) ln "$file" "$link" && echo "$link" ;;
  esac
}

# refused NAME TOOL-ARGUMENTS...: exit 2 on every rank, the inputs unchanged.
refused() {
  local name=$1
  shift
  expect "$name" 2 "$@"
  unchanged "$name"
}

# (a) every written path x every file of every form.
written_paths() {
  local form path file n=0 p
  for form in "${forms[@]}"; do
    path=$(form_path "$form")
    while read -r file; do
      n=$((n + 1))
      tool=$convert
      p=$(spelled $n "$file") && refused "$form:convert_out:$n" "$path" "$p" --quiet
      p=$(spelled $((n + 1)) "$file") && rm -rf "$scratch/o" &&
        ln -s "$p" "$scratch/o.kshard-partial" &&
        refused "$form:convert_partial:$n" "$path" "$scratch/o" --quiet
      rm -f "$scratch/o.kshard-partial"
      tool=$repair
      p=$(spelled $((n + 2)) "$file") && refused "$form:repair_out:$n" "$path" --out "$p"
      p=$(spelled $((n + 3)) "$file") &&
        refused "$form:repair_report:$n" "$path" --out "$scratch/r$n" --report "$p"
      [ -e "$scratch/r$n" ] && fail "$form:repair_report:$n: --out was written"
    done < <(form_files "$form")
  done
  # The undo file of an in-place repair named as an input file: refused, nothing written.
  tool=$repair
  ln "$cases/shards/.hf_metadata/config.json" "$cases/shards/shard-00001-model-00001-of-00001.safetensors.kshard-undo"
  before=$(snapshot "$cases")
  refused shards:undo_file "$cases/shards" --in-place
  rm "$cases/shards/shard-00001-model-00001-of-00001.safetensors.kshard-undo"
  before=$(snapshot "$cases")
  # OUT inside a folder the run copies, spelled directly and through `..`.
  tool=$convert
  refused model:out_in_subfolder "$cases/model" "$cases/model/1_Pooling/out" --quiet
  refused model:out_in_folder "$cases/model" "$cases/model/out" --quiet
  refused shards:out_in_hf_metadata "$cases/shards" "$cases/shards/.hf_metadata/x/../new" --quiet
  tool=$repair
  refused model:repair_out_in_subfolder "$cases/model" --out "$cases/model/1_Pooling/rep"
  tool=$convert  # a DCP folder is not copied whole: OUT may lie inside it
  cp -r "$cases/dcp" "$scratch/dcp_copy"
  expect dcp:out_inside_dcp 0 "$scratch/dcp_copy" "$scratch/dcp_copy/consolidated" --quiet
}

# (b) paths refused before anything is read.
argument_paths() {
  tool=$convert
  refused empty_out "$cases/shards" "" --quiet
  [ -e .kshard-partial ] && fail "empty_out: ./.kshard-partial was written"
  tool=$repair
  refused empty_report "$cases/shards" --dry-run --report ""
  refused report_in_missing_folder "$cases/shards" --dry-run --report "$scratch/no/such.json"
  refused empty_out_repair "$cases/shards" --out ""
}

# (c) a file of every form replaced by something that is not a regular file.
not_regular() {
  local form kind file copy
  tool=$convert
  for kind in fifo socket folder device; do
    for form in "${forms[@]}"; do
      copy=$scratch/broken
      rm -rf "$copy" && cp -r "$cases/$( [ "$form" = single ] && echo model || echo "$form")" "$copy"
      file=$(cd "$copy" && find . -type f \( -name '*.safetensors' -o -name '*.distcp' \) | sort | tail -n 1)
      rm "$copy/$file"
      case $kind in
        fifo) mkfifo "$copy/$file" ;;
        socket) python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$copy/$file" ;;
        folder) mkdir "$copy/$file" ;;
        device) ln -s /dev/zero "$copy/$file" ;;
      esac
      local start=$SECONDS
      expect "$form:$kind" 2 "$copy" "$scratch/nr" --quiet
      [ $((SECONDS - start)) -le 5 ] || fail "$form:$kind: took $((SECONDS - start)) s"
      [ -e "$scratch/nr" ] && fail "$form:$kind: OUT was written"
    done
  done
  rm -rf "$scratch/broken"
}

# mpmd_expect NAME CODE FORM-PATH: ranks 0..NP-2 in a/, the last rank in b/, each converting
# its copy (the same relative path) to one shared output folder; every rank exits with CODE.
mpmd_expect() {
  local name=$1 code=$2 in=$3
  rm -rf "$scratch/out"
  launch "$name" "$np" -n $((np - 1)) -wdir "$scratch/a" @TOOL "$in" "$scratch/out" --quiet \
    : -n 1 -wdir "$scratch/b" @TOOL "$in" "$scratch/out" --quiet
  codes_are "$name" "$code"
}

# (d) the last rank's copy differs from the others'.
node_local_copies() {
  [ "$np" -ge 2 ] || return 0
  local form file rel
  tool=$convert
  mkdir -p a b
  for form in model indexed shards dcp; do
    rm -rf a/in && cp -r "$cases/$form" a/in
    while read -r rel; do
      rm -rf b/in && cp -r a/in b/in && printf 'x' >>"b/in/$rel"
      mpmd_expect "$form:longer:${rel//\//_}" 2 in && grep -qF "$rel" "$dir/out.0" ||
        fail "$form:longer:${rel//\//_}: rank 0 does not name the file"
      rm -rf b/in && cp -r a/in b/in
      python3 - "b/in/$rel" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, 'rb').read())
data[8 if path.endswith('.safetensors') else 0] ^= 1  # the header JSON, the pickle, the ZIP record
open(path, 'wb').write(bytes(data))
PY
      mpmd_expect "$form:described_byte:${rel//\//_}" 2 in
    done < <(cd a/in && find . -type f \( -name '*.safetensors' -o -name '*.distcp' -o -name '.metadata' \
      -o -name '*.json' \) -not -path './1_Pooling/*' -not -name 'tokenizer.json' \
      -not -name 'fqn_to_*' | sed 's|^\./||' | sort)
  done
  # A tensor byte of a safetensors file (its last byte): not compared, as the docs say.
  rm -rf a/in b/in && cp -r "$cases/model" a/in && cp -r a/in b/in
  python3 -c 'import sys; p = sys.argv[1]; d = bytearray(open(p, "rb").read()); d[-1] ^= 1; open(p, "wb").write(bytes(d))' b/in/model.safetensors
  mpmd_expect model:tensor_byte 0 in
}

# (e) the last rank's file of per-rank shards missing.
last_file_missing() {
  tool=$convert
  rm -rf lost && cp -r "$cases/shards" lost && rm lost/shard-00004-model-00001-of-00001.safetensors
  expect lost_last_with_config 2 lost lost_hf --quiet &&
    { grep -qF "vocab_size 37" "$dir/out.0" || fail "lost_last_with_config: rank 0 does not name vocab_size"; }
  rm lost/.hf_metadata/config.json
  expect lost_last_without_config 0 lost lost_hf --quiet &&
    { grep -qF "found 3 per-rank files" "$dir/out.0" && grep -qF "no config.json gives vocab_size" "$dir/out.0" ||
      fail "lost_last_without_config: rank 0 does not warn"; }
}

written_paths
argument_paths
not_regular
node_local_copies
last_file_missing
harness_end "path guard"
