"""beamd-replay against a Python REQ client, no daemon.

Files are written by tools/make_test_h5.py into a temporary directory; the
client asks beamd-replay for frames as beamd's replay input would
(proto/PROTOCOL.md section 13), splits each reply into v1 messages and
decodes them with the Python twin of proto/ (tools/python/beamd/proto.py).
Frames are compared bit for bit with the arrays written; forwarded chunks
with the bytes h5py reads back with read_direct_chunk. Binaries come from
$BEAMD_BUILD (default build/); every test is bounded (sockets time out,
processes are killed in teardown).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))
sys.path.insert(0, os.path.join(REPO, "tools"))
from beamd import proto  # noqa: E402
import make_test_h5 as mk  # noqa: E402

BUILD = os.environ.get("BEAMD_BUILD", "build")
REPLAY = os.path.join(BUILD if os.path.isabs(BUILD) else os.path.join(REPO, BUILD),
                      "beamd-replay")
TIMEOUT_MS = 5000


@pytest.fixture(autouse=True)
def _binary():
    if not os.access(REPLAY, os.X_OK):
        pytest.fail("%s not built (make BUILD=%s %s)" % (REPLAY, BUILD, REPLAY))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_reply(parts):
    """Part 0 (status JSON) and the decoded v1 messages that follow, split
    with each header's nparts and META flag."""
    status = json.loads(parts[0])
    msgs, i = [], 1
    while i < len(parts):
        h = proto.decode_header(parts[i])
        n = 1 + h.nparts + (1 if h.flags & proto.FLAG_META else 0)
        assert i + n <= len(parts), "reply cut inside a message"
        chunk = parts[i:i + n]
        _, hdr, arr, meta = proto.decode_message(chunk)
        msgs.append((hdr, arr, meta, chunk))
        i += n
    return status, msgs


class Server:
    def __init__(self, tmp_path, path, *args, env=None):
        self.endpoint = "tcp://127.0.0.1:%d" % free_port()
        self.err_path = str(tmp_path / ("replay-%d.err" % free_port()))
        self._err = open(self.err_path, "w")
        self.p = subprocess.Popen([REPLAY, str(path), "--bind", self.endpoint] + list(args),
                                  stdout=subprocess.PIPE, stderr=self._err, text=True,
                                  env=env)
        self.ctx = zmq.Context()
        self.sock = None
        self._reconnect()

    def _reconnect(self):
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock = self.ctx.socket(zmq.REQ)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        self.sock.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
        self.sock.connect(self.endpoint)

    def raw(self, parts):
        self.sock.send_multipart(parts)
        try:
            return self.sock.recv_multipart()
        except zmq.Again:
            pytest.fail("no reply within %d ms; stderr:\n%s" % (TIMEOUT_MS, self.stderr()))

    def req(self, obj):
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        return split_reply(self.raw([data]))

    def get(self, next, credit, **kw):
        kw.update(op="get", next=next, credit=credit)
        return self.req(kw)

    def stderr(self):
        with open(self.err_path) as f:
            return f.read()

    def stop(self):
        """SIGTERM; returns (rc, stats JSON or None)."""
        self.sock.close(linger=0)
        self.p.send_signal(signal.SIGTERM)
        out, _ = self.p.communicate(timeout=10)
        self.ctx.term()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        return self.p.returncode, (json.loads(lines[-1]) if lines else None)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=5)
        if not self.sock.closed:
            self.sock.close(linger=0)
        self._err.close()


@pytest.fixture
def serve(tmp_path):
    made = []

    def start(path, *args):
        s = Server(tmp_path, path, *args)
        made.append(s)
        return s
    yield start
    for s in made:
        s.kill()


