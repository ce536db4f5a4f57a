#!/usr/bin/python3
"""Karabo bridge benchmark (bench/README.md, "Karabo bridge").

Output (output.karabo): zthroughput send (PUSH, 512 x 512 uint16 frames) ->
beamd (input pull, a `correct` stage: float32 512 x 512 results, 1 MiB) ->
output.karabo rep or push -> karabo_recv (C: REQ `next` or PULL, every
message decoded with proto/karabo.c), beside raw ZeroMQ moving the same
bytes: karabo_send (a C bridge server: the same one-source float32 512 x 512
message, data zero-copy) -> the same karabo_recv.

Input (input.mode karabo): karabo_send (REP, AGIPD-like trains: 16 modules
x 512 x 128, --pulses uint16, online layout (16, 512, 128, pulses) or file
layout (pulses, 16, 512, 128)) -> beamd (REQ `next`; every pulse a frame,
the online layout transposed) -> a roi_sum stage (64 x 64 rect, so the
figure is the ingest), beside raw ZeroMQ: the same server -> karabo_recv
--pattern req. The server's clock: from the first request to the one after
the last train (a REQ client asks again only once it has the train whole;
beamd only once every pulse is in a pool slot).

Medians of --reps runs of --seconds (output) or --trains trains (input),
after an uncounted warm-up per daemon; beamd's CPU seconds (all threads,
/proc/PID/stat) per GB moved in the measured runs.

    /usr/bin/python3 bench/karabo.py [--build build] [--seconds 2] [--reps 3]
        [--trains 12] [--pulses 32] [--json FILE]
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import bench_daemon

OUT_H = OUT_W = 512
MODULES, SS, FS = 16, 512, 128


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ep():
    return "tcp://127.0.0.1:%d" % free_port()


def load1():
    return os.getloadavg()[0]


def cpu_s(pid):
    """User + system CPU seconds of every thread of pid so far."""
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


class Kb:
    def __init__(self, build, tmp, log, seconds, reps, trains, pulses):
        self.build, self.tmp, self.log = build, tmp, log
        self.seconds, self.reps, self.trains, self.pulses = seconds, reps, trains, pulses
        self.ks = os.path.join(build, "bench", "karabo_send")
        self.kr = os.path.join(build, "bench", "karabo_recv")
        self.zt = os.path.join(build, "bench", "zthroughput")
        self.beamd = os.path.join(build, "beamd")
        self.daemon = self.daemon_log = None
        self.tid = int(time.time()) % 100000 * 1000000

    # ---- processes -----------------------------------------------------------

    @staticmethod
    def spawn(argv):
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def result(p, what, timeout):
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            bench_daemon.stop(p)
        lines = (out or "").strip().splitlines()
        if not lines:
            raise RuntimeError("%s: no result (%s): %s" % (what, p.returncode, (err or "").strip()))
        return json.loads(lines[-1])

    def ctl(self, cep, cmd):
        p = subprocess.run([self.zt, "ctl", "--endpoint", cep, "--timeout", "3", cmd],
                           capture_output=True, text=True, timeout=15)
        if p.returncode != 0:
            raise RuntimeError("ctl %s: %s" % (cmd, p.stderr.strip()))
        return json.loads(p.stdout.strip().splitlines()[-1])

    def start_daemon(self, cfg, cep, name):
        self.daemon, self.daemon_log = bench_daemon.launch(
            self.beamd, self.tmp, cfg, name, lambda: self.ctl(cep, "ping").get("ok"), 20)

    def stop_daemon(self):
        if self.daemon:
            bench_daemon.stop(self.daemon, 15)
            self.daemon_log.close()
            self.daemon = None

    # ---- output ----------------------------------------------------------------

    def out_client(self, kep, pattern, secs):
        return self.spawn([self.kr, "--endpoint", kep, "--pattern",
                           "req" if pattern == "rep" else "pull", "--seconds", str(secs),
                           "--timeout", "10"])

    def out_raw(self, pattern, secs):
        kep = ep()
        srv = self.spawn([self.ks, "--endpoint", kep, "--pattern", pattern, "--shape",
                          "%dx%d" % (OUT_H, OUT_W), "--dtype", "float32", "--source",
                          "beamd/corr.frame", "--seconds", str(secs + 5), "--hold", "30"])
        try:
            time.sleep(0.2)
            r = self.result(self.out_client(kep, pattern, secs), "karabo_recv", secs + 30)
        finally:
            bench_daemon.stop(srv)
        return r

    def out_beamd(self, pattern, secs, iep, kep):
        self.tid += 1
        snd = self.spawn([self.zt, "send", "--endpoint", iep, "--shape", "%dx%d" % (OUT_H, OUT_W),
                          "--seconds", str(secs + 3), "--series", str(self.tid), "--hwm", "16"])
        try:
            time.sleep(0.2)
            c0 = cpu_s(self.daemon.pid)
            r = self.result(self.out_client(kep, pattern, secs), "karabo_recv", secs + 30)
            r["beamd_cpu_s"] = cpu_s(self.daemon.pid) - c0
        finally:
            bench_daemon.stop(snd)
        return r

    def out_config(self, pattern, iep, kep, cep):
        return f"""# generated by bench/karabo.py
