"""End to end: HDF5 file -> beamd-replay (REP) -> beamd (input.mode replay)
-> record stage / output.push -> beamd-record, on loopback.

What is checked (proto/PROTOCOL.md section 13, docs/replay.md,
docs/recording.md):
- round trip: the frames the daemon's `record` stage writes equal the file
  replayed, frame by frame (plain, gzip, bitshuffle-LZ4, an Eiger-style
  master with data files), with the series metadata as attributes; the
  roi_sum results beamd-record stores from the PUSH output hold every frame
  id once, equal to numpy;
- resumption: kill -9 of the daemon mid-series and a restart with the same
  config resume from the state file, and beamd-record (running across the
  restart, dropping duplicates) holds every frame exactly once; kill -9 of
  beamd-replay makes the daemon's request time out and be sent again to the
  restarted server, and every frame arrives once;
- damaged input: a corrupt chunk is counted (input.corrupt) and its sums are
  NaN while every other frame is exact; a missing file stops beamd-replay
  with a message naming it;
- a viewer that subscribes and never reads does not slow a replay down;
- input.replay.exit_on_eof: the daemon exits 0 when the file is done, and its state
  file says so.

The roi_sum comparison is exact: sums of at most 3072 uint16 values in
float64 are exact in any order. Every wait has a deadline; the longest test
takes about 5 s, the file about 30 s on 2 cores. beamd-record's output is
read back with h5py; tools/make_test_h5.py writes the inputs and puts
Debian's filter plugins on HDF5_PLUGIN_PATH.
"""

import http.client
import json
import os
import re
import signal
import sys
import time

import numpy as np
import pytest
import zmq

from conftest import REPO, make_config, roi_masks

sys.path.insert(0, os.path.join(REPO, "tools"))
import make_test_h5 as mk  # noqa: E402  (sets HDF5_PLUGIN_PATH before h5py loads)
import h5py  # noqa: E402

H, W = 48, 64
ROIS = [
    {"name": "bf", "shape": "disk", "center": [30.0, 20.0], "radius": 9.5},
    {"name": "adf", "shape": "annulus", "radii": [6, 18]},
    {"name": "box", "shape": "rect", "rect": [3, 5, 41, 27]},
]
SERIES = 1  # beamd-replay's default --series-id


# ---- helpers ---------------------------------------------------------------------

def vd_stage(**kw):
    st = {"name": "vd", "kind": "roi_sum", "input": "frames", "backend": "cpu", "rois": ROIS}
    st.update(kw)
    return st


def replay_config(ports, stages, **inp):
    """A replay-mode config: beamd connects its REQ to the test's
    beamd-replay (which binds ports.ep_input) and PUSHes results."""
    cfg = make_config(ports, stages, mode="replay", push=True, pool_frames=32,
                      frame_bytes="1Mi")
    rp = {"credit": 16, "timeout": "2s"}
    for k, v in inp.items():
        (cfg["input"] if k in ("endpoint", "bind", "hwm") else rp)[k] = v
    cfg["input"]["replay"] = rp
    return cfg


def start_replay(run_tool, ports, path, *args):
    return run_tool("beamd-replay", [str(path), "--bind", ports.ep_input, "--quiet"] +
                    list(args))


def start_recorder(run_tool, ports, out_dir, *args, timeout=30):
    """beamd-record on the daemon's PUSH (lossless, dedup by frame id); it
    exits 0 after one complete series, 3 after `timeout` seconds."""
    out_dir.mkdir(exist_ok=True)
    return run_tool("beamd-record", ["--pull", "--connect", ports.ep_push, "--dir", str(out_dir),
                                     "--no-swmr", "--stats-json", "--series", "1",
                                     "--timeout", str(timeout)] + list(args))


def wait_recorder(rec, b, timeout):
    """Waits for beamd-record to finish its series; on failure the message
    holds the daemon's stats, which say where frames got stuck."""
    rc = rec.wait(timeout)
    if rc != 0:
        st = b.stats() if b.alive() else "beamd exited with %s" % b.p.returncode
        pytest.fail("beamd-record exited %d: %s\nbeamd stats: %s" %
                    (rc, rec.stderr().strip(), json.dumps(st)))


def recorder_stats(p):
    lines = [ln for ln in p.stdout().splitlines() if ln.startswith("{")]
    assert lines, "beamd-record printed no --stats-json line; stderr:\n" + p.stderr()
    return json.loads(lines[-1])


