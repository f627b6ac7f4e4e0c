# shellcheck shell=bash
# Sourced by scripts/test (after scripts/deps.sh): ranks on separate hosts. Two network
# namespaces joined by a veth pair act as two hosts of 2 ranks each, with Open MPI's traffic
# between them over TCP only (btl tcp,self: no shared memory at all). kshard_netns_stage BUILD_DIR
# runs the redistribute, lookup/tensor-parallel and repair tests across them, proves from the
# veth's counters that their traffic crossed the link, then cuts the link in the middle of a job
# that runs kshard collectives in a loop (tests/netns/collective_loop.cpp) with the collective
# watchdog on: every rank must name its stuck collective and the job must exit non-zero within
# the watchdog's timeout plus 30 s. Needs root (ip netns, unshare) and iproute2; everything it
# creates (namespaces, veths, processes, a scratch directory) is removed when it ends, failed or
# not. KSHARD_NETNS=0 skips the stage, saying so.
#
# How the two hosts are made:
# - namespaces kshard-h1-PID and kshard-h2-PID; the veth kshard-h1 (10.77.0.1/24) in the first,
#   its peer kshard-h2 (10.77.0.2/24) in the second; lo up in each. Nothing in the root namespace.
# - each host also gets a UTS namespace (hostname kshard-h1 / kshard-h2) and a TMPDIR of its own,
#   so that Open MPI's session directories, named after the host, do not collide.
# - mpiexec runs in the first namespace (its own host: ranks 0 and 1); Open MPI's rsh launcher
#   is a generated agent (OMPI_MCA_plm_rsh_agent) that gets "<host> <orted command>" and starts
#   the daemon with `ip netns exec <namespace of host> ...` (ranks 2 and 3 on 10.77.0.2).
# - pml ob1, btl tcp,self; btl_tcp_if_include and oob_tcp_if_include 10.77.0.0/24. Inside one
#   host the two ranks talk over TCP through that host's lo; between hosts over the veth.
# - mpi_abort_delay=3: the first rank whose watchdog fires would otherwise get the other rank of
#   its host killed before that one's own watchdog, milliseconds later, has spoken.
# - mpi_yield_when_idle=1: two hosts of 2 slots are 4 ranks on this machine's cores, and Open MPI,
#   which believes the slots, would otherwise busy-poll (the suite ran 7x slower on 2 cores).
# - net.ipv4.tcp_retries2 (KSHARD_NETNS_TCP_RETRIES2, default 5: a connection whose data goes
#   unacknowledged for 12.6 s is dropped) in both namespaces only. After the watchdog's MPI_Abort,
#   Open MPI 4.1's mpiexec waits for the daemon behind the cut link and has no timeout of its own:
#   with Linux's default (15, about 15 minutes) it hangs that long after every rank has reported
#   and exited. The watchdog's timeout must stay below the TCP timeout (checked below), so that
#   the ranks are stopped by the watchdog and not by a broken connection.

: "${KSHARD_NETNS_TIMEOUT:=5}"          # KSHARD_COLLECTIVE_TIMEOUT of the fault test, seconds
: "${KSHARD_NETNS_TCP_RETRIES2:=5}"     # see above
: "${KSHARD_NETNS_SUITE_LIMIT:=180}"    # seconds the 2x2 suite may run before it is failed
KSHARD_NETNS_FILTER='Redistribute*.*:TensorParallel*.*:*Lookup.*:Repair*.*'
KSHARD_NETNS_NET=10.77.0

kshard_netns_log() { printf '[kshard] netns: %s\n' "$*"; }

# One line naming the stage that failed, then the end of the stage (its subshell: the EXIT trap
# removes what it made).
kshard_netns_fail() {
  printf '[kshard] netns stage FAILED at %s: %s\n' "$1" "$2" >&2
  exit 1
}

kshard_netns_now() { date +%s.%N; }
kshard_netns_seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
kshard_netns_mb() { awk -v n="$1" 'BEGIN { printf "%.1f MB", n / 1e6 }'; }

# kshard_netns_bytes rx|tx: bytes through the first host's end of the veth so far.
kshard_netns_bytes() {
  ip netns exec "$kshard_netns_ns1" cat "/sys/class/net/kshard-h1/statistics/$1_bytes"
}

