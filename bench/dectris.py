#!/usr/bin/python3
"""DECTRIS detector input benchmark (bench/README.md, "DECTRIS detector input").

EIGER 4M (2167 x 2070) and EIGER2 16M (4362 x 4148) uint16 frames,
bitshuffle-LZ4 compressed (Poisson counts of mean --mean, default 1, which
compresses about 6x), sent by $BUILD/bench/dectris_send (C, PUSH, a bank of
messages encoded once, blobs zero-copy) as SIMPLON stream v1 (4M) and v2
(16M), over tcp and ipc, into:

- raw: `dectris_send recv`, a plain PULL that counts image messages: what
  ZeroMQ alone carries of the same messages on this machine;
- raw + write(): the same receiver also writing every image message into a
  file beside where record writes (tmpfs when there is one): the least any
  recorder must do, so what this machine can store at all;
- record: beamd (input.mode dectris) -> a `record` stage with compress
  bslz4 (check: full; record_framing: check: framing), which stores the
  blobs as they came (pass-through, never decoded;
  its `passthrough` counter must equal the frames). A run ends when the
  stage renames its file; the file's mtime is the end time;
- roi_sum, roi_sum_d2: beamd -> one `roi_sum` stage (a 64 x 64 rect, so the
  figure is the decode) -> output.push -> `zthroughput recv` counting
  `vd.sums` results; pool.decode_threads 0 (the stage thread decodes) and 2.

frames/s = frames / (sender's first image -> last image or result received,
or the record file's close), the median of --reps runs of --seconds each,
after an uncounted warm-up series per daemon. GB/s is of compressed bytes.
Beside them: the decoder's rate alone (beam_codec_decode in a loop on one
thread, `dectris_send decode`) for the same frames, and the per-message
parse cost of beam_dx1_parse / beam_dx2_parse ($BUILD/bench/dectris_parse).

    /usr/bin/python3 bench/dectris.py [--build build] [--seconds 2] [--reps 3]
        [--case 4m-v1 --case 16m-v2] [--transport tcp] [--graph record] [--json FILE]
"""
import argparse
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import bench_daemon

# case -> (shape name, stream version, C shape)
CASES = {"4m-v1": ("4m", 1, (2167, 2070)), "16m-v2": ("16m", 2, (4362, 4148)),
         "4m-v2": ("4m", 2, (2167, 2070)), "16m-v1": ("16m", 1, (4362, 4148))}
DEFAULT_CASES = ("4m-v1", "16m-v2")
TRANSPORTS = ("tcp", "ipc")
GRAPHS = ("record", "record_framing", "roi_sum", "roi_sum_d2")
QUEUE_BYTES = 64 << 20   # ZeroMQ HWM per socket, in compressed bytes of images
POOL_BYTES = 1152 << 20  # beamd's pool: at most this many bytes of decoded slots
TARGET_PASS = 0.90       # record (pass-through) against raw ZeroMQ
ROI_SIDE = 64


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load1():
    return os.getloadavg()[0]


