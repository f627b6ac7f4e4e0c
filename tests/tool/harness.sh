# shellcheck shell=bash
# The launch harness of the command-line tests (run.sh: kshard-repair, convert.sh:
# kshard-convert), sourced by both. Every launch runs each rank under a wrapper that records its
# exit code and its output, so a case checks the exit code of EVERY rank:
#
#   need_reference_python          exits 77 (skipped) unless python3 imports numpy and
#                                  safetensors, which the checkpoint cases need
#   harness_begin NP TOOL PREFIX   np, tool (absolute), mpiexec, a scratch folder $scratch under
#                                  /tmp named PREFIX.XXXXXX (removed at exit), the wrapper
#   launch NAME RANKS ARGS...      mpiexec ARGS, "@TOOL" in them the tool under the wrapper;
#                                  leaves in $dir rank r's stdout.r, stderr.r, out.r (both, in
#                                  that order) and rc.r (its exit code)
#   codes_are NAME CODE            every rank of the last launch exited with CODE
#   expect NAME CODE TOOL-ARGS...  the tool at NP ranks exits with CODE on every rank
#   fail MESSAGE                   counts a failure
#   snapshot DIR                   sha256 of every regular file of DIR (hidden ones too), sorted
#   harness_end WHAT               the summary line; exits 1 after any failure, else 0
#
# Environment: KSHARD_TOOL_MPIEXEC (default mpiexec), KSHARD_TOOL_TIMEOUT (seconds per launch,
# default 120: a launch that takes longer is a hang).

need_reference_python() {
  if ! python3 -c 'import numpy, safetensors' 2>/dev/null; then
    echo "skipped: python3 cannot import numpy and safetensors (pip install numpy safetensors)"
    exit 77
  fi
}

harness_begin() {
  np=$1
  tool=$(realpath "$2")
  mpiexec=${KSHARD_TOOL_MPIEXEC:-mpiexec}
  scratch=$(mktemp -d "/tmp/$3.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  failures=0
  # Runs one rank and records its exit code; the rank as Open MPI or MPICH (Hydra) name it.
  wrap=$scratch/wrap.sh
  cat >"$wrap" <<'WRAP'
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-0}}}
dir=$1
shift
"$@" >"$dir/stdout.$rank" 2>"$dir/stderr.$rank"
code=$?
cat "$dir/stdout.$rank" "$dir/stderr.$rank" >"$dir/out.$rank"
echo $code >"$dir/rc.$rank"
WRAP
}

fail() {
  echo "FAIL [np$np] $*"
  failures=$((failures + 1))
}

# launch NAME RANKS MPIEXEC-ARGUMENTS...: "@TOOL" in the arguments runs the tool under the
# wrapper; RANKS: how many ranks the launch makes. Leaves the per-rank results in $dir.
launch() {
  local name=$1 ranks=$2 args=() a
  shift 2
  dir=$scratch/run.$name
  rm -rf "$dir" && mkdir -p "$dir"
  for a in "$@"; do
    if [ "$a" = @TOOL ]; then args+=(bash "$wrap" "$dir" "$tool"); else args+=("$a"); fi
  done
  timeout "${KSHARD_TOOL_TIMEOUT:-120}" "$mpiexec" "${args[@]}" >"$dir/mpiexec.log" 2>&1
  launched=$?
  launched_ranks=$ranks
}

# codes_are NAME CODE: every rank of the last launch exited with CODE.
codes_are() {
  local name=$1 want=$2 r got
  [ "$launched" -eq 124 ] && fail "$name: timed out (a hang)"
  for ((r = 0; r < launched_ranks; r++)); do
    got=$(cat "$dir/rc.$r" 2>/dev/null || echo none)
    if [ "$got" != "$want" ]; then
      fail "$name: rank $r exited with $got, expected $want"
      sed 's/^/    /' "$dir/out.$r" 2>/dev/null | head -5
      return 1
    fi
  done
  echo "ok   [np$np] $name: exit $want on $launched_ranks rank(s)"
}

# expect NAME CODE TOOL-ARGUMENTS...: the tool at NP ranks exits with CODE on every rank.
expect() {
  local name=$1 want=$2
  shift 2
  launch "$name" "$np" -n "$np" @TOOL "$@"
  codes_are "$name" "$want"
}

snapshot() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum); }

harness_end() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s) at np$np"
    exit 1
  fi
  echo "all $1 tool cases passed at np$np"
  exit 0
}