# Removes everything the stage made: the processes in its namespaces (TERM, then KILL), the
# namespaces (which takes the veth pair with them) and the scratch directory.
kshard_netns_cleanup() {
  local status=$? ns pids
  trap - ERR
  # This shell's running jobs (the timeout processes around mpiexec, outside the namespaces),
  # then what runs inside the namespaces.
  for pids in $(jobs -p); do kill -TERM "$pids" 2>/dev/null || true; done
  for ns in "${kshard_netns_ns1:-}" "${kshard_netns_ns2:-}"; do
    if [ -z "$ns" ] || [ ! -e "/run/netns/$ns" ]; then continue; fi
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    if [ -n "${pids// /}" ]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
        [ -z "${pids// /}" ] && break
        sleep 0.2
      done
      if [ -n "${pids// /}" ]; then
        kshard_netns_log "killing what is left in $ns (pids $pids)"
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
      fi
    fi
    ip netns delete "$ns" 2>/dev/null ||
      printf '[kshard] netns: could not delete the namespace %s\n' "$ns" >&2
  done
  [ -n "${kshard_netns_work:-}" ] && rm -rf "$kshard_netns_work"
  exit "$status"
}

# kshard_netns_mpiexec LIMIT OUTPUT MPIEXEC_ARGS...: mpiexec on the first host, 4 ranks over the
# two hosts, every KSHARD_* and OMP_* variable forwarded; its output (both streams) to OUTPUT.
kshard_netns_mpiexec() {
  local limit=$1 output=$2 forward=() name
  shift 2
  for name in $(compgen -e); do
    case "$name" in KSHARD_* | OMP_*) forward+=(-x "$name") ;; esac
  done
  # In the background and waited for, so that a signal to the stage is handled at once (bash
  # runs no trap while a foreground command runs); timeout has a process group of its own.
  timeout --kill-after=10 "$limit" \
    ip netns exec "$kshard_netns_ns1" unshare --uts \
    sh -c 'hostname kshard-h1 && exec "$@"' sh \
    env TMPDIR="$kshard_netns_work/tmp-kshard-h1" \
    mpiexec --hostfile "$kshard_netns_work/hostfile" -n 4 "${forward[@]}" "$@" >"$output" 2>&1 &
  wait "$!"
}