class Dx:
    def __init__(self, build, tmp, log, seconds, reps, mean):
        self.build, self.tmp, self.log = build, tmp, log
        self.seconds, self.reps, self.mean = seconds, reps, mean
        self.ds = os.path.join(build, "bench", "dectris_send")
        self.zt = os.path.join(build, "bench", "zthroughput")
        self.beamd = os.path.join(build, "beamd")
        self.series = int(time.time()) % 100000 * 1000 + 500
        self.daemon = None
        self.daemon_log = None
        self.n_ep = 0

    # ---- processes ---------------------------------------------------------

    def bank_file(self, shape):
        return os.path.join(self.tmp, "bank-%s-m%g.bin" % (shape, self.mean))

    def run_json(self, argv, timeout):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError("%s failed (%d): %s%s" % (" ".join(argv[:2]), p.returncode,
                                                          p.stderr.strip(), p.stdout.strip()))
        return json.loads(p.stdout.strip().splitlines()[-1])

    def decode_alone(self, shape):
        return self.run_json([self.ds, "decode", "--shape", shape, "--mean", str(self.mean),
                              "--bank-file", self.bank_file(shape), "--reps", "5",
                              "--min-seconds", "0.2"], timeout=120)

    def start_sender(self, ep, shape, stream, sid, hwm, seconds):
        """Starts dectris_send send; returns (process, its JSON line) once it
        has sent the end message. It stays connected (--hold) until
        stopped: the caller stops it once the receiver has seen the end."""
        argv = [self.ds, "send", "--endpoint", ep, "--stream", str(stream), "--shape", shape,
                "--mean", str(self.mean), "--seconds", str(seconds), "--series", str(sid),
                "--hwm", str(hwm), "--timeout", "20", "--hold", "120",
                "--bank-file", self.bank_file(shape)]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + seconds + 90
        line = ""
        try:
            while not line:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("dectris_send send: no result in %.0f s" % (seconds + 90))
                r, _, _ = select.select([p.stdout], [], [], min(left, 1.0))
                if r:
                    line = p.stdout.readline()
                    if not line:  # exited without a result
                        p.wait(timeout=10)
                        raise RuntimeError("dectris_send send failed (%s): %s" %
                                           (p.returncode, p.stderr.read().strip()))
        except BaseException:
            bench_daemon.stop(p)
            raise
        return p, json.loads(line)

    def finish_sender(self, p):
        bench_daemon.stop(p)
        if p.returncode not in (0, -signal.SIGTERM):
            raise RuntimeError("dectris_send send exited %d: %s" %
                               (p.returncode, p.stderr.read().strip()))
        p.stdout.close()
        p.stderr.close()

    def ctl(self, ep, cmd, timeout_s=3):
        return self.run_json([self.zt, "ctl", "--endpoint", ep, "--timeout", str(timeout_s), cmd],
                             timeout=timeout_s + 10)

    def start_daemon(self, cfg_text, ctl_ep, name):
        self.daemon, self.daemon_log = bench_daemon.launch(
            self.beamd, self.tmp, cfg_text, name,
            lambda: self.ctl(ctl_ep, "ping", 0.5).get("ok"), 20)
        return self.daemon.pid

    def stop_daemon(self):
        if not self.daemon:
            return
        bench_daemon.stop(self.daemon, 15)
        self.daemon = None
        self.daemon_log.close()

    # ---- one run -----------------------------------------------------------

    def raw_run(self, ep, shape, stream, hwm, seconds, store=None):
        self.series += 1
        recv = subprocess.Popen([self.ds, "recv", "--endpoint", ep, "--bind", "--hwm", str(hwm),
                                 "--timeout", "20"] + (["--store", store] if store else []),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        snd = None
        try:
            time.sleep(0.3)  # let the receiver bind before the first image
            snd, s = self.start_sender(ep, shape, stream, self.series, hwm, seconds)
            out, err = recv.communicate(timeout=60)
        finally:
            bench_daemon.stop(recv)
            if snd:
                self.finish_sender(snd)
            if store and os.path.exists(store):
                os.unlink(store)
        if recv.returncode != 0:
            raise RuntimeError("dectris_send recv failed (%d): %s %s" %
                               (recv.returncode, err.strip(), out.strip()))
        r = json.loads(out.strip().splitlines()[-1])
        if r["counted"] != s["frames"]:
            raise RuntimeError("raw receiver counted %d of %d images" % (r["counted"], s["frames"]))
        span = (r["t_last_mono_ns"] - s["t0_mono_ns"]) * 1e-9
        return {"send": s, "recv": r, "fps": r["counted"] / span if span > 0 else 0.0}

    def roi_run(self, in_ep, out_ep, shape, stream, hwm, seconds):
        self.series += 1
        recv = subprocess.Popen([self.zt, "recv", "--endpoint", out_ep, "--topic", "vd.sums",
                                 "--series", str(self.series), "--timeout", "20"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        snd = None
        try:
            time.sleep(0.3)  # let the receiver connect before the first result
            snd, s = self.start_sender(in_ep, shape, stream, self.series, hwm, seconds)
            out, err = recv.communicate(timeout=90)
        finally:
            bench_daemon.stop(recv)
            if snd:
                self.finish_sender(snd)
            if store and os.path.exists(store):
                os.unlink(store)
        if recv.returncode != 0:
            raise RuntimeError("zthroughput recv failed (%d): %s %s" %
                               (recv.returncode, err.strip(), out.strip()))
        r = json.loads(out.strip().splitlines()[-1])
        if r["counted"] != s["frames"]:
            raise RuntimeError("beamd gave %d results for %d images" % (r["counted"], s["frames"]))
        span = (r["t_last_mono_ns"] - s["t0_mono_ns"]) * 1e-9
        return {"send": s, "recv": r, "fps": r["counted"] / span if span > 0 else 0.0}

    def record_run(self, in_ep, ctl_ep, rec_dir, shape, stream, hwm, seconds):
        self.series += 1
        before = self.ctl(ctl_ep, "stats")
        path = os.path.join(rec_dir, "series_%d.h5" % self.series)
        snd, s = self.start_sender(in_ep, shape, stream, self.series, hwm, seconds)
        try:
            deadline = time.monotonic() + 90
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    raise RuntimeError("the record stage did not close %s in 90 s" % path)
                time.sleep(0.02)
            end_ns = os.stat(path).st_mtime_ns
        finally:
            self.finish_sender(snd)
        after = self.ctl(ctl_ep, "stats")

        def rec(st, key):
            for x in st.get("stages", []):
                if x["name"] == "rec":
                    return x.get(key) or 0
            return 0
        passed = rec(after, "passthrough") - rec(before, "passthrough")
        took = rec(after, "frames_in") - rec(before, "frames_in")
        busy = rec(after, "busy_s") - rec(before, "busy_s")
        for p in [path] + [os.path.join(rec_dir, n) for n in os.listdir(rec_dir)]:
            if os.path.exists(p):
                os.remove(p)  # GBs per run: never keep them
        if took != s["frames"] or passed != s["frames"]:
            raise RuntimeError("record stage: %d frames in, %d passed through, of %d sent" %
                               (took, passed, s["frames"]))
        span = (end_ns - s["t0_real_ns"]) * 1e-9
        return {"send": s, "passthrough": passed, "frames_in": took, "stage_busy_s": busy,
                "fps": s["frames"] / span if span > 0 else 0.0}

    # ---- configs -----------------------------------------------------------

    @staticmethod
    def frame_bytes(hw):
        return ((hw[0] * hw[1] * 2 + (1 << 20) - 1) >> 20) << 20

    def config(self, graph, stream, hw, in_ep, out_ep, ctl_ep, hwm, rec_dir):
        fb = self.frame_bytes(hw)
        pool = max(16, min(64, POOL_BYTES // fb))
        dec = 2 if graph.endswith("_d2") else 0
        if graph.startswith("record"):
            check = "framing" if graph == "record_framing" else "full"
            stage = (f"""  - {{name: rec, kind: record, input: frames, dir: "{rec_dir}", compress: bslz4,
      check: {check}, queue: {pool + 8}}}""")
            out_ep = ""
        else:
            y0, x0 = hw[0] // 2 - ROI_SIDE // 2, hw[1] // 2 - ROI_SIDE // 2
            stage = f"""  - {{name: vd, kind: roi_sum, input: frames, backend: cpu, queue: {pool + 8},
      rois: [{{name: c, shape: rect, rect: [{x0}, {y0}, {x0 + ROI_SIDE}, {y0 + ROI_SIDE}]}}]}}"""
        return f"""# generated by bench/dectris.py
input: {{mode: dectris, endpoint: "{in_ep}", bind: true, hwm: {hwm}, dectris: {{format: v{stream}}}}}
output: {{publish: "", push: "{out_ep}", push_hwm: 1000, drain_timeout: 1s}}
pool: {{frames: {pool}, frame_bytes: {fb}, prefault: true, decode_threads: {dec}}}
control: {{endpoint: "{ctl_ep}"}}
metrics: {{listen: ""}}
log: {{level: warning}}
heartbeat: 1s
stages:
{stage}
""", pool, fb, dec

    # ---- one case ----------------------------------------------------------

    def endpoint(self, tr, tag):
        """A fresh endpoint per use: no run sees another run's leftovers."""
        self.n_ep += 1
        if tr == "tcp":
            return "tcp://127.0.0.1:%d" % free_port()
        return "ipc://%s/%s-%d.ipc" % (self.tmp, tag, self.n_ep)

    def case(self, name, tr, graphs, decode_fps):
        shape, stream, hw = CASES[name]
        row = {"case": name, "shape": list(hw), "stream": stream, "transport": tr,
               "load_start": load1(), "graphs": {}}
        raw = []
        # Sizes of one message, from a first sender run (the raw warm-up).
        ep = self.endpoint(tr, "raw")
        probe = self.raw_run(ep, shape, stream, 8, 0.3)
        blob = probe["send"]["blob_bytes"] / max(1, probe["send"]["frames"])
        hwm = max(4, int(QUEUE_BYTES // blob))
        row.update({"hwm": hwm, "blob_bytes": blob, "ratio_compression": probe["send"]["ratio"],
                    "raw_frame_bytes": probe["send"]["raw_frame_bytes"]})
        for rep in range(self.reps):
            raw.append(self.raw_run(self.endpoint(tr, "raw"), shape, stream, hwm, self.seconds))
            self.log("  %-6s %s raw ZeroMQ   rep %d: %9.1f frames/s" %
                     (name, tr, rep + 1, raw[-1]["fps"]))
        raw_fps = statistics.median(x["fps"] for x in raw)
        row["raw"] = {"fps": raw_fps, "gbps": raw_fps * blob / 1e9, "runs": raw}
        store_fps = None
        if any(g.startswith("record") for g in graphs):
            # The same receiver writing what it receives into a file where
            # record writes: what this machine can store at all.
            base = "/dev/shm" if os.path.isdir("/dev/shm") else self.tmp
            st_dir = tempfile.mkdtemp(prefix="beamd-dectris-raw-", dir=base)
            runs = []
            try:
                for rep in range(self.reps):
                    runs.append(self.raw_run(self.endpoint(tr, "raw"), shape, stream, hwm,
                                             self.seconds, os.path.join(st_dir, "raw.bin")))
                    self.log("  %-6s %s raw + write  rep %d: %9.1f frames/s" %
                             (name, tr, rep + 1, runs[-1]["fps"]))
            finally:
                shutil.rmtree(st_dir, ignore_errors=True)
            store_fps = statistics.median(x["fps"] for x in runs)
            row["raw_store"] = {"fps": store_fps, "gbps": store_fps * blob / 1e9, "runs": runs}
        for g in graphs:
            in_ep, out_ep = self.endpoint(tr, "in"), self.endpoint(tr, "out")
            ctl_ep = "tcp://127.0.0.1:%d" % free_port()
            rec_dir = None
            if g.startswith("record"):
                # tmpfs when there is one: the HDF5 write path, not this
                # VM's disk; deleted file by file as the runs go.
                base = "/dev/shm" if os.path.isdir("/dev/shm") else self.tmp
                rec_dir = tempfile.mkdtemp(prefix="beamd-dectris-rec-", dir=base)
            cfg, pool, fb, dec = self.config(g, stream, hw, in_ep, out_ep, ctl_ep, hwm, rec_dir)
            runs = []
            try:
                self.start_daemon(cfg, ctl_ep, "dectris-%s-%s-%s" % (name, tr, g))

                def one(secs):
                    if g.startswith("record"):
                        return self.record_run(in_ep, ctl_ep, rec_dir, shape, stream, hwm, secs)
                    return self.roi_run(in_ep, out_ep, shape, stream, hwm, secs)
                one(0.5)  # warm-up, not counted
                st0 = self.ctl(ctl_ep, "stats")
                for rep in range(self.reps):
                    runs.append(one(self.seconds))
                    self.log("  %-6s %s %-12s rep %d: %9.1f frames/s" %
                             (name, tr, g, rep + 1, runs[-1]["fps"]))
                st = self.ctl(ctl_ep, "stats")
            finally:
                self.stop_daemon()
                if rec_dir:
                    shutil.rmtree(rec_dir, ignore_errors=True)
            fps = statistics.median(x["fps"] for x in runs)
            busy = {}
            for s1 in st.get("stages", []):
                s0 = next((x for x in st0.get("stages", []) if x["name"] == s1["name"]), {})
                busy[s1["name"]] = (s1.get("busy_s", 0) or 0) - (s0.get("busy_s", 0) or 0)
            measured_s = sum(x["fps"] and x["send"]["frames"] / x["fps"] for x in runs)
            ent = {"fps": fps, "gbps": fps * blob / 1e9, "ratio_raw": fps / raw_fps if raw_fps else 0,
                   "ratio_store": fps / store_fps if store_fps and g.startswith("record") else None,
                   "decode_threads": dec, "pool_frames": pool, "pool_frame_bytes": fb,
                   "stage_busy_frac": {k: v / measured_s if measured_s else None
                                       for k, v in busy.items()},
                   "input": {k: st.get("input", {}).get(k)
                             for k in ("frames", "bytes", "paused_s", "decoded_ahead", "malformed",
                                       "missing")},
                   "dectris": st.get("input", {}).get("dectris"),
                   "stages": [{k: x.get(k) for k in ("name", "frames_in", "busy_s", "passthrough",
                                                     "errors")} for x in st.get("stages", [])],
                   "runs": runs}
            if not g.startswith("record") and decode_fps:
                want = decode_fps * max(1, dec)
                ent["decoder_fps_x_threads"] = want
                ent["ratio_decoder"] = fps / want
            row["graphs"][g] = ent
        row["load_end"] = load1()
        return row


def parse_bench(build, tmp, runs=15, min_ms=10):
    path = os.path.join(tmp, "dectris_parse.json")
    exe = os.path.join(build, "bench", "dectris_parse")
    p = subprocess.run([exe, "--runs", str(runs), "--min-ms", str(min_ms), "--json", path],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("dectris_parse failed: " + p.stderr.strip())
    with open(path) as f:
        out = json.load(f)
    out["load"] = load1()
    return out


def run(build, seconds=2.0, reps=3, log=print, tmp=None, cases=DEFAULT_CASES,
        transports=TRANSPORTS, graphs=GRAPHS, mean=1.0, parse=True):
    tmp = tempfile.mkdtemp(prefix="beamd-dectris-", dir=tmp)  # banks, configs, ipc sockets
    dx = Dx(build, tmp, log, seconds, reps, mean)
    res = {"seconds": seconds, "reps": reps, "mean": mean, "target_passthrough": TARGET_PASS,
           "decode": {}, "rows": [], "errors": []}
    try:
        if parse:
            log("  parse cost (bench/dectris_parse) ...")
            res["parse"] = parse_bench(build, tmp)
            for r in res["parse"]["results"]:
                log("    %-4s v%d %-14s %8.2f us" % (r["shape"], r["stream"], r["message"], r["us"]))
        for c in cases:
            shape = CASES[c][0]
            if shape not in res["decode"]:
                d = dx.decode_alone(shape)
                d["load"] = load1()
                res["decode"][shape] = d
                log("  decoder alone, %s: %.1f frames/s (%.0f us/frame, %.2f GB/s decoded), "
                    "compression %.2fx, load %.2f" % (shape, d["fps"], d["us_per_frame"],
                                                      d["decoded_gbps"], d["ratio"], d["load"]))
            for tr in transports:
                try:
                    res["rows"].append(dx.case(c, tr, graphs, res["decode"][shape]["fps"]))
                except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
                    res["errors"].append("%s %s: %s" % (c, tr, e))
                    log("  ERROR: %s %s: %s" % (c, tr, e))
    finally:
        dx.stop_daemon()
        shutil.rmtree(tmp, ignore_errors=True)
    if res["errors"] and not res["rows"]:
        raise RuntimeError("; ".join(res["errors"]))
    return res


GRAPH_LABEL = {"record": "record (pass)", "record_framing": "record (pass, framing)",
               "roi_sum": "roi_sum dt0", "roi_sum_d2": "roi_sum dt2"}


def summary_lines(res):
    L = ["DECTRIS input: dectris_send PUSH -> beamd (input.mode dectris) vs raw ZeroMQ, bslz4 "
         "uint16 Poisson mean %g (median of %d x %gs; GB/s of compressed bytes)" %
         (res["mean"], res["reps"], res["seconds"])]
    for shape, d in res.get("decode", {}).items():
        L.append("  decoder alone %-3s %dx%d: %7.1f frames/s on 1 thread (%.0f us/frame, %.2f GB/s "
                 "decoded), compression %.2fx (%.2f MB/frame), load %.2f" %
                 (shape, d["shape"][0], d["shape"][1], d["fps"], d["us_per_frame"],
                  d["decoded_gbps"], d["ratio"], d["blob_bytes"] / 1e6, d["load"]))
    L.append("  %-6s %-3s %-14s %9s %7s %8s %-26s %s" %
             ("case", "tr", "path", "f/s", "GB/s", "vs raw", "vs decoder x threads", "load"))
    for r in res.get("rows", []):
        ld = "%.2f->%.2f" % (r["load_start"], r["load_end"])
        L.append("  %-6s %-3s %-14s %9.1f %7.3f %8s %-26s %s" %
                 (r["case"], r["transport"], "raw ZeroMQ", r["raw"]["fps"], r["raw"]["gbps"], "-",
                  "-", ld))
        if r.get("raw_store"):
            rs = r["raw_store"]
            L.append("  %-6s %-3s %-14s %9.1f %7.3f %7.1f%% %-26s" %
                     ("", "", "raw + write()", rs["fps"], rs["gbps"],
                      100 * rs["fps"] / r["raw"]["fps"] if r["raw"]["fps"] else 0,
                      "what this machine stores"))
        for g, e in r["graphs"].items():
            if g.startswith("record"):
                note = "target >= %.0f%%: %s" % (100 * res["target_passthrough"],
                                                "ok" if e["ratio_raw"] >= res["target_passthrough"]
                                                else "BELOW")
                if e.get("ratio_store"):
                    note += "; %.1f%% of raw + write()" % (100 * e["ratio_store"])
            elif "ratio_decoder" in e:
                note = "%5.1f%% of %.1f" % (100 * e["ratio_decoder"], e["decoder_fps_x_threads"])
            else:
                note = "-"
            L.append("  %-6s %-3s %-14s %9.1f %7.3f %7.1f%% %-26s" %
                     ("", "", GRAPH_LABEL.get(g, g), e["fps"], e["gbps"], 100 * e["ratio_raw"],
                      note))
        busy = "; ".join("%s: %s" % (GRAPH_LABEL.get(g, g),
                                     ", ".join("%s %.0f%%" % (k, 100 * (v or 0))
                                               for k, v in e["stage_busy_frac"].items()))
                         for g, e in r["graphs"].items())
        if busy:
            L.append("  %-6s stage busy (share of measured time): %s" % ("", busy))
    p = res.get("parse")
    if p:
        L.append("  parse cost per message, one thread (median of %d runs), load %.2f:" %
                 (p["runs"], p["load"]))
        by = {}
        for x in p["results"]:
            by.setdefault((x["shape"], x["stream"]), []).append(x)
        for (shape, v), xs in by.items():
            L.append("    %-3s beam_dx%d_parse: %s" % (shape, v, ", ".join(
                "%s %.2f us" % (x["message"], x["us"]) for x in xs)))
    for e in res.get("errors", []):
        L.append("  ERROR: " + e)
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each run (default 2)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mean", type=float, default=1.0, help="Poisson mean, counts/pixel")
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="frame size and stream (repeatable; default 4m-v1, 16m-v2)")
    ap.add_argument("--transport", action="append", choices=TRANSPORTS)
    ap.add_argument("--graph", action="append", choices=GRAPHS)
    ap.add_argument("--no-parse", action="store_true", help="skip the parse micro-benchmark")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = run(a.build, a.seconds, a.reps, cases=a.case or DEFAULT_CASES,
              transports=a.transport or TRANSPORTS, graphs=a.graph or GRAPHS, mean=a.mean,
              parse=not a.no_parse)
    print("\n".join(summary_lines(res)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