input: {{mode: pull, endpoint: "{iep}", bind: true, hwm: 16}}
output: {{publish: "", push: "", drain_timeout: 1s,
         karabo: {{endpoint: "{kep}", pattern: {pattern}, hwm: 4, topics: "corr."}}}}
pool: {{frames: 32, frame_bytes: 1Mi, prefault: true}}
control: {{endpoint: "{cep}"}}
metrics: {{listen: ""}}
log: {{level: warning}}
heartbeat: 1s
stages:
  - {{name: corr, kind: correct, backend: cpu}}
"""

    def output(self, pattern):
        row = {"pattern": pattern, "load_start": load1()}
        iep, kep, cep = ep(), ep(), ep()
        raw, bd = [], []
        self.start_daemon(self.out_config(pattern, iep, kep, cep), cep, "karabo-out-" + pattern)
        try:
            self.out_beamd(pattern, 0.5, iep, kep)  # warm-up
            st0 = self.ctl(cep, "stats")
            for rep in range(self.reps):  # alternating, so load drifts hit both
                raw.append(self.out_raw(pattern, self.seconds))
                bd.append(self.out_beamd(pattern, self.seconds, iep, kep))
                self.log("  output %-4s rep %d: raw %8.1f results/s %6.3f GB/s | beamd %8.1f "
                         "results/s %6.3f GB/s" % (pattern, rep + 1, raw[-1]["sps"],
                                                   raw[-1]["gbps"], bd[-1]["sps"], bd[-1]["gbps"]))
            st = self.ctl(cep, "stats")
        finally:
            self.stop_daemon()
        k0, k1 = st0["outputs"]["karabo"], st["outputs"]["karabo"]
        med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
        gb = sum(x["array_bytes"] for x in bd) / 1e9
        row.update({"raw": {"sps": med(raw, "sps"), "gbps": med(raw, "gbps"), "runs": raw},
                    "beamd": {"sps": med(bd, "sps"), "gbps": med(bd, "gbps"), "runs": bd,
                              "cpu_s_per_gb": sum(x["beamd_cpu_s"] for x in bd) / gb if gb else None,
                              "served": k1["served"] - k0["served"],
                              "dropped": k1["dropped"] - k0["dropped"],
                              "bad": sum(x["bad"] for x in bd)},
                    "load_end": load1()})
        row["ratio"] = row["beamd"]["sps"] / row["raw"]["sps"] if row["raw"]["sps"] else 0
        return row

    # ---- input -------------------------------------------------------------------

    def shape(self, layout):
        if layout == "online":
            return "%dx%dx%dx%d" % (MODULES, SS, FS, self.pulses)
        return "%dx%dx%dx%d" % (self.pulses, MODULES, SS, FS)

    def in_server(self, kep, layout, trains):
        self.tid += 100000  # train ids only go up: beamd drops older ones as stale
        return self.spawn([self.ks, "--endpoint", kep, "--pattern", "rep", "--shape",
                           self.shape(layout), "--dtype", "uint16", "--trains", str(trains),
                           "--tid", str(self.tid), "--timeout", "30"])

    def in_raw(self, layout, trains):
        kep = ep()
        srv = self.in_server(kep, layout, trains)
        cli = None
        try:
            time.sleep(0.2)
            cli = self.spawn([self.kr, "--endpoint", kep, "--pattern", "req", "--messages",
                              str(trains + 1), "--timeout", "3"])
            r = self.result(srv, "karabo_send", 120)
        finally:
            bench_daemon.stop(cli)
            bench_daemon.stop(srv)
        return r

    def in_beamd(self, layout, trains, kep):
        srv = self.in_server(kep, layout, trains)
        c0 = cpu_s(self.daemon.pid)
        r = self.result(srv, "karabo_send", 120)
        r["beamd_cpu_s"] = cpu_s(self.daemon.pid) - c0
        return r

    def in_config(self, layout, kep, cep):
        fb = MODULES * SS * FS * 2
        return f"""# generated by bench/karabo.py
