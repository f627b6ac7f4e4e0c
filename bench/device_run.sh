#!/usr/bin/env bash
# The GPU run, copied into the folder scripts/device-bench builds and run there as `bash
# DIR/run` from the repository's root on the machine with the GPU: the MPI suite (device
# memory, MPICH staging through the host) and the checkpoint tests at 1 and 2 ranks, then every
# benchmark at 1 and 2 ranks, each under a time limit so that the whole run ends within 8
# minutes (a benchmark stopped at its limit keeps the records it wrote). Writes $OUT/run.log
# and $OUT/results.tar.gz (the benchmarks' JSON, each record naming the device and the date);
# `scripts/device-bench render` reads that tarball here.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"

# cuBLAS is the machine's: its CUDA 13 toolkit's, or the nvidia-cublas wheel's beside its PyTorch.
cublas=$(python3 -c 'import nvidia.cublas as c, os; print(os.path.join(c.__path__[0], "lib"))' 2>/dev/null || true)
unpacked=$(mktemp -d)
tar -xzf "$here/payload.tar.gz" -C "$unpacked"
export LD_LIBRARY_PATH="$unpacked/lib:/usr/local/cuda/lib64${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$unpacked/bin:$PATH" UCX_MODULE_DIR="$unpacked/lib/ucx"
# The tests find their fixtures under the source path they were built from: point it here.
source_dir=$(sed -n 's/^source //p' "$here/build.txt")
if [ -n "$source_dir" ] && [ ! -e "$source_dir" ]; then
  mkdir -p "$(dirname "$source_dir")" && ln -s "$PWD" "$source_dir"
fi

# step SECONDS RANKS PROGRAM ARGS...: one run under a limit; a failure is added to run_all's
# `failed`, and the run goes on.
step() {
  local limit=$1 np=$2 start=$SECONDS
  shift 2
  echo "== $(basename "$1") at $np rank(s)"
  if ! timeout "$limit" mpiexec.hydra -launcher fork -n "$np" "$@"; then
    failed+=("$(basename "$1") np$np")
  fi
  echo "== $(basename "$1") at $np rank(s): $((SECONDS - start)) s"
}

# The whole run: the device, the suite, the benchmarks.
run_all() {
  local failed=() results device
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  export KSHARD_BENCH_DEVICE="${device:-unknown GPU}, $(date -u +%F)"
  echo "== $KSHARD_BENCH_DEVICE; $(tr '\n' ';' <"$here/build.txt")"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv

  results=$(mktemp -d)
  for np in 1 2; do step 60 "$np" kshard_mpi_tests_cuda --gtest_brief=1; done
  for np in 1 2; do step 40 "$np" kshard_io_mpi_tests --gtest_brief=1; done
  for bench in rowwise tp redistribute io; do
    for np in 1 2; do
      step 35 "$np" "kshard_bench_$bench" --out "$results/$bench-np$np-cuda.json"
    done
  done
  tar -czf "$out/results.tar.gz" -C "$results" .
  echo "== failed: ${failed[*]:-none}; $SECONDS s in all"
}

run_all 2>&1 | tee "$out/run.log"
