"""beamd-view, end to end.

Two kinds of source feed the viewer here:
- a synthetic publisher in this test (a PUB socket sending hand-made v1
  RESULT messages with tools/python/beamd/proto.py), for exact checks of the
  display form (float32 values, downsampling, complex split), of coalescing,
  latest-wins and the credit window, and of bad input (unknown dtype, no descriptor, floods,
  huge images, disconnecting browsers, a stream that stops);
- the real pipeline: beamd running `preview` and `xpcs_multitau` fed by
  beamd-sim --pattern xpcs, for the WebSocket feed against an independent
  decode of the same results and for headless Chromium (the page lists the
  topics, draws an image and a g2 plot with one curve per ROI, keeps
  updating, and shows the pipeline status).

The WebSocket client and the DevTools driver are in viewclient.py.
Screenshots go to $BEAMD_ARTEFACTS (default BUILD/test-artefacts/view).
"""
import json
import os
import socket
import subprocess
import time

import numpy as np
import pytest
import zmq

from conftest import BUILD, Receiver, binary, free_ports, make_config, proto
from viewclient import Browser, ViewClient, WebSocket, WSError, decode, http_get

ARTEFACTS = os.environ.get("BEAMD_ARTEFACTS", os.path.join(BUILD, "test-artefacts", "view"))
TOKEN = "t0ken-for-tests"


# ---- helpers ---------------------------------------------------------------------

class View:
    """A running beamd-view on a free port."""

    def __init__(self, run_tool, subs, control="none", args=()):
        self.port = free_ports(1)[0]
        argv = ["--port", str(self.port), "--control", control]
        for s in subs:
            argv += ["--sub", s]
        self.proc = run_tool("beamd-view", argv + list(args))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not self.proc.alive():
                pytest.fail("beamd-view exited: %s" % self.proc.stderr())
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        pytest.fail("beamd-view did not listen on %d" % self.port)

    def client(self, token=None):
        return ViewClient(self.port, token=token)


class Pub:
    """The test's result source: a PUB bound on a free port."""

    def __init__(self, zctx):
        self.ep = "tcp://127.0.0.1:%d" % free_ports(1)[0]
        self.sock = zctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100000)
        self.sock.bind(self.ep)
        self.seq = 0

    def result(self, topic, array, frame_id=0, series_id=1, meta=None, flags=0):
        parts = proto.encode_message(proto.RESULT, array=array, topic=topic, series_id=series_id,
                                     frame_id=frame_id, seq=self.seq, meta=meta, flags=flags)
        self.seq += 1
        self.sock.send_multipart(parts)
        return parts

    def parts(self, parts):
        self.sock.send_multipart(parts)

    def close(self):
        self.sock.close()


def desc(topic, array, axes, units=""):
    stage, output = topic.split(".")
    return {"stage": stage, "output": output, "dtype": str(array.dtype),
            "shape": list(array.shape), "units": units, "axes": axes}


def wait_joined(pub, v, topic="x.join"):
    """PUB/SUB joins asynchronously: publishes a marker until the viewer lists it."""
    c = v.client()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pub.result(topic, np.zeros(1, np.float32))
            try:
                h, _ = c.next(timeout=0.3)
            except socket.timeout:
                continue
            if h["type"] == "topics" and any(t["topic"] == topic for t in h["topics"]):
                return
        pytest.fail("viewer never saw the test publisher")
    finally:
        c.close()


