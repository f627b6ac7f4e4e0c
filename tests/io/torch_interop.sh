#!/usr/bin/env bash
# Torch reads what kshard writes: each torch-written fixture's ground truth
# (tests/io/fixtures/torch_shards/*/expected.safetensors) resharded by kshard-convert into the
# per-rank shards of a 3-rank job (rows) and of a 2 x 2 job (rows, then columns), then loaded by
# torch's HuggingFaceStorageReader (tests/io/fixtures/torch_load_check.py) at another world
# size and layout, bit for bit; and each torch-written DCP fixture (tests/io/fixtures/torch_dcp)
# written by kshard-convert as the DCP of a 3-rank job (rows) and of a 2 x 2 job, and the
# shards' ground truth as DCP, loaded by torch.distributed.checkpoint.load
# (torch_dcp_load_check.py) at another world size and layout with its bytes items, bit for bit.
# Needs torch: runs only with KSHARD_TORCH_TESTS=1 (skipped, exit
# 77, otherwise); KSHARD_TORCH_PYTHON names the interpreter that has torch (default python3).
#
# usage: torch_interop.sh KSHARD_CONVERT SCRATCH MPIEXEC [MPIEXEC FLAGS...] -n
set -euo pipefail
if [ "${KSHARD_TORCH_TESTS:-0}" != 1 ]; then
  echo "skipped: set KSHARD_TORCH_TESTS=1 (and KSHARD_TORCH_PYTHON) to run torch's reader"
  exit 77
fi
convert=$1 scratch=$2
shift 2
mpiexec=("$@")  # ends with the flag that takes the rank count
python=${KSHARD_TORCH_PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
fixtures=$here/fixtures/torch_shards
"$python" -c "import torch, safetensors" || {
  echo "KSHARD_TORCH_TESTS=1 but $python cannot import torch and safetensors" >&2
  exit 1
}
rm -rf "$scratch" && mkdir -p "$scratch"
for case in fsdp2_4rank tp_2rank fsdp_tp_2x2 empty_rank_3rank single_rank; do
  truth=$fixtures/$case/expected.safetensors
  "${mpiexec[@]}" 2 "$convert" "$truth" "$scratch/$case-rows3" --to sharded --mesh 3 \
    --layout 'Shard(0)' --quiet
  "${mpiexec[@]}" 2 "$convert" "$truth" "$scratch/$case-grid" --to sharded --mesh 2x2 \
    --layout 'Shard(0), Shard(1)' --quiet
  "$python" "$fixtures/../torch_load_check.py" "$scratch/$case-rows3" "$truth" --world 2
  "$python" "$fixtures/../torch_load_check.py" "$scratch/$case-grid" "$truth" --world 3 \
    --placements S1
done
dcp=$here/fixtures/torch_dcp
for case in fsdp2_adamw_4rank tp_2rank fsdp_tp_2x2 empty_rank_3rank dtypes_2rank transposed_2rank \
  multi_file_2rank per_rank_metadata_2rank; do
  truth=$dcp/$case/expected.safetensors
  "${mpiexec[@]}" 2 "$convert" "$dcp/$case/checkpoint" "$scratch/$case-dcp-rows3" --to dcp \
    --mesh 3 --layout 'Shard(0)' --quiet
  "${mpiexec[@]}" 3 "$convert" "$dcp/$case/checkpoint" "$scratch/$case-dcp-grid" --to dcp \
    --mesh 2x2 --layout 'Shard(0), Shard(1)' --quiet
  "$python" "$dcp/torch_dcp_load_check.py" "$scratch/$case-dcp-rows3" "$truth" --world-size 2 \
    --layout col --bytes "$dcp/$case/expected_bytes.json"
  "$python" "$dcp/torch_dcp_load_check.py" "$scratch/$case-dcp-grid" "$truth" --world-size 3 \
    --layout row --bytes "$dcp/$case/expected_bytes.json"
done
for case in fsdp2_4rank tp_2rank; do
  truth=$fixtures/$case/expected.safetensors
  "${mpiexec[@]}" 2 "$convert" "$fixtures/$case/model" "$scratch/$case-as-dcp" --to dcp \
    --mesh 4 --quiet
  "$python" "$dcp/torch_dcp_load_check.py" "$scratch/$case-as-dcp" "$truth" --world-size 2 \
    --layout row
done
rm -rf "$scratch"
echo "torch read every kshard-written checkpoint bit for bit"