def wait_file(path, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return
        time.sleep(0.05)
    pytest.fail("%s did not appear within %.1f s (dir has %s)" %
                (path, timeout, sorted(os.listdir(os.path.dirname(path)))))


def ref_sums(frames):
    masks = roi_masks(ROIS, frames.shape[1], frames.shape[2])
    f = frames.astype(np.float64)
    return np.array([[fr[m].sum() for m in masks] for fr in f])


def check_sums(path, frames, nan_ids=()):
    """beamd-record's file holds vd.sums for every frame id exactly once,
    equal to numpy (NaN for the frames in nan_ids)."""
    with h5py.File(str(path), "r") as f:
        assert bool(f["/entry"].attrs["complete"]) is True
        g = f["/results/vd.sums"]
        ids = g["frame_id"][...]
        data = g["data"][...]
    n = frames.shape[0]
    assert len(ids) == len(set(ids.tolist())), "duplicate frame ids recorded"
    assert sorted(ids.tolist()) == list(range(n)), \
        "frame ids recorded: %d of %d, missing %s" % (len(ids), n,
                                                      sorted(set(range(n)) - set(ids.tolist()))[:20])
    ref = ref_sums(frames)
    for row, fid in zip(data, ids):
        if fid in nan_ids:
            assert np.all(np.isnan(row)), "frame %d: expected NaN sums, got %r" % (fid, row)
        else:
            assert np.array_equal(row, ref[fid]), \
                "frame %d: vd.sums %r != numpy %r" % (fid, row.tolist(), ref[fid].tolist())
    return ids


def attr(v):
    return v.decode() if isinstance(v, bytes) else v


# ---- 1. round trip ---------------------------------------------------------------

def _write_input(tmp_path, kind, n):
    """(path to replay, frames, is_master)."""
    if kind == "master":
        path, data, _ = mk.make_master(str(tmp_path / "eiger"), name="scan", nfiles=3,
                                       per_file=n // 3, shape=(H, W), kind="bslz4")
        return path, data, True
    path = tmp_path / ("%s.h5" % kind)
    return str(path), mk.make_dataset_file(str(path), kind, n=n, shape=(H, W)), False


def no_map(shm):
    """beamd-replay's options for a transport: "on" means landing slots
    only, so the server refuses to name its file."""
    return ["--no-map"] if shm == "on" else []


def check_shm(st, shm, n, in_place=0):
    """input.replay's transport: "on" with every payload landed in shared
    memory (the server ran --no-map), "nomap" the same because beamd's
    input.replay.map is false, "map" with `in_place` payloads read in place from
    the file and the rest landed, or "off" with neither."""
    rp = st["input"]["replay"]
    if shm in ("on", "nomap"):
        assert rp["shm"] == "on" and rp["shm_frames"] == n, rp
        assert rp["map"] == ("refused" if shm == "on" else "off") and rp["map_frames"] == 0, rp
    elif shm == "map":
        assert rp["shm"] == "on" and rp["map_frames"] == in_place, rp
        assert rp["shm_frames"] == n - in_place, rp
        assert rp["map"] == ("on" if in_place else "refused") and rp["map_damaged"] == 0, rp
    else:
        assert rp["shm"] == "off" and rp["shm_frames"] == 0 and rp["map_frames"] == 0, rp


@pytest.mark.parametrize("shm", ["off", "on", "map", "nomap"])
@pytest.mark.parametrize("kind,compress", [("raw", "none"), ("gzip", "bslz4"),
                                           ("bslz4", "bslz4"), ("master", "none")])
def test_round_trip_bit_exact(tmp_path, ports, start_beamd, run_tool, kind, compress, shm):
    n = 30
    path, data, master = _write_input(tmp_path, kind, n)
    rec_dir = tmp_path / "frames"
    stages = [{"name": "rec", "kind": "record", "input": "frames", "dir": str(rec_dir),
               "compress": compress, "queue": 64},
              vd_stage()]
    # nomap: input.replay.map false, so beamd never asks (the server would agree).
    b = start_beamd(replay_config(ports, stages, shm="off" if shm == "off" else "on",
                                  map=shm != "nomap"))
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    srv = start_replay(run_tool, ports, path, *no_map(shm))
    out = rec_dir / ("series_%d.h5" % SERIES)
    wait_file(str(out))
    wait_recorder(rec, b, 20)

    with h5py.File(str(out), "r") as f:
        d = f["/entry/data/data"]
        assert d.shape == data.shape and d.dtype == data.dtype
        for i in range(n):
            assert np.array_equal(d[i], data[i]), "recorded frame %d differs from the file" % i
        assert f["/entry/data/frame_id"][...].tolist() == list(range(n))
        assert bool(f["/entry"].attrs["complete"]) is True
        assert int(f["/entry"].attrs["series_id"]) == SERIES
        s = f["/series"].attrs
        assert int(s["nframes"]) == n
        assert attr(s["frame_dtype"]) == "uint16"
        assert [int(x) for x in s["frame_shape"]] == [H, W]
        assert bool(s["metadata_missing"]) is False
        meta = json.loads(attr(s["metadata_json"]))
        assert meta["source"]["file"] == os.path.abspath(path)
        assert meta["replay"]["first"] == 0 and meta["replay"]["last"] == n - 1
        if master:
            m = mk.MASTER_META
            assert attr(s["detector"]) == m["detector"]
            assert s["energy"] == pytest.approx(12398.42, rel=1e-5)
            assert s["distance"] == pytest.approx(m["distance_mm"] * 1e-3)
            assert s["frame_time"] == pytest.approx(m["frame_time_s"])
            assert np.allclose(np.atleast_1d(s["pixel_size"]), m["pixel_um"] * 1e-6)
            assert np.allclose(s["beam_center"], m["beam_center"])
            assert len(meta["source"]["data_files"]) == 3

    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data)
    rs = recorder_stats(rec)
    assert rs["duplicates"] == 0
    st = b.stats()
    inp = st["input"]
    assert inp["mode"] == "replay" and inp["frames"] == n and inp["corrupt"] == 0
    assert inp["replay"]["eof"] is True and inp["replay"]["next"] == n
    assert inp["replay"]["total"] == n and inp["replay"]["resends"] == 0
    # gzip chunks are inflated by the server; every other kind lies in the
    # file as the protocol carries it.
    check_shm(st, shm, n, in_place=0 if kind == "gzip" else n)
    if shm == "map":
        # Replayed to the end: beamd lets go of the files (a file deleted
        # after its replay frees its space).
        deadline = time.monotonic() + 3
        while str(tmp_path) in open("/proc/%d/maps" % b.p.pid).read():
            assert time.monotonic() < deadline, "beamd still maps the replayed files"
            time.sleep(0.05)
    assert b.alive() and srv.alive()


def test_series_starts_do_not_drop_frames(tmp_path, ports, start_beamd, run_tool):
    """Lossless across series: a busy stage with a short queue keeps the
    daemon asking for as many frames as the queue has room for, and every
    reply that opens a pass (a series, with --loop) carries SERIES_START
    as well. No frame may be dropped for want of room."""
    n, passes, side = 8, 10, 256
    path = tmp_path / "loop.h5"
    data = mk.make_dataset_file(str(path), "raw", n=n, shape=(side, side))
    # Many whole-frame ROIs make each frame take milliseconds, far longer
    # than a round trip, so the queue is what limits every request.
    busy = {"name": "vd", "kind": "roi_sum", "input": "frames", "backend": "cpu", "queue": 4,
            "rois": [{"name": "r%d" % i, "shape": "rect", "rect": [0, 0, side, side]}
                     for i in range(100)]}
    cfg = replay_config(ports, [busy])
    del cfg["input"]["replay"]["credit"]  # the default (64): the queue room decides
    b = start_beamd(cfg)
    out = tmp_path / "results"
    out.mkdir()
    rec = run_tool("beamd-record", ["--pull", "--connect", ports.ep_push, "--dir", str(out),
                                    "--no-swmr", "--stats-json", "--series", str(passes),
                                    "--timeout", "20"])
    start_replay(run_tool, ports, path, "--loop")
    wait_recorder(rec, b, 25)
    st = b.stats()["input"]
    assert st["dropped_busy"] == 0, "frames dropped for want of room: %s" % st
    total = float(data.astype(np.float64).sum(axis=(1, 2)).sum())
    for p in range(passes):
        with h5py.File(str(out / ("series_%d.h5" % (SERIES + p))), "r") as f:
            ids = f["/results/vd.sums/frame_id"][...].tolist()
            sums = f["/results/vd.sums/data"][...]
        assert sorted(ids) == list(range(n)), "pass %d: frame ids %s" % (p, ids)
        assert float(sums[:, 0].sum()) == total, "pass %d: sums differ from numpy" % p


def test_ready_line_names_replay_mode(tmp_path, ports, start_beamd):
    """The start-up line tells an operator which input mode runs."""
    b = start_beamd(replay_config(ports, [vd_stage()]))
    line = b.wait_log(r"^.* ready: config .*$", timeout=2).group(0)
    assert ", input replay %s (connect)," % ports.ep_input in line, line


# ---- 2. kill -9 and resume -------------------------------------------------------

@pytest.mark.parametrize("shm", ["off", "on", "map"])
def test_daemon_kill9_resumes_exactly_once(tmp_path, ports, start_beamd, run_tool, shm):
    """With shm on, the restarted daemon offers a new landing area (a new
    memfd) and the server, which mapped the dead daemon's, maps the new one.
    With map, the restarted daemon maps the file afresh."""
    n, rate = 240, 80  # about 3 s of replay; the kill lands after about 1 s
    path = tmp_path / "slow.h5"
    data = mk.make_dataset_file(str(path), "bslz4", n=n, shape=(H, W))
    state = tmp_path / "replay.state"
    cfg = replay_config(ports, [vd_stage()], state_file=str(state), commit_delay="0.3s",
                        timeout="1s", shm="on" if shm == "map" else shm)
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    srv = start_replay(run_tool, ports, path, "--rate", str(rate), *no_map(shm))
    b1 = start_beamd(cfg)
    st = b1.wait_stats(lambda s: (s["input"]["replay"]["committed"] or 0) >= 40, timeout=15,
                       what="40 frames committed to the state file")
    assert st["input"]["frames"] < n, "the replay finished before the kill: slow it down"
    b1.p.send_signal(signal.SIGKILL)
    b1.p.wait(timeout=5)
    saved = json.loads(state.read_text())
    assert 0 < saved["next"] < n, saved

    b2 = start_beamd(cfg, name="beamd2")
    m = b2.wait_log(r"resuming .* at frame index (\d+) of (\d+)", timeout=5)
    k, total = int(m.group(1)), int(m.group(2))
    assert total == n and k >= saved["next"] and 0 < k < n, (k, saved)
    wait_recorder(rec, b2, 25)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data)
    st2 = b2.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")
    # The second daemon started at k: it was given only the rest of the file.
    assert st2["input"]["frames"] == n - k, (st2["input"]["frames"], n, k)
    assert st2["input"]["replay"]["next"] == n
    check_shm(st2, shm, n - k, in_place=n - k)
    rs = recorder_stats(rec)
    print("daemon killed at %d frames in, committed %d, resumed at %d; recorder: %s" %
          (st["input"]["frames"], saved["next"], k, rs))
    # The restart asked for SERIES_START again (start: true) and re-sent the
    # frames processed after the last commit; the recorder kept one copy.
    assert rs["dup_starts"] == 1 and rs["duplicates"] > 0, rs
    assert rs["results"] == rs["written"] + rs["duplicates"], rs
    assert srv.alive()


