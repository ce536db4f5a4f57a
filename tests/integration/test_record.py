"""beamd-record fed with result streams made in Python, files checked with h5py.

Every test binds a PUSH (or XPUB) socket on a free loopback port, starts
beamd-record connected to it, sends SERIES_START / RESULT / SERIES_END
messages encoded with tools/python/beamd/proto.py (the independent twin of
proto/), and then reads the HDF5 files back: layout and attributes
(docs/recording.md), every/latest modes, duplicate skipping, the .partial
rename, aborted series, late subscribers, write errors, SWMR readers while the
recorder writes, compression round trips and the signal shutdown. Every wait
has a deadline; each test takes a few seconds.
"""
import json
import os
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest
import zmq

from conftest import binary, free_ports, proto

DESC_SUMS = {"stage": "vd", "output": "sums", "kind": "roi_sum", "dtype": "float32",
             "shape": [3], "units": "counts", "axes": ["roi"], "per_frame": True,
             "labels": {"roi": ["bf", "adf", "corner"]}}
DESC_PREV = {"stage": "prev", "output": "frame", "kind": "preview", "dtype": "uint16",
             "shape": [4, 5], "units": "counts/pixel", "axes": ["y", "x"], "per_frame": False}
SERIES_META = {"detector": "sim", "frame_time": 0.001, "nframes": 10, "energy": 12000.0,
               "pixel_size": [7.5e-5, 7.5e-5], "scan": {"positions": [[0, 0], [1, 0]]},
               "operator": "test", "dark_applied": True}


class Feed:
    """The test's beamd output: PUSH (recorder --pull) or XPUB (recorder SUB)."""

    def __init__(self, zctx, kind=zmq.PUSH):
        self.port = free_ports(1)[0]
        self.ep = "tcp://127.0.0.1:%d" % self.port
        self.sock = zctx.socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDTIMEO, 10000)
        self.sock.bind(self.ep)
        self.kind = kind
        self.seq = 0

    def wait_subscriber(self):
        self.sock.setsockopt(zmq.RCVTIMEO, 5000)
        assert self.sock.recv()[:1] == b"\x01"

    def send(self, type, **kw):
        parts = proto.encode_message(type, seq=self.seq, **kw)
        self.seq += 1
        self.sock.send_multipart(parts)

    def start(self, sid, meta=SERIES_META, shape=(4, 5)):
        self.send(proto.SERIES_START, series_id=sid, shape=shape, dtype="uint16", meta=meta,
                  topic="beamd.series")

    def end(self, sid, flags=0, meta=None):
        self.send(proto.SERIES_END, series_id=sid, flags=flags, topic="beamd.series", meta=meta)

    def result(self, topic, sid, fid, array, desc=None, flags=0, codec="raw"):
        self.send(proto.RESULT, topic=topic, series_id=sid, frame_id=fid, array=array,
                  meta=desc, flags=flags, t_acq_ns=1000 + fid, codec=codec)


def sums(fid):
    return np.array([fid, 2 * fid, 3 * fid + 0.5], np.float32)


def prev(fid):
    return (np.arange(20, dtype=np.uint16).reshape(4, 5) + fid).astype(np.uint16)


@pytest.fixture
def recorder(tmp_path, procs):
    """recorder(feed, *args) -> Proc writing into tmp_path/out."""
    from conftest import Proc
    out = tmp_path / "out"
    out.mkdir()

    def start(feed, *args, dir=None):
        argv = [binary("beamd-record"), "--connect", feed.ep, "--dir", str(dir or out),
                "--stats-json"]
        if feed.kind == zmq.PUSH:
            argv.append("--pull")
        p = Proc("beamd-record", argv + list(args), tmp_path, procs)
        p.out_dir = dir or out
        return p
    return start


def stats_of(p):
    lines = [l for l in p.stdout().splitlines() if l.startswith("{")]
    assert lines, "no --stats-json line; stderr:\n" + p.stderr()
    return json.loads(lines[-1])


