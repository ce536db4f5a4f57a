#!/bin/sh
# Runs each unit-test binary in its own process with a timeout, then prints
# one summary line. BEAM_TEST_TIMEOUT_MULTIPLIER scales the timeout
# (sanitizer builds); tests that need a GPU skip themselves without one.
mult=${BEAM_TEST_TIMEOUT_MULTIPLIER:-1}
limit=$((60 * mult))
pass=0; fail=0; failed=""
for t in "$@"; do
  name=$(basename "$t")
  if timeout "$limit" "$t"; then
    pass=$((pass + 1))
  else
    rc=$?
    fail=$((fail + 1)); failed="$failed $name"
    [ "$rc" = 124 ] && echo "# $name: timed out after ${limit}s"
  fi
done
echo "unit: $pass passed, $fail failed"
[ -n "$failed" ] && echo "unit failures:$failed"
[ "$fail" = 0 ]
