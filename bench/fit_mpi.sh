#!/bin/sh
# beamd-fit under MPI on CPU: wall time and fits/s for 1 rank, 2 ranks and
# 1 rank x 2 threads (the same cores without MPI) on a synthetic scan of
# H x W pixel traces of T frames (default 1000 x 1000 x 100 uint16, about
# 200 MB: 1 M damped-cosine fits), generated in a temporary directory.
#
#   BEAMD_BUILD=build bench/fit_mpi.sh [H] [W] [T] [codec]
#
# codec: raw (chunks of one frame, default) or bslz4 (bitshuffle-LZ4,
# Debian's filter plugin writes it, beamd's codec decodes it). The figure
# is beamd-fit's own summary line (read, fit + exchange + write, fits/s)
# and the peak RSS of the largest rank (/usr/bin/time, when present). The
# maps of the runs are compared bitwise at the end.
set -eu
B=${BEAMD_BUILD:-build}
H=${1:-1000}
W=${2:-1000}
T=${3:-100}
CODEC=${4:-raw}
PY=${PYTHON:-/usr/bin/python3}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
# --bind-to none: Open MPI binds each rank to one core by default (np <= 2),
# which would put all of a rank's threads on that core.
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader"

HDF5_PLUGIN_PATH=${HDF5_PLUGIN_PATH:-/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins} \
"$PY" - "$D/scan.h5" "$H" "$W" "$T" "$CODEC" <<'PYEOF'
import sys, numpy as np, h5py
path, H, W, T, codec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = np.random.default_rng(1)
amp = rng.uniform(150, 400, (H, W)).astype(np.float32)
ph = rng.uniform(-np.pi, np.pi, (H, W)).astype(np.float32)
tau = rng.uniform(3, 9, (H, W)).astype(np.float32)
f = rng.uniform(0.15, 0.45, (H, W)).astype(np.float32)
c = rng.uniform(500, 800, (H, W)).astype(np.float32)
x = np.linspace(0, 15, T)
kw = dict(chunks=(1, H, W))
if codec == "bslz4":
    kw.update(compression=32008, compression_opts=(0, 2))
with h5py.File(path, "w") as h:
    d = h.create_dataset("/entry/data/data", (T, H, W), "uint16", **kw)
    for k in range(T):  # one frame at a time: bounded memory
        mu = np.exp(-x[k] / tau) * amp * np.cos(2 * np.pi * f * x[k] + ph) + c
        d[k] = rng.poisson(mu).astype(np.uint16)
    h["/entry/data/delay"] = x
PYEOF
echo "beamd-fit CPU, ${H}x$W pixels x $T frames uint16 ($CODEC, $(du -m "$D/scan.h5" | cut -f1) MB), damped cosine, $(nproc) cores"

TIME=""
[ -x /usr/bin/time ] && TIME="/usr/bin/time -f %M -o $D/rss.%p"
run() { # label ranks threads out
  rm -f "$D"/rss.*
  s=$(date +%s.%N)
  $MPIRUN -n "$2" $TIME "$B/beamd-fit" "$D/scan.h5" -o "$D/$4" --model damped_cosine \
    --x /entry/data/delay --threads "$3" 2>"$D/log"
  e=$(date +%s.%N)
  rss=$(cat "$D"/rss.* 2>/dev/null | sort -n | tail -1)
  printf '%-20s wall %6.2f s  |%s\n' "$1" "$(echo "$e - $s" | bc)" \
    "$(grep -o 'read [0-9].*' "$D/log" | head -1)${rss:+; peak RSS ${rss} kB}"
}

run "1 rank  x 1 thread" 1 1 m11.h5
run "2 ranks x 1 thread" 2 1 m21.h5
run "1 rank  x 2 threads" 1 2 m12.h5
"$PY" - "$D" <<'PYEOF'
import sys, h5py, numpy as np
d = sys.argv[1]
a = h5py.File(d + "/m11.h5")["/maps"]
for o in ("m21.h5", "m12.h5"):
    b = h5py.File(d + "/" + o)["/maps"]
    same = all(np.array_equal(a[k][()], b[k][()], equal_nan=True) for k in a)
    print("maps %s vs 1 rank: %s" % (o, "bitwise identical" if same else "DIFFER"))
st = np.bincount(a["status"][()].ravel(), minlength=6)
print("status counts (converged bound max_iter singular bad_input too_few):", st[:6].tolist())
PYEOF
