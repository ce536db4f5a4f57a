#!/usr/bin/python3
"""beamd benchmark driver (bench/run.sh calls it; `make bench` calls run.sh).

Figures, not pass/fail: throughput of beamd against raw ZeroMQ on the same
messages, frame-in -> result-out latency while not saturated, the daemon's
resident memory, CPU kernel micro-benchmarks, HDF5 replay through beamd
against the raw chunk read rate (bench/replay.py, which needs h5py), and the
DECTRIS detector input against raw ZeroMQ (bench/dectris.py), CURVE
against plaintext on the same hops (bench/curve.py), and the Karabo bridge
output and input against raw ZeroMQ (bench/karabo.py).
Everything runs on loopback with ports and ipc paths of its own, every child
process has a timeout, and the whole run is bounded (about 4 minutes at the
defaults).

Prints a table per figure and a final summary, and writes every number to
--json (default $BEAMD_BUILD/bench-results.json). See bench/README.md.
"""
import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import bench_daemon

FRAME_SIZES = (512, 2048)
TRANSPORTS = ("tcp", "ipc")
TARGET_RATIO = 0.80
TARGET_P99_MS = 5.0
QUEUE_BYTES = 64 << 20  # ZeroMQ HWM per socket, in bytes of frames (see README)


def log(msg):
    print(msg, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Endpoints:
    """Fresh endpoints per use: no run can see another run's leftovers."""

    def __init__(self, transport, tmpdir):
        self.transport = transport
        self.tmpdir = tmpdir
        self.n = 0

    def new(self, tag):
        self.n += 1
        if self.transport == "tcp":
            return "tcp://127.0.0.1:%d" % free_port()
        return "ipc://%s/%s-%d.ipc" % (self.tmpdir, tag, self.n)


def machine_info():
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kb = int(line.split()[1])
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "loadavg_start": os.getloadavg()[0],
    }


