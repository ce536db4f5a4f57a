"""Two daemons chained (the test's sender -> daemon A -> daemon B -> the
test's recorder), and A killed with SIGKILL in the middle of a series.

A is `pull` with a `correct` stage and `output.push`; B is `pull` from A's
PUSH with `input.result_topic: corr.frame` (A's corrected frames are B's
frames) and a `roi_sum`, and its own PUSH is what the recorder (a PULL
here) takes. Loopback only; every wait has a deadline.

What a kill of A must cost, and only that (docs/chaining.md):
- the frames A had taken but not yet handed to B are lost, and B reports
  exactly that many missing: frames B published + B's missing_frames ==
  frames sent in the series; what B published is the unbroken prefix of
  the series, each result right;
- a restarted A never saw that series start, so it drops what still comes
  of it (unknown_series) together with its end; B ends the series when the
  next one starts, ABORTED and INCOMPLETE with {"missing_frames": N};
- the next series passes complete and clean (no INCOMPLETE, no missing).

Mid-series gaps (and the upstream's own counts) are checked with a sender
that speaks RESULTs to B directly, so the ids lost are known exactly.
"""

import http.client
import re
import subprocess
import time

import h5py
import numpy as np
import zmq

from conftest import Ports, Receiver, Sender, binary, make_config, proto, to_yaml

TOPIC = "corr.frame"


def a_config(ports):
    return make_config(ports, [{"name": "corr", "kind": "correct", "backend": "cpu"}],
                       mode="pull", push=True, pool_frames=32, frame_bytes="1Mi", input_hwm=0)


def b_config(ports, upstream_ep, rois, pool_frames=4, input_hwm=2):
    cfg = make_config(ports, [{"name": "vd", "kind": "roi_sum", "backend": "cpu", "queue": 2,
                               "rois": rois}],
                      mode="pull", push=True, pool_frames=pool_frames, frame_bytes="1Mi",
                      input_hwm=input_hwm)
    cfg["input"]["endpoint"] = upstream_ep
    cfg["input"]["result_topic"] = TOPIC
    return cfg


def frames_for(rng, n, h, w):
    return rng.integers(0, 1000, size=(n, h, w)).astype(np.uint16)


def send_series(tx, sid, frames):
    n, h, w = frames.shape
    tx.start(sid, (h, w), np.uint16, meta={"detector": "test", "frame_time": 0.001,
                                           "nframes": n})
    for k in range(n):
        tx.frame(sid, k, frames[k])
    tx.end(sid)


def sums_of(rx, sid):
    """frame id -> (header, sums) of vd.sums of series sid, each id once."""
    got = {}
    for topic, hdr, arr, meta in rx.snapshot("vd.sums"):
        if hdr.series_id == sid:
            assert hdr.frame_id not in got, "duplicate result for frame %d" % hdr.frame_id
            got[hdr.frame_id] = (hdr, arr, meta)
    return got


def chain_and_kill(zctx, start_beamd, rois, sid, frames):
    """Starts A and B, sends series sid to A with nobody taking B's output,
    and kills A (SIGKILL) once B is held up by its PUSH: the rest of the
    series is then in flight in A. Returns (a, b, a's ports, b's ports,
    the sender)."""
    pa, pb = Ports(), Ports()
    a = start_beamd(a_config(pa), name="beamd-a")
    b = start_beamd(b_config(pb, pa.ep_push, rois), name="beamd-b")
    tx = Sender(zctx, pa.ep_input, zmq.PUSH, send_timeout=20)
    send_series(tx, sid, frames)  # all queued: A's input has no high-water mark
    st = b.wait_stats(lambda s: s["input"]["paused"] and s["input"]["frames"] > 0, timeout=20,
                      what="B held up by its PUSH")
    time.sleep(0.3)  # B's pool and slots are full: what it holds now stays at that
    assert b.stats()["input"]["frames"] < len(frames), st["input"]
    a.p.kill()
    a.p.wait(timeout=5)
    return a, b, pa, pb, tx


def full_rois(n, h, w):
    return [{"name": "r%d" % i, "shape": "rect", "rect": [0, 0, w, h]} for i in range(n)]


