#!/usr/bin/env bash
# Usage: expect_abort.sh SECONDS PATTERN COMMAND...
# Passes when COMMAND (an MPI launch) exits non-zero within SECONDS of wall time and its output
# matches the extended regular expression PATTERN; the output is shown either way.
set -u
limit=$1
pattern=$2
shift 2
output=$(mktemp)
trap 'rm -f "$output"' EXIT

start=$(date +%s)
timeout --kill-after=10 "$limit" "$@" >"$output" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
cat "$output"

fail() {
  echo "expect_abort: FAILED: $*" >&2
  exit 1
}
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  fail "the job still ran after ${limit} s"
fi
if [ "$status" -eq 0 ]; then fail "the job exited with status 0 after ${elapsed} s"; fi
grep -Eq -- "$pattern" "$output" || fail "no line of the output matches: $pattern"
echo "expect_abort: ok: exit status $status after ${elapsed} s, and the output names it"