def run_fail(path, *args, timeout=10):
    p = subprocess.run([REPLAY, str(path), "--bind", "tcp://127.0.0.1:%d" % free_port()] +
                       list(args), capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stderr


def fetch_all(srv, credit=4, **kw):
    """All messages of one pass, asking from 0 until eof."""
    k, msgs, statuses = 0, [], []
    for _ in range(10000):
        st, m = srv.get(k, credit, **kw)
        assert st["ok"] is True, st
        statuses.append(st)
        msgs += m
        k = st["next"]
        if st["eof"]:
            return statuses, msgs
    pytest.fail("never reached eof")


def frames_of(msgs):
    return [m for m in msgs if m[0].type == proto.FRAME]


# ---- formats -------------------------------------------------------------------

CODEC_OF = {"raw": "raw", "contiguous": "raw", "gzip": "raw", "shuffle_gzip": "raw",
            "lz4": "lz4", "bslz4": "bslz4", "bs": "raw", "lz4_multi": "raw"}
FORWARDED = {"raw", "lz4", "bslz4"}


@pytest.mark.parametrize("kind", mk.KINDS)
def test_formats_bit_exact(tmp_path, serve, kind):
    path = tmp_path / ("%s.h5" % kind)
    data = mk.make_dataset_file(path, kind, n=7)
    srv = serve(path, "--stats-json")
    statuses, msgs = fetch_all(srv, credit=3)
    assert [m[0].type for m in msgs] == ([proto.SERIES_START] + [proto.FRAME] * 7 +
                                         [proto.SERIES_END])
    fr = frames_of(msgs)
    for k, (h, arr, meta, parts) in enumerate(fr):
        assert h.frame_id == k and h.series_id == 1
        assert h.codec_name == CODEC_OF[kind], (kind, h.codec_name)
        assert arr.dtype == data.dtype and arr.shape == data.shape[1:]
        assert np.array_equal(arr, data[k]), "frame %d differs" % k
        if kind in ("lz4", "bslz4"):
            mask, stored = mk.stored_chunk(path, k)
            assert mask == 0 and bytes(parts[1]) == stored, "frame %d not the stored chunk" % k
    rc, stats = srv.stop()
    assert rc == 0
    assert stats["frames_served"] == 7 and stats["corrupt_served"] == 0
    assert stats["arena_allocs"] == 1  # one reply buffer, reused for every reply
    if kind in FORWARDED:
        assert (stats["forwarded"], stats["decoded"]) == (7, 0)
    else:
        assert (stats["forwarded"], stats["decoded"]) == (0, 7)


@pytest.mark.parametrize("dtype", ["uint8", "uint32", "int16", "int32", "float32", "float64"])
@pytest.mark.parametrize("kind", ["bslz4", "gzip"])
def test_dtypes(tmp_path, serve, dtype, kind):
    path = tmp_path / "d.h5"
    data = mk.make_dataset_file(path, kind, n=3, shape=(9, 13), dtype=dtype)
    srv = serve(path)
    _, msgs = fetch_all(srv, credit=8)
    fr = frames_of(msgs)
    assert len(fr) == 3
    for k, (h, arr, _, _) in enumerate(fr):
        assert h.dtype_name == dtype
        assert np.array_equal(arr, data[k])


def test_big_endian_is_decoded(tmp_path, serve):
    import h5py
    path = tmp_path / "be.h5"
    data = mk.frames(3, (8, 8), "uint16")
    with h5py.File(path, "w") as f:
        f.create_dataset("/entry/data/data", data=data.astype(">u2"), chunks=(1, 8, 8))
    srv = serve(path)
    fr = frames_of(fetch_all(srv)[1])
    assert all(np.array_equal(fr[k][1], data[k]) for k in range(3))
    assert all(h.codec == 0 for h, _, _, _ in fr)


# ---- master files and metadata ---------------------------------------------------------

def test_master_concatenates_data_files(tmp_path, serve):
    master, data, pos = mk.make_master(str(tmp_path / "m"), nfiles=3, per_file=4, last_file=2)
    srv = serve(master)
    statuses, msgs = fetch_all(srv, credit=5)
    assert statuses[0]["total"] == 10
    fr = frames_of(msgs)
    assert len(fr) == 10
    for k, (h, arr, _, parts) in enumerate(fr):
        assert h.frame_id == k
        assert h.codec_name == "bslz4"
        assert np.array_equal(arr, data[k])
        f, local = 1 + k // 4, k % 4
        _, stored = mk.stored_chunk(os.path.join(str(tmp_path / "m"), "scan_data_%06d.h5" % f),
                                    local)
        assert bytes(parts[1]) == stored
        assert h.flags & proto.FLAG_POS
        assert np.allclose(h.pos[:2], pos[k], rtol=1e-12, atol=0) and h.pos[2] == 0.0


def test_series_metadata(tmp_path, serve):
    master, data, pos = mk.make_master(str(tmp_path / "m"), nfiles=2, per_file=3)
    srv = serve(master, "--first", "1", "--stride", "2")
    st, msgs = srv.get(0, 1)
    h, _, meta, _ = msgs[0]
    assert h.type == proto.SERIES_START and h.dtype_name == "uint16"
    assert h.frame_shape == (32, 48) and h.raw_size == 32 * 48 * 2
    m = mk.MASTER_META
    assert meta["detector"] == m["detector"]
    assert meta["nframes"] == 3  # frames 1, 3, 5
    assert meta["frame_time"] == pytest.approx(m["frame_time_s"], rel=1e-12)
    assert meta["count_time"] == pytest.approx(m["count_time_s"], rel=1e-12)
    assert meta["energy"] == pytest.approx(12398.419843, rel=1e-9)
    assert meta["distance"] == pytest.approx(0.25, rel=1e-12)
    assert meta["pixel_size"] == pytest.approx(75e-6, rel=1e-12)
    assert meta["beam_center"] == pytest.approx(list(m["beam_center"]), rel=1e-12)
    assert meta["pixel_mask"] == {"file": os.path.realpath(master),
                                  "dataset": "/entry/instrument/detector/pixel_mask"}
    sp = meta["scan_positions"]
    assert (sp["file"], sp["dataset"], sp["units"]) == (os.path.realpath(master),
                                                        "/entry/sample/positions", "um")
    src = meta["source"]
    assert src["file"] == os.path.realpath(master) and src["file_id"] == st["file_id"]
    assert [d["frames"] for d in src["data_files"]] == [3, 3]
    assert meta["replay"] == {"first": 1, "last": 5, "stride": 2, "pass": 0, "loop": False}


def test_energy_from_incident_energy_and_no_metadata(tmp_path, serve):
    master, _, _ = mk.make_master(str(tmp_path / "e"), nfiles=1, energy_from="energy")
    srv = serve(master)
    meta = srv.get(0, 1)[1][0][2]
    assert meta["energy"] == pytest.approx(12398.41984, rel=1e-9)
    bare = tmp_path / "bare.h5"
    mk.make_dataset_file(bare, "raw", n=2)
    srv2 = serve(bare)
    meta = srv2.get(0, 1)[1][0][2]
    assert meta["detector"] == "unknown" and meta["frame_time"] == 0.0
    for key in ("energy", "distance", "pixel_size", "pixel_mask", "scan_positions"):
        assert key not in meta
    assert srv2.get(0, 1)[1][1][0].flags & proto.FLAG_POS == 0


def test_positions_in_single_file(tmp_path, serve):
    path = tmp_path / "p.h5"
    data, pos = mk.make_dataset_file(path, "lz4", n=5, positions=True)
    srv = serve(path)
    fr = frames_of(fetch_all(srv)[1])
    for k, (h, arr, _, _) in enumerate(fr):
        assert h.flags & proto.FLAG_POS and np.allclose(h.pos[:2], pos[k], rtol=1e-12, atol=0)


# ---- request semantics -----------------------------------------------------------------

def test_credit_next_start_eof(tmp_path, serve):
    path = tmp_path / "r.h5"
    data = mk.make_dataset_file(path, "raw", n=5)
    srv = serve(path, "--series-id", "40")
    st, m = srv.get(0, 2)
    assert (st["ok"], st["next"], st["count"], st["total"], st["eof"], st["series_id"]) == \
        (True, 2, 2, 5, False, 40)
    assert [x[0].type for x in m] == [proto.SERIES_START, proto.FRAME, proto.FRAME]
    seq0 = m[0][0].seq
    assert [x[0].seq for x in m] == [seq0, seq0 + 1, seq0 + 2]
    # Mid-series without start: frames only.
    st, m = srv.get(2, 1)
    assert [x[0].type for x in m] == [proto.FRAME] and m[0][0].frame_id == 2
    assert m[0][0].seq == seq0 + 3
    # start: true mid-series re-sends the SERIES_START.
    st, m = srv.get(3, 1, start=True)
    assert [x[0].type for x in m] == [proto.SERIES_START, proto.FRAME]
    assert m[0][0].series_id == 40 and m[1][0].frame_id == 3
    # Credit larger than what is left: the rest, then SERIES_END, eof.
    st, m = srv.get(3, 100)
    assert (st["next"], st["count"], st["eof"]) == (5, 2, True)
    assert [x[0].type for x in m] == [proto.FRAME, proto.FRAME, proto.SERIES_END]
    assert m[-1][0].frame_id == 5 and m[-1][0].flags & proto.FLAG_ABORTED == 0
    assert np.array_equal(m[1][1], data[4])
    # At the end: eof, nothing follows.
    st, m = srv.get(5, 3)
    assert (st["ok"], st["count"], st["eof"], st["next"], m) == (True, 0, True, 5, [])
    # Past the end is an error.
    st, m = srv.get(6, 3)
    assert st["ok"] is False and "past the end" in st["error"] and m == []
    # The same frames again (stateless server): identical pixels.
    st, m = srv.get(1, 1)
    assert np.array_equal(m[0][1], data[1])


def test_loop_passes_are_series(tmp_path, serve):
    path = tmp_path / "l.h5"
    data = mk.make_dataset_file(path, "bslz4", n=3)
    srv = serve(path, "--loop", "--series-id", "7")
    k, seen = 0, []
    for _ in range(5):
        st, m = srv.get(k, 2)
        assert st["ok"] and st["eof"] is False and st["loop"] is True
        # A reply never spans two passes.
        assert len({x[0].series_id for x in m}) == 1
        assert st["series_id"] == m[0][0].series_id
        seen += [(x[0].type, x[0].series_id, x[0].frame_id) for x in m]
        for h, arr, _, _ in m:
            if h.type == proto.FRAME:
                assert np.array_equal(arr, data[h.frame_id])
        k = st["next"]
    S, F, E = proto.SERIES_START, proto.FRAME, proto.SERIES_END
    assert seen[:12] == [(S, 7, 0), (F, 7, 0), (F, 7, 1), (F, 7, 2), (E, 7, 3),
                         (S, 8, 0), (F, 8, 0), (F, 8, 1), (F, 8, 2), (E, 8, 3),
                         (S, 9, 0), (F, 9, 0)]
    st, m = srv.get(3 * 1000 + 1, 1)  # far ahead: pass 1000, frame 1
    assert st["series_id"] == 1007 and m[0][0].frame_id == 1


def test_stride_and_range(tmp_path, serve):
    path = tmp_path / "s.h5"
    data = mk.make_dataset_file(path, "gzip", n=9)
    srv = serve(path, "--first", "2", "--last", "8", "--stride", "3")
    statuses, msgs = fetch_all(srv, credit=10)
    assert statuses[0]["total"] == 3
    fr = frames_of(msgs)
    assert [h.frame_id for h, _, _, _ in fr] == [2, 5, 8]
    for h, arr, _, _ in fr:
        assert np.array_equal(arr, data[h.frame_id])
    assert msgs[-1][0].type == proto.SERIES_END and msgs[-1][0].frame_id == 3


@pytest.mark.parametrize("args,msg", [
    (["--first", "9"], "--first 9: the file has 9 frames"),
    (["--last", "20"], "--last 20"),
    (["--first", "5", "--last", "3"], "before --first"),
])
def test_bad_range(tmp_path, args, msg):
    path = tmp_path / "s.h5"
    mk.make_dataset_file(path, "raw", n=9)
    rc, err = run_fail(path, *args)
    assert rc == 1 and msg in err, err


def test_max_bytes(tmp_path, serve):
    path = tmp_path / "m.h5"
    data = mk.make_dataset_file(path, "raw", n=6)  # 3072-byte frames
    srv = serve(path, "--max-bytes", "7000")
    st, m = srv.get(0, 6)
    assert st["count"] == 2  # the server's cap
    st, m = srv.get(2, 6, max_bytes=4000)
    assert st["count"] == 1
    st, m = srv.get(3, 6, max_bytes=10)  # below one frame: still one
    assert st["count"] == 1 and np.array_equal(m[0][1], data[3])


def test_rate_limit(tmp_path, serve):
    path = tmp_path / "r.h5"
    mk.make_dataset_file(path, "raw", n=30, shape=(4, 4))
    srv = serve(path, "--rate", "60")
    t0 = time.monotonic()
    statuses, msgs = fetch_all(srv, credit=30)
    dt = time.monotonic() - t0
    assert len(frames_of(msgs)) == 30
    # 30 frames at 60/s: about 0.5 s (the first is free), never much faster.
    assert 0.35 <= dt < 5.0, dt
    assert len(statuses) > 1  # credit was cut to what the rate allowed


def test_info(tmp_path, serve):
    path = tmp_path / "i.h5"
    mk.make_dataset_file(path, "lz4", n=4)
    srv = serve(path)
    st, m = srv.req({"op": "info"})
    assert st["ok"] and m == [] and st["total"] == 4 and st["dtype"] == "uint16"
    assert st["shape"] == [32, 48] and st["file"] == str(path.resolve())
    assert len(st["file_id"]) == 16 and st["parts"][0]["read"] == "forward lz4 chunks"


def test_file_id_tracks_content(tmp_path, serve):
    path = tmp_path / "f.h5"
    mk.make_dataset_file(path, "raw", n=2)
    s1, s2 = serve(path), serve(path)
    a = s1.req({"op": "info"})[0]["file_id"]
    b = s2.req({"op": "info"})[0]["file_id"]
    assert a == b
    s1.kill()
    s2.kill()  # HDF5 locks the file while it is open
    time.sleep(0.02)
    mk.make_dataset_file(path, "raw", n=3)
    c = serve(path).req({"op": "info"})[0]["file_id"]
    assert c != a


@pytest.mark.parametrize("req,why", [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"op": "put", "next": 0, "credit": 1}', '"op" must be'),
    (b'{"next": 0, "credit": 1}', '"op" must be'),
    (b'{"op": "get", "credit": 1}', 'missing "next"'),
    (b'{"op": "get", "next": -1, "credit": 1}', '"next" must be'),
    (b'{"op": "get", "next": "0", "credit": 1}', '"next" must be'),
    (b'{"op": "get", "next": 0}', 'missing "credit"'),
    (b'{"op": "get", "next": 0, "credit": 0}', '"credit" must be an integer in 1..4096'),
    (b'{"op": "get", "next": 0, "credit": 4097}', '"credit" must be'),
    (b'{"op": "get", "next": 0, "credit": 1.5}', '"credit" must be'),
    (b'{"op": "get", "next": 0, "credit": 1, "start": "yes"}', '"start" must be'),
    (b'{"op": "get", "next": 0, "credit": 1, "max_bytes": 0}', '"max_bytes" must be'),
])
def test_bad_requests(tmp_path, serve, req, why):
    path = tmp_path / "b.h5"
    mk.make_dataset_file(path, "raw", n=2)
    srv = serve(path)
    parts = srv.raw([req])
    assert len(parts) == 1
    st = json.loads(parts[0])
    assert st["ok"] is False and why in st["error"], st
    # Still serving, and unknown keys are ignored.
    st, m = srv.req({"op": "get", "next": 0, "credit": 1, "whatever": [1]})
    assert st["ok"] and st["count"] == 1


