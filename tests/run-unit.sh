#!/bin/sh
# Runs every test of each C test binary in its own process with a timeout
# and reports TAP (version 13), as libuv's runner does: a test that crashes
# or hangs is named, and the others still run. A binary whose main is
# tests/common/runner.h lists its tests (BEAM_TEST_LIST=1) and runs one
# (BEAM_TEST_FILTER=NAME); one that lists nothing runs whole.
# The output of a failed test follows its "not ok" line as TAP comments.
# BEAM_TEST_TIMEOUT (seconds, default 60) is the per-test limit and
# BEAM_TEST_TIMEOUT_MULTIPLIER scales it (sanitizer
# builds); tests that need a GPU skip themselves without one.
mult=${BEAM_TEST_TIMEOUT_MULTIPLIER:-1}
limit=${BEAM_TEST_TIMEOUT:-$((60 * mult))} # seconds per test
log=$(mktemp "${TMPDIR:-/tmp}/beam-unit.XXXXXX")
trap 'rm -f "$log"' EXIT
n=0; pass=0; fail=0; failed=""; bins=0
echo "TAP version 13"

run_one() { # binary, test name or "" (the whole binary)
  n=$((n + 1))
  label=$(basename "$1")${2:+": $2"}
  BEAM_TEST_FILTER="$2" timeout "$limit" "$1" >"$log" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1))
    if grep -q "^\[  SKIPPED \]" "$log"; then
      echo "ok $n - $label # SKIP $(grep -m1 -i "skip" "$log" | cut -c1-120)"
    else
      echo "ok $n - $label"
    fi
    return
  fi
  fail=$((fail + 1)); failed="$failed $label;"
  if [ "$rc" = 124 ]; then why="timed out after ${limit}s"
  elif [ "$rc" -gt 128 ]; then why="killed by signal $((rc - 128))"
  else why="exit $rc"; fi
  echo "not ok $n - $label # $why"
  sed 's/^/#   /' "$log" | tail -n 60
}

for t in "$@"; do
  bins=$((bins + 1))
  names=$(BEAM_TEST_LIST=1 timeout 10 "$t" 2>/dev/null)
  if [ -z "$names" ]; then
    run_one "$t" ""
    continue
  fi
  for name in $names; do
    run_one "$t" "$name"
  done
done
echo "1..$n"
echo "unit: $pass passed, $fail failed ($n tests in $bins binaries, one process each)"
[ -n "$failed" ] && echo "unit failures:$failed"
[ "$fail" = 0 ]