def thread_cpu(pid):
    """{tid: (comm, ns on CPU)} for every thread of pid (schedstat: exact)."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for t in tids:
        try:
            with open("/proc/%d/task/%s/comm" % (pid, t)) as f:
                comm = f.read().strip()
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                out[int(t)] = (comm, int(f.read().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return out


def busy_cpu_s():
    """CPU seconds the whole machine has been busy (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


def self_cpu_s():
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime, b.ru_utime + b.ru_stime


class CpuMeter:
    """CPU per frame during one run: each beamd thread (by name: "beamd" is
    the loop thread, "st:NAME" a stage, "ZMQbg/IO/0" ZeroMQ's I/O thread),
    the sender and receiver together, and the CPU used meanwhile by
    processes that are not ours ("other load", in cores): another job on
    the machine changes every figure, so a run with other load is worth
    rerunning."""

    def __init__(self, pid=None):
        self.pid = pid
        self.t0 = thread_cpu(pid) if pid else {}
        self.s0, self.c0 = self_cpu_s()
        self.b0, self.w0 = busy_cpu_s(), time.monotonic()

    def done(self, frames):
        b1, w1 = busy_cpu_s(), time.monotonic()
        s1, c1 = self_cpu_s()
        t1 = thread_cpu(self.pid) if self.pid else {}
        n = max(frames, 1)
        per = {}
        mine = (s1 - self.s0) + (c1 - self.c0)
        for tid, (comm, ns) in t1.items():
            if tid in self.t0:
                d = (ns - self.t0[tid][1]) * 1e-9
                mine += d
                per[comm] = per.get(comm, 0.0) + d * 1e6 / n
        return {"us_per_frame": {k: round(v, 1) for k, v in per.items() if v >= 0.05},
                "send_recv_us_per_frame": round((c1 - self.c0) * 1e6 / n, 1),
                "other_load_cores": round(max(0.0, (b1 - self.b0) - mine) / (w1 - self.w0), 3)}


def proc_mem(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k = line.split(":", 1)[0]
            if k in ("VmRSS", "VmHWM", "VmSize"):
                out[k] = int(line.split()[1])  # kB
    return out


class Bench:
    def __init__(self, args):
        self.a = args
        self.build = args.build
        self.zt = os.path.join(self.build, "bench", "zthroughput")
        self.kernels = os.path.join(self.build, "bench", "kernels")
        self.beamd = os.path.join(self.build, "beamd")
        self.tmp = tempfile.mkdtemp(prefix="beamd-bench-")
        self.series = int(time.time()) % 100000 * 1000
        self.daemon = None
        self.daemon_log = None

    # ---- processes ---------------------------------------------------------

    def zrun(self, args, timeout):
        """Runs zthroughput to completion; returns its JSON line."""
        p = subprocess.run([self.zt] + args, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError("zthroughput %s failed (%d): %s%s" %
                               (args[0], p.returncode, p.stderr.strip(), p.stdout.strip()))
        return json.loads(p.stdout.strip().splitlines()[-1])

    def one_run(self, recv_ep, send_ep, shape, hwm, topic=None, rate=0, seconds=None,
                latency=False, bind_recv=False, skip=0):
        """Starts a receiver, then a sender; returns (send, recv) JSON."""
        self.series += 1
        sid = str(self.series)
        secs = self.a.seconds if seconds is None else seconds
        rargs = ["recv", "--endpoint", recv_ep, "--series", sid, "--hwm", str(hwm),
                 "--timeout", "20"]
        if bind_recv:
            rargs.append("--bind")
        if topic:
            rargs += ["--topic", topic]
        if latency:
            rargs += ["--latency", "--skip", str(skip)]
        t_start = time.monotonic()
        recv = subprocess.Popen([self.zt] + rargs, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.3)  # let the receiver connect before the first frame
            sargs = ["send", "--endpoint", send_ep, "--shape", "%dx%d" % (shape, shape),
                     "--seconds", str(secs), "--series", sid, "--hwm", str(hwm),
                     "--timeout", "20"]
            if rate:
                sargs += ["--rate", str(rate)]
            snd = self.zrun(sargs, timeout=secs + 60)
            out, err = recv.communicate(timeout=60)
        except BaseException:
            recv.kill()
            recv.wait()
            raise
        if recv.returncode != 0:
            raise RuntimeError("receiver failed (%d): %s %s" % (recv.returncode, err.strip(),
                                                                out.strip()))
        rcv = json.loads(out.strip().splitlines()[-1])
        rcv["wall_s"] = time.monotonic() - t_start  # receiver start to series end
        # Throughput over the whole run: first frame sent -> last result
        # received. Unlike the receiver's first-to-last rate it cannot be
        # flattered by frames buffered inside beamd arriving in a burst.
        span = (rcv["t_last_mono_ns"] - snd["t0_mono_ns"]) * 1e-9
        rcv["e2e_fps"] = rcv["counted"] / span if span > 0 else 0.0
        if rcv["counted"] != snd["frames"] - (skip if latency else 0):
            raise RuntimeError("receiver counted %d of %d frames (lossless path lost some)" %
                               (rcv["counted"], snd["frames"]))
        return snd, rcv

    def ctl(self, ep, cmd, timeout_s=3):
        return self.zrun(["ctl", "--endpoint", ep, "--timeout", str(timeout_s), cmd],
                         timeout=timeout_s + 10)

    def start_daemon(self, cfg_text, ctl_ep, name):
        self.daemon, self.daemon_log = bench_daemon.launch(
            self.beamd, self.tmp, cfg_text, name,
            lambda: self.ctl(ctl_ep, "ping", 0.5).get("ok"), 10)
        return self.daemon.pid

    def stop_daemon(self):
        if not self.daemon:
            return
        bench_daemon.stop(self.daemon, 15)
        self.daemon = None
        self.daemon_log.close()

    # ---- configs -----------------------------------------------------------

    def config(self, in_ep, out_ep, ctl_ep, shape, hwm, pool_frames, frame_bytes, thread=None):
        q = shape // 8
        thread = thread or self.a.vd_thread
        return f"""# generated by bench/run.py
input: {{mode: pull, endpoint: "{in_ep}", bind: true, hwm: {hwm}}}
output: {{publish: "", push: "{out_ep}", push_hwm: {hwm}}}
pool: {{frames: {pool_frames}, frame_bytes: {frame_bytes}}}
control: {{endpoint: "{ctl_ep}"}}
metrics: {{listen: ""}}
log: {{level: warning}}
heartbeat: 1s
stages:
  - {{name: corr, kind: correct, input: frames, backend: cpu, publish: false,
      threshold: 0.5, saturation: 60000}}
  - name: vd
    kind: roi_sum
    input: corr
    backend: cpu
    thread: {thread}
    rois:
      - {{name: bf, shape: disk, radius: {q}}}
      - {{name: adf, shape: annulus, radii: [{q}, {2 * q}]}}
      - {{name: haadf, shape: annulus, radii: [{2 * q}, {4 * q}]}}
"""

    @staticmethod
    def hwm_for(shape):
        return max(4, QUEUE_BYTES // (shape * shape * 2))

    # ---- figures -----------------------------------------------------------

    def throughput(self):
        rows = []
        for tr in self.a.transports:
            for shape in self.a.sizes:
                eps = Endpoints(tr, self.tmp)
                hwm = self.hwm_for(shape)
                fbytes = shape * shape * 2
                in_ep, out_ep = eps.new("in"), eps.new("out")
                ctl_ep = "tcp://127.0.0.1:%d" % free_port()
                cfg = self.config(in_ep, out_ep, ctl_ep, shape, hwm, 64, fbytes)
                self.start_daemon(cfg, ctl_ep, "tput-%s-%d" % (tr, shape))
                raw, bd = [], []
                try:
                    # Warm-up, not counted: the first series after start-up
                    # faults in the pool and output slots and builds tables.
                    ep = eps.new("raw")
                    self.one_run(ep, ep, shape, hwm, bind_recv=True, seconds=1)
                    self.one_run(out_ep, in_ep, shape, hwm, topic="vd.sums", seconds=1)
                    for rep in range(self.a.reps):
                        # Raw: the same sender and receiver, nothing in between.
                        ep = eps.new("raw")
                        meter = CpuMeter()
                        s, r = self.one_run(ep, ep, shape, hwm, bind_recv=True)
                        raw.append({"send": s, "recv": r, "cpu": meter.done(r["counted"])})
                        meter = CpuMeter(self.daemon.pid)
                        s, r = self.one_run(out_ep, in_ep, shape, hwm, topic="vd.sums")
                        bd.append({"send": s, "recv": r, "cpu": meter.done(r["counted"])})
                        other = max(raw[-1]["cpu"]["other_load_cores"],
                                    bd[-1]["cpu"]["other_load_cores"])
                        log("  %s %4dx%-4d rep %d: raw %8.1f frames/s   beamd %8.1f frames/s%s" %
                            (tr, shape, shape, rep + 1, raw[-1]["recv"]["e2e_fps"],
                             bd[-1]["recv"]["e2e_fps"],
                             "   (other load %.2f cores)" % other if other >= 0.1 else ""))
                    stats = self.ctl(ctl_ep, "stats")
                finally:
                    self.stop_daemon()
                own = None
                if self.a.vd_thread == "auto":
                    own = self.own_thread_runs(eps, shape, hwm, fbytes, tr)
                raw_fps = statistics.median(x["recv"]["e2e_fps"] for x in raw)
                bd_fps = statistics.median(x["recv"]["e2e_fps"] for x in bd)
                # Stages also work while the pipeline fills and drains, so
                # their busy time is set against the whole beamd runs.
                busy_window = sum(x["recv"]["wall_s"] for x in bd)
                stages = [{"name": st["name"], "busy_s": st.get("busy_s"),
                           "busy_frac_of_beamd_runs": (st.get("busy_s", 0) / busy_window
                                                       if busy_window else None),
                           "latency": st.get("latency")}
                          for st in stats.get("stages", [])]
                cpu = {}
                for run in bd:
                    for k, v in run["cpu"]["us_per_frame"].items():
                        cpu.setdefault(k, []).append(v)
                cpu = {k: statistics.median(v) for k, v in cpu.items()}
                runs_on = {st["name"]: st.get("runs_on") for st in stats.get("stages", [])}
                fused = {st["name"]: st.get("fused", 0) for st in stats.get("stages", [])}
                cpu["send+recv"] = statistics.median(x["cpu"]["send_recv_us_per_frame"]
                                                     for x in bd)
                if own:
                    own["ratio"] = own["fps"] / raw_fps if raw_fps else 0
                rows.append({
                    "vd_thread_own": own, "vd_runs_on": runs_on.get("vd"),
                    "corr_fused_frames": fused.get("corr", 0),
                    "beamd_cpu_us_per_frame": cpu,
                    "raw_cpu_us_per_frame": statistics.median(x["cpu"]["send_recv_us_per_frame"]
                                                              for x in raw),
                    "other_load_cores_max": max(x["cpu"]["other_load_cores"] for x in raw + bd),
                    "transport": tr, "shape": [shape, shape], "dtype": "uint16",
                    "frame_bytes": fbytes, "hwm": hwm,
                    "raw_fps": raw_fps, "raw_gbps": raw_fps * fbytes / 1e9,
                    "beamd_fps": bd_fps, "beamd_gbps": bd_fps * fbytes / 1e9,
                    "ratio": bd_fps / raw_fps if raw_fps else 0,
                    "raw_runs": raw, "beamd_runs": bd, "beamd_stages": stages,
                    "beamd_input": {k: stats.get("input", {}).get(k)
                                    for k in ("frames", "lost", "dropped_busy", "paused_s")},
                })
        return rows

    def own_thread_runs(self, eps, shape, hwm, fbytes, tr):
        """The yardstick for `thread: auto`: the same reps with roi_sum on a
        thread of its own, as before auto could run it on correct's."""
        in_ep, out_ep = eps.new("in"), eps.new("out")
        ctl_ep = "tcp://127.0.0.1:%d" % free_port()
        cfg = self.config(in_ep, out_ep, ctl_ep, shape, hwm, 64, fbytes, thread="own")
        self.start_daemon(cfg, ctl_ep, "tput-own-%s-%d" % (tr, shape))
        runs = []
        try:
            self.one_run(out_ep, in_ep, shape, hwm, topic="vd.sums", seconds=1)
            for rep in range(self.a.reps):
                meter = CpuMeter(self.daemon.pid)
                s, r = self.one_run(out_ep, in_ep, shape, hwm, topic="vd.sums")
                runs.append({"fps": r["e2e_fps"], "cpu": meter.done(r["counted"])})
                log("  %s %4dx%-4d rep %d: beamd, roi_sum on its own thread %8.1f frames/s" %
                    (tr, shape, shape, rep + 1, runs[-1]["fps"]))
        finally:
            self.stop_daemon()
        stage_us = [sum(v for k, v in x["cpu"]["us_per_frame"].items() if k.startswith("st:"))
                    for x in runs]
        return {"fps": statistics.median(x["fps"] for x in runs),
                "stage_cpu_us_per_frame": statistics.median(stage_us), "runs": runs}

    def latency_memory(self):
        """One daemon with the 512-frame pool: idle memory, paced latency
        runs (beamd's own histograms then cover exactly those frames), a
        saturating run, memory again."""
        shape = 512
        eps = Endpoints("tcp", self.tmp)
        in_ep, out_ep = eps.new("in"), eps.new("out")
        ctl_ep = "tcp://127.0.0.1:%d" % free_port()
        hwm = self.hwm_for(shape)
        cfg = self.config(in_ep, out_ep, ctl_ep, shape, hwm, 512, "512Ki")
        pid = self.start_daemon(cfg, ctl_ep, "latency-memory")
        lat = []
        try:
            time.sleep(1.0)
            mem_idle = proc_mem(pid)
            for rate in self.a.rates:
                # The same paced stream straight from sender to receiver: the
                # transport's and the machine's own latency and jitter.
                ep = eps.new("raw")
                _, rr = self.one_run(ep, ep, shape, hwm, rate=rate, latency=True,
                                     skip=self.a.skip, bind_recv=True)
                s, r = self.one_run(out_ep, in_ep, shape, hwm, topic="vd.sums", rate=rate,
                                    latency=True, skip=self.a.skip)
                lat.append({"rate_requested": rate, "rate_achieved": r["fps"],
                            "frames": s["frames"], **r["latency"], "raw": rr["latency"]})
                log("  latency @%5d frames/s: achieved %7.1f, p50 %.3f ms, p99 %.3f ms "
                    "(raw ZeroMQ p50 %.3f ms, p99 %.3f ms)" %
                    (rate, r["fps"], r["latency"]["p50_us"] / 1e3,
                     r["latency"]["p99_us"] / 1e3, rr["latency"]["p50_us"] / 1e3,
                     rr["latency"]["p99_us"] / 1e3))
            stats_paced = self.ctl(ctl_ep, "stats")
            mem_paced = proc_mem(pid)
            s, r = self.one_run(out_ep, in_ep, shape, hwm, topic="vd.sums")
            log("  saturating run: %.1f frames/s" % r["fps"])
            mem_after = proc_mem(pid)
        finally:
            self.stop_daemon()
        beamd_lat = {"e2e": stats_paced.get("latency"),
                     "stages": {st["name"]: st.get("latency")
                                for st in stats_paced.get("stages", [])}}
        memory = {"pool_frames": 512, "pool_frame_bytes": 512 * 1024,
                  "pool_bytes": 512 * 512 * 1024,
                  "idle_kb": mem_idle, "after_paced_kb": mem_paced,
                  "after_saturated_kb": mem_after, "saturated_fps": r["fps"]}
        return lat, beamd_lat, memory

    def replay_bench(self):
        # Imported here: replay.py needs h5py, numpy and pyzmq (Debian's
        # python3 has them); without them only this figure is lost.
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        try:
            import replay
        except ImportError as e:
            raise RuntimeError("bench/replay.py cannot run: %s" % e)
        return replay.run_replay(self.build, self.a.reps, self.a.replay_pass_mib, log,
                                 tmp=self.tmp)

    def kernel_bench(self):
        path = os.path.join(self.tmp, "kernels.json")
        p = subprocess.run([self.kernels, "--runs", str(self.a.kernel_runs), "--json", path],
                           capture_output=True, text=True, timeout=600)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            raise RuntimeError("kernels failed: " + p.stderr.strip())
        with open(path) as f:
            return json.load(f)

    def ptycho_bench(self):
        # bench/ptycho.c: DM iteration of the CPU engine beside its FFTs alone
        path = os.path.join(self.tmp, "ptycho.json")
        exe = os.path.join(self.build, "bench", "ptycho")
        p = subprocess.run([exe, "--threads", "2", "--json", path], capture_output=True,
                           text=True, timeout=600)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            raise RuntimeError("ptycho failed: " + p.stderr.strip())
        with open(path) as f:
            return json.load(f)

    def ptycho_gpu_bench(self):
        # bench/ptycho_gpu.c: the CUDA DM engine at the seed scale (10000
        # views, 50 iterations); prints "skipped: ..." and exits 0 without a GPU
        path = os.path.join(self.tmp, "ptycho_gpu.json")
        exe = os.path.join(self.build, "bench", "ptycho_gpu")
        p = subprocess.run([exe, "--json", path], capture_output=True, text=True, timeout=1200)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            raise RuntimeError("ptycho_gpu failed: " + p.stderr.strip())
        if p.stdout.startswith("skipped"):
            return {"skipped": p.stdout.strip()}
        with open(path) as f:
            return json.load(f)


def summary(res):
    m = res["machine"]
    L = []
    L.append("=" * 78)
    L.append("beamd benchmark summary   %s   %d CPUs   %.1f GiB   load %.2f -> %.2f" %
             (m["cpu_model"], m["nproc"], m["mem_gib"], m["loadavg_start"],
              m.get("loadavg_end", 0)))
    L.append("=" * 78)
    if "throughput" in res:
        L.append("Throughput, uint16 frames, lossless PUSH->PULL, correct+roi_sum in beamd "
                 "(median of %d x %gs)" % (res["params"]["reps"], res["params"]["seconds"]))
        L.append("  %-4s %-10s %10s %8s %10s %8s %8s  %s" %
                 ("tr", "frame", "raw f/s", "raw GB/s", "beamd f/s", "GB/s", "ratio",
                  "target >= 80%"))
        for r in res["throughput"]:
            L.append("  %-4s %-10s %10.1f %8.3f %10.1f %8.3f %7.1f%%  %s" %
                     (r["transport"], "%dx%d" % tuple(r["shape"]), r["raw_fps"], r["raw_gbps"],
                      r["beamd_fps"], r["beamd_gbps"], 100 * r["ratio"],
                      "ok" if r["ratio"] >= TARGET_RATIO else "BELOW"))
            busy = ", ".join("%s %.0f%%" % (s["name"], 100 * (s["busy_frac_of_beamd_runs"] or 0))
                             for s in r["beamd_stages"])
            L.append("  %-15s stage busy (share of beamd run time): %s" % ("", busy))
            if r.get("beamd_cpu_us_per_frame"):
                c = r["beamd_cpu_us_per_frame"]
                L.append("  %-15s CPU us/frame: %s; raw send+recv %.0f%s" % (
                    "", ", ".join("%s %.0f" % (k, c[k]) for k in sorted(c, key=lambda k: -c[k])
                                  if c[k] >= 0.5),
                    r["raw_cpu_us_per_frame"],
                    "; other load up to %.2f cores: rerun" % r["other_load_cores_max"]
                    if r["other_load_cores_max"] >= 0.1 else ""))
            own = r.get("vd_thread_own")
            if own:
                c = r.get("beamd_cpu_us_per_frame") or {}
                L.append("  %-15s thread auto ran roi_sum on %s; on its own thread: %.1f f/s,"
                         " %.1f%% of raw, stage CPU us/frame %.0f (auto: %.0f)" % (
                             "", ("correct's thread, fused (%d frames)" % r["corr_fused_frames"]
                                  if r.get("corr_fused_frames") else "correct's thread")
                             if r.get("vd_runs_on") else "its own",
                             own["fps"], 100 * own["ratio"], own["stage_cpu_us_per_frame"],
                             sum(v for k, v in c.items() if k.startswith("st:"))))
    if "latency" in res:
        L.append("Latency frame-in -> result-out, 512x512 uint16, tcp, paced "
                 "(sender t_acq_ns -> receiver, realtime clock)")
        L.append("  %8s %9s %8s %9s %9s %9s %9s  %s" %
                 ("req f/s", "got f/s", "frames", "p50 ms", "p90 ms", "p99 ms", "max ms",
                  "target p99 < 5 ms"))
        for r in res["latency"]:
            L.append("  %8d %9.1f %8d %9.3f %9.3f %9.3f %9.3f  %s" %
                     (r["rate_requested"], r["rate_achieved"], r["count"], r["p50_us"] / 1e3,
                      r["p90_us"] / 1e3, r["p99_us"] / 1e3, r["max_us"] / 1e3,
                      "ok" if r["p99_us"] / 1e3 < TARGET_P99_MS else "ABOVE"))
            w = r["raw"]
            L.append("  %8s %9s %8d %9.3f %9.3f %9.3f %9.3f  (raw ZeroMQ, no beamd)" %
                     ("", "", w["count"], w["p50_us"] / 1e3, w["p90_us"] / 1e3,
                      w["p99_us"] / 1e3, w["max_us"] / 1e3))
        bl = res["beamd_latency"]
        e = bl.get("e2e") or {}
        L.append("  beamd stats (all paced frames): e2e recv->sent p50 %.3f ms p90 %.3f ms "
                 "p99 %.3f ms (%s results)" %
                 (e.get("p50_us", 0) / 1e3, e.get("p90_us", 0) / 1e3, e.get("p99_us", 0) / 1e3,
                  e.get("count", "?")))
        for name, st in bl.get("stages", {}).items():
            st = st or {}
            L.append("    stage %-6s process time p50 %.3f ms p90 %.3f ms p99 %.3f ms" %
                     (name, st.get("p50_us", 0) / 1e3, st.get("p90_us", 0) / 1e3,
                      st.get("p99_us", 0) / 1e3))
    if "memory" in res:
        mm = res["memory"]
        L.append("Daemon memory, pool 512 x 512 KiB (%d MiB of slots), correct+roi_sum" %
                 (mm["pool_bytes"] >> 20))
        for k, label in (("idle_kb", "idle"), ("after_paced_kb", "after paced runs"),
                         ("after_saturated_kb", "after saturated run")):
            v = mm[k]
            L.append("  %-20s VmRSS %8.1f MiB   VmHWM %8.1f MiB   VmSize %8.1f MiB" %
                     (label, v["VmRSS"] / 1024, v["VmHWM"] / 1024, v["VmSize"] / 1024))
    if "kernels" in res:
        L.append("CPU kernels, one thread, cold frames (median of %d runs)" %
                 res["kernels"]["runs"])
        L.append("  %-13s %-10s %12s %8s %10s" % ("kernel", "frame", "ns/frame", "GB/s",
                                                 "frames/s"))
        for k in res["kernels"]["results"]:
            L.append("  %-13s %-10s %12.0f %8.2f %10.0f" %
                     (k["kernel"], "%dx%d" % (k["h"], k["w"]), k["ns_per_frame"], k["gbps"],
                      k["fps"]))
    if res.get("replay"):
        from replay import summary_lines
        L.extend(summary_lines(res["replay"], res["params"]["reps"]))
    if res.get("xpcs"):
        import xpcs
        L.extend(xpcs.summary_lines(res["xpcs"]))
    if res.get("dectris"):
        import dectris
        L.extend(dectris.summary_lines(res["dectris"]))
    if res.get("curve"):
        import curve
        L.extend(curve.summary_lines(res["curve"]))
    if res.get("karabo"):
        import karabo
        L.extend(karabo.summary_lines(res["karabo"]))
    if res.get("ptycho"):
        L.append("DM ptychography, CPU engine, %d threads (median of %d iterations)" %
                 (res["ptycho"]["threads"], res["ptycho"]["iters"]))
        for r in res["ptycho"]["results"]:
            L.append("  %5d views %dx%d %d mode(s) %s: %.3f s/iteration, FFTs alone %.3f s, "
                     "ratio %.2f" % (r["views"], r["n"], r["n"], r["modes"], r["prec"],
                                     r["s_per_iter"], r["fft_only_s"], r["ratio"]))
    if res.get("ptycho_gpu"):
        g = res["ptycho_gpu"]
        if "skipped" in g:
            L.append("DM ptychography, CUDA engine: " + g["skipped"])
        else:
            L.append("DM ptychography, CUDA engine on %s" % g["device"])
            for r in g["cases"]:
                L.append("  %5d views %dx%d %d mode(s) %s: %.4f s/iteration (%d: %.2f s), FFTs "
                         "alone %.4f s, device %.0f MiB" %
                         (r["views"], r["n"], r["n"], r["modes"], r["prec"], r["s_per_iter"],
                          r["iters"], r["total_s"], r["fft_s_per_iter"], r["dev_mib"]))
    for e in res.get("errors", []):
        L.append("ERROR: " + e)
    L.append("JSON: " + res["json_path"])
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--json", help="output file (default BUILD/bench-results.json)")
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", 3)),
                    help="length of each throughput and latency run (default 3)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS),
                    help="throughput cases: transports (default tcp ipc)")
    ap.add_argument("--sizes", nargs="+", type=int, default=list(FRAME_SIZES),
                    help="throughput cases: frame sizes, square uint16 (default 512 2048)")
    ap.add_argument("--vd-thread", choices=["auto", "own", "upstream"], default="auto",
                    help="thread key of the roi_sum stage in the throughput config (default auto)")
    ap.add_argument("--rates", type=int, nargs="+", default=[200, 1000],
                    help="paced rates for the latency figure (frames/s)")
    ap.add_argument("--skip", type=int, default=10,
                    help="latency: results not counted at the start of a run (warm-up)")
    ap.add_argument("--kernel-runs", type=int, default=7)
    ap.add_argument("--replay-pass-mib", type=int, default=512,
                    help="replay: decoded frame bytes per pass, MiB (default 512)")
    ap.add_argument("--dectris-seconds", type=float, default=1.0,
                    help="dectris: length of each run (default 1; --reps runs of each case)")
    ap.add_argument("--curve-seconds", type=float, default=1.5,
                    help="curve: length of each raw and pub run (default 1.5)")
    ap.add_argument("--karabo-seconds", type=float, default=2.0,
                    help="karabo: length of each output run (default 2; --reps runs of each case)")
    ap.add_argument("--only", choices=["throughput", "latency", "kernels", "replay", "xpcs", "view",
                                        "ptycho", "ptycho_gpu", "dectris", "curve",
                                        "karabo", "fit", "azint"],
                    action="append",
                    help="run only these figures (repeatable; latency includes memory)")
    a = ap.parse_args()
    only = set(a.only or ["throughput", "latency", "kernels", "replay", "xpcs", "view",
                          "ptycho", "ptycho_gpu", "dectris", "curve", "karabo", "fit", "azint"])
    a.json = a.json or os.path.join(a.build, "bench-results.json")

    b = Bench(a)
    for exe in (b.zt, b.kernels, b.beamd):
        if not os.access(exe, os.X_OK):
            sys.exit("bench: %s is missing; run `make BUILD=%s` first" % (exe, a.build))
    res = {"machine": machine_info(),
           "params": {"seconds": a.seconds, "reps": a.reps, "rates": a.rates, "skip": a.skip,
                      "replay_pass_mib": a.replay_pass_mib, "dectris_seconds": a.dectris_seconds,
                      "curve_seconds": a.curve_seconds,
                      "karabo_seconds": a.karabo_seconds,
                      "queue_bytes_per_socket": QUEUE_BYTES},
           "errors": [], "json_path": a.json}
    m = res["machine"]
    log("beamd benchmarks: %s, %d CPUs, load %.2f, build %s" %
        (m["cpu_model"], m["nproc"], m["loadavg_start"], a.build))
    t0 = time.time()
    steps = [("kernels", "CPU kernels", lambda: res.__setitem__("kernels", b.kernel_bench())),
             ("throughput", "throughput (raw ZeroMQ vs beamd)",
              lambda: res.__setitem__("throughput", b.throughput())),
             ("latency", "latency and memory", None),
             ("replay", "HDF5 replay (beamd-replay -> beamd -> beamd-record vs H5Dread_chunk)",
              lambda: res.__setitem__("replay", b.replay_bench())),
             ("xpcs", "XPCS multi-tau (bench/xpcs.py: stage kernel, daemon end to end)",
              lambda: res.__setitem__("xpcs", __import__("xpcs").run(a.build))),
             ("fit", "batched fitter (bench/fit.py: damped cosine, g2, XANI-shaped; beamd on one "
              "core beside SciPy least_squares on the same data)",
              lambda: res.__setitem__("fit", __import__("fit").run(a.build, log=log))),
             ("azint", "azimuthal integration (bench/azint.py: 4.5 Mpx uint16 to 1000 bins, "
              "beamd's CPU stage beside pyFAI's CSR integrator, threads 1 and 2)",
              lambda: res.__setitem__("azint", __import__("azint").run(a.build, log=log))),
             ("dectris", "DECTRIS detector input (bench/dectris.py: EIGER 4M stream v1 and "
              "EIGER2 16M stream v2, bslz4, raw ZeroMQ vs beamd record pass-through and roi_sum; "
              "decoder and parse cost)",
              lambda: res.__setitem__("dectris", __import__("dectris").run(
                  a.build, a.dectris_seconds, a.reps, log, tmp=b.tmp))),
             ("curve", "CURVE vs plaintext (bench/curve.py: raw ZeroMQ tcp stream, beamd result "
              "PUB, beamd-replay -> beamd replay input)",
              lambda: res.__setitem__("curve", __import__("curve").run(
                  a.build, a.curve_seconds, a.reps, log, tmp=b.tmp))),
             ("karabo", "Karabo bridge (bench/karabo.py: output.karabo rep/push and input.mode "
              "karabo AGIPD-like trains, beside raw ZeroMQ moving the same messages)",
              lambda: res.__setitem__("karabo", __import__("karabo").run(
                  a.build, a.karabo_seconds, a.reps, log, tmp=b.tmp))),
             ("view", "live viewer (bench/view.py: viewer CPU, published -> drawn latency, "
              "daemon throughput with and without a viewer)",
              lambda: res.__setitem__("view", __import__("view").run(a.build))),
             ("ptycho", "DM ptychography engine (bench/ptycho.c: s/iteration vs FFTs alone)",
              lambda: res.__setitem__("ptycho", b.ptycho_bench())),
             ("ptycho_gpu", "DM ptychography, CUDA engine (bench/ptycho_gpu.c: 10000 views, "
              "50 iterations, vs FFTs alone)",
              lambda: res.__setitem__("ptycho_gpu", b.ptycho_gpu_bench()))]
    try:
        for key, title, fn in steps:
            if key not in only:
                continue
            log("-- %s" % title)
            try:
                if key == "latency":
                    lat, bl, mem = b.latency_memory()
                    res["latency"], res["beamd_latency"], res["memory"] = lat, bl, mem
                else:
                    fn()
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
                res["errors"].append("%s: %s" % (title, e))
                log("  ERROR: %s" % e)
    finally:
        b.stop_daemon()
    # A figure that ran with some of its cases failed keeps its errors.
    res["errors"].extend("dectris: " + e for e in (res.get("dectris") or {}).get("errors", []))
    res["errors"].extend("curve: " + e for e in (res.get("curve") or {}).get("errors", []))
    res["errors"].extend("karabo: " + e for e in (res.get("karabo") or {}).get("errors", []))
    m["loadavg_end"] = os.getloadavg()[0]
    res["wall_s"] = time.time() - t0
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    log(summary(res))
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