def test_chained_equals_single(tmp_path, zctx, start_beamd, receivers):
    """No kill: B's results from A's corrected frames are bit for bit what
    one daemon computes with correct -> roi_sum, and both series end clean."""
    H, W, N = 32, 48, 25
    rois = [{"name": "c", "shape": "disk", "radius": 9},
            {"name": "q", "shape": "rect", "rect": [3, 4, 40, 20]}]
    rng = np.random.default_rng(11)
    frames = frames_for(rng, N, H, W)
    pa, pb, pc = Ports(), Ports(), Ports()
    start_beamd(a_config(pa), name="beamd-a")
    b = start_beamd(b_config(pb, pa.ep_push, rois, pool_frames=16, input_hwm=0), name="beamd-b")
    single = make_config(pc, [{"name": "corr", "kind": "correct", "backend": "cpu",
                               "publish": False},
                              {"name": "vd", "kind": "roi_sum", "backend": "cpu",
                               "input": "corr", "rois": rois}],
                         mode="pull", push=True)
    start_beamd(single, name="beamd-single")
    rb = Receiver(zctx, pb.ep_push, kind=zmq.PULL)
    rc = Receiver(zctx, pc.ep_push, kind=zmq.PULL)
    receivers.extend([rb, rc])
    ta = Sender(zctx, pa.ep_input, zmq.PUSH)
    tc = Sender(zctx, pc.ep_input, zmq.PUSH)
    for sid in (3, 4):
        send_series(ta, sid, frames)
        send_series(tc, sid, frames)
    for sid in (3, 4):
        for r in (rb, rc):
            end = r.wait_series_end(sid, timeout=20)
            assert not end[1].flags & (proto.FLAG_INCOMPLETE | proto.FLAG_ABORTED), end
        chained, one = sums_of(rb, sid), sums_of(rc, sid)
        assert sorted(chained) == list(range(N)) and sorted(one) == list(range(N))
        for k in range(N):
            assert not chained[k][0].flags & proto.FLAG_INCOMPLETE
            np.testing.assert_array_equal(chained[k][1], one[k][1])
        y, x = np.mgrid[0:H, 0:W]
        masks = [(x - (W - 1) / 2.0) ** 2 + (y - (H - 1) / 2.0) ** 2 < 81,
                 (x >= 3) & (x < 40) & (y >= 4) & (y < 20)]
        ref = np.array([[frames[k][m].astype(np.float64).sum() for m in masks] for k in range(N)])
        got = np.array([np.asarray(chained[k][1], np.float64).ravel()[:2] for k in range(N)])
        np.testing.assert_allclose(got, ref, rtol=1e-6)
    st = b.stats()["input"]
    assert st["frames"] == 2 * N and st["missing"] == 0 and st["unknown_series"] == 0, st
    assert st["unexpected"] == 0 and st["malformed"] == 0, st
    assert not rb.decode_errors() and not rc.decode_errors()


