#!/usr/bin/env python3
"""Soak run (`make soak`, not a test): every stage kind at a steady rate for
a while, with what an operator watches sampled along the way.

beamd-sim (pattern ptycho: 64x64 frames with scan positions, so that
ptycho_dm has work too) pushes frames at --rate into one beamd whose graph
holds every stage kind: correct -> bin -> roi_sum, preview, xpcs_multitau,
xpcs_twotime, pca, fit (source pixels, on the binned frames), ptycho_dm and
record. Series of --frames frames follow each other for --minutes. Every
--every seconds the daemon's RSS, open file descriptors and threads (from
/proc), the stages' queue depths and the loss counters (stats) are
sampled; the record stage's finished series files are deleted as they
land (as a facility's data mover would), so the disk stays bounded.

Printed: the samples, then start (after --warmup) vs end for each figure
and the RSS slope (least squares over the samples after the warm-up, MiB
per hour). Flat means: fds and threads equal, RSS within a few MiB and a
slope near zero, losses 0 (lossless pull input), queues not growing.
Exit status 0 when the run completed (figures, not pass/fail).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_daemon  # noqa: E402
from run import free_port  # noqa: E402

H = W = 64


def config(eps, tmp, frames):
    labels = os.path.join(tmp, "labels.npy")
    write_labels(labels)
    rec = os.path.join(tmp, "rec")
    os.makedirs(rec)
    return """input: {mode: pull, endpoint: "%(inp)s"}
output: {publish: "%(pub)s"}
control: {endpoint: "%(ctl)s"}
pool: {frames: 128, frame_bytes: 64Ki}
log: {level: warning}
heartbeat: 1s
stages:
  - {name: corr, kind: correct, backend: cpu, threshold: 0.5}
  - {name: binned, kind: bin, input: corr, backend: cpu, factor: 2}
  - {name: vd, kind: roi_sum, input: corr, backend: cpu,
     rois: [{name: all, shape: rect, rect: [0, 0, %(w)d, %(h)d]},
            {name: centre, shape: disk, center: [32, 32], radius: 10}]}
  - {name: prev, kind: preview, input: corr, backend: cpu}
  - {name: g2, kind: xpcs_multitau, backend: cpu, rois: {file: "%(lab)s"}, levels: 6,
     buffers: 8, publish_every: 100}
  - {name: c2, kind: xpcs_twotime, backend: cpu, rois: {file: "%(lab)s"},
     max_frames: %(frames)d}
  - {name: pca, kind: pca, input: corr, backend: cpu, components: 4}
  - {name: fitmap, kind: fit, input: binned, backend: cpu, source: pixels, model: poly,
     degree: 1, max_frames: %(frames)d}
  - {name: dm, kind: ptycho_dm, backend: cpu, n: 64, iterations: 10, final_iterations: 5,
     min_frames: 16, max_frames: %(frames)d, publish_every: 50, threads: 1,
     probe: {init: zone_plate, zp_diameter: 100e-6, zp_outer_zone: 130e-9,
             central_stop: 40e-6, defocus: 1.1e-3}}
  - {name: rec, kind: record, input: frames, dir: "%(rec)s"}