def wait_file(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return
        time.sleep(0.02)
    pytest.fail("%s did not appear within %.1f s (dir has %s)" %
                (path, timeout, os.listdir(os.path.dirname(path))))


def s(v):
    return v.decode() if isinstance(v, bytes) else v


def test_every_layout_and_attributes(zctx, recorder):
    feed = Feed(zctx)
    p = recorder(feed, "--series", "1", "--timeout", "15")
    feed.start(7)
    for fid in range(10):
        feed.result("vd.sums", 7, fid, sums(fid), DESC_SUMS if fid == 0 else None,
                    flags=proto.FLAG_FINAL if fid == 9 else 0)
        feed.result("prev.frame", 7, fid, prev(fid), DESC_PREV if fid == 0 else None)
    feed.end(7)
    assert p.wait(15) == 0, p.stderr()
    path = os.path.join(p.out_dir, "series_7.h5")
    assert os.path.exists(path) and not os.path.exists(path + ".partial")
    with h5py.File(path, "r") as f:
        e = f["/entry"]
        assert bool(e.attrs["complete"]) is True
        assert e.attrs["series_id"] == 7
        assert e.attrs["results_written"] == 20
        ser = f["/series"]
        assert s(ser.attrs["detector"]) == "sim"
        assert ser.attrs["nframes"] == 10 and ser.attrs["energy"] == 12000.0
        assert list(ser.attrs["pixel_size"]) == [7.5e-5, 7.5e-5]
        assert json.loads(s(ser.attrs["scan"])) == {"positions": [[0, 0], [1, 0]]}
        assert bool(ser.attrs["dark_applied"]) is True
        assert bool(ser.attrs["metadata_missing"]) is False
        assert json.loads(s(ser.attrs["metadata_json"])) == SERIES_META
        assert list(ser.attrs["frame_shape"]) == [4, 5] and s(ser.attrs["frame_dtype"]) == "uint16"
        d = f["/results/vd.sums/data"]
        assert d.shape == (10, 3) and d.dtype == np.float32 and d.maxshape == (None, 3)
        assert d.chunks == (1, 3)
        np.testing.assert_array_equal(d[...], np.stack([sums(i) for i in range(10)]))
        assert list(f["/results/vd.sums/frame_id"][...]) == list(range(10))
        assert list(f["/results/vd.sums/t_acq_ns"][...]) == [1000 + i for i in range(10)]
        fl = f["/results/vd.sums/flags"][...]
        assert fl[9] & proto.FLAG_FINAL and not fl[0] & proto.FLAG_FINAL
        assert s(d.attrs["stage"]) == "vd" and s(d.attrs["output"]) == "sums"
        assert s(d.attrs["units"]) == "counts" and s(d.attrs["dtype"]) == "float32"
        assert [s(a) for a in d.attrs["axes"]] == ["roi"]
        assert json.loads(s(d.attrs["labels"])) == {"roi": ["bf", "adf", "corner"]}
        assert bool(d.attrs["per_frame"]) is True
        assert s(f["/results/vd.sums"].attrs["mode"]) == "every"
        pv = f["/results/prev.frame/data"]
        assert pv.shape == (10, 4, 5) and pv.dtype == np.uint16 and pv.chunks == (1, 4, 5)
        np.testing.assert_array_equal(pv[3], prev(3))
        assert [s(a) for a in pv.attrs["axes"]] == ["y", "x"]
    st = stats_of(p)
    assert st["written"] == 20 and st["series_complete"] == 1 and st["duplicates"] == 0


def test_incomplete_series_says_what_it_lost(zctx, recorder):
    """An INCOMPLETE SERIES_END (frames lost upstream, PROTOCOL.md) leaves
    the count in the file: /entry@missing_frames, beside complete (the
    series did end) and results_written; a clean end has no such count."""
    feed = Feed(zctx)
    p = recorder(feed, "--series", "2", "--timeout", "15")  # the aborted one does not count
    feed.start(7)
    for fid in (0, 1, 2, 5, 6):
        feed.result("vd.sums", 7, fid, sums(fid), DESC_SUMS if fid == 0 else None,
                    flags=proto.FLAG_INCOMPLETE if fid >= 5 else 0)
    feed.end(7, flags=proto.FLAG_INCOMPLETE, meta={"missing_frames": 2})
    feed.start(8)
    feed.result("vd.sums", 8, 0, sums(0), DESC_SUMS)
    feed.end(8, flags=proto.FLAG_INCOMPLETE | proto.FLAG_ABORTED, meta={"missing_frames": 9})
    feed.start(9)
    feed.result("vd.sums", 9, 0, sums(0), DESC_SUMS)
    feed.end(9)
    assert p.wait(15) == 0, p.stderr()
    with h5py.File(os.path.join(p.out_dir, "series_7.h5"), "r") as f:
        e = f["/entry"]
        assert bool(e.attrs["complete"]) is True and e.attrs["results_written"] == 5
        assert e.attrs["missing_frames"] == 2
        assert list(f["/results/vd.sums/frame_id"][...]) == [0, 1, 2, 5, 6]
    with h5py.File(os.path.join(p.out_dir, "series_8.h5.partial"), "r") as f:
        assert bool(f["/entry"].attrs["complete"]) is False
        assert f["/entry"].attrs["missing_frames"] == 9
    with h5py.File(os.path.join(p.out_dir, "series_9.h5"), "r") as f:
        assert "missing_frames" not in f["/entry"].attrs


def test_latest_mode(zctx, recorder):
    feed = Feed(zctx)
    p = recorder(feed, "--latest", "prev.", "--series", "1", "--timeout", "15")
    feed.start(1)
    for fid in range(6):
        feed.result("vd.sums", 1, fid, sums(fid), DESC_SUMS if fid == 0 else None)
        feed.result("prev.frame", 1, fid, prev(fid), DESC_PREV if fid == 0 else None)
    feed.end(1)
    assert p.wait(15) == 0, p.stderr()
    with h5py.File(os.path.join(p.out_dir, "series_1.h5"), "r") as f:
        g = f["/results/prev.frame"]
        assert s(g.attrs["mode"]) == "latest"
        assert g["data"].shape == (4, 5)
        np.testing.assert_array_equal(g["data"][...], prev(5))
        assert g["frame_id"][()] == 5 and g["t_acq_ns"][()] == 1005
        assert g.attrs["results"] == 6
        assert f["/results/vd.sums/data"].shape == (6, 3)  # not matched: every

    feed2 = Feed(zctx)
    p2 = recorder(feed2, "--mode", "latest", "--series", "1", "--timeout", "15",
                  "--prefix", "all_")
    feed2.start(2)
    for fid in range(4):
        feed2.result("vd.sums", 2, fid, sums(fid), DESC_SUMS if fid == 0 else None)
    feed2.end(2)
    assert p2.wait(15) == 0, p2.stderr()
    with h5py.File(os.path.join(p2.out_dir, "all_series_2.h5"), "r") as f:
        np.testing.assert_array_equal(f["/results/vd.sums/data"][...], sums(3))


DESC_G2 = {"stage": "mt", "output": "g2", "kind": "xpcs_multitau", "dtype": "float64",
           "shape": [12, 2], "units": "", "axes": ["lag", "roi"], "per_frame": False}
DESC_CNT = {"stage": "h", "output": "counts", "kind": "hist", "dtype": "uint16",
            "shape": [7], "units": "", "axes": ["bin"], "per_frame": False}


def g2_rows(fid, rows):
    return 1.0 + np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) / (fid + 1)