def test_kill_middle_daemon(tmp_path, zctx, start_beamd, receivers):
    """kill -9 of A while it holds the rest of a series; restart; next series.

    The recorder connects only after the kill, so B fills up (its pool, its
    stage's output slots, its PUSH backlog), stops reading, and the rest of
    the series waits in A (its pipeline, its PUSH backlog, ZeroMQ's queues
    and socket buffers): that rest is what is in flight when A dies. A
    message the kernel still delivers from A's socket after the kill is
    received by B as usual; the accounting holds either way."""
    H, W, N, N2 = 256, 256, 200, 20
    rois = [{"name": "all", "shape": "rect", "rect": [0, 0, W, H]},
            {"name": "c", "shape": "disk", "radius": 20}]
    rng = np.random.default_rng(5)
    frames = frames_for(rng, N, H, W)
    frames2 = frames_for(rng, N2, H, W)
    sid = 41
    a, b, pa, pb, tx = chain_and_kill(zctx, start_beamd, rois, sid, frames)

    rx = Receiver(zctx, pb.ep_push, kind=zmq.PULL)
    receivers.append(rx)
    a2 = start_beamd(a.cfg, name="beamd-a")  # the same config, rewritten to the same file
    sid2 = 42
    send_series(tx, sid2, frames2)
    end = rx.wait_series_end(sid, timeout=30)
    end2 = rx.wait_series_end(sid2, timeout=30)

    got = sums_of(rx, sid)
    k_ok = len(got)
    assert 0 < k_ok < N, k_ok
    # What B published is the unbroken prefix of the series, each right ...
    assert sorted(got) == list(range(k_ok)), sorted(got)
    for k, (hdr, arr, meta) in got.items():
        assert float(np.asarray(arr).ravel()[0]) == float(frames[k].astype(np.float64).sum()), k
    # ... and exactly the rest, what A had when it died, is reported missing:
    # at the first result of the next series (the end never came).
    assert end[1].flags & proto.FLAG_INCOMPLETE and end[1].flags & proto.FLAG_ABORTED, end[1]
    assert end[3] == {"missing_frames": N - k_ok}, (end[3], k_ok)

    # The next series recovers cleanly.
    got2 = sums_of(rx, sid2)
    assert sorted(got2) == list(range(N2)), sorted(got2)
    assert not end2[1].flags & (proto.FLAG_INCOMPLETE | proto.FLAG_ABORTED), end2[1]
    assert end2[3] is None, end2[3]
    for k, (hdr, arr, meta) in got2.items():
        assert not hdr.flags & proto.FLAG_INCOMPLETE, k
        assert float(np.asarray(arr).ravel()[0]) == float(frames2[k].astype(np.float64).sum()), k
    st = b.stats()["input"]
    assert st["frames"] == k_ok + N2 and st["missing"] == N - k_ok, st
    assert st["seq_resets"] >= 1 and st["malformed"] == 0 and st["unexpected"] == 0, st
    assert st["unknown_series"] == 0 and st["dropped_busy"] == 0, st
    st2 = a2.stats()["input"]
    assert st2["frames"] == N2 and st2["malformed"] == 0, st2
    assert not rx.decode_errors()


def test_kill_middle_daemon_recorded(tmp_path, zctx, start_beamd, run_tool):
    """The same kill with beamd-record as the last hop: the killed series'
    file holds exactly the results B published and says how many frames
    the series lost (/entry@missing_frames); the next series' file is
    complete and says nothing of losses."""
    H, W, N, N2 = 256, 256, 200, 20
    rois = [{"name": "all", "shape": "rect", "rect": [0, 0, W, H]}]
    rng = np.random.default_rng(9)
    frames = frames_for(rng, N, H, W)
    frames2 = frames_for(rng, N2, H, W)
    sid, sid2 = 51, 52
    a, b, pa, pb, tx = chain_and_kill(zctx, start_beamd, rois, sid, frames)
    out = tmp_path / "rec"
    out.mkdir()
    # --series counts complete series: the killed one ends ABORTED
    rec = run_tool("beamd-record", ["--connect", pb.ep_push, "--pull", "--dir", str(out),
                                    "--series", "1", "--timeout", "40", "--stats-json"])
    start_beamd(a.cfg, name="beamd-a")
    send_series(tx, sid2, frames2)
    assert rec.wait(45) == 0, rec.stderr()
    st = b.stats()["input"]
    with h5py.File(out / ("series_%d.h5.partial" % sid), "r") as f:  # ended ABORTED
        e = f["/entry"]
        k = int(e.attrs["results_written"])
        assert 0 < k < N, k
        assert e.attrs["missing_frames"] == N - k and bool(e.attrs["complete"]) is False
        assert list(f["/results/vd.sums/frame_id"][...]) == list(range(k))
        sums = f["/results/vd.sums/data"][...][:, 0]
        np.testing.assert_array_equal(sums, frames[:k].reshape(k, -1).sum(axis=1).astype(sums.dtype))
    assert st["missing"] == N - k, (st, k)
    with h5py.File(out / ("series_%d.h5" % sid2), "r") as f:
        e = f["/entry"]
        assert bool(e.attrs["complete"]) is True and e.attrs["results_written"] == N2
        assert "missing_frames" not in e.attrs
    tx.close()


