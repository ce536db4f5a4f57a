#!/usr/bin/python3
"""Replay benchmark: HDF5 file -> beamd-replay -> beamd (input.mode replay)
-> output.push -> beamd-record, over ipc, against the raw chunk read rate
of the same file. Figures, not pass/fail (bench/README.md, section 5).

For each case (uncompressed and bitshuffle-LZ4, 512x512 and 2048x2048
uint16) a file is written with h5py: one frame per chunk, Poisson counts
(a bank of distinct frames repeated, so generating gigabytes stays quick
while the compressor sees detector-like data). Then, in the same run:

- raw: `h5chunkread` ($BUILD/bench/h5chunkread, H5Dread_chunk into one
  reused buffer, no decompression: what beamd-replay itself does per
  frame, except that beamd-replay must write each frame to different
  memory while the one buffer stays in cache: the issue's yardstick),
  `h5chunkread --ring N` (the same, each frame into the next of N =
  pool.frames buffers, at most 256 MiB of them: what a reader that keeps
  frames in flight can reach, shown beside the yardstick, not instead of
  it), and
  for bslz4 also `h5chunkread --decode` (H5Dread through the filter) and
  `h5chunkread --beam-decode` (H5Dread_chunk + beamd's own decoder on one
  thread: what the one stage thread that decodes, lazily, can do at most);
- ceilings: raw ZeroMQ PUSH->PULL over ipc for uncompressed frames of the
  size (bench/zthroughput), and memcpy bandwidth (numpy copy of 256 MiB):
  a raw frame crosses a unix socket once, which copies it twice;
- beamd, once per transport: `map` (input.replay.shm on, the defaults on one
  host: beamd reads each forwarded chunk in place from its own mapping of
  the file, PROTOCOL.md 13.8, and nothing is copied), `shm` (the same with
  beamd-replay --no-map: beamd-replay reads each payload into beamd's
  shared landing area, 13.6; the reply carries headers only in both) and
  `inline` (input.replay.shm off: payloads inside the ZeroMQ replies). beamd-replay --loop serves the file pass
  after pass, each pass a series; beamd runs a trivial graph (roi_sum over a 16x16 rect, which
  needs every frame decoded) and PUSHes its results to beamd-record. A
  pass ends when beamd-record closes that series' file, so the time of
  pass p is the gap between the closing of series p-1 and p (file mtimes):
  the steady state, with the pipeline full across pass boundaries. Pass 0
  is a warm-up (pool pages faulted in) and is not counted.
- the `none` graph: no stages at all, so a frame is released as soon as
  it is in: the delivery rate of beamd-replay, the transport and the
  replay input alone (beamd-record then only sees the series events);
- for bslz4 files also `roi_sum_d2`, the roi_sum graph with
  pool.decode_threads 2 (frames decoded ahead of the stage, two at once),
  and the `record` graph: the daemon's record stage
  writing the frames to HDF5 (bslz4, one frame per chunk), a graph that
  needs no pixels, so chunks go from file to file still compressed; a
  pass ends when the stage renames its file. Its files go to /dev/shm
  (tmpfs) when there is one: the HDF5 write path without the disk.

Reported per case: medians of --reps runs (passes; a variant whose counted
passes add up to under 2 s is run again with as many as make 2 s, up to
200, because the CPU is sampled every 0.1 s), frames/s and GB/s of
decoded frame bytes for both paths, their ratio (target >= 80 %), the ratio
to the ZeroMQ ceiling (raw), round trips per frame (beamd stats
input.replay.requests / input.frames), and where the CPU goes: CPU
microseconds per frame of every process and thread group (from
/proc/PID/task/*/stat over the counted passes: beamd-replay main and ZeroMQ I/O
thread, beamd loop thread, ZeroMQ I/O thread and stage workers,
beamd-record), which stays meaningful on a machine shared with other work,
where wall-clock rates do not.

Standalone: bench/replay.py [--build DIR] [--reps 3] [--pass-mib 1024]
[--json FILE]; bench/run.py calls run_replay() for its summary.
"""
import argparse
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PLUGIN_DIR = "/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins"
os.environ.setdefault("HDF5_PLUGIN_PATH", PLUGIN_DIR)

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import zmq  # noqa: E402