@pytest.mark.parametrize("shm", ["off", "on", "map"])
def test_server_kill9_request_resent(tmp_path, ports, start_beamd, run_tool, shm):
    """With shm on, the request in flight at the kill keeps its landing
    slots reserved and the resend offers the same ones to the new server.
    With map, the new server names the file by another pid: mapped anew."""
    n, rate = 200, 80
    path = tmp_path / "slow.h5"
    data = mk.make_dataset_file(str(path), "raw", n=n, shape=(H, W))
    cfg = replay_config(ports, [vd_stage()], timeout="1s", shm="on" if shm == "map" else shm)
    b = start_beamd(cfg)
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    srv = start_replay(run_tool, ports, path, "--rate", str(rate), *no_map(shm))
    b.wait_stats(lambda s: s["input"]["frames"] >= 40, timeout=15, what="40 frames in")
    srv.p.send_signal(signal.SIGKILL)
    srv.p.wait(timeout=5)
    got = b.stats()["input"]["frames"]
    assert got < n, "the replay finished before the kill: slow it down"
    time.sleep(1.5)  # longer than input.replay.timeout: the daemon asks again into the void
    srv2 = start_replay(run_tool, ports, path, "--rate", str(rate), *no_map(shm))
    wait_recorder(rec, b, 25)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data)
    st = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")
    # The daemon never restarted, so nothing was delivered twice.
    assert st["input"]["frames"] == n
    assert st["input"]["replay"]["resends"] >= 1
    check_shm(st, shm, n, in_place=n)
    assert re.search(r"replay: no answer from .* asking again", b.stderr())
    assert recorder_stats(rec)["duplicates"] == 0
    assert srv2.alive()


