#!/usr/bin/python3
"""beamd-view benchmark (bench/run.py runs it as the "view" figure).

Figures, not pass/fail:
1. Viewer CPU and end-to-end latency at 10 and 50 results/s of 512x512
   float32 images: beamd's `preview` stage (rate R, max_size 512) fed by
   beamd-sim (512x512 uint16 at 2R frames/s), beamd-view subscribed, and one
   headless Chromium page drawing the image. Latency is "published -> drawn":
   the page stamps performance.timeOrigin + performance.now() when the image
   is on the canvas, minus the daemon's t_send_ns of the result (same host,
   same clock). Viewer CPU is utime + stime of the beamd-view process from
   /proc over the window, in % of one core; measured with no browser too.
2. Daemon throughput without a viewer, with one, with one whose browser
   never reads (coupling without CPU load), and with a page open: beamd
   (correct + roi_sum + preview at 50/s) in pull mode, beamd-sim pushing
   N frames of 512x512 as fast as it can; frames/s = N over the time from
   the first to the last frame through the last stage (control-socket stats
   polled every 20 ms). Medians of --reps runs, alternating the two cases.

Everything on loopback with free ports; every process is killed at the end.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import viewclient  # noqa: E402  (WebSocket + DevTools client, standard library + numpy)

try:
    import zmq
except ImportError:  # the figure is skipped, not failed
    zmq = None

SHAPE = 512


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Rig:
    """beamd + beamd-view (+ sim runs), torn down by close()."""

    def __init__(self, build, stages, tmp):
        self.build, self.tmp, self.procs = build, tmp, []
        self.in_ep = "tcp://127.0.0.1:%d" % free_port()
        self.pub_ep = "tcp://127.0.0.1:%d" % free_port()
        self.ctl_ep = "tcp://127.0.0.1:%d" % free_port()
        cfg = os.path.join(tmp, "view-bench.yaml")
        with open(cfg, "w") as f:
            f.write("input: {mode: pull, endpoint: \"%s\"}\n"
                    "output: {publish: \"%s\"}\n"
                    "pool: {frames: 64, frame_bytes: 1Mi}\n"
                    "control: {endpoint: \"%s\"}\n"
                    "metrics: {listen: \"\"}\n"
                    "log: {level: warning}\n"
                    "heartbeat: 1s\n"
                    "stages:\n%s" % (self.in_ep, self.pub_ep, self.ctl_ep, stages))
        self.beamd = self.spawn("beamd", ["-c", cfg])
        self.zctx = zmq.Context()
        deadline = time.monotonic() + 10
        while not self.ctl("ping", 0.3):
            if time.monotonic() > deadline or self.beamd.poll() is not None:
                raise RuntimeError("beamd did not start (see %s)" % tmp)
        self.view = None
        self.browser = None

    def spawn(self, name, args):
        log = open(os.path.join(self.tmp, "%s-%d.log" % (name, len(self.procs))), "w")
        p = subprocess.Popen([os.path.join(self.build, name)] + args, stdout=log,
                             stderr=subprocess.STDOUT)
        self.procs.append((p, log))
        return p

    def ctl(self, cmd, timeout=2.0):
        s = self.zctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        try:
            s.connect(self.ctl_ep)
            s.send_string(cmd)
            return json.loads(s.recv())
        except zmq.Again:
            return None
        finally:
            s.close()

    def start_view(self):
        self.view_port = free_port()
        # --max-rate above the 50/s figure: the default (20/s per topic per
        # browser) would cap what this benchmark is to measure.
        self.view = self.spawn("beamd-view", ["--sub", self.pub_ep, "--control", self.ctl_ep,
                                              "--port", str(self.view_port), "--max-rate", "100"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.view_port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("beamd-view did not listen")

    def open_page(self, topics):
        # A page is normally on another machine; here it shares two cores
        # with the daemon, so it runs at the lowest priority.
        self.browser = viewclient.Browser(width=1400, height=900, nice=19)
        self.browser.goto("http://127.0.0.1:%d/?topics=%s" % (self.view_port, topics))
        self.browser.wait("window.beamdView && beamdView.connected", 15)

    def sim(self, frames, rate, series_id):
        args = ["--bind", self.in_ep, "--socket", "push", "--quiet", "--pattern", "counter",
                "--shape", "%dx%d" % (SHAPE, SHAPE), "--frames", str(frames),
                "--series-id", str(series_id)]
        if rate:
            args += ["--rate", str(rate)]
        return self.spawn("beamd-sim", args)

    def close(self):
        if self.browser:
            self.browser.close()
        for p, log in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            log.close()
        self.zctx.destroy(linger=0)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def latency_cpu(build, tmp, rate, seconds):
    stages = ("  - {name: preview, kind: preview, backend: cpu, rate: %d, max_size: %d}\n"
              % (rate, SHAPE))
    rig = Rig(build, stages, tmp)
    out = {"rate": rate}
    try:
        rig.start_view()
        sim = rig.sim(0, 2 * rate, 1)  # one open-ended series
        time.sleep(1.5)
        t0, c0 = time.monotonic(), cpu_s(rig.view.pid)
        time.sleep(seconds / 2)
        out["viewer_cpu_pct_no_browser"] = 100 * (cpu_s(rig.view.pid) - c0) / (time.monotonic() - t0)
        rig.open_page("preview.frame")
        b = rig.browser
        b.wait("(beamdView.drawn['preview.frame'] || 0) > 3", 15, "first images drawn")
        b.eval("beamdView.latencies.length = 0")
        d0 = b.eval("beamdView.drawn['preview.frame']")
        t0, c0 = time.monotonic(), cpu_s(rig.view.pid)
        time.sleep(seconds)
        dt = time.monotonic() - t0
        out["viewer_cpu_pct"] = 100 * (cpu_s(rig.view.pid) - c0) / dt
        d1 = b.eval("beamdView.drawn['preview.frame']")
        lat = b.eval("beamdView.latencies.filter(l => l.topic == 'preview.frame').map(l => l.ms)")
        # the part from the viewer's send to the drawing (WebSocket + page)
        page = b.eval("beamdView.latencies.filter(l => l.topic == 'preview.frame').map(l => l.viewer_ms)")
        st = rig.ctl("stats") or {}
        pub = (st.get("outputs") or {}).get("publish") or {}
        out.update({
            "drawn_per_s": (d1 - d0) / dt,
            "latency_ms_p50": statistics.median(lat) if lat else float("nan"),
            "latency_ms_p90": pct(lat, 0.9), "latency_ms_p99": pct(lat, 0.99),
            "latency_n": len(lat), "seconds": dt,
            "viewer_tx_to_drawn_ms_p50": statistics.median(page) if page else float("nan"),
            "daemon_results_per_s": st.get("results_per_s"),
            "daemon_publish_dropped": pub.get("dropped"),
            "page_errors": b.eval("beamdView.errors.length"),
        })
        sim.kill()
    finally:
        rig.close()
    return out


def throughput_once(rig, frames, series_id):
    def done():
        st = rig.ctl("stats", 2.0) or {}
        stg = {s["name"]: s for s in st.get("stages", [])}
        return stg.get("vd", {}).get("frames_out", 0)
    base = done()
    sim = rig.sim(frames, 0, series_id)
    t_first = t_last = None
    deadline = time.monotonic() + 120
    last = base
    while time.monotonic() < deadline:
        n = done()
        now = time.monotonic()
        if n > base and t_first is None:
            t_first, n_first = now, n
        if n != last:
            t_last, last = now, n
        if n - base >= frames:
            break
        time.sleep(0.02)
    sim.wait(timeout=30)
    if last - base < frames or t_first is None or t_last <= t_first:
        raise RuntimeError("daemon processed %d of %d frames" % (last - base, frames))
    return (last - n_first) / (t_last - t_first)


def daemon_throughput(build, tmp, frames, reps):
    q = SHAPE // 8
    stages = ("  - {name: corr, kind: correct, backend: cpu, publish: false, threshold: 0.5}\n"
              "  - name: vd\n    kind: roi_sum\n    input: corr\n    backend: cpu\n"
              "    rois:\n      - {name: bf, shape: disk, radius: %d}\n"
              "      - {name: adf, shape: annulus, radii: [%d, %d]}\n"
              "  - {name: preview, kind: preview, input: corr, backend: cpu, rate: 50, max_size: %d}\n"
              % (q, q, 2 * q, SHAPE))
    rig = Rig(build, stages, tmp)
    cases = ("without_viewer", "with_viewer", "with_stalled_client", "with_viewer_and_page")
    res = {"frames": frames}
    for case in cases:
        res[case] = []
    stalled = None
    sid = 100
    try:
        throughput_once(rig, frames // 4, sid)  # warm-up
        rig.start_view()
        view_proc = rig.view
        # without: the viewer stopped (SIGSTOP would keep its socket: a dead
        # subscriber); with: running and subscribed (and with a page open).
        for rep in range(reps):
            for case in cases:
                sid += 1
                if stalled:
                    stalled.close()
                    stalled = None
                if case == "without_viewer":
                    if rig.browser:
                        rig.browser.close()
                        rig.browser = None
                    view_proc.send_signal(signal.SIGTERM)
                    view_proc.wait(timeout=10)
                elif case == "with_viewer":
                    rig.start_view()
                    view_proc = rig.view
                    time.sleep(0.5)
                elif case == "with_stalled_client":
                    # a browser that never reads: the worst case for coupling,
                    # and nearly free in CPU, so it isolates coupling from
                    # CPU contention
                    stalled = viewclient.WebSocket("127.0.0.1", rig.view_port, "/ws")
                    stalled.send_json({"subscribe": "*"})
                    time.sleep(0.5)
                else:
                    rig.open_page("preview.frame")
                    rig.browser.wait("(beamdView.drawn['preview.frame'] || 0) >= 0", 5)
                fps = throughput_once(rig, frames, sid)
                res[case].append(fps)
                print("  rep %d %-22s %8.1f frames/s" % (rep + 1, case, fps), flush=True)
        st = rig.ctl("stats") or {}
        res["publish_dropped"] = ((st.get("outputs") or {}).get("publish") or {}).get("dropped")
    finally:
        if stalled:
            stalled.close()
        rig.close()
    for case in cases:
        res[case + "_median"] = statistics.median(res[case])
    return res


def run(build, seconds=6.0, frames=3000, reps=3):
    if zmq is None:
        return {"skipped": "pyzmq is not installed"}
    if not os.access(viewclient.CHROMIUM, os.X_OK):
        return {"skipped": "%s not found" % viewclient.CHROMIUM}
    tmp = tempfile.mkdtemp(prefix="beamd-bench-view-")
    res = {"latency_cpu": [], "tmp": tmp}
    for rate in (10, 50):
        r = latency_cpu(build, tmp, rate, seconds)
        res["latency_cpu"].append(r)
        print("  %2d results/s: drawn %.1f/s, published->drawn p50 %.1f ms p90 %.1f ms "
              "p99 %.1f ms (n=%d; viewer send->drawn p50 %.1f ms), viewer CPU %.1f %% "
              "(%.1f %% without a page)" %
              (rate, r["drawn_per_s"], r["latency_ms_p50"], r["latency_ms_p90"],
               r["latency_ms_p99"], r["latency_n"], r["viewer_tx_to_drawn_ms_p50"],
               r["viewer_cpu_pct"],
               r["viewer_cpu_pct_no_browser"]), flush=True)
    res["daemon"] = daemon_throughput(build, tmp, frames, reps)
    d = res["daemon"]
    print("  daemon throughput (median of %d): %.1f frames/s without a viewer, %.1f with, "
          "%.1f with a client that never reads, %.1f with a page open (same 2 cores); "
          "publish drops %s" % (reps, d["without_viewer_median"], d["with_viewer_median"],
                                d["with_stalled_client_median"],
                                d["with_viewer_and_page_median"], d.get("publish_dropped")),
          flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--seconds", type=float, default=6.0, help="latency window per rate")
    ap.add_argument("--frames", type=int, default=3000, help="frames per throughput run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = run(a.build, a.seconds, a.frames, a.reps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if "skipped" not in res else 0


if __name__ == "__main__":
    sys.exit(main())