def test_multipart_request_rejected(tmp_path, serve):
    path = tmp_path / "b.h5"
    mk.make_dataset_file(path, "raw", n=2)
    srv = serve(path, "--stats-json")
    parts = srv.raw([b'{"op": "info"}', b"extra"])
    st = json.loads(parts[0])
    assert st["ok"] is False and "one part" in st["error"]
    rc, stats = srv.stop()
    assert rc == 0 and stats["bad_requests"] == 1 and stats["requests"] == 1


# ---- corrupt data and errors -------------------------------------------------------------

@pytest.mark.parametrize("kind,reason", [("bslz4", "bslz4: total size does not match"),
                                         ("lz4", "lz4: total size does not match"),
                                         ("gzip", "inflate")])
def test_corrupt_chunk(tmp_path, serve, kind, reason):
    path = tmp_path / ("c_%s.h5" % kind)
    data = mk.make_corrupt(path, kind, n=5, bad=(2,))
    srv = serve(path)
    statuses, msgs = fetch_all(srv, credit=5)
    assert statuses[0]["corrupt"] == 1 and statuses[0]["corrupt_total"] == 1
    fr = frames_of(msgs)
    assert len(fr) == 5
    h, arr, meta, parts = fr[2]
    assert h.flags & proto.FLAG_CORRUPT and h.nparts == 0 and arr is None
    assert h.frame_id == 2 and h.frame_shape == (32, 48)
    err = meta["error"]
    assert str(path.resolve()) in err and "dataset /entry/data/data" in err
    assert "frame 2:" in err and reason in err, err
    for k in (0, 1, 3, 4):
        assert fr[k][0].flags & proto.FLAG_CORRUPT == 0
        assert np.array_equal(fr[k][1], data[k])