CASES = (("raw", 512), ("bslz4", 512), ("raw", 2048), ("bslz4", 2048))
TARGET_RATIO = 0.80
MIN_COUNTED_S = 2.0  # counted passes shorter than this are run again, more of them
MAX_REPS = 200
BSHUF_ID = 32008
BANK = 16          # distinct frames per file
MEAN_COUNTS = 2.0  # Poisson mean per pixel: a sparse diffraction-like frame
POOL_FRAMES = 128  # --pool; the daemon's default pool.frames
CREDIT = 64  # --credit; the daemon's default input.replay.credit
DEPTH = 2    # --depth: requests in flight (input.replay.depth)
# A SERIES_START takes a stage queue place that the daemon's credit does
# not count, so a request sized by the queue room can overflow the queue at
# a pass boundary and drop a frame (a daemon bug, see bench/README.md). A
# queue longer than the pool (by 8) keeps the pool the limit, which avoids it.


def log(msg):
    print(msg, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- files -------------------------------------------------------------------------

def _bank(side, seed):
    rng = np.random.default_rng(seed)
    frames = rng.poisson(MEAN_COUNTS, (BANK, side, side)).astype(np.uint16)
    # A few hot pixels and a slow gradient, as real frames have.
    y = np.arange(side)[:, None]
    frames += (y * 4 // side).astype(np.uint16)
    frames[:, side // 3, side // 5] = 60000
    return frames


def _compressed_bank(bank):
    """The bank's chunks as HDF5's bitshuffle plugin stores them (32008,
    LZ4): written once to an in-memory file and read back raw."""
    n, h, w = bank.shape
    with h5py.File("bank.h5", "w", driver="core", backing_store=False) as f:
        d = f.create_dataset("d", data=bank, chunks=(1, h, w), compression=BSHUF_ID,
                             compression_opts=(0, 2))
        return [d.id.read_direct_chunk((k, 0, 0))[1] for k in range(n)]


def make_file(path, codec, side, nframes, seed=1):
    """Writes (nframes, side, side) uint16, one frame per chunk, with
    write_direct_chunk; returns {stored_bytes, compression_ratio}."""
    bank = _bank(side, seed)
    if codec == "bslz4":
        chunks = _compressed_bank(bank)
        kw = {"compression": BSHUF_ID, "compression_opts": (0, 2)}
    else:
        chunks = [bank[k].tobytes() for k in range(BANK)]
        kw = {}
    stored = 0
    with h5py.File(path, "w") as f:
        d = f.create_dataset("/entry/data/data", shape=(nframes, side, side), dtype=np.uint16,
                             chunks=(1, side, side), **kw)
        for k in range(nframes):
            c = chunks[k % BANK]
            d.id.write_direct_chunk((k, 0, 0), c, 0)
            stored += len(c)
    return {"stored_bytes": stored, "compression_ratio": nframes * side * side * 2 / stored}


# ---- processes ---------------------------------------------------------------------

class Run:
    """One case: the daemon, the server and the recorder, all killed by close()."""

    def __init__(self, build, tmp, tag):
        self.build, self.tmp, self.tag = build, tmp, tag
        self.procs = []
        self.logs = []
        self.ctx = zmq.Context()

    def spawn(self, name, argv, stdout=True):
        """stdout=True: a pipe the caller reads (--stats-json lines);
        False: into the log with stderr, so a chatty child cannot block."""
        lg = open(os.path.join(self.tmp, "%s-%s.log" % (self.tag, name)), "w+")
        self.logs.append(lg)
        p = subprocess.Popen([os.path.join(self.build, name)] + argv,
                             stdout=subprocess.PIPE if stdout else lg, stderr=lg, text=True)
        self.procs.append(p)
        return p

    def log_text(self, name):
        with open(os.path.join(self.tmp, "%s-%s.log" % (self.tag, name))) as f:
            return f.read()[-3000:]

    def ctl(self, ep, cmd, timeout=3.0):
        s = self.ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        try:
            s.connect(ep)
            s.send(cmd.encode())
            return json.loads(s.recv())
        finally:
            s.close()

    def start_beamd(self, cfg_text, ctl_ep):
        path = os.path.join(self.tmp, self.tag + ".yaml")
        with open(path, "w") as f:
            f.write(cfg_text)
        p = self.spawn("beamd", ["-c", path], stdout=False)
        # pool.prefault touches every page of the pool and the landing area
        # (2 GiB at 2048x2048), at ~15 us a page on this VM: many seconds.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if p.poll() is not None:
                break
            try:
                if self.ctl(ctl_ep, "ping", 0.5).get("ok"):
                    return p
            except zmq.ZMQError:
                pass
        raise RuntimeError("beamd did not start: " + self.log_text("beamd"))

    def close(self):
        # SIGINT: beamd drains (output.drain_timeout is 1 s here), the tools
        # print their --stats-json; whatever lingers is killed.
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for lg in self.logs:
            lg.close()
        self.ctx.destroy(linger=0)


TRANSPORTS = ("map", "shm", "inline")


def variants(codec):
    """(graph, transport) pairs run for a file: roi_sum over every
    transport, no stages (the transport alone) in place and through landing
    slots, and for bslz4 the decode pool and the record graph, which needs
    no pixels."""
    v = [("roi_sum", tr) for tr in TRANSPORTS] + [("none", "map"), ("none", "shm")]
    if codec == "raw":
        # Every pixel read: in place, the stage itself pulls the whole frame
        # out of the page cache.
        return v + [("roi_full", "map"), ("roi_full", "shm")]
    return v + [("roi_sum_d2", "map"), ("record", "map")]


def config(in_ep, out_ep, ctl_ep, frame_bytes, transport, graph="roi_sum", rec_dir=None):
    shm = "off" if transport == "inline" else "on"
    # roi_sum_d2: roi_sum with a decode pool of 2 threads (pool.decode_threads)
    dec = 2 if graph.endswith("_d2") else 0
    graph = graph[:-3] if dec else graph
    if graph == "none":
        # No stages: frames are released as soon as they are in, so this
        # is the delivery rate of the transport and the replay input alone.
        stage = "  []"
        out = out_ep
        dec = 0
    elif graph == "record":
        # The daemon's own recorder, frames in: a graph that needs no
        # pixels, so bslz4 chunks can go from the file to the new file
        # compressed as they are (daemon/stage_record.c pass-through).
        stage = (f"""  - {{name: rec, kind: record, input: frames, dir: "{rec_dir}", compress: bslz4,
      queue: {POOL_FRAMES + 8}}}""")
        out = ""
    else:
        side = int(round((frame_bytes // 2) ** 0.5)) if graph == "roi_full" else 16
        stage = f"""  - {{name: vd, kind: roi_sum, input: frames, backend: cpu, queue: {POOL_FRAMES + 8},
      rois: [{{name: corner, shape: rect, rect: [0, 0, {side}, {side}]}}]}}"""
        out = out_ep
    return f"""# generated by bench/replay.py
input: {{mode: replay, endpoint: "{in_ep}",
        replay: {{credit: {CREDIT}, depth: {DEPTH}, timeout: 10s, shm: {shm}}}}}
output: {{publish: "", push: "{out}", push_hwm: 1000, drain_timeout: 1s}}
pool: {{frames: {POOL_FRAMES}, frame_bytes: {frame_bytes}, prefault: true, decode_threads: {dec}}}
control: {{endpoint: "{ctl_ep}"}}
metrics: {{listen: ""}}
log: {{level: notice}}
heartbeat: 1s
stages:
{stage}
"""


def ring_slots(frame_bytes):
    """Buffers of the h5ring read: pool.frames, but no more than 256 MiB,
    far beyond any cache already. Past that, this VM's memory (pages that
    its hypervisor backs lazily, and DAMON paging out what was not touched
    for a while) makes a large ring first-touch bound, which measures the
    VM, not the reading."""
    return max(2, min(POOL_FRAMES, (256 << 20) // frame_bytes))


def h5read(build, path, decode=False, min_s=1.0, beam_decode=False, ring=1):
    argv = [os.path.join(build, "bench", "h5chunkread"), path, "--min-seconds", str(min_s),
            "--ring", str(ring)]
    if decode:
        argv.append("--decode")
    if beam_decode:
        argv.append("--beam-decode")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("h5chunkread failed (%d): %s" % (p.returncode, p.stderr.strip()))
    return json.loads(p.stdout.strip().splitlines()[-1])


def zmq_ceiling(build, tmp, side, reps, seconds=1.5):
    """Frames/s of raw ZeroMQ PUSH -> PULL over ipc for uncompressed frames
    of this size (bench/zthroughput, as figure 1 of bench/README.md): the
    transport's own ceiling, which no replay of raw frames can pass. The
    median of reps runs; None when zthroughput is not built."""
    zt = os.path.join(build, "bench", "zthroughput")
    if not os.access(zt, os.X_OK):
        return None
    hwm = str(max(4, (64 << 20) // (side * side * 2)))
    rates = []
    for k in range(reps):
        ep = "ipc://%s/zmq-%d-%d.ipc" % (tmp, side, k)
        sid = str(7000 + k)
        recv = subprocess.Popen([zt, "recv", "--endpoint", ep, "--bind", "--series", sid,
                                 "--hwm", hwm, "--timeout", "30"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.3)
            snd = subprocess.run([zt, "send", "--endpoint", ep, "--shape", "%dx%d" % (side, side),
                                  "--seconds", str(seconds), "--series", sid, "--hwm", hwm,
                                  "--timeout", "30"], capture_output=True, text=True,
                                 timeout=seconds + 60)
            out, err = recv.communicate(timeout=60)
        except BaseException:
            recv.kill()
            recv.wait()
            raise
        if snd.returncode != 0 or recv.returncode != 0:
            raise RuntimeError("zthroughput failed: %s %s" % (snd.stderr.strip(), err.strip()))
        s = json.loads(snd.stdout.strip().splitlines()[-1])
        r = json.loads(out.strip().splitlines()[-1])
        span = (r["t_last_mono_ns"] - s["t0_mono_ns"]) * 1e-9
        rates.append(r["counted"] / span if span > 0 else 0.0)
    return statistics.median(rates)


def memcpy_gbps(reps=5, mib=256):
    """memcpy bandwidth (numpy copyto of mib MiB, pages touched first),
    GB/s, median of reps: the most any in-memory hop can move."""
    a = np.ones(mib << 20, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(b, a)
        rates.append(a.nbytes / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


HZ = os.sysconf("SC_CLK_TCK")


def _threads_cpu(pid):
    """{(tid, comm): CPU seconds} of every thread of pid ({} once gone)."""
    out = {}
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                st = f.read()
            comm = st[st.index("(") + 1:st.rindex(")")]
            fl = st[st.rindex(")") + 2:].split()
            out[(int(t), comm)] = (int(fl[11]) + int(fl[12])) / HZ
    except (OSError, ValueError):
        pass
    return out


class CpuSampler:
    """Samples the threads of the processes in procs (name -> pid) every
    0.1 s and keeps the last sample of each, so a process that exits on its
    own (beamd-record at --series) is still counted up to its last 0.1 s.
    The first sample taken once the file `baseline_after` exists (the
    warm-up pass is recorded) is the baseline: start-up (the pool's pages
    faulted in, files opened) and the warm-up pass are not counted."""

    def __init__(self, baseline_after):
        self.procs = {}
        self.last = {}
        self.base = None
        self.baseline_after = baseline_after
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self):
        while not self.stop.is_set():
            self.sample()
            time.sleep(0.1)

    def sample(self):
        for name, pid in list(self.procs.items()):
            th = _threads_cpu(pid)
            if th:
                self.last[name] = (pid, th)
        if self.base is None and os.path.exists(self.baseline_after):
            self.base = {k: dict(v[1]) for k, v in self.last.items()}

    def groups(self):
        """CPU seconds per process and thread group."""
        self.stop.set()
        self.th.join()
        self.sample()
        g = {}
        base = self.base or {}
        for name, (pid, th) in self.last.items():
            for (tid, comm), sec in th.items():
                sec -= base.get(name, {}).get((tid, comm), 0.0)
                if comm.startswith("ZMQbg/IO"):
                    grp = "zmq_io"
                elif comm.startswith("ZMQbg"):
                    grp = "zmq_other"
                elif tid == pid:
                    grp = "loop" if name == "beamd" else "main"
                else:
                    grp = "workers"
                key = "%s.%s" % (name, grp)
                g[key] = g.get(key, 0.0) + sec
        return g


def _wait_files(paths, timeout):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise RuntimeError("the record stage did not close %s in %d s" % (paths[-1], timeout))
        time.sleep(0.05)


def beamd_passes(build, tmp, tag, path, frame_bytes, nframes, reps, transport, graph="roi_sum"):
    """Runs 1 + reps passes through beamd; returns (per-pass seconds
    without the warm-up, beamd stats, server stats, recorder stats, CPU
    seconds per process and thread group over all passes). With graph
    "record" the daemon's record stage writes the frames and there is no
    beamd-record; a pass ends when the stage renames its file."""
    run = Run(build, tmp, tag)
    rec_dir = os.path.join(tmp, tag + "-rec")
    if graph == "record" and os.path.isdir("/dev/shm"):
        # The record stage's files on tmpfs: the HDF5 write path, not this
        # VM's disk (whose writeback throttles a GB-sized pass to a crawl).
        rec_dir = os.path.join(tempfile.mkdtemp(prefix="beamd-replay-bench-", dir="/dev/shm"),
                               tag + "-rec")
    cpu = CpuSampler(os.path.join(rec_dir, "series_1.h5"))  # the warm-up pass, closed
    try:
        in_ep = "ipc://%s/%s-in.ipc" % (tmp, tag)
        out_ep = "ipc://%s/%s-out.ipc" % (tmp, tag)
        ctl_ep = "tcp://127.0.0.1:%d" % free_port()
        os.makedirs(rec_dir)
        cpu.procs["beamd"] = run.start_beamd(config(in_ep, out_ep, ctl_ep, frame_bytes,
                                                    transport, graph, rec_dir), ctl_ep).pid
        passes = 1 + reps
        files = [os.path.join(rec_dir, "series_%d.h5" % (1 + p)) for p in range(passes)]
        if graph != "record":
            rec = run.spawn("beamd-record", ["--pull", "--connect", out_ep, "--dir", rec_dir,
                                             "--no-swmr", "--series", str(passes), "--stats-json",
                                             "--timeout", "300"])
            cpu.procs["beamd-record"] = rec.pid
        time.sleep(0.2)
        srv = run.spawn("beamd-replay", [path, "--bind", in_ep, "--loop", "--quiet",
                                         "--stats-json", "--series-id", "1"] +
                        (["--no-map"] if transport == "shm" else []))
        cpu.procs["beamd-replay"] = srv.pid
        if graph == "record":
            _wait_files(files, 300)
            rec_stats = {}
        else:
            try:
                out, _ = rec.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                raise RuntimeError("beamd-record did not finish %d passes in 300 s" % passes)
            if rec.returncode != 0:
                raise RuntimeError("beamd-record failed (%d): %s" %
                                   (rec.returncode, run.log_text("beamd-record")))
            rec_stats = json.loads(out.strip().splitlines()[-1])
        st = run.ctl(ctl_ep, "stats")
        cpu_s = cpu.groups()
        ends = [os.stat(f).st_mtime_ns for f in files]
        if graph == "none" and st.get("input", {}).get("frames", 0) < passes * nframes:
            raise RuntimeError("beamd took %s frames of %d" % (st.get("input", {}).get("frames"),
                                                                passes * nframes))
        for p in range(passes if graph != "none" else 0):
            with h5py.File(files[p], "r") as f:
                got = (f["/entry/data/data"].shape[0] if graph == "record"
                       else f["/results/vd.sums/frame_id"].shape[0])
            if got != nframes:
                raise RuntimeError("pass %d: %s holds %d of %d" % (p, files[p], got, nframes))
        srv.send_signal(signal.SIGINT)
        sout, _ = srv.communicate(timeout=10)
        lines = [ln for ln in sout.splitlines() if ln.startswith("{")]
        srv_stats = json.loads(lines[-1]) if lines else {}
        secs = [(ends[p] - ends[p - 1]) * 1e-9 for p in range(1, passes)]
        return secs, st, srv_stats, rec_stats, cpu_s
    finally:
        cpu.stop.set()
        run.close()
        shutil.rmtree(os.path.dirname(rec_dir) if rec_dir.startswith("/dev/shm/") else rec_dir,
                      ignore_errors=True)


def run_replay(build, reps=3, pass_mib=1024, logf=log, tmp=None, cases=CASES, graphs=None):
    """The cases (all by default) and, per case, the graphs given (all of
    variants() by default); returns a list of result rows (see
    bench/README.md)."""
    for exe in ("beamd", "beamd-replay", "beamd-record", os.path.join("bench", "h5chunkread")):
        if not os.access(os.path.join(build, exe), os.X_OK):
            raise RuntimeError("%s is missing in %s; run make first" % (exe, build))
    own_tmp = tmp is None
    tmp = tmp or tempfile.mkdtemp(prefix="beamd-replay-bench-")
    rows = []
    zmq_fps = {}
    mem_gbps = memcpy_gbps()
    logf("  memcpy %.2f GB/s (numpy copy of 256 MiB, median of 5)" % mem_gbps)
    try:
        for codec, side in cases:
            todo = [v for v in variants(codec) if graphs is None or v[0] in graphs]
            if not todo:
                continue
            tag = "%s-%d" % (codec, side)
            frame_bytes = side * side * 2
            nframes = max(32, (pass_mib << 20) // frame_bytes)
            path = os.path.join(tmp, tag + ".h5")
            try:
                t = time.monotonic()
                info = make_file(path, codec, side, nframes)
                gen_s = time.monotonic() - t
                raw = [h5read(build, path) for _ in range(reps)]
                ring = [h5read(build, path, ring=ring_slots(frame_bytes)) for _ in range(reps)]
                dec = h5read(build, path, decode=True) if codec != "raw" else None
                bdec = ([h5read(build, path, beam_decode=True) for _ in range(reps)]
                        if codec != "raw" else None)
                runs, counted = {}, {}
                for g, tr in todo:
                    name = "%s-%s-%s" % (tag, g, tr)
                    n = reps
                    runs[(g, tr)] = beamd_passes(build, tmp, name, path, frame_bytes, nframes,
                                                 n, tr, g)
                    spent = sum(runs[(g, tr)][0])
                    if spent < MIN_COUNTED_S and g != "record":  # record: GBs in /dev/shm
                        # Passes shorter than the CPU sampler's period say
                        # nothing of where the CPU goes: run enough of them.
                        n = min(MAX_REPS, math.ceil(n * MIN_COUNTED_S / max(spent, 1e-3)))
                        runs[(g, tr)] = beamd_passes(build, tmp, name + "-long", path,
                                                     frame_bytes, nframes, n, tr, g)
                    counted[(g, tr)] = n
                if side not in zmq_fps:
                    zmq_fps[side] = zmq_ceiling(build, tmp, side, reps)
            except zmq.ZMQError as e:
                raise RuntimeError("%s: ZeroMQ: %s" % (tag, e))
            finally:
                if os.path.exists(path):
                    os.unlink(path)  # gigabytes: never left behind
            raw_fps = statistics.median(r["fps"] for r in raw)
            ring_fps = statistics.median(r["fps"] for r in ring)
            bdec_fps = statistics.median(r["fps"] for r in bdec) if bdec else None
            for g, tr in todo:
                rows.append(_row(codec, side, tr, frame_bytes, nframes, info, gen_s, raw, raw_fps,
                                 dec, bdec_fps, mem_gbps, zmq_fps[side], counted[(g, tr)],
                                 *runs[(g, tr)], ring_fps=ring_fps))
                r = rows[-1]
                r["graph"] = g
                logf("  %-5s %4dx%-4d %-7s %-6s raw %8.1f f/s %6.2f GB/s   beamd %8.1f f/s %6.2f GB/s"
                     "   ratio %5.1f%%   round trips/frame %.4f" %
                     (codec, side, side, g, tr, raw_fps, r["raw_gbps"], r["beamd_fps"],
                      r["beamd_gbps"], 100 * r["ratio"], r["round_trips_per_frame"] or 0))
                logf("        CPU us/frame: " + ", ".join(
                    "%s %.0f" % (k, v) for k, v in r["cpu_us_per_frame"].items() if v >= 0.5))
    finally:
        if own_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _row(codec, side, transport, frame_bytes, nframes, info, gen_s, raw, raw_fps, dec, bdec_fps,
         mem_gbps, zmq_f, reps, secs, st, srv, rec, cpu_s, ring_fps=None):
    counted = reps * nframes  # the CPU figures leave the warm-up pass out
    bd_fps = statistics.median(nframes / s for s in secs)
    inp = st.get("input", {})
    rp = inp.get("replay", {})
    return {
        "codec": codec, "shape": [side, side], "dtype": "uint16",
        "transport": transport, "shm_frames": rp.get("shm_frames"),
        "map_frames": rp.get("map_frames"),
        "frame_bytes": frame_bytes, "frames_per_pass": nframes, "file": info,
        "generate_s": gen_s,
        "raw_fps": raw_fps, "raw_gbps": raw_fps * frame_bytes / 1e9,
        "raw_runs": raw,
        "decode_fps": dec["fps"] if dec else None,
        "decode_gbps": dec["gbps"] if dec else None,
        "beam_decode_fps": bdec_fps,
        "memcpy_gbps": mem_gbps,
        "cpu_us_per_frame": {k: 1e6 * v / counted for k, v in sorted(cpu_s.items())},
        "beamd_fps": bd_fps, "beamd_gbps": bd_fps * frame_bytes / 1e9,
        "beamd_pass_s": secs,
        "ratio": bd_fps / raw_fps if raw_fps else 0.0,
        "ring_fps": ring_fps, "ring_slots": ring_slots(frame_bytes),
        "ratio_ring": bd_fps / ring_fps if ring_fps else None,
        "zmq_raw_fps": zmq_f,
        "ratio_zmq": (bd_fps / zmq_f if codec == "raw" and zmq_f else None),
        "requests": rp.get("requests"), "frames": inp.get("frames"),
        "round_trips_per_frame": (rp.get("requests", 0) / inp["frames"]
                                  if inp.get("frames") else None),
        "frames_per_reply": (inp["frames"] / rp["replies"]
                             if rp.get("replies") else None),
        "beamd_input": {k: inp.get(k) for k in ("frames", "dropped_total", "paused_s",
                                                "corrupt")},
        "beamd_stages": [{k: s.get(k) for k in ("name", "busy_s", "passthrough")}
                         for s in st.get("stages", [])],
        "server": srv, "recorder": rec,
    }


def summary_lines(rows, reps):
    L = ["Replay: HDF5 -> beamd-replay -> beamd (replay input, roi_sum) -> PUSH -> beamd-record, "
         "ipc (median of %d passes)" % reps,
         "  %-6s %-10s %-10s %-6s %10s %8s %10s %8s %7s %10s %7s %10s %7s %11s %10s %10s  %s" %
         ("codec", "frame", "graph", "via", "h5 f/s", "h5 GB/s", "beamd f/s", "GB/s",
          "ratio", "h5ring f/s", "of ring", "zmq f/s", "of zmq", "trips/frame", "h5dec f/s",
          "bdec f/s", "ratio >= 80%")]
    for r in rows:
        zmq_f = r.get("zmq_raw_fps") if r["codec"] == "raw" else None
        rz = r.get("ratio_zmq")
        rr = r.get("ratio_ring")
        L.append("  %-6s %-10s %-10s %-6s %10.1f %8.3f %10.1f %8.3f %6.1f%% %10s %7s %10s %7s "
                 "%11.4f %10s %10s  %s" %
                 (r["codec"], "%dx%d" % tuple(r["shape"]), r.get("graph", "roi_sum"),
                  r.get("transport", "inline"),
                  r["raw_fps"], r["raw_gbps"],
                  r["beamd_fps"], r["beamd_gbps"], 100 * r["ratio"],
                  "%.1f" % r["ring_fps"] if r.get("ring_fps") else "-",
                  "%.1f%%" % (100 * rr) if rr else "-",
                  "%.1f" % zmq_f if zmq_f else "-", "%.1f%%" % (100 * rz) if rz else "-",
                  r["round_trips_per_frame"] or 0,
                  "%.1f" % r["decode_fps"] if r["decode_fps"] else "-",
                  "%.1f" % r["beam_decode_fps"] if r.get("beam_decode_fps") else "-",
                  "ok" if r["ratio"] >= TARGET_RATIO else "BELOW"))
    if rows:
        L.append("  memcpy %.2f GB/s in the same run" % rows[0].get("memcpy_gbps", 0.0))
    L.append("  CPU microseconds per frame (counted passes; loop = beamd's libuv thread, "
             "workers = stage threads, zmq_io = ZeroMQ's I/O thread):")
    for r in rows:
        c = r.get("cpu_us_per_frame", {})
        L.append("  %-6s %-10s %-10s %-6s %s" % (r["codec"], "%dx%d" % tuple(r["shape"]),
                                                 r.get("graph", "roi_sum"),
                                                 r.get("transport", "inline"), ", ".join("%s %.0f" % (k, v) for k, v in c.items()
                                                if v >= 0.5)))
    L.append("  h5 = H5Dread_chunk of the same file into one reused buffer (stored bytes, no "
             "decompression; ratio = beamd / h5, the issue's yardstick); h5ring = the same "
             "into a ring of pool.frames buffers (256 MiB at most) in turn, as a reader that keeps frames in "
             "flight must (each frame lands in memory no longer in cache); "
             "h5dec = H5Dread through the filter;")
    L.append("  via: map = chunks read in place by beamd from its mapping of the file "
             "(input.replay.shm on, the default over ipc); shm = read by beamd-replay into beamd's "
             "landing area (beamd-replay --no-map); inline = inside the ZeroMQ replies;")
    L.append("  graph: roi_sum = one roi_sum stage (needs pixels) PUSHing to beamd-record; "
             "roi_full = the same over the whole frame (every pixel read); "
             "none = no stages (the transport alone); roi_sum_d2 = roi_sum with "
             "pool.decode_threads 2; record = the daemon's record stage writing the frames "
             "(needs no pixels)")
    L.append("  bdec = H5Dread_chunk + beamd's decoder on one thread; zmq = raw ZeroMQ "
             "PUSH->PULL of uncompressed frames of that size over ipc (the transport's "
             "ceiling); GB/s of decoded frame bytes")
    return L


def main():
    global CREDIT, DEPTH, POOL_FRAMES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--reps", type=int, default=3, help="counted passes per case (median)")
    ap.add_argument("--pass-mib", type=int, default=1024,
                    help="decoded frame bytes per pass, MiB (sets the frames per file)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--case", action="append", metavar="CODEC:SIDE",
                    help="only this case, e.g. raw:512 or bslz4:2048 (repeatable)")
    ap.add_argument("--graph", action="append",
                    help="only this graph: roi_sum, none, roi_sum_d2, record (repeatable)")
    ap.add_argument("--credit", type=int, default=CREDIT, help="input.replay.credit (default %d)" % CREDIT)
    ap.add_argument("--depth", type=int, default=DEPTH, help="input.replay.depth (default %d)" % DEPTH)
    ap.add_argument("--pool", type=int, default=POOL_FRAMES,
                    help="pool.frames (default %d)" % POOL_FRAMES)
    a = ap.parse_args()
    CREDIT, DEPTH, POOL_FRAMES = a.credit, a.depth, a.pool
    cases = CASES
    if a.case:
        cases = []
        for c in a.case:
            codec, _, side = c.partition(":")
            if (codec, int(side or 0)) not in CASES:
                ap.error("--case %s: expected one of %s" %
                         (c, ", ".join("%s:%d" % x for x in CASES)))
            cases.append((codec, int(side)))
    if a.reps < 1 or a.pass_mib < 1:
        ap.error("--reps and --pass-mib must be >= 1")
    try:
        rows = run_replay(a.build, a.reps, a.pass_mib, cases=cases, graphs=a.graph)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        sys.exit("bench/replay.py: %s" % e)
    log("\n".join(summary_lines(rows, a.reps)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
