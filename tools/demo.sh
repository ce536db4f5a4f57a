#!/bin/sh
# The quick-start demo: beamd on its built-in default configuration, fed by
# the simulator (a 4D-STEM-like pattern), results printed live by
# beamd-sub, then the daemon's own statistics. Runs DEMO_SECONDS (10).
set -e
B=${BEAMD_BUILD:-build}
SECS=${DEMO_SECONDS:-10}
cleanup() { kill $SIM $SUB $VIEW 2>/dev/null || true; [ -n "$D" ] && kill -TERM $D 2>/dev/null && wait $D 2>/dev/null || true; }
trap cleanup EXIT INT TERM
echo "== beamd (built-in default configuration: $B/beamd --print-default-config shows it)"
$B/beamd &
D=$!
for i in $(seq 50); do $B/beamd-ctl -t 0.2 ping >/dev/null 2>&1 && break; sleep 0.1; done
if [ -x "$B/beamd-view" ]; then
  # The live page, for whoever has a browser on this machine (or a tunnel).
  $B/beamd-view --port "${DEMO_VIEW_PORT:-8600}" >/dev/null 2>&1 &
  VIEW=$!
  echo "== beamd-view: open http://127.0.0.1:${DEMO_VIEW_PORT:-8600}/ while the demo runs"
fi
echo "== beamd-sub: results from tcp://127.0.0.1:5600 (virtual detectors and previews)"
$B/beamd-sub --print --topic vd. --topic preview. --timeout "$SECS" &
SUB=$!
sleep 0.5
echo "== beamd-sim: 256x256 uint16 frames at 50 Hz on tcp://127.0.0.1:5500"
$B/beamd-sim --pattern stem --shape 256x256 --rate 50 --frames $((SECS * 50 - 50)) --quiet &
SIM=$!
wait $SUB || true
wait $SIM 2>/dev/null || true
echo "== beamd-ctl stats"
$B/beamd-ctl --pretty stats