@pytest.mark.parametrize("server_shm", [True, False])
def test_shm_auto_over_ipc(tmp_path, ports, start_beamd, run_tool, server_shm):
    """input.replay.shm auto (the default) uses shared memory for an ipc://
    endpoint; a server started with --no-shm refuses it, the daemon logs
    why once and every frame still arrives, inline."""
    n = 40
    path = tmp_path / "r.h5"
    data = mk.make_dataset_file(str(path), "raw", n=n, shape=(H, W))
    ep = "ipc://%s/replay.ipc" % tmp_path
    cfg = replay_config(ports, [vd_stage()])
    cfg["input"]["endpoint"] = ep
    b = start_beamd(cfg)
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    run_tool("beamd-replay", [str(path), "--bind", ep, "--quiet", "--no-map"] +
             ([] if server_shm else ["--no-shm"]))
    wait_recorder(rec, b, 20)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data)
    rp = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")["input"]["replay"]
    if server_shm:
        assert rp["shm"] == "on" and rp["shm_frames"] == n, rp
    else:
        assert rp["shm"] == "refused" and rp["shm_frames"] == 0, rp
        logs = re.findall(r"does not use shared memory \((.*)\)", b.stderr())
        assert len(logs) == 1 and "--no-shm" in logs[0], b.stderr()


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_pipelined_requests_short_replies(tmp_path, ports, start_beamd, run_tool, depth):
    """input.replay.depth requests in flight: with a rate-limited server every
    reply is short, so the requests pipelined after it asked for the wrong
    range; their replies are discarded and asked for again, and every
    frame still arrives exactly once, in order. With depth 1 nothing is
    ever discarded."""
    n = 120
    path = tmp_path / "r.h5"
    data = mk.make_dataset_file(str(path), "raw", n=n, shape=(H, W))
    b = start_beamd(replay_config(ports, [vd_stage()], depth=depth, shm="on"))
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    start_replay(run_tool, ports, path, "--rate", "400", "--no-map")
    wait_recorder(rec, b, 20)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data)
    st = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")
    rp = st["input"]
    assert rp["frames"] == n and rp["dropped_busy"] == 0, rp
    assert rp["replay"]["shm_frames"] == n and rp["replay"]["inflight"] == 0, rp["replay"]
    if depth == 1:
        assert rp["replay"]["discarded"] == 0, rp["replay"]
    print("depth %d: %d requests, %d replies, %d discarded" %
          (depth, rp["replay"]["requests"], rp["replay"]["replies"], rp["replay"]["discarded"]))
    assert recorder_stats(rec)["duplicates"] == 0