# kshard_netns_stage BUILD_DIR: the 2x2 TCP suite, then the cut-link fault test.
kshard_netns_stage() (
  set -eEuo pipefail
  trap 'kshard_netns_fail "an unexpected step" "line $LINENO: \"$BASH_COMMAND\" failed"' ERR
  trap kshard_netns_cleanup EXIT
  trap 'kshard_netns_log "interrupted: removing what the stage made"; exit 130' INT
  trap 'kshard_netns_log "terminated: removing what the stage made"; exit 143' TERM

  if [ "${KSHARD_NETNS:-1}" = 0 ]; then
    kshard_netns_log "SKIPPED: KSHARD_NETNS=0 (ranks on separate hosts are not tested)"
    exit 0
  fi
  build=${1:-}
  [ -n "$build" ] || kshard_netns_fail "arguments" "usage: kshard_netns_stage BUILD_DIR"
  stage_start=$(kshard_netns_now)

  # --- prerequisites ---------------------------------------------------------------------
  [ "$(id -u)" -eq 0 ] || kshard_netns_fail "prerequisites" \
    "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN); run as root, or set KSHARD_NETNS=0 to skip this stage"
  if ! command -v ip >/dev/null; then
    kshard_netns_log "installing iproute2 (for ip netns)"
    if declare -F kshard_install_packages >/dev/null; then
      kshard_install_packages iproute2 || true
    else
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; } \
        >/dev/null 2>&1 || true
    fi
    command -v ip >/dev/null || kshard_netns_fail "prerequisites" \
      "iproute2 (the ip command) is missing and could not be installed"
  fi
  for tool in unshare timeout mpiexec awk; do
    command -v "$tool" >/dev/null || kshard_netns_fail "prerequisites" "$tool is not installed"
  done
  tests_binary=""
  for candidate in "$build"/tests/kshard_mpi_tests_serial "$build"/tests/kshard_mpi_tests_*; do
    if [ -x "$candidate" ]; then tests_binary=$candidate && break; fi
  done
  [ -n "$tests_binary" ] || kshard_netns_fail "prerequisites" \
    "no MPI test binary in $build/tests (kshard_mpi_tests_serial); build it first"
  loop_binary=$build/tests/kshard_netns_collective_loop
  [ -x "$loop_binary" ] || kshard_netns_fail "prerequisites" \
    "$loop_binary is missing; build the target kshard_netns_collective_loop first"
  timeout_s=$KSHARD_NETNS_TIMEOUT
  [[ "$timeout_s" =~ ^[1-9][0-9]*$ && "$KSHARD_NETNS_TCP_RETRIES2" =~ ^[1-9][0-9]*$ ]] ||
    kshard_netns_fail "prerequisites" \
      "KSHARD_NETNS_TIMEOUT ($timeout_s) and KSHARD_NETNS_TCP_RETRIES2 ($KSHARD_NETNS_TCP_RETRIES2) must be whole numbers of at least 1"
  # Linux's timeout for unacknowledged data: RTO 200 ms doubled per retry, capped at 120 s.
  tcp_timeout=$(awk -v r="$KSHARD_NETNS_TCP_RETRIES2" \
    'BEGIN { printf "%.1f", r <= 9 ? (2 ^ (r + 1) - 1) * 0.2 : 204.6 + (r - 9) * 120 }')
  awk -v t="$timeout_s" -v tcp="$tcp_timeout" 'BEGIN { exit !(t + 2 < tcp) }' ||
    kshard_netns_fail "prerequisites" \
      "KSHARD_NETNS_TIMEOUT=$timeout_s must be positive and at least 2 s below the TCP timeout of $tcp_timeout s (KSHARD_NETNS_TCP_RETRIES2=$KSHARD_NETNS_TCP_RETRIES2)"

  # --- the two hosts -----------------------------------------------------------------------
  kshard_netns_work=$(mktemp -d /tmp/kshard-netns.XXXXXX)
  work=$kshard_netns_work
  mkdir -p "$work/tmp-kshard-h1" "$work/tmp-kshard-h2" "$work/fault"
  ns1=kshard-h1-$BASHPID
  ns2=kshard-h2-$BASHPID
  ip netns add "$ns1" 2>"$work/setup.err" || kshard_netns_fail "creating the network namespaces" \
    "'ip netns add $ns1' is not permitted here ($(tr '\n' ' ' <"$work/setup.err")); this stage needs network namespaces (root, CAP_SYS_ADMIN)"
  kshard_netns_ns1=$ns1
  ip netns add "$ns2" 2>"$work/setup.err" || kshard_netns_fail "creating the network namespaces" \
    "'ip netns add $ns2' failed: $(tr '\n' ' ' <"$work/setup.err")"
  kshard_netns_ns2=$ns2
  {
    ip link add kshard-h1 netns "$ns1" type veth peer name kshard-h2 netns "$ns2" &&
      ip -n "$ns1" addr add "$KSHARD_NETNS_NET.1/24" dev kshard-h1 &&
      ip -n "$ns2" addr add "$KSHARD_NETNS_NET.2/24" dev kshard-h2 &&
      ip -n "$ns1" link set lo up && ip -n "$ns2" link set lo up &&
      ip -n "$ns1" link set kshard-h1 up && ip -n "$ns2" link set kshard-h2 up &&
      ip netns exec "$ns1" sysctl -qw "net.ipv4.tcp_retries2=$KSHARD_NETNS_TCP_RETRIES2" &&
      ip netns exec "$ns2" sysctl -qw "net.ipv4.tcp_retries2=$KSHARD_NETNS_TCP_RETRIES2"
  } 2>"$work/setup.err" ||
    kshard_netns_fail "creating the veth pair" "$(tr '\n' ' ' <"$work/setup.err")"

  # Open MPI's remote launcher: "<host> <orted command...>" -> the daemon in that host's
  # namespace, with the host's name and TMPDIR. The command is written for a remote shell.
  cat >"$work/agent" <<AGENT
#!/bin/sh
host=\$1
shift
case "\$host" in
  $KSHARD_NETNS_NET.1) ns=$ns1 name=kshard-h1 ;;
  $KSHARD_NETNS_NET.2) ns=$ns2 name=kshard-h2 ;;
  *) echo "kshard netns agent: unknown host '\$host'" >&2; exit 1 ;;
esac
echo "\$host -> \$ns: \$*" >>"$work/agent.log"
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$name && TMPDIR=$work/tmp-\$name && export TMPDIR && \$*"
AGENT
  # Each rank's stderr in a file of its own, written on its own host (the link may be cut).
  cat >"$work/stderr-to-file" <<WRAP