def test_dangling_link(tmp_path, serve):
    d = str(tmp_path / "dg")
    master, data, _ = mk.make_master(d, name="dang", nfiles=3, per_file=2, dangling=(2,))
    srv = serve(master)
    statuses, msgs = fetch_all(srv, credit=10)
    fr = frames_of(msgs)
    assert len(fr) == 6
    for k in (0, 1, 4, 5):
        assert np.array_equal(fr[k][1], data[k])
    for k in (2, 3):
        h, arr, meta, _ = fr[k]
        assert h.flags & proto.FLAG_CORRUPT and arr is None and h.frame_id == k
        assert "dang_gone_000002.h5" in meta["error"] and "frame %d:" % (k - 2) in meta["error"]
    assert statuses[-1]["corrupt_total"] == 2
    err = srv.stderr()
    assert "warning" in err and "dang_gone_000002.h5" in err and "CORRUPT" in err


def test_dangling_last_file_uses_master_length(tmp_path, serve):
    import h5py
    d = str(tmp_path / "dl")
    master, _, _ = mk.make_master(d, name="dl", nfiles=2, per_file=4, last_file=3,
                                  missing=(2,))
    with h5py.File(master, "a") as f:
        f["/entry/instrument/detector/detectorSpecific/nimages"] = 7
    srv = serve(master)
    st, m = srv.req({"op": "info"})
    assert st["total"] == 7 and st["parts"][1]["frames"] == 3