def test_pipelined_long_replay_does_not_stall(tmp_path, ports, start_beamd, run_tool):
    """Requests sent from outside the read loop (room coming back, a
    timeout) may take in a reply without ZMQ_FD ever signalling it: the
    replay input must look after every send, or it waits for a reply that
    is already in its queue, until the timeout, again and again. Found by
    bench/replay.py with this shape of run (512x512 bslz4 frames into a
    record stage, pipelined, through the landing area); without the check
    this test stalled within its first pass when tried."""
    import h5py as h5
    n, passes, side = 512, 3, 512
    path = tmp_path / "b.h5"
    rng = np.random.default_rng(3)
    bank = rng.poisson(2.0, (8, side, side)).astype(np.uint16)
    with h5.File(str(path), "w") as f:  # 8 distinct frames repeated: quick to write
        d = f.create_dataset("/entry/data/data", (n, side, side), "uint16",
                             chunks=(1, side, side), compression=mk.BSHUF_ID,
                             compression_opts=(0, 2))
        for i in range(n):
            d[i] = bank[i % 8]
    rec_dir = tmp_path / "frames"
    stages = [{"name": "rec", "kind": "record", "input": "frames", "dir": str(rec_dir),
               "queue": 72}]
    cfg = replay_config(ports, stages, shm="on", timeout="30s", credit=32)
    cfg["pool"].update({"frames": 64, "frame_bytes": "1Mi"})
    b = start_beamd(cfg)
    start_replay(run_tool, ports, path, "--loop")
    for p in range(passes):
        wait_file(str(rec_dir / ("series_%d.h5" % (SERIES + p))), timeout=25)
    rp = b.stats()["input"]["replay"]
    assert rp["resends"] == 0, rp


class FakeServer:
    """A replay server in Python (PROTOCOL.md 13) on `ep`, serving `frames`
    as series SERIES, for the cases beamd-replay never produces. It answers
    "info" itself and wraps every "get" reply in the status, SERIES_START
    (at k = 0 or when asked) and SERIES_END; `frames_for(req, k, frame)`
    returns (k2, the FRAME parts of k..k2-1, extra status keys), where
    frame(i) encodes FRAME i with the next sequence number."""

    def __init__(self, zctx, ep, frames, frames_for):
        import threading
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools",
                                        "python"))
        from beamd import proto
        self.proto, self.frames, self.frames_for = proto, frames, frames_for
        self.sock = zctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ep)
        self.seq = 0
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._serve, daemon=True)
        self.th.start()

    def _msg(self, kind, **kw):
        self.seq += 1
        return self.proto.encode_message(kind, seq=self.seq - 1, series_id=SERIES, **kw)

    def _serve(self):
        n, P = len(self.frames), self.proto
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            req = json.loads(self.sock.recv())
            st = {"ok": True, "total": n, "loop": False, "series_id": SERIES, "file": "fake",
                  "file_id": "fake", "corrupt": 0, "id": req.get("id")}
            if req["op"] == "info":
                st.update(op="info", count=0, next=0, eof=False, dtype="uint16", shape=[H, W])
                self.sock.send_json(st)
                continue
            k, msgs = req["next"], []
            if k == 0 or req.get("start"):
                msgs += self._msg(P.SERIES_START, shape=(H, W), dtype="uint16")
            k2, parts, extra = self.frames_for(
                req, k, lambda i: self._msg(P.FRAME, frame_id=i, array=self.frames[i]))
            msgs += parts
            if k2 == n:
                msgs += self._msg(P.SERIES_END, frame_id=n, shape=(H, W), dtype="uint16")
            st.update(extra, next=k2, count=k2 - k, eof=k2 == n)
            self.sock.send_multipart([json.dumps(st).encode()] + msgs)

    def close(self):
        self.stop.set()
        self.th.join(timeout=5)


def test_reply_beyond_offered_slots_is_refused(tmp_path, ports, start_beamd, run_tool, zctx):
    """A server (here a Python one) whose reply claims more landed frames
    than the request offered slots: the frames up to the last offered slot
    are taken, the bad message is counted as malformed and logged, and the
    rest is asked for again, so every frame still arrives exactly once,
    with the right pixels."""
    n = 24
    frames = (np.arange(n * H * W, dtype=np.uint16) % 1021).reshape(n, H, W)
    bad_sent = []

    def land(req, k, frame):
        shm = req["shm"]
        # The first reply lands one frame more than it was offered slots for.
        extra = 0 if bad_sent else 1
        k2 = min(n, k + len(shm["slots"]) + extra)
        msgs = []
        fd = os.open(shm["path"], os.O_RDWR)
        for i in range(k, k2):
            parts = frame(i)
            if i - k < len(shm["slots"]):  # the extra one has no slot to be in
                os.pwrite(fd, parts[1], shm["slots"][i - k] * shm["slot_bytes"])
            msgs += [parts[0], b""]
        os.close(fd)
        bad_sent.append(extra)
        return k2, msgs, {"shm": True}

    srv = FakeServer(zctx, ports.ep_input, frames, land)
    try:
        b = start_beamd(replay_config(ports, [vd_stage()], shm="on", depth=1))
        rec = start_recorder(run_tool, ports, tmp_path / "results")
        wait_recorder(rec, b, 20)
        check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), frames)
        inp = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")["input"]
        assert inp["malformed"] == 1 and inp["frames"] == n, inp
        assert re.search(r"has a landing slot it was not offered, or a payload larger than a "
                         r"slot, at part \d+; the rest of the reply is skipped", b.stderr())
    finally:
        srv.close()


