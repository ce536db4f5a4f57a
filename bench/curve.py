#!/usr/bin/python3
"""CURVE against plaintext, side by side in one run (bench/README.md, "CURVE").

Every hop here is one tcp stream on 127.0.0.1, once in plaintext and once
with CURVE (keys made by beamd-keygen, the server's allow-list enforced by
beamd's ZAP handler, daemon/curve.h), alternating where the set-up allows:

- raw: `zthroughput send` (PUSH, connects) -> `zthroughput recv` (PULL,
  binds; the CURVE server) for 16 KiB, 512 KiB and 8 MiB messages: the
  yardstick, what one encrypted ZeroMQ stream carries on this machine;
- pub: `zthroughput send` -> beamd (input.mode pull, plaintext) -> one
  `correct` stage publishing its float32 frames (1 MiB results at 512x512)
  on output.publish, plaintext or `{address, curve: true}` -> `zthroughput
  recv --sub` (CURVE client): results delivered per second unpaced (the
  PUB is lossy, so what the subscriber misses is dropped, counted), and
  paced at a viewer's rate, where the figure is beamd's CPU per result;
- replay: beamd-replay (REP, binds; `--curve-secret --curve-allow` with
  beamd's public key) -> beamd (input.mode replay, `endpoint: {address,
  curve: true, server_key}`, payloads inline: shm off) -> roi_sum over a
  16x16 corner -> output.push -> `zthroughput recv --passes` (PULL). The
  file is served pass after pass (--loop); a pass's time is the gap between
  its SERIES_END and the previous one's at the consumer, pass 0 not
  counted.

frames/s are medians; GB/s are of the bytes that crossed the measured hop
(10^9 bytes): frame bytes for raw and replay, result bytes for pub. The
ratio is CURVE / plaintext of the same run. Never compare absolute figures
across machines.

    /usr/bin/python3 bench/curve.py [--build build] [--seconds 1.5] [--reps 3]
        [--part raw --part pub --part replay] [--json FILE]
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import bench_daemon

RAW_SIZES = ((64, 128), (512, 512), (2048, 2048))  # uint16: 16 KiB, 512 KiB, 8 MiB
QUEUE_BYTES = 64 << 20     # ZeroMQ HWM per socket in bytes of messages, as figure 1
PUB_SIDE = 512             # pub: 512x512 uint16 in, 1 MiB float32 results out
PUB_RATE = 100             # pub: a viewer's rate, results/s
REPLAY_SIDES = (512, 2048)
REPLAY_FILE_MIB = 256      # replay: bytes of frames per file (one pass)
REPLAY_POOL_MIB = 256      # replay: at most this many bytes of pool slots
REPLAY_MIN_PASSES = 5      # counted passes per replay case, at least
PARTS = ("raw", "pub", "replay")
MODES = ("plain", "curve")


def log(msg):
    print(msg, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp():
    return "tcp://127.0.0.1:%d" % free_port()


def load1():
    return os.getloadavg()[0]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def crypto_backend(exe):
    """(libzmq version, CURVE library) of the libzmq exe is linked with:
    libzmq does CURVE with libsodium when built with it, else with its
    bundled tweetnacl, several times slower."""
    try:
        out = subprocess.run(["ldd", exe], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?", "?"
    zpath = next((ln.split("=>")[1].split()[0] for ln in out.splitlines()
                  if "libzmq" in ln and "=>" in ln), None)
    ver = "?"
    if zpath:
        try:
            lib = ctypes.CDLL(zpath)
            a, b, c = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
            lib.zmq_version(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
            ver = "%d.%d.%d" % (a.value, b.value, c.value)
            if zpath and "libsodium" not in out:
                zo = subprocess.run(["ldd", zpath], capture_output=True, text=True,
                                    timeout=10).stdout
                out += zo
        except (OSError, subprocess.TimeoutExpired):
            pass
    sodium = next((ln.split("=>")[1].split()[0] for ln in out.splitlines()
                   if "libsodium" in ln and "=>" in ln), None)
    return ver, ("libsodium (%s)" % os.path.basename(os.path.realpath(sodium)) if sodium
                 else "tweetnacl (built into libzmq)")


def threads_cpu(pid):
    """{thread name: CPU seconds} of pid, threads of one name summed
    (schedstat: exact); {} once it is gone."""
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
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[comm] = out.get(comm, 0.0) + ns * 1e-9
    return out


def children_cpu_s():
    r = os.times()
    return r.children_user + r.children_system


def busy_cpu_s():
    """CPU seconds the whole machine has been busy (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Cores used during a run by processes that are not the benchmark's:
    the machine's busy time less this process, its reaped children and the
    CPU of the long-lived processes the caller adds (daemons). Another job
    changes every figure here; a run that shows one is worth rerunning."""

    def __init__(self):
        t = os.times()
        self.b0, self.w0, self.m0 = busy_cpu_s(), time.monotonic(), t.user + t.system
        self.c0 = children_cpu_s()

    def cores(self, extra_s=0.0):
        t = os.times()
        mine = (t.user + t.system - self.m0) + (children_cpu_s() - self.c0) + extra_s
        return round(max(0.0, busy_cpu_s() - self.b0 - mine) / (time.monotonic() - self.w0), 3)


def us_per(d0, d1, n, prefix=""):
    n = max(n, 1)
    return {prefix + k: round((v - d0.get(k, 0.0)) * 1e6 / n, 1) for k, v in d1.items()
            if (v - d0.get(k, 0.0)) * 1e6 / n >= 0.05}


class Curve:
    def __init__(self, build, tmp, seconds, reps, logf):
        self.build, self.tmp, self.seconds, self.reps, self.log = build, tmp, seconds, reps, logf
        self.zt = os.path.join(build, "bench", "zthroughput")
        self.beamd = os.path.join(build, "beamd")
        self.series = int(time.time()) % 100000 * 1000 + 700
        self.daemons = []
        self.keys = os.path.join(tmp, "keys")

    # ---- keys ---------------------------------------------------------------

    def make_keys(self):
        """Key pairs for every role and the allow-lists of each server."""
        os.makedirs(self.keys)
        for name in ("beamd", "replay", "viewer", "sender", "receiver"):
            p = subprocess.run([os.path.join(self.build, "beamd-keygen"), "--dir", self.keys,
                                name], capture_output=True, text=True, timeout=10)
            if p.returncode != 0:
                raise RuntimeError("beamd-keygen %s: %s" % (name, p.stderr.strip()))
        for allow, who in (("allow-receiver", "sender"), ("allow-beamd", "viewer"),
                           ("allow-replay", "beamd")):
            os.makedirs(os.path.join(self.tmp, allow))
            shutil.copy(self.pubkey(who), os.path.join(self.tmp, allow, who))

    def pubkey(self, name):
        return os.path.join(self.keys, name)

    def sec(self, name):
        return os.path.join(self.keys, name + "_secret")

    def allow(self, server):
        return os.path.join(self.tmp, "allow-" + server)

    def client_opts(self, me, server):
        return ["--curve-secret", self.sec(me), "--curve-server", self.pubkey(server)]

    def server_opts(self, me):
        return ["--curve-secret", self.sec(me), "--curve-allow", self.allow(me)]

    # ---- processes ----------------------------------------------------------

    def pair(self, recv_args, send_args, seconds, rate=0, lossy=False):
        """Starts `zthroughput recv`, then `send`; returns (send, recv) JSON,
        recv with e2e_fps: counted / (sender's first frame -> last counted
        message), which a burst at the end cannot flatter."""
        self.series += 1
        sid = str(self.series)
        recv = subprocess.Popen([self.zt, "recv", "--series", sid] + recv_args,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.3)  # the receiver connected and, with CURVE, through its handshake
            sargs = [self.zt, "send", "--series", sid, "--seconds", str(seconds),
                     "--timeout", "20"] + send_args + (["--rate", str(rate)] if rate else [])
            p = subprocess.run(sargs, capture_output=True, text=True, timeout=seconds + 60)
            if p.returncode != 0:
                raise RuntimeError("zthroughput send failed (%d): %s" %
                                   (p.returncode, p.stderr.strip()))
            snd = json.loads(p.stdout.strip().splitlines()[-1])
            out, err = recv.communicate(timeout=60)
        except BaseException:
            recv.kill()
            recv.wait()
            raise
        # A lossy PUB may drop the SERIES_END too: recv then times out (3)
        # and its counts still stand.
        if recv.returncode != 0 and not (lossy and recv.returncode == 3 and out.strip()):
            raise RuntimeError("zthroughput recv failed (%d): %s %s" %
                               (recv.returncode, err.strip(), out.strip()))
        rcv = json.loads(out.strip().splitlines()[-1])
        span = (rcv["t_last_mono_ns"] - snd["t0_mono_ns"]) * 1e-9
        rcv["e2e_fps"] = rcv["counted"] / span if span > 0 and rcv["counted"] else 0.0
        if not lossy and rcv["counted"] != snd["frames"]:
            raise RuntimeError("receiver counted %d of %d frames on a lossless path" %
                               (rcv["counted"], snd["frames"]))
        return snd, rcv

    def ctl(self, ep, cmd, timeout_s=3):
        p = subprocess.run([self.zt, "ctl", "--endpoint", ep, "--timeout", str(timeout_s), cmd],
                           capture_output=True, text=True, timeout=timeout_s + 10)
        if p.returncode != 0:
            raise RuntimeError("ctl %s: %s" % (cmd, p.stderr.strip()))
        return json.loads(p.stdout.strip().splitlines()[-1])

    def start_daemon(self, cfg, ctl_ep, name, wait_s=30):
        p, lg = bench_daemon.launch(self.beamd, self.tmp, cfg, name,
                                    lambda: self.ctl(ctl_ep, "ping", 0.5).get("ok"), wait_s)
        self.daemons.append((p, lg))
        return p

    def stop_daemons(self):
        for p, lg in self.daemons:
            bench_daemon.stop(p, 15)
            lg.close()
        self.daemons = []

    def curve_section(self):
        return 'curve: {secret_key: "%s", allow: "%s"}\n' % (self.sec("beamd"),
                                                             self.allow("beamd"))

    # ---- 1. raw ZeroMQ ------------------------------------------------------

    def raw(self):
        rows = []
        for h, w in RAW_SIZES:
            nbytes = h * w * 2
            hwm = str(max(4, QUEUE_BYTES // nbytes))
            runs = {m: [] for m in MODES}
            for rep in range(self.reps + 1):  # rep 0: warm-up, not counted
                for mode in MODES:
                    ep = tcp()
                    rargs = ["--endpoint", ep, "--bind", "--hwm", hwm, "--timeout", "20"]
                    sargs = ["--endpoint", ep, "--shape", "%dx%d" % (h, w), "--hwm", hwm]
                    if mode == "curve":
                        rargs += self.server_opts("receiver")
                        sargs += self.client_opts("sender", "receiver")
                    c0 = children_cpu_s()
                    other = OtherLoad()
                    s, r = self.pair(rargs, sargs, self.seconds if rep else 0.5)
                    r["other_load_cores"] = other.cores()
                    if rep:
                        r["cpu_us_per_frame"] = (children_cpu_s() - c0) * 1e6 / max(1, s["frames"])
                        runs[mode].append({"send": s, "recv": r})
                if rep:
                    self.log("  raw %-9s rep %d: plain %9.1f msg/s   curve %9.1f msg/s" %
                             ("%dx%d" % (h, w), rep, runs["plain"][-1]["recv"]["e2e_fps"],
                              runs["curve"][-1]["recv"]["e2e_fps"]))
            row = {"shape": [h, w], "message_bytes": nbytes, "hwm": int(hwm), "runs": runs}
            for mode in MODES:
                fps = statistics.median(x["recv"]["e2e_fps"] for x in runs[mode])
                row[mode] = {"fps": fps, "gbps": fps * nbytes / 1e9,
                             "send_recv_cpu_us_per_msg": statistics.median(
                                 x["recv"]["cpu_us_per_frame"] for x in runs[mode])}
            row["other_load_cores_max"] = max(x["recv"]["other_load_cores"]
                                              for m in MODES for x in runs[m])
            row["ratio"] = row["curve"]["fps"] / row["plain"]["fps"] if row["plain"]["fps"] else 0
            rows.append(row)
        return rows

    # ---- 2. result PUB ------------------------------------------------------

    def pub_config(self, in_ep, pub_ep, ctl_ep, mode):
        pub = ('{address: "%s", curve: true}' % pub_ep) if mode == "curve" else '"%s"' % pub_ep
        hwm = max(4, QUEUE_BYTES // (PUB_SIDE * PUB_SIDE * 2))
        return f"""# generated by bench/curve.py
input: {{mode: pull, endpoint: "{in_ep}", bind: true, hwm: {hwm}}}
output: {{publish: {pub}, push: "", hwm: 1000, pub_buffer: 64Mi}}
pool: {{frames: 64, frame_bytes: {PUB_SIDE * PUB_SIDE * 2}}}
control: {{endpoint: "{ctl_ep}"}}
metrics: {{listen: ""}}
{self.curve_section()}log: {{level: warning}}
heartbeat: 1s
stages:
  - {{name: corr, kind: correct, input: frames, backend: cpu, publish: true, queue: 72}}
"""

    def pub(self):
        """Both daemons up at once (pool 32 MiB each), their runs
        alternating, so a change in the machine's load hits both alike."""
        d = {}
        hwm = str(max(4, QUEUE_BYTES // (PUB_SIDE * PUB_SIDE * 2)))
        for mode in MODES:
            in_ep, pub_ep, ctl_ep = tcp(), tcp(), tcp()
            p = self.start_daemon(self.pub_config(in_ep, pub_ep, ctl_ep, mode), ctl_ep,
                                  "curve-pub-" + mode)
            d[mode] = {"in": in_ep, "pub": pub_ep, "ctl": ctl_ep, "pid": p.pid}
        runs = {m: [] for m in MODES}
        paced = {}
        result_bytes = PUB_SIDE * PUB_SIDE * 4

        def one(mode, seconds, rate=0):
            x = d[mode]
            rargs = ["--endpoint", x["pub"], "--sub", "--topic", "corr.frame", "--hwm", hwm,
                     "--timeout", "5"]
            if mode == "curve":
                rargs += self.client_opts("viewer", "beamd")
            t0 = threads_cpu(x["pid"])
            d0 = {m: sum(threads_cpu(d[m]["pid"]).values()) for m in MODES}
            other = OtherLoad()
            s, r = self.pair(rargs, ["--endpoint", x["in"], "--shape",
                                     "%dx%d" % (PUB_SIDE, PUB_SIDE), "--hwm", hwm],
                             seconds, rate=rate, lossy=True)
            r["other_load_cores"] = other.cores(sum(sum(threads_cpu(d[m]["pid"]).values()) - d0[m]
                                                    for m in MODES))
            r["beamd_cpu_us_per_result"] = us_per(t0, threads_cpu(x["pid"]), r["counted"])
            r["delivered_frac"] = r["counted"] / s["frames"] if s["frames"] else 0.0
            return {"send": s, "recv": r}

        for mode in MODES:
            one(mode, 1.0)  # warm-up: pool and output slots faulted in, subscriber joined
        for rep in range(self.reps):
            for mode in MODES:
                runs[mode].append(one(mode, self.seconds))
            self.log("  pub unpaced rep %d: plain %7.1f results/s (%.0f%% of sent)   curve %7.1f "
                     "results/s (%.0f%% of sent)" %
                     (rep + 1, runs["plain"][-1]["recv"]["e2e_fps"],
                      100 * runs["plain"][-1]["recv"]["delivered_frac"],
                      runs["curve"][-1]["recv"]["e2e_fps"],
                      100 * runs["curve"][-1]["recv"]["delivered_frac"]))
        for mode in MODES:
            paced[mode] = one(mode, max(2.0, self.seconds), rate=PUB_RATE)
        stats = {m: self.ctl(d[m]["ctl"], "stats") for m in MODES}
        self.stop_daemons()
        res = {"frame_shape": [PUB_SIDE, PUB_SIDE], "result_bytes": result_bytes,
               "paced_rate": PUB_RATE, "runs": runs, "paced_runs": paced,
               "beamd_stats": {m: {k: stats[m].get(k) for k in ("input", "output", "curve")}
                               for m in MODES}}
        for mode in MODES:
            rs = [x["recv"] for x in runs[mode]]
            fps = statistics.median(r["e2e_fps"] for r in rs)
            io = [r["beamd_cpu_us_per_result"].get("ZMQbg/IO/0", 0.0) for r in rs]
            pr = paced[mode]["recv"]
            res[mode] = {
                "fps": fps, "gbps": fps * result_bytes / 1e9,
                "sent_fps": statistics.median(x["send"]["fps"] for x in runs[mode]),
                "delivered_frac": statistics.median(r["delivered_frac"] for r in rs),
                "zmq_io_us_per_result": statistics.median(io),
                "paced_fps": pr["fps"], "paced_delivered_frac": pr["delivered_frac"],
                "paced_beamd_cpu_us_per_result": pr["beamd_cpu_us_per_result"],
            }
        res["ratio"] = res["curve"]["fps"] / res["plain"]["fps"] if res["plain"]["fps"] else 0
        res["other_load_cores_max"] = max(x["recv"]["other_load_cores"]
                                          for m in MODES for x in runs[m] + [paced[m]])
        return res

    # ---- 3. replay ----------------------------------------------------------

    def replay_config(self, rep_ep, out_ep, ctl_ep, mode, frame_bytes, pool):
        ep = ('{address: "%s", curve: true, server_key: "%s"}' % (rep_ep, self.pubkey("replay"))
              if mode == "curve" else '"%s"' % rep_ep)
        credit = min(64, max(1, pool // 2))
        # Payloads inline (shm off): on one host beamd could read them from
        # shared memory or its own mapping of the file, and then only the
        # headers would cross the encrypted socket.
        return f"""# generated by bench/curve.py
input: {{mode: replay, endpoint: {ep},
        replay: {{credit: {credit}, depth: 2, timeout: 10s, shm: off}}}}
output: {{publish: "", push: "{out_ep}", push_hwm: 1000, drain_timeout: 1s}}
pool: {{frames: {pool}, frame_bytes: {frame_bytes}, prefault: true}}
control: {{endpoint: "{ctl_ep}"}}
metrics: {{listen: ""}}
{self.curve_section()}log: {{level: warning}}
heartbeat: 1s
stages:
  - {{name: vd, kind: roi_sum, input: frames, backend: cpu, queue: {pool + 8},
      rois: [{{name: corner, shape: rect, rect: [0, 0, 16, 16]}}]}}
"""

    def replay_case(self, path, side, nframes, mode, passes):
        frame_bytes = side * side * 2
        pool = max(8, min(128, (REPLAY_POOL_MIB << 20) // frame_bytes))
        rep_ep, out_ep, ctl_ep = tcp(), tcp(), tcp()
        name = "curve-replay-%d-%s" % (side, mode)
        bd = self.start_daemon(self.replay_config(rep_ep, out_ep, ctl_ep, mode, frame_bytes,
                                                  pool), ctl_ep, name, wait_s=90)
        self.series += 1
        sid = self.series
        srv = recv = None
        lg = open(os.path.join(self.tmp, name + "-replay.log"), "w+")
        try:
            recv = subprocess.Popen([self.zt, "recv", "--endpoint", out_ep, "--topic", "vd.sums",
                                     "--series", str(sid), "--passes", str(passes),
                                     "--hwm", "1000", "--timeout", "30"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(0.3)
            t0 = threads_cpu(bd.pid)
            other = OtherLoad()
            argv = [os.path.join(self.build, "beamd-replay"), path, "--bind", rep_ep, "--loop",
                    "--quiet", "--series-id", str(sid)]
            if mode == "curve":
                argv += self.server_opts("replay")
            srv = subprocess.Popen(argv, stdout=lg, stderr=lg)
            try:
                out, err = recv.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                recv.kill()
                recv.wait()
                raise RuntimeError("%s: the consumer did not see %d passes in 180 s" %
                                   (name, passes))
            t1 = threads_cpu(bd.pid)
            s1 = threads_cpu(srv.pid)
            other_cores = other.cores(sum(t1.values()) - sum(t0.values()) + sum(s1.values()))
            if recv.returncode != 0:
                lg.seek(0)
                raise RuntimeError("%s: zthroughput recv failed (%d): %s; beamd-replay: %s" %
                                   (name, recv.returncode, err.strip(), lg.read()[-1000:]))
            r = json.loads(out.strip().splitlines()[-1])
            st = self.ctl(ctl_ep, "stats")
        finally:
            if recv and recv.poll() is None:
                recv.kill()
                recv.wait()
            if srv and srv.poll() is None:
                srv.send_signal(signal.SIGINT)
                try:
                    srv.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    srv.kill()
                    srv.wait()
            lg.close()
            self.stop_daemons()
        ps = r["passes"]
        for p in ps:
            if p["counted"] != nframes:
                raise RuntimeError("%s: series %d delivered %d of %d results" %
                                   (name, p["series"], p["counted"], nframes))
        secs = [(ps[k]["end_mono_ns"] - ps[k - 1]["end_mono_ns"]) * 1e-9
                for k in range(1, len(ps))]
        total = nframes * passes  # the CPU figures include the warm-up pass
        return {"pass_s": secs, "fps": statistics.median(nframes / s for s in secs),
                "pool_frames": pool, "other_load_cores": other_cores,
                "cpu_us_per_frame": {**us_per(t0, t1, total, "beamd:"),
                                     **us_per({}, s1, total, "replay:")},
                "beamd_input": {k: st.get("input", {}).get(k) for k in ("frames", "replay")},
                "curve": st.get("curve")}

    def replay(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        try:
            import replay  # h5py and numpy
        except ImportError as e:
            raise RuntimeError("bench/replay.py cannot run: %s" % e)
        rows = []
        passes = 1 + max(REPLAY_MIN_PASSES, self.reps)
        # The file on tmpfs where there is one: written to a disk, its
        # writeback would run (kernel threads, other load) during the passes.
        fdir = (tempfile.mkdtemp(prefix="beamd-curve-", dir="/dev/shm")
                if os.path.isdir("/dev/shm") else self.tmp)
        try:
            for side in REPLAY_SIDES:
                rows.append(self.replay_side(replay, fdir, side, passes))
        finally:
            if fdir != self.tmp:
                shutil.rmtree(fdir, ignore_errors=True)
        return rows

    def replay_side(self, replay, fdir, side, passes):
        frame_bytes = side * side * 2
        nframes = max(32, (REPLAY_FILE_MIB << 20) // frame_bytes)
        path = os.path.join(fdir, "replay-%d.h5" % side)
        try:
            replay.make_file(path, "raw", side, nframes)
            row = {"shape": [side, side], "frame_bytes": frame_bytes,
                   "frames_per_pass": nframes, "counted_passes": passes - 1}
            for mode in MODES:
                row[mode] = self.replay_case(path, side, nframes, mode, passes)
                row[mode]["gbps"] = row[mode]["fps"] * frame_bytes / 1e9
        finally:
            if os.path.exists(path):
                os.unlink(path)
        row["ratio"] = row["curve"]["fps"] / row["plain"]["fps"] if row["plain"]["fps"] else 0
        self.log("  replay %4dx%-4d plain %8.1f f/s %6.3f GB/s   curve %8.1f f/s %6.3f GB/s"
                 "   curve/plain %5.1f%%" %
                 (side, side, row["plain"]["fps"], row["plain"]["gbps"], row["curve"]["fps"],
                  row["curve"]["gbps"], 100 * row["ratio"]))
        return row


def run(build, seconds=1.5, reps=3, log=log, tmp=None, parts=PARTS):
    for exe in ("beamd", "beamd-keygen", "beamd-replay", os.path.join("bench", "zthroughput")):
        if not os.access(os.path.join(build, exe), os.X_OK):
            raise RuntimeError("%s is missing in %s; run make first" % (exe, build))
    # The tools' default keys: set in the caller's environment, they would
    # turn the plaintext cases into CURVE ones.
    for k in ("BEAMD_CURVE_SECRET", "BEAMD_CURVE_SERVER", "BEAMD_CURVE_ALLOW"):
        os.environ.pop(k, None)
    tmp = tempfile.mkdtemp(prefix="beamd-curve-", dir=tmp)
    zver, crypto = crypto_backend(os.path.join(build, "bench", "zthroughput"))
    res = {"seconds": seconds, "reps": reps, "cpu_model": cpu_model(), "nproc": os.cpu_count(),
           "libzmq": zver, "crypto": crypto, "load_start": load1(), "errors": []}
    log("  libzmq %s, CURVE with %s; %s, %d CPUs" % (zver, crypto, res["cpu_model"],
                                                   res["nproc"]))
    c = Curve(build, tmp, seconds, reps, log)
    try:
        c.make_keys()
        for part in PARTS:
            if part not in parts:
                continue
            try:
                res[part] = getattr(c, part)()
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
                res["errors"].append("%s: %s" % (part, e))
                log("  ERROR: %s: %s" % (part, e))
            finally:
                c.stop_daemons()
    finally:
        c.stop_daemons()
        shutil.rmtree(tmp, ignore_errors=True)
    res["load_end"] = load1()
    return res


def other_note(cores):
    return ("; other load up to %.2f cores: rerun" % cores) if cores >= 0.1 else ""


def summary_lines(res):
    L = ["CURVE vs plaintext, one tcp stream on loopback each, side by side in one run "
         "(median of %d; ratio = CURVE / plain)" % res["reps"],
         "  %s, %d CPUs; libzmq %s, CURVE with %s; load %.2f -> %.2f" %
         (res["cpu_model"], res["nproc"], res["libzmq"], res["crypto"], res["load_start"],
          res.get("load_end", 0))]
    if res.get("raw"):
        L.append("  raw ZeroMQ PUSH->PULL, %gs runs" % res["seconds"])
        L.append("    %-9s %9s %10s %8s %10s %8s %7s  %s" %
                 ("frame", "message", "plain m/s", "GB/s", "curve m/s", "GB/s", "ratio",
                  "CPU us/msg plain/curve"))
        for r in res["raw"]:
            L.append("    %-9s %9s %10.1f %8.3f %10.1f %8.3f %6.1f%%  %.0f/%.0f" %
                     ("%dx%d" % tuple(r["shape"]), "%g KiB" % (r["message_bytes"] / 1024),
                      r["plain"]["fps"], r["plain"]["gbps"], r["curve"]["fps"],
                      r["curve"]["gbps"], 100 * r["ratio"],
                      r["plain"]["send_recv_cpu_us_per_msg"],
                      r["curve"]["send_recv_cpu_us_per_msg"]))
        L.append("    (m/s = messages/s; CPU = sender and receiver processes together)%s" %
                 other_note(max(r["other_load_cores_max"] for r in res["raw"])))
    p = res.get("pub")
    if p:
        L.append("  result PUB: beamd correct -> output.publish -> SUB, %dx%d in, %g MiB float32 "
                 "results" % (p["frame_shape"][0], p["frame_shape"][1],
                              p["result_bytes"] / 2**20))
        L.append("    %-7s %12s %8s %10s %10s %16s %22s" %
                 ("", "delivered/s", "GB/s", "sent f/s", "delivered", "ZMQ I/O us/res",
                  "@%d/s: beamd us/res" % p["paced_rate"]))
        for m in MODES:
            e = p[m]
            L.append("    %-7s %12.1f %8.3f %10.1f %9.0f%% %16.0f %22s" %
                     (m, e["fps"], e["gbps"], e["sent_fps"], 100 * e["delivered_frac"],
                      e["zmq_io_us_per_result"], "%.0f (%.0f%% delivered)" % (
                          sum(e["paced_beamd_cpu_us_per_result"].values()),
                          100 * e["paced_delivered_frac"])))
        L.append("    ratio (delivered) %.1f%%; paced beamd CPU by thread: plain %s; curve %s" %
                 (100 * p["ratio"],
                  ", ".join("%s %.0f" % kv for kv in
                            sorted(p["plain"]["paced_beamd_cpu_us_per_result"].items())),
                  ", ".join("%s %.0f" % kv for kv in
                            sorted(p["curve"]["paced_beamd_cpu_us_per_result"].items()))))
        if other_note(p["other_load_cores_max"]):
            L.append("    " + other_note(p["other_load_cores_max"])[2:])
    if res.get("replay"):
        L.append("  replay: beamd-replay REP -> beamd (replay input, inline payloads) -> "
                 "roi_sum -> PUSH (uint16, passes of %d MiB)" % REPLAY_FILE_MIB)
        L.append("    %-9s %10s %8s %10s %8s %7s  %s" %
                 ("frame", "plain f/s", "GB/s", "curve f/s", "GB/s", "ratio",
                  "CPU us/frame curve (plain)"))
        for r in res["replay"]:
            cp, cc = r["plain"]["cpu_us_per_frame"], r["curve"]["cpu_us_per_frame"]
            L.append("    %-9s %10.1f %8.3f %10.1f %8.3f %6.1f%%  %s" %
                     ("%dx%d" % tuple(r["shape"]), r["plain"]["fps"], r["plain"]["gbps"],
                      r["curve"]["fps"], r["curve"]["gbps"], 100 * r["ratio"],
                      ", ".join("%s %.0f (%.0f)" % (k, v, cp.get(k, 0))
                                for k, v in sorted(cc.items()) if v >= 1)))
        note = other_note(max(r[m]["other_load_cores"] for r in res["replay"] for m in MODES))
        if note:
            L.append("    " + note[2:])
    for e in res.get("errors", []):
        L.append("  ERROR: " + e)
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--seconds", type=float, default=1.5, help="length of each run (default 1.5)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--part", action="append", choices=PARTS,
                    help="only this part (repeatable; default all)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.reps < 1 or a.seconds <= 0:
        ap.error("--reps must be >= 1 and --seconds > 0")
    try:
        res = run(a.build, a.seconds, a.reps, parts=a.part or PARTS)
    except (RuntimeError, OSError) as e:
        sys.exit("bench/curve.py: %s" % e)
    print("\n".join(summary_lines(res)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