def test_all_data_files_missing(tmp_path):
    d = str(tmp_path / "none")
    master, _, _ = mk.make_master(d, name="none", nfiles=2, missing=(1, 2))
    rc, err = run_fail(master)
    assert rc == 1 and "none of its 2 data files can be read" in err
    assert "none_data_000001.h5" in err


def test_missing_file(tmp_path):
    rc, err = run_fail(tmp_path / "nope.h5")
    assert rc == 1 and "nope.h5" in err and "No such file" in err


def test_not_hdf5(tmp_path):
    p = tmp_path / "text.h5"
    p.write_text("hello")
    rc, err = run_fail(p)
    assert rc == 1 and "text.h5" in err and "cannot open as HDF5" in err


def test_not_3d(tmp_path):
    p = mk.make_2d(str(tmp_path / "flat.h5"))
    rc, err = run_fail(p)
    assert rc == 1 and "flat.h5" in err and "dataset /entry/data/data" in err
    assert "has 2 dimensions, expected 3" in err


def test_dataset_choice(tmp_path, serve):
    import h5py
    p = tmp_path / "two.h5"
    a, b = mk.frames(2, (4, 4)), mk.frames(3, (4, 4), seed=9)
    with h5py.File(p, "w") as f:
        f["/x/a"] = a
        f["/x/b"] = b
        f["/x/scalar"] = 1.0
    rc, err = run_fail(p)
    assert rc == 1 and "2 3-D datasets" in err and "x/a (2x4x4)" in err and "x/b" in err
    rc, err = run_fail(p, "--dataset", "/x/nope")
    assert rc == 1 and "no dataset /x/nope" in err
    rc, err = run_fail(p, "--dataset", "/x")
    assert rc == 1 and "is not a dataset" in err
    rc, err = run_fail(p, "--dataset", "/x/scalar")
    assert rc == 1 and "has 0 dimensions" in err
    srv = serve(p, "--dataset", "/x/b")
    fr = frames_of(fetch_all(srv)[1])
    assert len(fr) == 3 and np.array_equal(fr[2][1], b[2])