def test_file_truncated_during_replay(tmp_path, ports, start_beamd, run_tool):
    """A file cut short by another program while beamd reads it in place:
    the server sends the frames past the new end CORRUPT, naming the cut
    (HDF5 alone would read them as zeros), beamd survives frames it had
    mapped already (what lay past the end reads as zeros, reported) and
    every frame id still comes through exactly once."""
    n = 200
    path = tmp_path / "cut.h5"
    mk.make_dataset_file(str(path), "raw", n=n, shape=(H, W))
    b = start_beamd(replay_config(ports, [vd_stage()], shm="on", credit=32))
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    srv = start_replay(run_tool, ports, path, "--rate", "100")
    cut = os.path.getsize(str(path)) // 3
    with h5py.File(str(path), "r") as f:
        d = f["/entry/data/data"]
        ends = [d.id.get_chunk_info(k).byte_offset + d.id.get_chunk_info(k).size
                for k in range(n)]
    beyond = [k for k in range(n) if ends[k] > cut]
    b.wait_stats(lambda s: s["input"]["frames"] >= 40, timeout=15, what="40 frames in")
    os.truncate(str(path), cut)
    wait_recorder(rec, b, 25)
    with h5py.File(str(tmp_path / "results" / ("series_%d.h5" % SERIES)), "r") as f:
        ids = f["/results/vd.sums/frame_id"][...]
        sums = f["/results/vd.sums/data"][...]
    assert sorted(ids.tolist()) == list(range(n))
    inp = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")["input"]
    assert inp["frames"] == n, inp
    # Frames sent after the cut and past it are CORRUPT (NaN sums); those
    # before it are intact.
    assert 0 < inp["corrupt"] <= len(beyond), (inp["corrupt"], len(beyond))
    nan = {int(i) for i, row in zip(ids, sums) if np.all(np.isnan(row))}
    assert len(nan) == inp["corrupt"] and min(nan) >= beyond[0], sorted(nan)[:5]
    print("cut at frame %d: %d CORRUPT, map %s, %d read in place, %d mappings zero-filled; "
          "log: %s" % (beyond[0], inp["corrupt"], inp["replay"]["map"],
                       inp["replay"]["map_frames"], inp["replay"]["map_damaged"],
                       re.findall(r"(shrank.*|cannot read frames in place.*)", b.stderr())))
    assert b.alive() and srv.alive()


def test_unreadable_file_reference_falls_back(tmp_path, ports, start_beamd, run_tool, zctx):
    """A server (here a Python one) that names, for reading in place, a file
    beamd must not map (not HDF5): beamd takes nothing from that reply,
    says why once, stops asking for "map" and asks for the frames again;
    they come inline and every frame arrives once, with its pixels."""
    n = 20
    frames = (np.arange(n * H * W, dtype=np.uint16) % 1021).reshape(n, H, W)
    plain = tmp_path / "plain.bin"
    plain.write_bytes(frames.tobytes())
    pfd = os.open(str(plain), os.O_RDONLY)
    asked = []

    def in_place(req, k, frame):
        asked.append(bool(req.get("map")))
        k2 = min(n, k + req["credit"])
        msgs = []
        for i in range(k, k2):
            parts = frame(i)
            msgs += [parts[0], b""] if asked[-1] else parts
        if not asked[-1]:
            return k2, msgs, {}
        return k2, msgs, {"map": {"files": [{"path": "/proc/%d/fd/%d" % (os.getpid(), pfd),
                                             "name": str(plain)}],
                                  "at": [[0, i * H * W * 2] for i in range(k, k2)]}}

    srv = FakeServer(zctx, ports.ep_input, frames, in_place)
    try:
        b = start_beamd(replay_config(ports, [vd_stage()], shm="on", depth=1))
        rec = start_recorder(run_tool, ports, tmp_path / "results")
        wait_recorder(rec, b, 20)
        check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), frames)
        inp = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")["input"]
        rp = inp["replay"]
        assert inp["frames"] == n and inp["malformed"] == 0, inp
        assert rp["map"] == "failed" and rp["map_frames"] == 0, rp
        assert "not an HDF5 file" in rp["map_error"], rp
        assert asked[0] is True and not any(asked[1:]), asked
        logs = re.findall(r"cannot read frames in place \((.*)\)", b.stderr())
        assert len(logs) == 1 and "not an HDF5 file" in logs[0], b.stderr()
        assert recorder_stats(rec)["duplicates"] == 0
    finally:
        srv.close()
        os.close(pfd)


def test_server_echoes_request_id(tmp_path, run_tool, zctx):
    """The id a pipelining consumer matches replies by comes back in the
    status of get, info and error replies alike."""
    path = tmp_path / "r.h5"
    mk.make_dataset_file(str(path), "raw", n=3, shape=(H, W))
    ep = "ipc://%s/id.ipc" % tmp_path
    run_tool("beamd-replay", [str(path), "--bind", ep, "--quiet"])
    s = zctx.socket(zmq.REQ)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(ep)
    for req in ({"op": "info", "id": 7}, {"op": "get", "next": 0, "credit": 2, "id": 8},
                {"op": "get", "next": 99, "credit": 2, "id": 9}):
        s.send_json(req)
        st = json.loads(s.recv_multipart()[0])
        assert st["id"] == req["id"], (req, st)
    s.send_json({"op": "info"})
    assert "id" not in json.loads(s.recv_multipart()[0])
    s.close()


