#!/bin/sh
# beamd-ptycho MPI scaling on CPU: seconds per DM iteration for 1 rank and
# 2 ranks (and 1 rank x 2 threads, the same cores without MPI) on a
# moderate simulated scan. The figure is the median of the engine's own
# per-iteration wall times (/entry_1/process_1/history/seconds), so file
# reading and set-up are left out.
#
#   BEAMD_BUILD=build bench/ptycho_mpi.sh [views] [n] [iterations]
#
# Defaults: 256 views of 128x128, 20 iterations, single precision. Open MPI
# needs --allow-run-as-root when run as root and --oversubscribe on a
# machine with fewer cores than ranks; btl self,vader keeps it on loopback
# shared memory.
set -eu
B=${BEAMD_BUILD:-build}
VIEWS=${1:-256}
N=${2:-128}
IT=${3:-20}
PY=${PYTHON:-/usr/bin/python3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# --bind-to none: Open MPI binds each rank to one core by default (np <= 2),
# which would put all of a rank's threads on that core.
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader"

"$B/beamd-sim" --pattern ptycho --frames "$VIEWS" --ptycho-n "$N" --dtype float32 \
  --scan-step 0.15e-6 --quiet --write-h5 "$T/scan.h5"

median() {
  "$PY" -c 'import h5py, numpy as np, sys
s = h5py.File(sys.argv[1])["/entry_1/process_1/history/seconds"][()]
print("%.4f" % np.median(s))' "$1"
}

run() { # label ranks threads
  $MPIRUN -n "$2" "$B/beamd-ptycho" "$T/scan.h5" -o "$T/r.h5" --iterations "$IT" \
    --probe zp --threads "$3" --quiet
  printf '%-22s %s s/iteration (median of %s)\n' "$1" "$(median "$T/r.h5")" "$IT"
}

echo "beamd-ptycho CPU, $VIEWS views of ${N}x$N, single precision, $(nproc) cores"
run "1 rank  x 1 thread" 1 1
run "2 ranks x 1 thread" 2 1
run "1 rank  x 2 threads" 1 2