def test_result_gaps_and_upstream_losses(tmp_path, ports, zctx, start_beamd, receivers):
    """RESULTs sent to B directly: frame-id gaps, another topic, an
    upstream's INCOMPLETE count, and an end short of nframes."""
    H, W, NF = 8, 8, 12
    rois = [{"name": "all", "shape": "rect", "rect": [0, 0, W, H]}]
    cfg = b_config(ports, ports.ep_input, rois, pool_frames=16, input_hwm=0)
    b = start_beamd(cfg)
    rx = Receiver(zctx, ports.ep_push, kind=zmq.PULL)
    receivers.append(rx)
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    sid = 7
    # The upstream's SERIES_START: the geometry of ITS input (uint16, 8x9);
    # the series here takes the results' (float32 8x8).
    tx.start(sid, (H, W + 1), np.uint16, meta={"detector": "t", "frame_time": 0.01,
                                               "nframes": NF})
    rng = np.random.default_rng(3)
    arrs = {k: rng.uniform(0, 10, size=(H, W)).astype(np.float32) for k in range(NF)}

    def result(k, topic=TOPIC, flags=0, meta=None):
        parts = proto.encode_message(proto.RESULT, array=arrs[k], series_id=sid, frame_id=k,
                                     seq=tx.seq, topic=topic,
                                     flags=flags | proto.FLAG_PARTIAL, meta=meta, stage_id=1)
        tx.send_parts(parts)

    for k in (0, 1, 2):
        result(k)
    result(2, topic="corr.other")           # another topic: skipped, counted
    for k in (5, 6):                        # 3, 4 never come: 2 missing
        result(k)
    # The upstream says it lost 3 frames of this series so far.
    result(7, flags=proto.FLAG_INCOMPLETE,
           meta={"stage": "corr", "output": "frame", "dtype": "float32", "shape": [H, W],
                 "missing_frames": 3})
    result(9)                               # 8 never comes: 3 by gaps
    tx.end(sid)                             # 10, 11 never come: 5 in all
    end = rx.wait_series_end(sid, timeout=15)
    assert end[1].flags & proto.FLAG_INCOMPLETE and not end[1].flags & proto.FLAG_ABORTED
    assert end[3] == {"missing_frames": 5}, end[3]
    got = sums_of(rx, sid)
    assert sorted(got) == [0, 1, 2, 5, 6, 7, 9], sorted(got)
    for k, (hdr, arr, meta) in got.items():
        np.testing.assert_allclose(np.asarray(arr).ravel()[0], arrs[k].astype(np.float64).sum(),
                                   rtol=1e-6)
        if k >= 5:  # published after the first loss
            assert hdr.flags & proto.FLAG_INCOMPLETE, k
            assert isinstance(meta, dict) and 2 <= meta["missing_frames"] <= 5, (k, meta)
    st = b.stats()["input"]
    assert st["frames"] == 7 and st["other_topics"] == 1 and st["missing"] == 5, st
    assert st["upstream_missing"] == 3 and st["unexpected"] == 0 and st["malformed"] == 0, st
    assert st["shape_mismatch"] == 0, st
    # The same counts where an operator's alerts read them (/metrics is
    # refreshed once a heartbeat).
    want = [r"^beamd_input_upstream_missing_total 3$", r"^beamd_input_other_topics_total 1$",
            r"^beamd_input_missing_total 5$"]
    deadline = time.monotonic() + 5
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", ports.metrics, timeout=3)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        conn.close()
        if all(re.search(w, body, re.M) for w in want) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for w in want:
        assert re.search(w, body, re.M), (w, body)

    # A series whose start and end come without a single result: all missing.
    tx.start(sid + 1, (H, W), np.uint16, meta={"detector": "t", "frame_time": 0.01,
                                                "nframes": 4})
    tx.end(sid + 1)
    end = rx.wait_series_end(sid + 1, timeout=10)
    assert end[3] == {"missing_frames": 4}, end[3]
    assert not rx.decode_errors()


def test_result_topic_config_errors(tmp_path, ports, start_beamd):
    """result_topic is checked at load: a valid topic, and only for the
    beamd protocol inputs."""
    for bad, why in (({"mode": "pull", "result_topic": "Corr Frame"}, "result_topic"),
                     ({"mode": "replay", "result_topic": "corr.frame"}, "only for input.mode")):
        cfg = make_config(ports, [{"name": "p", "kind": "preview"}])
        cfg["input"].update(bad)
        path = tmp_path / "bad.yaml"
        path.write_text(to_yaml(cfg) + "\n")
        r = subprocess.run([binary("beamd"), "--check-config", str(path)],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode != 0 and why in r.stderr + r.stdout, (r.returncode, r.stderr)