def test_unavailable_filter(tmp_path):
    path = tmp_path / "bs.h5"
    mk.make_dataset_file(path, "bs", n=2)
    env = dict(os.environ, HDF5_PLUGIN_PATH=str(tmp_path / "no-plugins"))
    p = subprocess.run([REPLAY, str(path), "--bind", "tcp://127.0.0.1:%d" % free_port()],
                       capture_output=True, text=True, timeout=10, env=env)
    assert p.returncode == 1 and "filter 32008" in p.stderr and "not available" in p.stderr


def test_command_line_errors(tmp_path):
    for args, msg in ([["--rate", "x"], "--rate"], [["--stride", "0"], "--stride"],
                      [["--bogus"], "unknown option"], [["--dataset", "rel"], "absolute"]):
        p = subprocess.run([REPLAY, "f.h5"] + args, capture_output=True, text=True, timeout=10)
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)
    p = subprocess.run([REPLAY], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "no file" in p.stderr


def test_sigint_exits_cleanly(tmp_path, serve):
    path = tmp_path / "q.h5"
    mk.make_dataset_file(path, "raw", n=3)
    srv = serve(path, "--stats-json", "--quiet")
    srv.get(0, 2)
    srv.sock.close(linger=0)
    srv.p.send_signal(signal.SIGINT)
    out, _ = srv.p.communicate(timeout=10)
    assert srv.p.returncode == 0
    st = json.loads(out.strip().splitlines()[-1])
    assert st["frames_served"] == 2 and st["next"] == 2 and st["total"] == 3
    assert srv.stderr() == ""


def test_large_multiframe_chunks(tmp_path, serve):
    # 4-frame chunks of 1.2 MB each: decoded with a chunk cache that holds them.
    path = tmp_path / "mf.h5"
    data = mk.make_dataset_file(path, "lz4_multi", n=6, shape=(300, 512))
    srv = serve(path, "--stats-json")
    fr = frames_of(fetch_all(srv, credit=4)[1])
    assert len(fr) == 6
    for k, (h, arr, _, _) in enumerate(fr):
        assert h.codec == 0 and np.array_equal(arr, data[k])
    rc, stats = srv.stop()
    assert rc == 0 and stats["decoded"] == 6


@pytest.mark.parametrize("kind", ["raw", "bslz4", "gzip"])
def test_unwritten_chunk_is_corrupt(tmp_path, serve, kind):
    import h5py
    path = tmp_path / "hole.h5"
    data = mk.frames(4, (8, 16))
    kw = {"raw": {}, "bslz4": {"compression": mk.BSHUF_ID, "compression_opts": (0, 2)},
          "gzip": {"compression": "gzip"}}[kind]
    with h5py.File(path, "w") as f:
        d = f.create_dataset("/entry/data/data", shape=data.shape, dtype=data.dtype,
                             chunks=(1, 8, 16), **kw)
        for k in (0, 1, 3):
            d[k] = data[k]
    srv = serve(path)
    fr = frames_of(fetch_all(srv)[1])
    assert [bool(h.flags & proto.FLAG_CORRUPT) for h, _, _, _ in fr] == [False, False, True, False]
    assert "frame 2: chunk was never written" in fr[2][2]["error"]
    assert np.array_equal(fr[3][1], data[3])