def test_growing_shapes(zctx, recorder):
    """Results whose shape changes (a g2 gaining lag rows, a histogram
    shrinking, a topic without descriptor) are stored faithfully in both
    modes, also after SWMR began: `data` extends up to the descriptor's
    shape, `shape` holds each result's own shape, padding is NaN (floats)
    or 0. A result larger than the declared shape, or of another dtype or
    rank, is skipped and counted (docs/recording.md)."""
    feed = Feed(zctx)
    p = recorder(feed, "--latest", "last.", "--swmr-after", "4", "--series", "1",
                 "--timeout", "15")
    sid = 11
    feed.start(sid)
    rows = [3, 5, 8, 12, 6]
    sent = []
    for fid, r in enumerate(rows):
        a = g2_rows(fid, r)
        sent.append(a)
        d = DESC_G2 if fid == 0 else None
        feed.result("mt.g2", sid, fid, a, d)
        feed.result("last.g2", sid, fid, a, d)
        feed.result("nodesc.g2", sid, fid, a)  # never a descriptor: no bound
        feed.result("h.counts", sid, fid, np.arange(7 - fid, dtype=np.uint16) + 1,
                    DESC_CNT if fid == 0 else None)
        if fid == 0:
            # The 4 topics exist; wait for SWMR (a SWMR reader can open the
            # file only then), so every change of shape happens in SWMR mode.
            partial = os.path.join(p.out_dir, "series_%d.h5.partial" % sid)
            deadline = time.monotonic() + 10
            while True:
                try:
                    h5py.File(partial, "r", libver="latest", swmr=True).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "SWMR never started"
                    time.sleep(0.05)
    feed.result("mt.g2", sid, 90, g2_rows(90, 13))                   # above the declared 12
    feed.result("mt.g2", sid, 91, g2_rows(91, 4).astype(np.float32))  # another dtype
    feed.result("mt.g2", sid, 92, g2_rows(92, 4).reshape(-1))         # another rank
    feed.end(sid)
    assert p.wait(15) == 0, p.stderr()
    with h5py.File(os.path.join(p.out_dir, "series_%d.h5" % sid), "r") as f:
        for topic, maxshape in (("mt.g2", (None, 12, 2)), ("nodesc.g2", (None, None, None))):
            g = f["/results/" + topic]
            d = g["data"]
            assert d.shape == (5, 12, 2) and d.maxshape == maxshape and d.dtype == np.float64
            # one result per chunk: the bound, or the first shape without one
            assert d.chunks == ((1, 12, 2) if topic == "mt.g2" else (1, 3, 2))
            np.testing.assert_array_equal(g["shape"][()], [[r, 2] for r in rows])
            assert g["shape"].dtype == np.uint32
            for k, r in enumerate(rows):
                np.testing.assert_array_equal(d[k, :r], sent[k])
                assert np.isnan(d[k, r:]).all()
                # the documented way to read one result back
                got = d[(k,) + tuple(slice(0, n) for n in g["shape"][k])]
                np.testing.assert_array_equal(got, sent[k])
            assert list(g["frame_id"][()]) == list(range(5))
            assert g.attrs["reshaped"] == 4
        assert f["/results/mt.g2"].attrs["mismatched_skipped"] == 3
        assert f["/results/nodesc.g2"].attrs["mismatched_skipped"] == 0
        last = f["/results/last.g2"]
        assert s(last.attrs["mode"]) == "latest"
        assert last["data"].shape == (6, 2) and last["data"].maxshape == (12, 2)
        np.testing.assert_array_equal(last["data"][()], sent[-1])
        np.testing.assert_array_equal(last["shape"][()], [6, 2])
        assert last["frame_id"][()] == 4 and last.attrs["results"] == 5
        h = f["/results/h.counts"]
        assert h["data"].shape == (5, 7) and h["data"].maxshape == (None, 7)
        for k in range(5):
            np.testing.assert_array_equal(h["data"][k], np.r_[np.arange(7 - k) + 1, [0] * k])
        np.testing.assert_array_equal(h["shape"][()], [[7 - k] for k in range(5)])
    st = stats_of(p)
    assert st["mismatched"] == 3 and st["written"] == 20


DESC_BIG = {"stage": "prev", "output": "big", "kind": "preview", "dtype": "uint16",
            "shape": [256, 256], "units": "", "axes": ["y", "x"], "per_frame": False}
DESC_IMG = {"stage": "img", "output": "full", "kind": "preview", "dtype": "float32",
            "shape": [640, 512], "units": "", "axes": ["y", "x"], "per_frame": False}