def test_decode_threads(tmp_path, ports, start_beamd, run_tool):
    """pool.decode_threads: bslz4 frames decoded ahead of the stages by a
    decode pool give the same exact sums (a corrupt chunk still NaN), the
    pool did decode (decoded_ahead), and a record stage beside it still
    stores every good frame as it came (the decode keeps the wire bytes)."""
    n, bad = 60, (11,)
    path = tmp_path / "c.h5"
    data = mk.make_corrupt(str(path), "bslz4", n=n, bad=bad, shape=(H, W))
    rec_dir = tmp_path / "frames"
    stages = [vd_stage(), {"name": "rec", "kind": "record", "input": "frames",
                           "dir": str(rec_dir), "queue": 64}]
    cfg = replay_config(ports, stages, shm="on")
    cfg["pool"]["decode_threads"] = 2
    b = start_beamd(cfg)
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    start_replay(run_tool, ports, path)
    wait_recorder(rec, b, 20)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data, nan_ids=bad)
    out = rec_dir / ("series_%d.h5" % SERIES)
    wait_file(str(out.with_suffix(".h5")))
    st = b.wait_stats(lambda s: s["input"]["replay"]["eof"] and
                      all(x["frames_in"] == n for x in s["stages"]), timeout=5, what="eof")
    assert st["input"]["decoded_ahead"] > 0, st["input"]
    rs = {x["name"]: x for x in st["stages"]}
    assert rs["rec"]["passthrough"] == n - len(bad), rs["rec"]
    with h5py.File(str(out), "r") as f:
        ids = f["/entry/data/frame_id"][...].tolist()
        assert ids == [i for i in range(n) if i not in bad]
        for row, i in enumerate(ids):
            assert np.array_equal(f["/entry/data/data"][row], data[i]), "frame %d" % i
    print("decoded ahead: %d of %d" % (st["input"]["decoded_ahead"], n))


# ---- 3. damaged input ------------------------------------------------------------

def test_corrupt_count_adds_over_replies(tmp_path, ports, start_beamd, run_tool):
    """Corrupt frames spread over many replies (credit 4) are all counted:
    input.corrupt is the sum over replies, not the last reply's count."""
    n = 60
    bad = tuple(range(1, n, 2))
    path = tmp_path / "corrupt_many.h5"
    data = mk.make_corrupt(str(path), "bslz4", n=n, bad=bad, shape=(H, W))
    b = start_beamd(replay_config(ports, [vd_stage()], shm="off", credit=4))
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    start_replay(run_tool, ports, path)
    wait_recorder(rec, b, 20)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data, nan_ids=bad)
    st = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")
    assert st["input"]["corrupt"] == len(bad), st["input"]
    assert st["input"]["replay"]["corrupt"] == len(bad), st["input"]["replay"]
    assert st["input"]["frames"] == n
    assert re.search(r"served completely \(%d frames, %d corrupt\)" % (n, len(bad)),
                     b.stderr()), b.stderr()[-2000:]
    time.sleep(0.3)  # /metrics is rendered at each heartbeat
    c = http.client.HTTPConnection("127.0.0.1", ports.metrics, timeout=3)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    val = {k: float(v) for k, v in re.findall(r"^(beamd_[a-z_]+) (\S+)$", body, re.M)}
    assert val["beamd_input_corrupt_total"] == len(bad)
    assert val["beamd_input_progress_frames"] == n and val["beamd_input_expected_frames"] == n


@pytest.mark.parametrize("shm", ["off", "on", "map"])
@pytest.mark.parametrize("kind", ["bslz4", "gzip"])
def test_corrupt_chunk_counted_and_nan(tmp_path, ports, start_beamd, run_tool, kind, shm):
    """A corrupt chunk is found by the server also when the frames around it
    are read in place (it checks their framing from its own mapping)."""
    n, bad = 12, (3, 7)
    path = tmp_path / ("corrupt_%s.h5" % kind)
    data = mk.make_corrupt(str(path), kind, n=n, bad=bad, shape=(H, W))
    b = start_beamd(replay_config(ports, [vd_stage()], shm="on" if shm == "map" else shm))
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    start_replay(run_tool, ports, path, *no_map(shm))
    wait_recorder(rec, b, 20)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data, nan_ids=bad)
    st = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")
    assert st["input"]["corrupt"] == len(bad)
    assert st["input"]["frames"] == n
    # Corrupt frames travel inline (their error text); the rest landed, or
    # were read in place (bslz4; gzip is inflated by the server).
    good = n - len(bad)
    check_shm(st, shm, good, in_place=good if kind == "bslz4" else 0)


def test_bad_lz4_block_decoded_on_stage_thread(tmp_path, ports, start_beamd, run_tool):
    """A bslz4 chunk whose framing is sound but whose LZ4 block is garbage
    passes beamd-replay's framing check and is forwarded compressed; beamd
    decodes it lazily on the roi_sum thread (pipeline/frame.h), where the
    decode fails: that frame is processed as CORRUPT (NaN sums) and counted
    as a stage error naming the reason, every other frame is exact."""
    n, bad = 10, 4
    path = tmp_path / "badblock.h5"
    data = mk.make_dataset_file(str(path), "bslz4", n=n, shape=(H, W))
    with h5py.File(str(path), "r+") as f:
        d = f["/entry/data/data"]
        mask, chunk = d.id.read_direct_chunk((bad, 0, 0))
        # 12-byte header, then one block (H*W*2 bytes < the 8 KiB default
        # block): a 4-byte big-endian size and the LZ4 bytes, here all 0xff,
        # a literal run longer than the block.
        size = int.from_bytes(chunk[12:16], "big")
        assert 16 + size == len(chunk)
        d.id.write_direct_chunk((bad, 0, 0), chunk[:16] + b"\xff" * size, mask)
    b = start_beamd(replay_config(ports, [vd_stage()]))
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    start_replay(run_tool, ports, path)
    wait_recorder(rec, b, 20)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data, nan_ids=(bad,))
    st = b.wait_stats(lambda s: s["input"]["replay"]["eof"], timeout=5, what="eof")
    assert st["input"]["frames"] == n and st["input"]["corrupt"] == 0
    vd = [x for x in st["stages"] if x["name"] == "vd"][0]
    assert vd["errors"] == 1, vd
    assert re.search(r'stage "vd" series %d frame %d: undecodable payload' % (SERIES, bad),
                     b.stderr())