input: {{mode: karabo, endpoint: "{kep}", bind: false, hwm: 4,
        karabo: {{pattern: req, pulse_axis: {"last" if layout == "online" else "first"},
                  series_idle: 0, timeout: 10s}}}}
output: {{publish: "", push: "", drain_timeout: 1s}}
pool: {{frames: {max(64, 2 * self.pulses)}, frame_bytes: {fb}, prefault: true}}
control: {{endpoint: "{cep}"}}
metrics: {{listen: ""}}
log: {{level: warning}}
heartbeat: 1s
stages:
  - {{name: vd, kind: roi_sum, input: frames, backend: cpu, queue: {max(64, 2 * self.pulses)},
     rois: [{{name: c, shape: rect, rect: [32, 4000, 96, 4064]}}]}}
"""

    def input(self, layout):
        row = {"layout": layout, "shape": self.shape(layout), "pulses": self.pulses,
               "load_start": load1()}
        # The REP server binds: one endpoint for the daemon's life, a new
        # server per run (beamd's REQ reconnects).
        kep, cep = ep(), ep()
        raw, bd = [], []
        self.start_daemon(self.in_config(layout, kep, cep), cep, "karabo-in-" + layout)
        try:
            self.in_beamd(layout, 2, kep)  # warm-up: faults in the pool
            st0 = self.ctl(cep, "stats")
            for rep in range(self.reps):
                raw.append(self.in_raw(layout, self.trains))
                bd.append(self.in_beamd(layout, self.trains, kep))
                self.log("  input %-6s rep %d: raw %7.2f trains/s %6.3f GB/s | beamd %7.2f "
                         "trains/s %6.3f GB/s" % (layout, rep + 1, raw[-1]["tps"],
                                                  raw[-1]["gbps"], bd[-1]["tps"], bd[-1]["gbps"]))
            st = self.ctl(cep, "stats")
        finally:
            self.stop_daemon()
        k0, k1 = st0["input"]["karabo"], st["input"]["karabo"]
        want = self.reps * self.trains
        if k1["trains"] - k0["trains"] != want or \
                k1["pulses_in"] - k0["pulses_in"] != want * self.pulses:
            raise RuntimeError("beamd took %d trains, %d pulses of %d trains sent" %
                               (k1["trains"] - k0["trains"], k1["pulses_in"] - k0["pulses_in"],
                                want))
        med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
        gb = sum(x["trains"] * x["train_bytes"] for x in bd) / 1e9
        row.update({"train_bytes": raw[0]["train_bytes"],
                    "raw": {"tps": med(raw, "tps"), "gbps": med(raw, "gbps"), "runs": raw},
                    "beamd": {"tps": med(bd, "tps"), "gbps": med(bd, "gbps"), "runs": bd,
                              "cpu_s_per_gb": sum(x["beamd_cpu_s"] for x in bd) / gb if gb else None,
                              "fps": med(bd, "tps") * self.pulses},
                    "load_end": load1()})
        row["ratio"] = row["beamd"]["tps"] / row["raw"]["tps"] if row["raw"]["tps"] else 0
        return row


def run(build, seconds=2.0, reps=3, log=print, tmp=None, trains=12, pulses=32,
        outputs=("rep", "push"), layouts=("online", "file")):
    tmp = tempfile.mkdtemp(prefix="beamd-karabo-", dir=tmp)
    kb = Kb(build, tmp, log, seconds, reps, trains, pulses)
    res = {"seconds": seconds, "reps": reps, "trains": trains, "pulses": pulses,
           "output": [], "input": [], "errors": []}
    try:
        for p in outputs:
            try:
                res["output"].append(kb.output(p))
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
                res["errors"].append("output %s: %s" % (p, e))
                log("  ERROR: output %s: %s" % (p, e))
        for layout in layouts:
            try:
                res["input"].append(kb.input(layout))
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
                res["errors"].append("input %s: %s" % (layout, e))
                log("  ERROR: input %s: %s" % (layout, e))
    finally:
        kb.stop_daemon()
        shutil.rmtree(tmp, ignore_errors=True)
    if res["errors"] and not res["output"] and not res["input"]:
        raise RuntimeError("; ".join(res["errors"]))
    return res


def summary_lines(res):
    L = ["Karabo bridge: beamd vs raw ZeroMQ moving the same messages (C server karabo_send, "
         "C client karabo_recv; median of %d runs)" % res["reps"]]
    if res.get("output"):
        L.append("  output.karabo, %dx%d float32 results (correct stage), %g s runs:" %
                 (OUT_H, OUT_W, res["seconds"]))
        L.append("    %-5s %12s %8s %12s %8s %7s %11s %s" % ("", "raw res/s", "GB/s", "beamd res/s",
                                                          "GB/s", "ratio", "CPU s/GB", "load"))
        for r in res["output"]:
            b = r["beamd"]
            L.append("    %-5s %12.1f %8.3f %12.1f %8.3f %6.1f%% %11.2f %.2f->%.2f" %
                     (r["pattern"], r["raw"]["sps"], r["raw"]["gbps"], b["sps"], b["gbps"],
                      100 * r["ratio"], b["cpu_s_per_gb"] or 0, r["load_start"], r["load_end"]))
    if res.get("input"):
        L.append("  input.mode karabo (REQ), AGIPD-like uint16 trains of %d pulses, %d trains "
                 "per run:" % (res["pulses"], res["trains"]))
        L.append("    %-6s %-16s %10s %8s %10s %8s %9s %7s %11s %s" %
                 ("layout", "shape", "raw tr/s", "GB/s", "beamd tr/s", "GB/s", "frames/s",
                  "ratio", "CPU s/GB", "load"))
        for r in res["input"]:
            b = r["beamd"]
            L.append("    %-6s %-16s %10.2f %8.3f %10.2f %8.3f %9.0f %6.1f%% %11.2f %.2f->%.2f" %
                     (r["layout"], r["shape"], r["raw"]["tps"], r["raw"]["gbps"], b["tps"],
                      b["gbps"], b["fps"], 100 * r["ratio"], b["cpu_s_per_gb"] or 0,
                      r["load_start"], r["load_end"]))
    for e in res.get("errors", []):
        L.append("  ERROR: " + e)
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--seconds", type=float, default=2.0, help="output: length of each run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--trains", type=int, default=12, help="input: trains per run")
    ap.add_argument("--pulses", type=int, default=32, help="input: pulses per train")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = run(a.build, a.seconds, a.reps, trains=a.trains, pulses=a.pulses)
    print("\n".join(summary_lines(res)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