def test_blocks_keep_every_row_in_order(zctx, recorder):
    """The recorder writes the rows of a topic in blocks (256 rows or 1 MiB,
    a block per shape; docs/recording.md): across block boundaries, changes
    of shape inside a block, duplicates straddling a boundary, rows of
    128 KiB (8 to a block) and rows above 1 MiB (written one by one), every
    row lands once, in arrival order, with its own shape and padding, and a
    SWMR reader sees every row sent before a pause within the flush interval,
    not only the full blocks."""
    feed = Feed(zctx)
    p = recorder(feed, "--swmr-after", "50", "--series", "1", "--timeout", "40")
    sid = 21
    feed.start(sid)
    # (fid, array) stored, per topic; the q*.frame topics (1 MiB blocks of
    # 64 KiB rows) pass the file's 4 MiB of block buffers together
    qs = ["q%d.frame" % i for i in range(4)]
    got = {t: [] for t in ["mt.g2", "vd.sums", "prev.big", "img.full"] + qs}

    def g2_shape(fid):
        return 2 if fid % 37 == 0 else min(3 + (fid // 70) % 10, 12)

    def big(fid):
        rows = 200 if fid % 30 == 0 else 256
        return ((np.arange(rows * 256, dtype=np.uint32) * 7 + fid) % 65521).astype(
            np.uint16).reshape(rows, 256)

    def qframe(fid, i):
        rows = 100 if fid % 45 == 5 else 128
        return ((np.arange(rows * 256, dtype=np.uint32) + 31 * fid + i) % 65521).astype(
            np.uint16).reshape(rows, 256)

    def img(fid):
        rows = 320 if fid % 2 else 640
        return (np.arange(rows * 512, dtype=np.float32) + fid).reshape(rows, 512)

    def send(topic, fid, a, desc=None, dup=False):
        feed.result(topic, sid, fid, a, desc)
        if not dup:
            got[topic].append((fid, a))

    def send_fids(lo, hi):
        for fid in range(lo, hi):
            send("vd.sums", fid, sums(fid), DESC_SUMS if fid == 0 else None)
            send("mt.g2", fid, g2_rows(fid, g2_shape(fid)), DESC_G2 if fid == 0 else None)
            if fid % 10 == 0:
                send("prev.big", fid, big(fid), DESC_BIG if fid == 0 else None)
            if fid % 10 == 5:
                for i, q in enumerate(qs):
                    send(q, fid, qframe(fid, i), dict(DESC_BIG, shape=[128, 256]) if fid == 5 else None)
            if fid % 100 == 0:
                send("img.full", fid, img(fid // 100), DESC_IMG if fid == 0 else None)
            if fid == 262:  # re-sent (a resumed replay) across the first block boundary
                for d in range(250, 262):
                    send("vd.sums", d, sums(d), dup=True)
                    send("mt.g2", d, g2_rows(d, g2_shape(d)), dup=True)

    def check(g, rows):
        """The rows of topic group g are exactly `rows` (fid, array), in order."""
        fids = g["frame_id"][()]
        assert list(fids) == [fid for fid, _ in rows]
        d, shp = g["data"], g["shape"][()]
        assert d.shape[0] == len(rows) and shp.shape[0] == len(rows)
        assert list(g["t_acq_ns"][()]) == [1000 + fid for fid, _ in rows]
        ext = np.max([a.shape for _, a in rows], axis=0)
        assert tuple(d.shape[1:]) == tuple(ext)
        for k, (fid, a) in enumerate(rows):
            assert tuple(shp[k]) == a.shape, (g.name, k, fid)
            row = d[k]
            inside = tuple(slice(0, n) for n in a.shape)
            np.testing.assert_array_equal(row[inside], a, err_msg="%s row %d" % (g.name, k))
            pad = np.ones(row.shape, bool)
            pad[inside] = False
            fill = row[pad]
            assert (np.isnan(fill).all() if a.dtype.kind == "f" else (fill == 0).all()), \
                (g.name, k, fid)

    send_fids(0, 60)  # SWMR starts after 50 (it writes out every block then)
    part = os.path.join(p.out_dir, "series_%d.h5.partial" % sid)
    deadline = time.monotonic() + 10
    f = None
    while f is None:
        try:
            f = h5py.File(part, "r", libver="latest", swmr=True)
        except OSError:
            assert time.monotonic() < deadline, "SWMR never started:\n" + p.stderr()
            time.sleep(0.05)
    send_fids(60, 300)
    with f:
        # 300 and 312 rows: full blocks and a partial one each; the flush
        # (at least once a second) must carry the partial ones too.
        deadline = time.monotonic() + 5
        while True:
            ds = [f["/results/%s/%s" % (t, n)] for t in got for n in ("data", "frame_id", "shape")]
            for x in ds:
                x.refresh()
            if all(f["/results/%s/frame_id" % t].shape[0] == len(got[t]) for t in got):
                break
            assert time.monotonic() < deadline, {t: f["/results/%s/frame_id" % t].shape for t in got}
            time.sleep(0.1)
        for t in got:
            check(f["/results/" + t], got[t])
    send_fids(300, 700)
    feed.end(sid)
    assert p.wait(30) == 0, p.stderr()
    with h5py.File(os.path.join(p.out_dir, "series_%d.h5" % sid), "r") as f:
        for t, rows in got.items():
            g = f["/results/" + t]
            check(g, rows)
            assert g.attrs["results"] == len(rows)
            first = rows[0][1].shape
            assert g.attrs["reshaped"] == sum(a.shape != first for _, a in rows)
        assert f["/results/vd.sums"].attrs["duplicates_skipped"] == 12
        assert f["/results/mt.g2"].attrs["duplicates_skipped"] == 12
        assert f["/entry"].attrs["results_written"] == sum(map(len, got.values()))
    st = stats_of(p)
    assert st["written"] == sum(map(len, got.values())) and st["duplicates"] == 24


def test_duplicates_skipped(zctx, recorder):
    """Replay resumption re-sends results (and the SERIES_START): each
    (topic, frame_id) is stored once; FINAL results are keyed apart."""
    feed = Feed(zctx)
    p = recorder(feed, "--series", "1", "--timeout", "15")
    feed.start(3)
    for fid in range(10):
        feed.result("vd.sums", 3, fid, sums(fid), DESC_SUMS if fid == 0 else None)
    feed.start(3)  # the resumed replay's start
    for fid in range(5, 15):
        feed.result("vd.sums", 3, fid, sums(fid))
    feed.result("vd.sums", 3, 14, sums(99), flags=proto.FLAG_FINAL)  # same id, final: kept
    feed.result("vd.sums", 3, 14, sums(98), flags=proto.FLAG_FINAL)  # duplicate final
    feed.end(3)
    assert p.wait(15) == 0, p.stderr()
    with h5py.File(os.path.join(p.out_dir, "series_3.h5"), "r") as f:
        assert list(f["/results/vd.sums/frame_id"][...]) == list(range(15)) + [14]
        np.testing.assert_array_equal(f["/results/vd.sums/data"][-1], sums(99))
        assert f["/results/vd.sums"].attrs["duplicates_skipped"] == 6
    st = stats_of(p)
    assert st["duplicates"] == 6 and st["dup_starts"] == 1 and st["written"] == 16


def test_partial_rename_and_aborted(zctx, recorder):
    feed = Feed(zctx)
    p = recorder(feed, "--timeout", "15", "--swmr-after", "1")
    feed.start(10)
    feed.result("vd.sums", 10, 0, sums(0), DESC_SUMS)
    part = os.path.join(p.out_dir, "series_10.h5.partial")
    wait_file(part)
    assert not os.path.exists(os.path.join(p.out_dir, "series_10.h5"))
    feed.end(10)
    wait_file(os.path.join(p.out_dir, "series_10.h5"))
    assert not os.path.exists(part)

    feed.start(11)
    feed.result("vd.sums", 11, 0, sums(0), DESC_SUMS)
    feed.result("vd.sums", 11, 1, sums(1))
    feed.end(11, flags=proto.FLAG_ABORTED)
    deadline = time.monotonic() + 10
    while "series 11 incomplete" not in p.stderr() and time.monotonic() < deadline:
        time.sleep(0.05)
    p.signal(signal.SIGINT)
    assert p.wait(10) == 0, p.stderr()
    assert "series 11 incomplete (SERIES_END with the ABORTED flag)" in p.stderr()
    aborted = os.path.join(p.out_dir, "series_11.h5.partial")
    assert os.path.exists(aborted) and not os.path.exists(os.path.join(p.out_dir, "series_11.h5"))
    with h5py.File(aborted, "r") as f:
        assert bool(f["/entry"].attrs["complete"]) is False
        assert "ABORTED" in s(f["/entry"].attrs["incomplete_reason"])
        assert f["/results/vd.sums/data"].shape == (2, 3)
    st = stats_of(p)
    assert st["series_complete"] == 1 and st["series_aborted"] == 1


def test_late_subscriber_keeps_data(zctx, recorder):
    """SUB joined after SERIES_START: the file is opened anyway, without
    metadata (and said so), and the results are kept."""
    feed = Feed(zctx, zmq.XPUB)
    p = recorder(feed, "--count", "5", "--timeout", "15")
    feed.wait_subscriber()
    for fid in range(20, 25):
        feed.result("vd.sums", 4, fid, sums(fid), DESC_SUMS if fid == 22 else None)
    assert p.wait(15) == 0, p.stderr()
    path = os.path.join(p.out_dir, "series_4.h5.partial")
    with h5py.File(path, "r") as f:
        assert bool(f["/series"].attrs["metadata_missing"]) is True
        assert bool(f["/entry"].attrs["complete"]) is False
        d = f["/results/vd.sums/data"]
        assert d.shape == (5, 3)
        np.testing.assert_array_equal(d[0], sums(20))
        # the descriptor came with the third result, before SWMR: recorded
        assert s(d.attrs["units"]) == "counts"
    assert "without series metadata" in p.stderr()
    assert stats_of(p)["late_join"] == 1


def test_unwritable_dir(tmp_path, zctx, recorder):
    feed = Feed(zctx)
    missing = tmp_path / "nope" / "deeper"
    p = recorder(feed, "--timeout", "5", dir=missing)
    assert p.wait(10) == 1
    assert str(missing) in p.stderr() and "No such file or directory" in p.stderr()
    afile = tmp_path / "file"
    afile.write_text("x")
    p = recorder(feed, "--timeout", "5", dir=afile)
    assert p.wait(10) == 1
    assert str(afile) in p.stderr()


def test_disk_full_keeps_partial(tmp_path, zctx, recorder):
    """ENOSPC mid-series: a clear error naming the file, exit 1, and what was
    written before is in a readable, properly closed .partial file."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): %s" % r.stderr.decode().strip())
    try:
        feed = Feed(zctx)
        p = recorder(feed, "--timeout", "15", "--swmr-after", "1", dir=mnt)
        feed.start(5)
        big = np.arange(64 * 64, dtype=np.uint32).reshape(64, 64)
        desc = dict(DESC_PREV, dtype="uint32", shape=[64, 64])
        n = 0
        while p.alive() and n < 200:
            try:
                feed.result("big.img", 5, n, big + n, desc if n == 0 else None)
            except zmq.Again:
                break
            n += 1
            time.sleep(0.002)
        assert p.wait(15) == 1, p.stderr()
        err = p.stderr()
        assert "series_5.h5.partial" in err and "No space left on device" in err, err
        with h5py.File(str(mnt / "series_5.h5.partial"), "r") as f:
            assert bool(f["/entry"].attrs["complete"]) is False
            d = f["/results/big.img/data"]
            assert d.shape[0] >= 1
            np.testing.assert_array_equal(d[0], big)
        assert stats_of(p)["write_errors"] >= 1
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_swmr_reader_while_writing(zctx, recorder):
    feed = Feed(zctx)
    p = recorder(feed, "--swmr-after", "3", "--timeout", "20", "--series", "1")
    feed.start(6)
    for fid in range(3):
        feed.result("vd.sums", 6, fid, sums(fid), DESC_SUMS if fid == 0 else None)
    part = os.path.join(p.out_dir, "series_6.h5.partial")
    deadline = time.monotonic() + 10
    f = None
    while f is None:
        try:
            f = h5py.File(part, "r", libver="latest", swmr=True)
        except (OSError, FileNotFoundError):
            if time.monotonic() > deadline:
                pytest.fail("could not open %s in SWMR mode:\n%s" % (part, p.stderr()))
            time.sleep(0.05)
    with f:
        d = f["/results/vd.sums/data"]
        deadline = time.monotonic() + 5
        while d.shape[0] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            d.refresh()
        assert d.shape[0] == 3
        for fid in range(3, 8):
            feed.result("vd.sums", 6, fid, sums(fid))
        # a topic first seen after SWMR started: SWMR pauses, the topic lands
        feed.result("late.topic", 6, 0, sums(0))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            d.refresh()
            if d.shape[0] == 8:
                break
            time.sleep(0.1)  # the recorder flushes at least every second
        assert d.shape[0] == 8
        np.testing.assert_array_equal(d[7], sums(7))
        feed.end(6)
        assert p.wait(15) == 0, p.stderr()
    with h5py.File(os.path.join(p.out_dir, "series_6.h5"), "r") as f:
        np.testing.assert_array_equal(f["/results/late.topic/data"][0], sums(0))
        assert [s(t) for t in f["/entry"].attrs["topics_added_after_swmr"]] == ["late.topic"]
        assert f["/results/vd.sums/data"].shape[0] == 8
    assert "SWMR paused to add topic late.topic" in p.stderr()
    st = stats_of(p)
    assert st["late_topic"] == 1 and st["swmr_pauses"] == 1 and st["written"] == 9, st


@pytest.mark.parametrize("swmr", ["swmr", "no-swmr"])
def test_topics_first_seen_at_series_end_land(zctx, recorder, swmr):
    """Results whose topics first appear at SERIES_END (a two-time map, a
    final fit) after SWMR began are all stored, with their descriptors, in
    SWMR and non-SWMR modes; the partial topic keeps every row."""
    feed = Feed(zctx)
    args = ["--swmr-after", "2"] if swmr == "swmr" else ["--no-swmr"]
    p = recorder(feed, *args, "--timeout", "20", "--series", "1")
    feed.start(12)
    for fid in range(6):
        feed.result("vd.sums", 12, fid, sums(fid), DESC_SUMS if fid == 0 else None)
    time.sleep(0.5)  # SWMR has begun (--swmr-after 2) before the late topics
    for k, topic in enumerate(("tt.c2", "tt.diag", "fit.params")):
        feed.result(topic, 12, 5, prev(k), DESC_PREV)
    feed.end(12)
    assert p.wait(15) == 0, p.stderr()
    with h5py.File(os.path.join(p.out_dir, "series_12.h5"), "r") as f:
        assert f["/entry"].attrs["complete"]
        for k, topic in enumerate(("tt.c2", "tt.diag", "fit.params")):
            g = f["/results/" + topic]
            np.testing.assert_array_equal(g["data"][0], prev(k))
            assert "descriptor_json" in g["data"].attrs, topic
        assert f["/results/vd.sums/data"].shape[0] == 6
        late = [s(t) for t in f["/entry"].attrs.get("topics_added_after_swmr", [])]
        assert late == (["tt.c2", "tt.diag", "fit.params"] if swmr == "swmr" else [])
    st = stats_of(p)
    assert st["written"] == 9 and st["series_complete"] == 1, st
    # One pause per tick at most: topics arriving between two ticks share it.
    assert (1 <= st["swmr_pauses"] <= 3) if swmr == "swmr" else st["swmr_pauses"] == 0, st
    assert st["late_topic"] == (3 if swmr == "swmr" else 0), st


@pytest.mark.parametrize("comp,filt", [("gzip", "gzip"), ("bslz4", 32008)])
def test_compression_round_trip(zctx, recorder, comp, filt):
    feed = Feed(zctx)
    p = recorder(feed, "--compress", comp, "--series", "1", "--timeout", "15")
    feed.start(8)
    for fid in range(5):
        # wire codecs vary: the recorder decodes, HDF5 re-encodes
        feed.result("prev.frame", 8, fid, prev(fid) * 100, DESC_PREV if fid == 0 else None,
                    codec=["raw", "lz4", "bslz4"][fid % 3])
    feed.end(8)
    assert p.wait(15) == 0, p.stderr()
    with h5py.File(os.path.join(p.out_dir, "series_8.h5"), "r") as f:
        d = f["/results/prev.frame/data"]
        if filt == "gzip":
            assert d.compression == "gzip"
        else:
            assert str(filt) in d._filters or filt in d._filters, d._filters
        for fid in range(5):
            np.testing.assert_array_equal(d[fid], prev(fid) * 100)
        assert s(f["/entry"].attrs["compression"]) == comp


def test_sigterm_leaves_partial(zctx, recorder):
    feed = Feed(zctx)
    p = recorder(feed, "--timeout", "15")
    feed.start(9)
    for fid in range(4):
        feed.result("vd.sums", 9, fid, sums(fid), DESC_SUMS if fid == 0 else None)
    part = os.path.join(p.out_dir, "series_9.h5.partial")
    wait_file(part)
    time.sleep(0.5)  # the four results are long received by then (loopback)
    p.signal(signal.SIGTERM)
    assert p.wait(10) == 0, p.stderr()
    with h5py.File(part, "r") as f:
        assert bool(f["/entry"].attrs["complete"]) is False
        assert "signal" in s(f["/entry"].attrs["incomplete_reason"])
        assert f["/results/vd.sums/data"].shape == (4, 3)


def test_stats_documents(zctx, recorder):
    feed = Feed(zctx)
    p = recorder(feed, "--stats", "--series", "1", "--timeout", "15")
    doc = json.dumps({"frames": 1}).encode()
    feed.start(12)
    feed.send(proto.RESULT, topic="beamd.stats", array=np.frombuffer(doc, np.uint8))
    feed.result("vd.sums", 12, 0, sums(0), DESC_SUMS)
    feed.end(12)
    assert p.wait(15) == 0, p.stderr()
    with open(os.path.join(p.out_dir, "stats.jsonl")) as f:
        assert [json.loads(l) for l in f] == [{"frames": 1}]
    with h5py.File(os.path.join(p.out_dir, "series_12.h5"), "r") as f:
        assert list(f["/results"]) == ["vd.sums"]


def test_bad_command_line(tmp_path):
    for args in (["--mode", "sometimes"], ["--compress", "zip"], ["--count", "0"],
                 ["--prefix", "a/b"], ["--bogus"]):
        r = subprocess.run([binary("beamd-record")] + args, capture_output=True, text=True,
                           timeout=10)
        assert r.returncode == 2, args
        assert "beamd-record:" in r.stderr


def test_daemon_record_stage_end_to_end(tmp_path, ports, start_beamd, run_tool, zctx):
    """The real daemon with a `record` stage, fed by beamd-sim over PUSH/PULL:
    the files hold every frame bit-exact (counter pattern), through the
    Debian bitshuffle plugin, and beamd-record on the daemon's PUB gets the
    results of a parallel stage."""
    from conftest import make_config
    rec_dir = tmp_path / "frames"
    stages = [{"name": "rec", "kind": "record", "input": "frames", "dir": str(rec_dir),
               "compress": "bslz4"},
              {"name": "b", "kind": "bin", "input": "frames", "factor": 2}]
    cfg = make_config(ports, stages, mode="pull")
    b = start_beamd(cfg)
    res_dir = tmp_path / "results"
    res_dir.mkdir()
    rec = run_tool("beamd-record", ["--connect", ports.ep_publish, "--dir", str(res_dir),
                                    "--series", "2", "--timeout", "20"])
    time.sleep(0.5)  # the SUB join
    run_tool("beamd-sim", ["--bind", ports.ep_input, "--socket", "push", "--shape", "32x48",
                           "--frames", "20", "--series", "2", "--series-id", "40", "--codec",
                           "bslz4", "--pattern", "counter", "--quiet"], wait=20)
    assert rec.wait(25) == 0, rec.stderr()
    for sid in (40, 41):
        with h5py.File(str(rec_dir / ("series_%d.h5" % sid)), "r") as f:
            d = f["/entry/data/data"]
            assert d.shape == (20, 32, 48) and d.dtype == np.uint16 and d.chunks == (1, 32, 48)
            assert "32008" in d._filters
            assert bool(f["/entry"].attrs["complete"]) is True
            ids = f["/entry/data/frame_id"][...]
            assert list(ids) == list(range(20))
            for i, fid in enumerate(ids):
                exp = ((fid + np.arange(32 * 48, dtype=np.int64)) % 65536).astype(np.uint16)
                np.testing.assert_array_equal(d[i], exp.reshape(32, 48))
            assert f["/series"].attrs["nframes"] == 20
        with h5py.File(str(res_dir / ("series_%d.h5" % sid)), "r") as f:
            assert f["/results/b.frame/data"].shape == (20, 16, 24)
    assert b.alive()


@pytest.mark.parametrize("others", [False, True], ids=["alone", "with_decoders"])
def test_daemon_record_passthrough(tmp_path, ports, start_beamd, zctx, others):
    """Frames sent bitshuffle-LZ4 by this test (tools/python/beamd/proto.py,
    random counts) reach a `record` stage still encoded (lazy decode). Alone,
    the stage stores every one as it came: the chunks are the sent payloads
    byte for byte, the pixels read back through the HDF5 plugin are the sent
    arrays, and its stats count them as passed through. A frame whose LZ4
    stream is broken is not stored: it is recorded as CORRUPT, as without
    pass-through. With other stages that decode the same frames on their own
    threads (bin, and a record stage with two frames per chunk, which cannot
    pass through), the decode keeps the wire bytes for record (frame.h
    keep_encoded), so it still stores every good frame as it came."""
    from conftest import make_config
    d1, d2 = tmp_path / "pt", tmp_path / "cf2"
    stages = [{"name": "rec", "kind": "record", "input": "frames", "dir": str(d1)}]
    if others:
        stages += [{"name": "rec2", "kind": "record", "input": "frames", "dir": str(d2),
                    "chunk_frames": 2},
                   {"name": "b", "kind": "bin", "input": "frames", "factor": 2}]
    cfg = make_config(ports, stages, mode="pull")
    # Frames stay encoded up to the stages only in an unpinned pool, and
    # pinned: auto pins it when a stage (bin) runs on CUDA.
    cfg["pool"]["pinned"] = "no"
    b = start_beamd(cfg)
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.bind(ports.ep_input)
    rng = np.random.default_rng(7)
    n, bad, shape = 12, 5, (64, 80)
    frames = [rng.poisson(3.0 if i % 2 else 300.0, shape).astype(np.uint16) for i in range(n)]
    sent = {}
    seq = 0
    push.send_multipart(proto.encode_message(proto.SERIES_START, seq=seq, series_id=3,
                                             shape=shape, dtype="uint16", meta={"nframes": n}))
    for i, a in enumerate(frames):
        seq += 1
        parts = proto.encode_message(proto.FRAME, seq=seq, series_id=3, frame_id=i, array=a,
                                     codec="bslz4", t_acq_ns=100 + i)
        hdr = proto.decode_header(parts[0])
        assert hdr.nparts == 1 and len(parts[1]) == hdr.payload_size
        if i == bad:  # framing intact, LZ4 stream of the first block ruined
            p = bytearray(parts[1])
            p[16:80] = b"\xff" * 64
            parts[1] = bytes(p)
        else:
            sent[i] = parts[1]
        push.send_multipart(parts)
    push.send_multipart(proto.encode_message(proto.SERIES_END, seq=seq + 1, series_id=3))
    dirs = ((d1, 1), (d2, 2)) if others else ((d1, 1),)
    for d, _ in dirs:
        wait_file(str(d / "series_3.h5"), timeout=20)
    deadline = time.monotonic() + 10
    while True:  # the other stages may still be on their last frames
        st = {s["name"]: s for s in b.stats()["stages"]}
        if all(s["frames_in"] == n for s in st.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    good = [i for i in range(n) if i != bad]
    for d, cf in dirs:
        with h5py.File(str(d / "series_3.h5"), "r") as f:
            data = f["/entry/data/data"]
            assert data.chunks == (cf,) + shape and "32008" in data._filters
            assert list(f["/entry/data/frame_id"][...]) == good
            for row, i in enumerate(good):
                np.testing.assert_array_equal(data[row], frames[i])
            e = f["/entry"].attrs
            assert e["frames_corrupt"] == 1 and bool(e["complete"]) is True
            if cf == 2:
                assert e["frames_passthrough"] == 0
                continue
            assert e["frames_passthrough"] == st["rec"]["passthrough"] == len(good)
            for row, i in enumerate(good):
                filt, chunk = data.id.read_direct_chunk((row, 0, 0))
                assert filt == 0 and chunk == sent[i], "row %d" % row
    # the broken frame: one decode error reported by each stage, as before
    assert all(s["errors"] == 1 for s in st.values()), st
    if others:
        assert st["rec2"]["passthrough"] == 0
    push.close()
    assert b.alive()


def test_daemon_record_passthrough_sim(tmp_path, ports, start_beamd, run_tool):
    """beamd-sim --codec bslz4 into a daemon whose only stage is `record`:
    every frame is stored without being decoded (stats: passthrough), and
    the file holds the sim's counter pattern bit-exact."""
    from conftest import make_config
    rec_dir = tmp_path / "frames"
    cfg = make_config(ports, [{"name": "rec", "kind": "record", "input": "frames",
                               "dir": str(rec_dir)}], mode="pull")
    cfg["pool"]["pinned"] = "no"
    b = start_beamd(cfg)
    run_tool("beamd-sim", ["--bind", ports.ep_input, "--socket", "push", "--shape", "96x128",
                           "--frames", "30", "--series-id", "50", "--codec", "bslz4",
                           "--pattern", "counter", "--quiet"], wait=20)
    wait_file(str(rec_dir / "series_50.h5"), timeout=20)
    with h5py.File(str(rec_dir / "series_50.h5"), "r") as f:
        d = f["/entry/data/data"]
        assert d.shape == (30, 96, 128) and d.chunks == (1, 96, 128)
        ids = f["/entry/data/frame_id"][...]
        assert list(ids) == list(range(30))
        for i, fid in enumerate(ids):
            exp = ((fid + np.arange(96 * 128, dtype=np.int64)) % 65536).astype(np.uint16)
            np.testing.assert_array_equal(d[i], exp.reshape(96, 128))
        assert f["/entry"].attrs["frames_passthrough"] == 30
    rs = b.stats()["stages"][0]
    assert rs["name"] == "rec" and rs["passthrough"] == 30 and rs["errors"] == 0, rs
    assert b.alive()