def test_missing_file_named(tmp_path, ports, run_tool):
    p = start_replay(run_tool, ports, tmp_path / "no_such_scan.h5")
    assert p.wait(10) != 0
    assert "no_such_scan.h5" in p.stderr()


# ---- 4. a stuck viewer ---------------------------------------------------------------

def _timed_replay(tmp_path, ports, start_beamd, run_tool, zctx, path, n, stuck, tag):
    """Seconds from starting beamd-replay to beamd-record holding the whole
    series, and the daemon's stats."""
    stages = [vd_stage(), {"name": "img", "kind": "bin", "input": "frames", "backend": "cpu",
                           "factor": 1}]
    cfg = replay_config(ports, stages)  # output.hwm: the default (1000)
    b = start_beamd(cfg, name="beamd-" + tag)
    viewer = None
    if stuck:
        viewer = zctx.socket(zmq.SUB)
        viewer.setsockopt(zmq.LINGER, 0)
        viewer.setsockopt(zmq.RCVHWM, 2)
        viewer.setsockopt(zmq.RCVBUF, 64 * 1024)
        viewer.setsockopt(zmq.SUBSCRIBE, b"")
        viewer.connect(ports.ep_publish)
        time.sleep(0.5)  # the join; the viewer then never calls recv
    out = tmp_path / ("results-" + tag)
    rec = start_recorder(run_tool, ports, out, timeout=12)
    time.sleep(0.3)
    t0 = time.monotonic()
    srv = start_replay(run_tool, ports, path)
    wait_recorder(rec, b, 17)
    dt = time.monotonic() - t0
    st = b.stats()
    b.kill()
    srv.kill()
    seen = None
    if viewer is not None:
        # What the viewer can still read: its small queue and what the
        # kernel buffered, far less than was published if it was stuck.
        seen = 0
        while viewer.poll(300):
            viewer.recv_multipart()
            seen += 1
        viewer.close()
    return dt, st, out, seen


def test_stuck_viewer_does_not_slow_replay(tmp_path, ports, start_beamd, run_tool, zctx):
    n, shape = 300, (256, 256)
    path = tmp_path / "big.h5"
    with h5py.File(str(path), "w") as f:
        rng = np.random.default_rng(5)
        f.create_dataset("/entry/data/data", data=rng.poisson(3.0, (n,) + shape).astype(np.uint16),
                         chunks=(1,) + shape)
    free_dt, free_st, _, _ = _timed_replay(tmp_path, ports, start_beamd, run_tool, zctx, path,
                                           n, False, "free")
    stuck_dt, stuck_st, out, seen = _timed_replay(tmp_path, ports, start_beamd, run_tool, zctx,
                                                  path, n, True, "stuck")
    with h5py.File(str(out / ("series_%d.h5" % SERIES)), "r") as f:
        assert sorted(f["/results/vd.sums/frame_id"][...].tolist()) == list(range(n))
    assert free_st["input"]["frames"] == n and stuck_st["input"]["frames"] == n
    published = stuck_st["outputs"]["publish"]["messages"]
    print("replay of %d frames: %.2f s free, %.2f s with a stuck viewer (it can read %d of %d "
          "published messages)" % (n, free_dt, stuck_dt, seen, published))
    # The viewer really was stuck: most of what was published never reached it.
    assert seen < published // 2, (seen, published)
    assert stuck_dt < 1.5 * free_dt + 1.0, \
        "replay took %.2f s with a stuck viewer, %.2f s without" % (stuck_dt, free_dt)


# ---- 5. exit_on_eof ------------------------------------------------------------------

def test_exit_on_eof_and_state(tmp_path, ports, start_beamd, run_tool):
    n = 40
    path = tmp_path / "batch.h5"
    data = mk.make_dataset_file(str(path), "lz4", n=n, shape=(H, W))
    state = tmp_path / "batch.state"
    cfg = replay_config(ports, [vd_stage()], state_file=str(state), commit_delay="0.3s",
                        exit_on_eof=True)
    b = start_beamd(cfg)
    rec = start_recorder(run_tool, ports, tmp_path / "results")
    start_replay(run_tool, ports, path)
    assert b.wait(20) == 0, b.stderr()
    assert "exit_on_eof" in b.stderr()
    saved = json.loads(state.read_text())
    assert saved["next"] == n, saved
    assert saved["file"] == os.path.abspath(str(path))
    wait_recorder(rec, b, 10)
    check_sums(tmp_path / "results" / ("series_%d.h5" % SERIES), data)