""" % dict(inp=eps["input"], pub=eps["publish"], ctl=eps["control"], lab=labels, h=H, w=W,
           frames=frames, rec=rec)


def write_labels(path):
    """uint16 .npy: four rings about the centre (numpy-free: the bench uses
    the standard library only)."""
    import struct
    hdr = "{'descr': '<u2', 'fortran_order': False, 'shape': (%d, %d), }" % (H, W)
    hdr += " " * (63 - (len(hdr) + 10) % 64) + "\n"
    vals = []
    for y in range(H):
        for x in range(W):
            r = ((y - H / 2) ** 2 + (x - W / 2) ** 2) ** 0.5
            vals.append(int(r // 7) + 1 if 3 <= r < 31 else 0)
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%dH" % len(vals), *vals))


def proc_figures(pid):
    st = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            st[k] = v.strip()
    return {"rss_mib": int(st["VmRSS"].split()[0]) / 1024.0,
            "fds": len(os.listdir("/proc/%d/fd" % pid)),
            "threads": int(st["Threads"])}


def stats(ctl_tool, ep):
    for attempt in range(5):  # a rebuild may replace the tool under us
        try:
            out = subprocess.run([ctl_tool, "-e", ep, "-t", "5", "stats"], capture_output=True,
                                 text=True, timeout=15)
            break
        except OSError:
            if attempt == 4:
                raise
            time.sleep(1)
    if out.returncode != 0:
        raise RuntimeError("beamd-ctl stats: " + out.stderr)
    return json.loads(out.stdout)


def sample(pid, st):
    s = proc_figures(pid)
    inp = st["input"]
    s["frames"] = inp["frames"]
    s["losses"] = (inp.get("lost", 0) + inp.get("dropped_busy", 0) + inp.get("missing", 0) +
                   inp.get("malformed", 0))
    outs = st.get("outputs", {})
    s["out_dropped"] = sum(o.get("dropped", 0) for o in outs.values())
    s["queue_max"] = max((x.get("queue_depth", 0) for x in st["stages"]), default=0)
    s["stage_errors"] = sum(x.get("errors", 0) + x.get("rejected", 0) for x in st["stages"])
    s["series"] = inp.get("series", 0)
    return s


def slope_per_hour(ts, ys):
    n = len(ts)
    if n < 2:
        return 0.0
    mt, my = sum(ts) / n, sum(ys) / n
    den = sum((t - mt) ** 2 for t in ts)
    return 0.0 if den == 0 else sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den * 3600


def clean_records(rec):
    """Finished series files go (the .partial being written stays)."""
    for name in os.listdir(rec):
        if name.endswith(".h5"):
            try:
                os.unlink(os.path.join(rec, name))
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=100.0, help="frames per second")
    ap.add_argument("--frames", type=int, default=500, help="frames per series")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before the start figures")
    a = ap.parse_args()
    beamd = os.path.join(a.build, "beamd")
    sim_bin = os.path.join(a.build, "beamd-sim")
    ctl = os.path.join(a.build, "beamd-ctl")
    tmp = tempfile.mkdtemp(prefix="beamd-soak-")
    eps = {k: "tcp://127.0.0.1:%d" % free_port() for k in ("input", "publish", "control")}
    p = sim = None
    try:
        p, logf = bench_daemon.launch(beamd, tmp, config(eps, tmp, a.frames), "soak",
                                      lambda: stats(ctl, eps["control"]) is not None, 30)
        n_series = int(a.minutes * 60 * a.rate / a.frames) + 2
        sim = subprocess.Popen([sim_bin, "--bind", eps["input"], "--socket", "push",
                                "--pattern", "ptycho", "--shape", "%dx%d" % (H, W),
                                "--rate", str(a.rate), "--frames", str(a.frames),
                                "--series", str(n_series), "--noise", "poisson",
                                "--photons", "1e5"],
                               stdout=subprocess.DEVNULL, stderr=open(
                                   os.path.join(tmp, "sim.log"), "w"))
        t0 = time.monotonic()
        rows = []
        print("soak: %.1f min at %.0f frames/s, %d-frame series of %dx%d, every stage kind"
              % (a.minutes, a.rate, a.frames, H, W))
        print("%7s %8s %8s %5s %5s %8s %7s %7s %6s %6s" % (
            "t_s", "frames", "rss_MiB", "fds", "thr", "series", "losses", "dropped", "q_max",
            "errors"))
        while time.monotonic() - t0 < a.minutes * 60:
            if p.poll() is not None:
                raise RuntimeError("beamd exited %s: %s" % (
                    p.returncode, open(os.path.join(tmp, "soak.log")).read()[-2000:]))
            s = sample(p.pid, stats(ctl, eps["control"]))
            s["t"] = time.monotonic() - t0
            rows.append(s)
            print("%7.0f %8d %8.1f %5d %5d %8d %7d %7d %6d %6d" % (
                s["t"], s["frames"], s["rss_mib"], s["fds"], s["threads"], s["series"],
                s["losses"], s["out_dropped"], s["queue_max"], s["stage_errors"]), flush=True)
            clean_records(os.path.join(tmp, "rec"))
            time.sleep(a.every)
        after = [r for r in rows if r["t"] >= a.warmup] or rows
        first, last = after[0], after[-1]
        print("soak: start (t=%.0f s) -> end (t=%.0f s)" % (first["t"], last["t"]))
        for k, unit in (("rss_mib", "MiB"), ("fds", ""), ("threads", ""), ("losses", ""),
                        ("out_dropped", ""), ("queue_max", ""), ("stage_errors", "")):
            print("  %-12s %10.1f -> %10.1f %s" % (k, first[k], last[k], unit))
        rate = (last["frames"] - first["frames"]) / max(last["t"] - first["t"], 1e-9)
        print("  %-12s %10.1f frames/s through the graph (asked %.0f)" % ("rate", rate, a.rate))
        print("  %-12s %10.2f MiB/h (least squares over %d samples after the warm-up)" % (
            "rss_slope", slope_per_hour([r["t"] for r in after], [r["rss_mib"] for r in after]),
            len(after)))
        print(json.dumps({"soak": {"minutes": a.minutes, "rate": a.rate, "start": first,
                                   "end": last, "frames_per_s": rate}}))
        return 0
    finally:
        if sim is not None and sim.poll() is None:
            sim.send_signal(signal.SIGINT)
            try:
                sim.wait(5)
            except subprocess.TimeoutExpired:
                sim.kill()
        bench_daemon.stop(p, 30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
