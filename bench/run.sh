#!/bin/sh
# beamd benchmarks: `make bench` runs this with BEAMD_BUILD set to the build
# directory. Figures, not pass/fail (exit status is non-zero only when a
# benchmark could not run). Loopback only; about 3 minutes on 2 cores.
# Options are passed to bench/run.py (see `bench/run.sh --help`), e.g.
#   bench/run.sh --only kernels        bench/run.sh --seconds 5 --reps 5
set -eu
here=$(cd "$(dirname "$0")" && pwd)
BEAMD_BUILD=${BEAMD_BUILD:-build}
export BEAMD_BUILD
# The tools (and zthroughput) take CURVE keys from these: a key set in the
# caller's shell would turn the plaintext cases into CURVE ones.
unset BEAMD_CURVE_SECRET BEAMD_CURVE_SERVER BEAMD_CURVE_ALLOW
# Debian's python3 (the pyenv one on PATH may be a different interpreter);
# only the standard library is used.
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr)"
exec "$PY" "$here/run.py" --build "$BEAMD_BUILD" "$@"