def block_reduce(a, f, use_max=False):
    """Reference downsampling: f x f blocks, edge blocks smaller, NaN skipped."""
    h, w = a.shape
    oh, ow = -(-h // f), -(-w // f)
    out = np.empty((oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            b = a[i * f:(i + 1) * f, j * f:(j + 1) * f].astype(np.float64)
            b = b[np.isfinite(b)]
            out[i, j] = np.nan if b.size == 0 else (b.max() if use_max else b.mean())
    return out.astype(np.float32)


# ---- the WebSocket feed, against a synthetic source ----------------------------------

@pytest.fixture
def pub(zctx):
    p = Pub(zctx)
    yield p
    p.close()


def test_display_forms_match_numpy(run_tool, pub):
    v = View(run_tool, [pub.ep], args=["--max-side", "256"])
    wait_joined(pub, v)
    rng = np.random.default_rng(3)
    img = rng.normal(100, 10, (300, 200)).astype(np.float64)
    img[5, 7] = np.nan
    img[:4, :4] = np.nan  # one whole display block is NaN
    cpx = (rng.normal(size=(40, 80)) + 1j * rng.normal(size=(40, 80))).astype(np.complex64)
    u16 = rng.integers(0, 65535, (64, 65), dtype=np.uint16)
    g2 = (1 + rng.random((20, 3))).astype(np.float64)
    c = v.client()
    c.ws.send_json({"subscribe": "*"})
    pub.result("a.img", img, frame_id=1, meta=desc("a.img", img, ["y", "x"], "counts"))
    pub.result("a.cpx", cpx, frame_id=2, meta=desc("a.cpx", cpx, ["y", "x"]))
    pub.result("a.u16", u16, frame_id=3, meta=desc("a.u16", u16, ["y", "x"]))
    pub.result("a.g2", g2, frame_id=4, meta=desc("a.g2", g2, ["lag", "roi"]))
    got = {}
    c.until(lambda h, a: h["type"] == "result" and got.setdefault(h["topic"], (h, a)) and
            {"a.img", "a.cpx", "a.u16", "a.g2"} <= set(got), what="the four results")
    # 300x200 with max side 256: one factor 2 on both axes (aspect kept)
    h, a = got["a.img"]
    assert h["shape"] == [300, 200] and h["dtype"] == "float64"
    assert h["data"]["shape"] == [150, 100] and h["data"]["factor"] == [2, 2]
    ref = block_reduce(img, 2)
    np.testing.assert_allclose(a, ref, rtol=1e-6, equal_nan=True)
    assert np.isnan(a[:2, :2]).all() and np.isfinite(a[2, 2])
    st = h["data"]["arrays"][0]
    assert st["min"] == pytest.approx(np.nanmin(ref), rel=1e-6)
    assert st["max"] == pytest.approx(np.nanmax(ref), rel=1e-6)
    assert st["nonfinite"] == int(np.isnan(ref).sum()) >= 4
    assert h["desc"]["units"] == "counts" and h["frame_id"] == 1
    # complex: magnitude and phase planes, not downsampled (fits)
    h, a = got["a.cpx"]
    assert h["data"]["complex"] is True and [x["name"] for x in h["data"]["arrays"]] == \
        ["magnitude", "phase"]
    np.testing.assert_allclose(a[0], np.abs(cpx), rtol=1e-6)
    np.testing.assert_allclose(a[1], np.angle(cpx), atol=1e-6)
    # integers: exact in float32 up to 2^24
    h, a = got["a.u16"]
    np.testing.assert_array_equal(a, u16.astype(np.float32))
    # curve-like 2-D arrays are never downsampled across curves
    h, a = got["a.g2"]
    np.testing.assert_array_equal(a, g2.astype(np.float32))
    assert h["desc"]["axes"] == ["lag", "roi"]
    c.close()


def test_downsample_max_and_huge_image(run_tool, pub):
    v = View(run_tool, [pub.ep], args=["--downsample", "max"])
    wait_joined(pub, v)
    big = np.arange(4100 * 3000, dtype=np.float32).reshape(4100, 3000) % 977
    c = v.client()
    c.ws.send_json({"subscribe": ["h."]})
    pub.result("h.big", big, meta=desc("h.big", big, ["y", "x"]))
    h, a, _ = c.until(lambda h, a: h.get("topic") == "h.big", timeout=20, what="the huge image")
    # 4100 rows: factor ceil(4100 / 1024) = 5 on both axes
    assert h["data"]["factor"] == [5, 5] and h["data"]["shape"] == [820, 600]
    np.testing.assert_array_equal(a, block_reduce(big, 5, use_max=True))
    assert v.proc.alive()
    c.close()


def test_coalescing_latest_wins(run_tool, pub):
    """A browser that reads slowly gets few messages, and always the newest:
    the versions in between are skipped, never queued."""
    v = View(run_tool, [pub.ep], args=["--max-rate", "4"])
    wait_joined(pub, v)
    c = v.client()
    c.ws.send_json({"subscribe": ["c."]})
    img = np.zeros((256, 256), np.float32)
    meta = desc("c.img", img, ["y", "x"])
    t0 = time.monotonic()
    n = 400
    for i in range(n):  # about 2 s of results at 200/s, while the client does not read
        img[0, 0] = i
        pub.result("c.img", img, frame_id=i, meta=meta if i == 0 else None)
        time.sleep(0.005)
    sent_s = time.monotonic() - t0
    time.sleep(0.5)
    frames = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            h, a = c.next(timeout=0.5)
        except socket.timeout:
            continue
        if h.get("topic") == "c.img":
            frames.append((h["frame_id"], float(a[0, 0])))
    ids = [f for f, _ in frames]
    assert ids and ids[-1] == n - 1, ids            # latest wins
    assert all(f == x for f, x in frames)           # each message carries its own data
    assert ids == sorted(ids)
    # at most max-rate per second over the whole time, plus the first one
    assert len(ids) <= 4 * (sent_s + 0.5 + 3) + 2, (len(ids), sent_s)
    assert len(ids) < n / 10
    c.close()


def test_credit_window_holds_results_in_the_viewer(run_tool, pub):
    """With {"window": 1} the viewer sends one result and then waits for an
    ack; whatever was published meanwhile is replaced there, so the ack
    brings the newest, not the next."""
    v = View(run_tool, [pub.ep], args=["--max-rate", "1000"])
    wait_joined(pub, v)
    c = v.client()
    c.ws.send_json({"subscribe": ["w."], "window": 1})
    pub.result("w.x", np.full(4, 0, np.float32), frame_id=0)
    h, _, _ = c.until(lambda h, a: h.get("topic") == "w.x", what="the first result")
    assert h["frame_id"] == 0
    for i in range(1, 50):
        pub.result("w.x", np.full(4, i, np.float32), frame_id=i)
        time.sleep(0.01)
    time.sleep(0.3)
    late = []
    try:
        while True:
            h, _ = c.next(timeout=0.5)
            if h.get("topic") == "w.x":
                late.append(h["frame_id"])
    except socket.timeout:
        pass
    assert late == [], late  # no credit: nothing more was sent
    c.ws.send_json({"ack": 1})
    h, a, _ = c.until(lambda h, a: h.get("topic") == "w.x", what="the result after the ack")
    assert h["frame_id"] == 49 and a[0] == 49
    c.close()


def test_rate_limit_per_topic_not_global(run_tool, pub):
    v = View(run_tool, [pub.ep], args=["--max-rate", "5"])
    wait_joined(pub, v)
    c = v.client()
    c.ws.send_json({"subscribe": ["r."]})
    counts = {"r.a": 0, "r.b": 0}
    t_end = time.monotonic() + 2.0
    i = 0
    while time.monotonic() < t_end:
        for t in counts:
            pub.result(t, np.full(4, i, np.float32), frame_id=i)
        i += 1
        time.sleep(0.01)
        try:
            while True:
                h, _ = c.next(timeout=0.001)
                if h.get("topic") in counts:
                    counts[h["topic"]] += 1
        except socket.timeout:
            pass
    # 5/s each over 2 s: both topics flow, neither starves the other
    for t, k in counts.items():
        assert 5 <= k <= 14, counts


def test_bad_input_is_listed_and_shown_raw(run_tool, pub):
    v = View(run_tool, [pub.ep])
    wait_joined(pub, v)
    c = v.client()
    c.ws.send_json({"subscribe": ["bad.", "nodesc."]})
    parts = proto.encode_message(proto.RESULT, array=np.zeros(8, np.float32), topic="bad.dtype")
    hdr = bytearray(parts[1])
    hdr[56] = 99  # dtype byte: no such dtype
    pub.parts([parts[0], bytes(hdr)] + parts[2:])
    pub.parts([b"bad.short", b"\x89BMD\x01"])  # truncated header
    arr = np.arange(12, dtype=np.int32).reshape(3, 4)
    pub.result("nodesc.val", arr)  # no descriptor at all
    want = {"bad.dtype", "bad.short", "nodesc.val"}
    seen = {}

    def done(h, a):
        if h["type"] in ("raw", "result") and h.get("topic") in want:
            seen[h["topic"]] = (h, a)
        if h["type"] == "topics":
            seen["list"] = {t["topic"]: t for t in h["topics"]}
        return want <= set(seen) and "list" in seen and want <= set(seen["list"])
    c.until(done, what="raw topics and the list naming them")
    lst = seen["list"]
    assert lst["bad.dtype"]["ok"] is False and lst["bad.dtype"]["raw"] is True
    assert lst["bad.dtype"]["why"] == "unknown dtype"
    assert lst["bad.short"]["why"] == "header part too short"
    assert lst["nodesc.val"]["ok"] is True and lst["nodesc.val"]["raw"] is True
    h, _ = seen["bad.dtype"]
    assert h["type"] == "raw" and h["why"] == "unknown dtype" and h["head_hex"].startswith("89424d44")
    h, a = seen["nodesc.val"]
    assert h["type"] == "result" and h["desc"] is None
    np.testing.assert_array_equal(a, arr.astype(np.float32))
    assert v.proc.alive()
    c.close()


def test_flood_and_disconnects_keep_the_viewer_serving(run_tool, pub):
    v = View(run_tool, [pub.ep])
    wait_joined(pub, v)
    # a browser that goes away in the middle of a large message
    big = np.ones((1024, 1024), np.float32)
    for k in range(3):
        w = WebSocket("127.0.0.1", v.port, "/ws")
        assert w.status == 101
        w.send_json({"subscribe": ["f.big"]})
        pub.result("f.big", big, frame_id=k)
        w.sock.recv(1000)  # a little, then hang up without a close frame
        w.sock.close()
    # a flood of tiny results on many topics while a page is fetched
    t0 = time.monotonic()
    for i in range(20000):
        pub.result("f.t%d" % (i % 50), np.full(1, i, np.float32), frame_id=i)
    st, body, _ = http_get(v.port, "/", timeout=5)
    assert st == 200 and b"beamd-view" in body
    c = v.client()
    c.ws.send_json({"subscribe": ["f.t49"]})
    h, a, _ = c.until(lambda h, a: h.get("topic") == "f.t49" and h["frame_id"] == 19999,
                      timeout=15, what="the last tiny result")
    assert a[0] == 19999
    assert time.monotonic() - t0 < 30
    assert v.proc.alive()
    c.close()


def test_stream_that_stops_is_reported(run_tool, pub):
    v = View(run_tool, [pub.ep])
    wait_joined(pub, v)
    c = v.client()
    for i in range(5):
        pub.result("s.x", np.full(1, i, np.float32), frame_id=i)
        time.sleep(0.05)
    stop = time.monotonic()

    def stale(h, a):
        if h["type"] != "topics":
            return False
        t = {t["topic"]: t for t in h["topics"]}.get("s.x")
        return t is not None and t["count"] == 5 and t["age_s"] >= 2.0
    h, _, _ = c.until(stale, timeout=6, what="a topic list showing the stream stopped")
    t = {t["topic"]: t for t in h["topics"]}["s.x"]
    assert t["age_s"] <= time.monotonic() - stop + 0.5
    assert h["subs"][0]["age_s"] >= 1.5
    assert v.proc.alive()
    c.close()


# ---- token --------------------------------------------------------------------------

def test_token_gets_403_and_nothing_else(run_tool, pub):
    v = View(run_tool, [pub.ep], args=["--token", TOKEN])
    for path in ("/", "/?token=wrong", "/app.js", "/index.html?token=" + TOKEN[:-1]):
        st, body, _ = http_get(v.port, path)
        assert st == 403, path
        assert b"beamd" not in body and b"<script" not in body
    st, body, hdrs = http_get(v.port, "/?token=" + TOKEN)
    assert st == 200 and b"app.js" in body
    cookie = hdrs.get("set-cookie") or hdrs.get("Set-Cookie")
    assert cookie and TOKEN in cookie and "HttpOnly" in cookie
    st, body, _ = http_get(v.port, "/app.js", headers={"Cookie": cookie.split(";")[0]})
    assert st == 200 and b"beamdView" in body
    st, _, _ = http_get(v.port, "/style.css", headers={"Authorization": "Bearer " + TOKEN})
    assert st == 200
    for path in ("/ws", "/ws?token=nope"):
        w = WebSocket("127.0.0.1", v.port, path)
        assert w.status == 403 and b"topics" not in w.body
    c = v.client(token=TOKEN)
    h, _ = c.next()
    assert h["type"] == "hello"
    c.close()


# ---- loopback: Host and Origin ----------------------------------------------------------

def test_loopback_refuses_foreign_origin_and_host(run_tool, pub):
    """Without a token, a foreign page (Origin) or a rebound name (Host)
    gets 403 and no data; the viewer's own page origin, and a client that
    sends no Origin, get the feed. Each refusal is counted."""
    v = View(run_tool, [pub.ep])
    own = ["http://127.0.0.1:%d" % v.port, "http://localhost:%d" % v.port,
           "http://[::1]:%d" % v.port, "HTTP://LOCALHOST:%d" % v.port]
    foreign = ["http://evil.example", "http://evil.example:%d" % v.port, "null",
               "http://127.0.0.1:%d" % (v.port + 1), "https://127.0.0.1:%d" % v.port,
               "http://127.0.0.1:%d.evil.example" % v.port]
    for origin in foreign:
        w = WebSocket("127.0.0.1", v.port, "/ws", headers=["Origin: " + origin])
        assert w.status == 403, origin
        assert b"hello" not in w.body and b"topics" not in w.body
    hosts = ["evil.example:%d" % v.port, "127.0.0.1:%d" % (v.port + 1), "127.0.0.1",
             "localhost.evil.example:%d" % v.port]
    for host in hosts:
        w = WebSocket("127.0.0.1", v.port, "/ws", host_header=host,
                      headers=["Origin: http://%s" % host])
        assert w.status == 403, host
        w = WebSocket("127.0.0.1", v.port, "/ws", host_header=host)
        assert w.status == 403, host
    # Plain HTTP under a rebound name: the page itself is refused.
    for path in ("/", "/app.js", "/style.css"):
        st, body, _ = http_get(v.port, path, headers={"Host": "evil.example:%d" % v.port})
        assert st == 403 and b"<script" not in body, path
    st, body, _ = http_get(v.port, "/", headers={"Host": "localhost:%d" % v.port})
    assert st == 200 and b"app.js" in body
    for origin in own:
        w = WebSocket("127.0.0.1", v.port, "/ws", headers=["Origin: " + origin])
        assert w.status == 101, origin
        w.close()
    w = WebSocket("127.0.0.1", v.port, "/ws", host_header="[::1]:%d" % v.port)
    assert w.status == 101
    w.close()
    c = v.client()                      # no Origin: a non-browser client
    h, _ = c.next()
    assert h["type"] == "hello"
    # The counts ride on the topic list (sent once a second).
    want = {"token": 0, "origin": len(foreign), "host": 2 * len(hosts) + 3}
    c.until(lambda h, a: h["type"] == "topics" and h["refused"] == want, timeout=5,
            what="topics with refused = %s" % want)
    c.close()
    assert "is not this viewer's" in v.proc.stderr()


def test_token_mode_does_not_check_origin(run_tool, pub):
    v = View(run_tool, [pub.ep], args=["--token", TOKEN])
    w = WebSocket("127.0.0.1", v.port, "/ws?token=" + TOKEN, host_header="beamline-host:8600",
                  headers=["Origin: http://beamline-host:8600"])
    assert w.status == 101
    w.close()


def test_bind_beyond_loopback_needs_a_token(run_tool):
    p = run_tool("beamd-view", ["--bind", "0.0.0.0", "--port", str(free_ports(1)[0])], wait=10)
    assert p.p.returncode == 2
    assert "--token" in p.stderr()
    p = run_tool("beamd-view", ["--token", "short"], wait=10)
    assert p.p.returncode == 2 and "8..128" in p.stderr()


# ---- the real pipeline ----------------------------------------------------------------

SHAPE = (128, 128)


def sim_args(nframes, label_file, rate=0):
    a = ["--pattern", "xpcs", "--shape", "%dx%d" % SHAPE, "--frames", str(nframes),
         "--xpcs-rings", "4", "--mean", "5", "--frame-time", "0.001", "--seed", "2",
         "--label-file", str(label_file)]
    return a + (["--rate", str(rate)] if rate else [])


def make_labels(zctx, tmp_path):
    """The sim's label file, from a 1-frame run (drained to SERIES_END)."""
    lab = tmp_path / "labels.npy"
    port = free_ports(1)[0]
    pull = zctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVTIMEO, 10000)
    pull.connect("tcp://127.0.0.1:%d" % port)
    sim = subprocess.Popen([binary("beamd-sim"), "--bind", "tcp://127.0.0.1:%d" % port,
                            "--socket", "push", "--quiet"] + sim_args(1, lab))
    try:
        while proto.decode_message(pull.recv_multipart())[1].type != proto.SERIES_END:
            pass
    finally:
        pull.close(0)
        sim.wait(timeout=10)
    return lab


@pytest.fixture
def pipeline(tmp_path, ports, zctx, start_beamd, run_tool):
    """beamd (preview + xpcs_multitau) fed by beamd-sim at 500 frames/s, and
    a viewer on its publish and control endpoints."""
    lab = make_labels(zctx, tmp_path)
    stages = [{"name": "preview", "kind": "preview", "backend": "cpu", "rate": 20},
              {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu", "rois": {"file": str(lab)},
               "levels": 8, "buffers": 8, "publish_every": 50}]
    b = start_beamd(make_config(ports, stages, mode="pull", pool_frames=64))
    v = View(run_tool, [ports.ep_publish], control=ports.ep_control)
    sim = run_tool("beamd-sim", ["--bind", ports.ep_input, "--socket", "push", "--quiet"] +
                   sim_args(40000, tmp_path / "labels2.npy", rate=500))
    return b, v, sim


def test_feed_from_the_pipeline_matches_an_independent_decode(pipeline, zctx, receivers, ports):
    b, v, sim = pipeline
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    c = v.client()
    got = {"preview.frame": [], "mt.g2": [], "mt.lags": []}
    status = []

    def need(h, a):
        if h["type"] == "result" and h["topic"] in got:
            got[h["topic"]].append((h, a))
        if h["type"] == "status" and h["ok"] and h["stats"]["input"]["frames"] > 0:
            status.append(h)
        return status and all(len(x) >= 3 for x in got.values())
    c.until(need, timeout=30, what="3 previews, g2s and lags, and a status")
    c.close()
    last = got["mt.g2"][-1][0]["frame_id"]
    rx.wait_for(lambda ms: any(m[0] == "mt.g2" and m[1].frame_id >= last for m in ms), timeout=10)
    msgs = {(m[0], m[1].series_id, m[1].frame_id): m for m in rx.snapshot()}
    for topic in ("preview.frame", "mt.g2"):
        compared = 0
        for h, a in got[topic]:
            ref = msgs.get((topic, h["series_id"], h["frame_id"]))
            if ref is None:
                continue  # published before the Receiver joined
            np.testing.assert_array_equal(a, ref[2].astype(np.float32))
            assert h["data"]["arrays"][0]["max"] == pytest.approx(float(np.max(ref[2])), rel=1e-6)
            compared += 1
        assert compared >= 2, topic
    h, a = got["mt.g2"][-1]
    assert h["desc"]["axes"] == ["lag", "roi"] and a.shape[1] == 4
    assert np.all(a[1:4] > 1.0)  # correlated speckle: g2 above 1 at short lags
    st = status[-1]
    assert [s["name"] for s in st["status"]["stages"]] == ["preview", "mt"]
    assert [s["name"] for s in st["stats"]["stages"]] == ["preview", "mt"]


def test_status_says_when_the_daemon_is_gone(pipeline):
    b, v, sim = pipeline
    c = v.client()
    c.until(lambda h, a: h["type"] == "status" and h["ok"], timeout=10, what="a good status")
    sim.kill()
    b.kill()
    h, _, _ = c.until(lambda h, a: h["type"] == "status" and not h["ok"], timeout=10,
                      what="a status saying the daemon does not answer")
    assert "no reply" in h["error"]
    assert v.proc.alive()
    c.close()


def test_browser_draws_image_and_g2_and_keeps_updating(pipeline):
    b, v, sim = pipeline
    os.makedirs(ARTEFACTS, exist_ok=True)
    try:
        br = Browser()
    except (FileNotFoundError, RuntimeError) as e:
        pytest.skip("headless chromium not usable here: %s" % e)
    try:
        br.goto("http://127.0.0.1:%d/" % v.port)
        br.wait("window.beamdView && beamdView.connected", 15, "the WebSocket to open")
        # the topic list names every topic, with what it is
        br.wait("['preview.frame','mt.g2','mt.lags','mt.info'].every(t => "
                "document.querySelector('#topics li[data-topic=\"' + t + '\"]'))", 20,
                "all topics listed")
        kinds = br.eval("Object.fromEntries(Array.from(document.querySelectorAll('#topics li'))"
                        ".map(l => [l.dataset.topic, l.dataset.kind]))")
        assert kinds["preview.frame"] == "image" and kinds["mt.g2"] == "curves"
        br.wait("(beamdView.drawn['preview.frame'] || 0) >= 2 && (beamdView.drawn['mt.g2'] || 0) >= 2",
                20, "image and g2 drawn")
        br.wait("document.querySelectorAll('#status tr[data-stage]').length == 2", 10,
                "the stage table")
        shot1 = br.screenshot(os.path.join(ARTEFACTS, "view-1.png"))
        d0 = br.eval("Object.assign({}, beamdView.drawn)")
        time.sleep(2.0)
        d1 = br.eval("Object.assign({}, beamdView.drawn)")
        assert d1["preview.frame"] >= d0["preview.frame"] + 3, (d0, d1)  # 20 previews/s published
        assert d1["mt.g2"] > d0["mt.g2"], (d0, d1)
        # canvas state: the image has many colours, the g2 plot 4 curves on a log axis
        img = br.eval("""(() => { const p = beamdView.panels.get('preview.frame');
            const d = p.canvas.getContext('2d').getImageData(0, 0, p.canvas.width, p.canvas.height).data;
            const s = new Set(); for (let i = 0; i < d.length; i += 4) s.add(d[i] << 16 | d[i+1] << 8 | d[i+2]);
            return {colours: s.size, w: p.img.w, h: p.img.h}; })()""")
        assert img["colours"] > 20 and (img["w"], img["h"]) == (SHAPE[1], SHAPE[0]), img
        g2 = br.eval("""(() => { const p = beamdView.panels.get('mt.g2');
            const d = p.canvas.getContext('2d').getImageData(0, 0, p.canvas.width, p.canvas.height).data;
            const want = [[79,140,201],[242,142,43],[89,161,79],[225,87,89]];
            const n = want.map(c => { let k = 0; for (let i = 0; i < d.length; i += 4)
                if (d[i] == c[0] && d[i+1] == c[1] && d[i+2] == c[2]) k++; return k; });
            return {curves: p.curves, points: p.points, logx: p.opts.logx.checked, pixels: n}; })()""")
        assert g2["curves"] == 4 and g2["logx"] is True, g2
        assert all(k > 30 for k in g2["pixels"]), g2  # every ROI's colour is on the canvas
        assert br.eval("beamdView.errors.length") == 0, br.eval("beamdView.errors")
        br.screenshot(os.path.join(ARTEFACTS, "view-2.png"))
        # the stream stops: the page says so
        sim.kill()
        b.kill()
        txt = br.wait("document.getElementById('stream').textContent.includes('stopped') && "
                      "document.getElementById('stream').textContent", 15, "the stopped indicator")
        assert "last result" in txt
        br.screenshot(os.path.join(ARTEFACTS, "view-stopped.png"))
        assert os.path.getsize(shot1) > 10000
    finally:
        br.close()


def test_browser_lists_bad_input_as_raw(run_tool, pub):
    """The page with hand-made input: an undecodable topic is listed with a
    raw badge and shows why; a result without a descriptor is drawn by its
    shape with a raw badge; a complex image shows magnitude, then phase."""
    v = View(run_tool, [pub.ep])
    wait_joined(pub, v)
    os.makedirs(ARTEFACTS, exist_ok=True)
    try:
        br = Browser()
    except (FileNotFoundError, RuntimeError) as e:
        pytest.skip("headless chromium not usable here: %s" % e)
    rng = np.random.default_rng(1)
    cpx = (rng.normal(size=(96, 128)) + 1j * rng.normal(size=(96, 128))).astype(np.complex64)
    plain = rng.random((80, 100)).astype(np.float32)
    bad = proto.encode_message(proto.RESULT, array=np.zeros(8, np.float32), topic="bad.dtype")
    hdr = bytearray(bad[1])
    hdr[56] = 99
    try:
        br.goto("http://127.0.0.1:%d/" % v.port)
        br.wait("window.beamdView && beamdView.connected", 15, "the WebSocket to open")
        t_end = time.monotonic() + 20
        ok = False
        while time.monotonic() < t_end and not ok:
            pub.result("dm.object", cpx, meta=desc("dm.object", cpx, ["y", "x"]))
            pub.result("nodesc.img", plain)
            pub.parts([bad[0], bytes(hdr)] + bad[2:])
            time.sleep(0.2)
            ok = br.eval("['dm.object','nodesc.img','bad.dtype'].every(t => "
                         "document.querySelector('#topics li[data-topic=\"' + t + '\"]')) && "
                         "(beamdView.drawn['dm.object'] || 0) > 0 && (beamdView.drawn['nodesc.img'] || 0) > 0")
        assert ok, "topics not listed and drawn within 20 s"
        li = br.eval("""Object.fromEntries(['dm.object','nodesc.img','bad.dtype'].map(t => {
            const l = document.querySelector('#topics li[data-topic="' + t + '"]');
            return [t, {kind: l.dataset.kind, raw: !!l.querySelector('.raw'), text: l.textContent}]; }))""")
        assert li["bad.dtype"]["raw"] and li["bad.dtype"]["kind"] == "raw"
        assert "unknown dtype" in li["bad.dtype"]["text"]
        assert li["nodesc.img"]["raw"] and li["nodesc.img"]["kind"] == "image"
        assert not li["dm.object"]["raw"] and li["dm.object"]["kind"] == "image"
        # the raw topic, opened by a click, says why
        br.eval("document.querySelector('#topics li[data-topic=\"bad.dtype\"]').click()")
        pub.parts([bad[0], bytes(hdr)] + bad[2:])
        br.wait("(() => { const p = beamdView.panels.get('bad.dtype');"
                " return p && p.pre.textContent.includes('cannot decode: unknown dtype'); })()",
                10, "the raw panel")
        # complex: magnitude by default (max = largest |z|), then phase (-pi..pi)
        mag = br.eval("beamdView.panels.get('dm.object').opts.hi.value")
        assert float(mag) == pytest.approx(float(np.abs(cpx).max()), rel=1e-4)
        br.eval("(() => { const p = beamdView.panels.get('dm.object'); p.opts.part.value = '1';"
                " p.opts.part.onchange(); })()")
        br.wait("Math.abs(parseFloat(beamdView.panels.get('dm.object').opts.hi.value) - Math.PI) < 1e-3",
                10, "the phase view")
        br.screenshot(os.path.join(ARTEFACTS, "view-bad-input.png"))
        assert br.eval("beamdView.errors.length") == 0, br.eval("beamdView.errors")
        assert v.proc.alive()
    finally:
        br.close()