#!/bin/sh
exec "\$@" 2>"$work/fault/rank\$OMPI_COMM_WORLD_RANK.stderr"
WRAP
  chmod +x "$work/agent" "$work/stderr-to-file"
  printf '%s slots=2\n' "$KSHARD_NETNS_NET.1" "$KSHARD_NETNS_NET.2" >"$work/hostfile"

  export OMPI_MCA_plm_rsh_agent="$work/agent"
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self  # ob1 over these BTLs only (not UCX, not an MTL)
  export OMPI_MCA_btl_tcp_if_include="$KSHARD_NETNS_NET.0/24"
  export OMPI_MCA_oob_tcp_if_include="$KSHARD_NETNS_NET.0/24"
  export OMPI_MCA_mpi_yield_when_idle=1
  # A rank's MPI_Abort makes Open MPI kill the other ranks of its host at once, possibly before
  # their own watchdog, a few milliseconds later, has spoken (seen here: rank 0 silent after
  # rank 1's report); each aborting rank waits 3 s first.
  export OMPI_MCA_mpi_abort_delay=3
  export OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_hwloc_base_binding_policy=none
  unset OMPI_MCA_btl_vader_single_copy_mechanism
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMP_WAIT_POLICY=passive
  unset KSHARD_COLLECTIVE_TIMEOUT
  kshard_netns_log "hosts: $ns1 (kshard-h1, $KSHARD_NETNS_NET.1) and $ns2 (kshard-h2, $KSHARD_NETNS_NET.2), veth kshard-h1 <-> kshard-h2; btl tcp,self; agent $work/agent"

  # --- where the ranks run -----------------------------------------------------------------
  # shellcheck disable=SC2016 # expanded by the ranks' shell
  kshard_netns_mpiexec 60 "$work/placement.log" \
    sh -c 'echo "placement: rank $OMPI_COMM_WORLD_RANK on $(hostname) in $(ip netns identify)"' ||
    {
      cat "$work/placement.log" >&2
      kshard_netns_fail "placing 4 ranks on the two hosts" "mpiexec failed (output above)"
    }
  on1=$(grep -c "on kshard-h1 in $ns1\$" "$work/placement.log" || true)
  on2=$(grep -c "on kshard-h2 in $ns2\$" "$work/placement.log" || true)
  if [ "$on1" != 2 ] || [ "$on2" != 2 ]; then
    cat "$work/placement.log" >&2
    kshard_netns_fail "placing 4 ranks on the two hosts" \
      "expected 2 ranks in each namespace, got $on1 in $ns1 and $on2 in $ns2"
  fi
  kshard_netns_log "ranks 0,1 on kshard-h1 ($ns1), ranks 2,3 on kshard-h2 ($ns2)"

  # --- the 2x2 suite over TCP ----------------------------------------------------------------
  rx0=$(kshard_netns_bytes rx)
  tx0=$(kshard_netns_bytes tx)
  t0=$(kshard_netns_now)
  suite_status=0
  kshard_netns_mpiexec "$KSHARD_NETNS_SUITE_LIMIT" "$work/suite.log" \
    "$tests_binary" --gtest_filter="$KSHARD_NETNS_FILTER" --gtest_color=no || suite_status=$?
  t1=$(kshard_netns_now)
  rx=$(($(kshard_netns_bytes rx) - rx0))
  tx=$(($(kshard_netns_bytes tx) - tx0))
  if [ "$suite_status" -ne 0 ] || ! grep -q '^\[  PASSED  \]' "$work/suite.log"; then
    grep -E '^\[  FAILED  \]|Failure|error|ERROR' "$work/suite.log" | head -n 40 >&2 || true
    tail -n 40 "$work/suite.log" >&2
    case "$suite_status" in
      124 | 137) why="still running after $KSHARD_NETNS_SUITE_LIMIT s (KSHARD_NETNS_SUITE_LIMIT)" ;;
      *) why="mpiexec exited with status $suite_status" ;;
    esac
    kshard_netns_fail "the 2x2 TCP suite ($(basename "$tests_binary") --gtest_filter=$KSHARD_NETNS_FILTER)" "$why"
  fi
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$work/suite.log" | head -n 1)
  kshard_netns_log "2x2 TCP suite: ${passed:-?} tests passed in $(kshard_netns_seconds "$t0" "$t1") s; across the link: $(kshard_netns_mb "$tx") host1->host2, $(kshard_netns_mb "$rx") host2->host1"
  if [ "$tx" -lt 1000000 ] || [ "$rx" -lt 1000000 ]; then
    kshard_netns_fail "the 2x2 TCP suite" \
      "under 1 MB crossed the veth ($tx bytes out, $rx in): the ranks did not talk across hosts"
  fi

  # --- the fault test: cut the link in the middle of a job ----------------------------------
  job_limit=$((timeout_s + 120))
  tx0=$(kshard_netns_bytes tx)
  export KSHARD_COLLECTIVE_TIMEOUT=$timeout_s
  : >"$work/fault/mpiexec.log"
  t0=$(kshard_netns_now)
  { kshard_netns_mpiexec "$job_limit" "$work/fault/mpiexec.log" \
    "$work/stderr-to-file" "$loop_binary" 600 || exit $?; } &
  job=$!
  unset KSHARD_COLLECTIVE_TIMEOUT
  ready=0
  for _ in $(seq 1 300); do
    ready=$(grep -c ': running for ' "$work/fault/mpiexec.log" || true)
    ready=${ready:-0}
    [ "$ready" -ge 4 ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.2
  done
  if [ "$ready" -lt 4 ] || ! kill -0 "$job" 2>/dev/null; then
    cat "$work/fault/mpiexec.log" "$work"/fault/rank*.stderr >&2 2>/dev/null || true
    kshard_netns_fail "the fault test" "the collective loop did not start on 4 ranks"
  fi
  sleep 2  # collectives in full flow across the link
  kill -0 "$job" 2>/dev/null || {
    cat "$work/fault/mpiexec.log" >&2
    kshard_netns_fail "the fault test" "the collective loop ended before the link was cut"
  }
  tx_cut=$(($(kshard_netns_bytes tx) - tx0))
  ip -n "$ns1" link set kshard-h1 down ||
    kshard_netns_fail "the fault test" "could not set the veth kshard-h1 down"
  t_cut=$(kshard_netns_now)
  kshard_netns_log "fault test: link cut $(kshard_netns_seconds "$t0" "$t_cut") s after the start (KSHARD_COLLECTIVE_TIMEOUT=$timeout_s, tcp_retries2=$KSHARD_NETNS_TCP_RETRIES2); $(kshard_netns_mb "$tx_cut") host1->host2 before it"
  job_status=0
  wait "$job" || job_status=$?
  t_end=$(kshard_netns_now)
  after_cut=$(kshard_netns_seconds "$t_cut" "$t_end")
  kshard_netns_log "fault test: mpiexec exited with status $job_status, $after_cut s after the cut ($(kshard_netns_seconds "$t0" "$t_end") s in all)"
  missing=()
  for rank in 0 1 2 3; do
    line=$(grep -E "^kshard watchdog: rank $rank: .* has not completed after [0-9.]+ s \\(KSHARD_COLLECTIVE_TIMEOUT=$timeout_s\\); [0-9]+ kshard collectives completed before it on this rank; aborting the job" \
      "$work/fault/rank$rank.stderr" 2>/dev/null || true)
    if [ -n "$line" ]; then kshard_netns_log "  rank $rank: $line"; else missing+=("$rank"); fi
  done
  if [ "$job_status" -eq 0 ] || [ "$job_status" -eq 124 ] || [ "$job_status" -eq 137 ] ||
    [ ${#missing[@]} -gt 0 ] ||
    ! awk -v e="$after_cut" -v t="$timeout_s" 'BEGIN { exit !(e <= t + 30) }'; then
    grep -v ' rounds$' "$work/fault/mpiexec.log" | tail -n 30 >&2 || true
    for rank in 0 1 2 3; do
      echo "--- rank $rank stderr:" >&2
      cat "$work/fault/rank$rank.stderr" >&2 2>/dev/null || echo "(none)" >&2
    done
    problems=()
    [ "$job_status" -eq 0 ] && problems+=("the job exited 0")
    if [ "$job_status" -eq 124 ] || [ "$job_status" -eq 137 ]; then
      problems+=("mpiexec still ran $job_limit s after the start and was killed")
    fi
    [ ${#missing[@]} -gt 0 ] && problems+=("no watchdog report from rank(s) ${missing[*]}")
    awk -v e="$after_cut" -v t="$timeout_s" 'BEGIN { exit !(e > t + 30) }' &&
      problems+=("the job ended $after_cut s after the cut, over the timeout + 30 s")
    joined=$(printf '%s; ' "${problems[@]}")
    kshard_netns_fail "the fault test (link cut mid-run)" "${joined%; }"
  fi
  kshard_netns_log "fault test passed: every rank reported its stuck collective, exit status $job_status within $after_cut s of the cut (limit $((timeout_s + 30)) s)"
  kshard_netns_log "stage done in $(kshard_netns_seconds "$stage_start" "$(kshard_netns_now)") s"
)
