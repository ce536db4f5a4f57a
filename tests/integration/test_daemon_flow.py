"""Flow control end to end: lossless pull mode under overload, live mode
under overload with exact drop accounting, and SIGTERM drain.

The pipeline is made slow on purpose (roi_sum with many full-frame ROIs on
512x512 frames, a few milliseconds per frame) while the test's sender
re-sends one pre-encoded payload with fresh headers, far faster than that.
"""

import collections
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import zmq

from conftest import FastFrames, Receiver, Sender, make_config, proto, stage

H, W = 512, 512
SLOW_ROIS = [{"name": "r%d" % i, "shape": "rect", "rect": [0, 0, W, H]} for i in range(48)]


def slow_stages(queue=None, scan=False):
    vd = {"name": "vd", "kind": "roi_sum", "input": "corr", "backend": "cpu", "rois": SLOW_ROIS}
    corr = {"name": "corr", "kind": "correct", "backend": "cpu", "publish": False}
    if queue:
        vd["queue"] = queue
        corr["queue"] = queue
    if scan:
        vd["scan_shape"] = [16, 16]
        vd["image_every"] = 1000000
    return [corr, vd]


def frame_array():
    rng = np.random.default_rng(1)
    return rng.integers(0, 100, size=(H, W)).astype(np.uint16)


def test_pull_overload_loses_nothing(ports, zctx, start_beamd, receivers):
    n, sid = 150, 21
    cfg = make_config(ports, slow_stages(queue=2), mode="pull", push=True, pool_frames=8,
                      input_hwm=2)
    b = start_beamd(cfg)
    rx = Receiver(zctx, ports.ep_push, kind=zmq.PULL)
    receivers.append(rx)
    tx = Sender(zctx, ports.ep_input, zmq.PUSH, sndhwm=2, send_timeout=20)
    ff = FastFrames(frame_array())
    tx.start(sid, (H, W), np.uint16)
    t0 = time.monotonic()
    for fid in range(n):
        tx.send_parts(ff.parts(sid, fid, tx.seq))
    tx.end(sid)
    send_s = time.monotonic() - t0
    end = rx.wait_series_end(sid, timeout=60)
    assert not end[1].flags & proto.FLAG_ABORTED
    ids = collections.Counter(m[1].frame_id for m in rx.snapshot("vd.sums")
                              if m[1].series_id == sid)
    assert sorted(ids) == list(range(n)), "missing frame ids: %s" % sorted(set(range(n)) - set(ids))
    assert set(ids.values()) == {1}, "duplicates: %s" % {k: v for k, v in ids.items() if v > 1}
    assert not rx.decode_errors(), rx.decode_errors()
    st = b.stats()
    inp = st["input"]
    assert inp["frames"] == n and inp["messages"] == n + 2
    assert inp["dropped_busy"] == 0 and inp["lost"] == 0 and inp["dropped_total"] == 0
    assert inp["malformed"] == 0 and inp["unknown_series"] == 0
    assert stage(st, "corr")["frames_in"] == n and stage(st, "vd")["frames_out"] == n
    # Backpressure really happened: the input stopped reading for a while
    # (the sender was throttled to the pipeline's pace).
    assert inp["paused_s"] > 0, "input never paused (sent in %.2f s): %s" % (send_s, inp)
    push = st["outputs"]["push"]
    assert push["dropped"] == 0 and push["backlog"] == 0
    assert push["messages"] == n + 2  # n results + SERIES_START + SERIES_END
    tx.close()


def test_live_overload_counts_every_drop(ports, zctx, start_beamd, receivers):
    """Invariant from daemon/ingest.c: every received message that parses
    goes through track_seq (lost += size of each sequence gap) and then one
    of on_series_start / on_frame / on_series_end. on_frame either accepts
    (input.frames) or counts exactly one of unknown_series, shape_mismatch,
    too_large, dropped_busy (or malformed for an undecodable payload). So
    with contiguous seq numbers, the first message (SERIES_START, seq 0)
    and the last (SERIES_END, sent after the queues drained) received, and
    no malformed input:
        frames + dropped_busy + lost + unknown_series == frames sent
        messages + lost == messages sent.
    The XPUB sender waits for beamd's subscription, which settles the
    PUB/SUB join race, so the START cannot be lost (then unknown_series is 0
    and input.series is 1, both asserted)."""
    n, sid = 400, 31
    cfg = make_config(ports, slow_stages(), mode="live", pool_frames=4, input_hwm=4)
    b = start_beamd(cfg)
    rx = Receiver(zctx, ports.ep_publish, topics=(b"beamd.series", b"vd.sums"))
    receivers.append(rx)
    tx = Sender(zctx, ports.ep_input, zmq.XPUB, sndhwm=8)
    tx.wait_subscriber()
    ff = FastFrames(frame_array())
    tx.start(sid, (H, W), np.uint16)
    # Paced at 1 ms, several times faster than the pipeline (about 5 ms a
    # frame on the 2-core reference machine): beamd reads everything and
    # drops for lack of slots (dropped_busy). Then a burst: ZeroMQ drops at
    # the high-water marks and beamd sees sequence gaps (lost).
    for fid in range(n):
        tx.send_parts(ff.parts(sid, fid, tx.seq))
        if fid < n // 2:
            time.sleep(0.001)
    time.sleep(1.0)  # let every queue drain, so the END cannot be dropped
    tx.end(sid)
    total = n + 2
    st = b.wait_stats(lambda s: s["input"]["messages"] + s["input"]["lost"] >= total,
                      timeout=30, what="all %d messages seen or counted lost" % total)
    rx.wait_series_end(sid, timeout=30)
    st = b.stats()
    inp = st["input"]
    assert inp["series"] == 1 and inp["unknown_series"] == 0, inp
    assert inp["malformed"] == 0 and inp["shape_mismatch"] == 0 and inp["too_large"] == 0
    assert inp["messages"] + inp["lost"] == total, inp
    assert inp["frames"] + inp["dropped_busy"] + inp["lost"] + inp["unknown_series"] == n, inp
    assert inp["dropped_total"] == inp["dropped_busy"] + inp["lost"]
    assert inp["dropped_busy"] > 0 and inp["lost"] > 0, "both kinds of drop must occur: %s" % inp
    assert inp["frames"] > 0
    # Every accepted frame went through the pipeline.
    assert stage(st, "corr")["frames_in"] == inp["frames"]
    assert stage(st, "vd")["frames_out"] == inp["frames"]
    # The losses are not silent: the SERIES_END is INCOMPLETE and says how
    # many frames the series lost; results published after the first loss
    # are INCOMPLETE and carry the count so far, which only grows.
    end = rx.wait_series_end(sid, timeout=5)
    lost = inp["dropped_busy"] + inp["lost"]
    assert end[1].flags & proto.FLAG_INCOMPLETE, end[1]
    assert end[3] == {"missing_frames": lost}, end[3]
    res = [m for m in rx.snapshot("vd.sums") if m[1].series_id == sid]
    flagged = [m for m in res if m[1].flags & proto.FLAG_INCOMPLETE]
    assert flagged, "no vd.sums result of the lossy series is flagged INCOMPLETE"
    counts = [m[3]["missing_frames"] for m in flagged]
    assert all(isinstance(c, int) and 0 < c <= lost for c in counts), counts
    assert counts == sorted(counts), counts
    first = res.index(flagged[0])
    assert all(m[1].flags & proto.FLAG_INCOMPLETE for m in res[first:])

    # Still alive and answering, and a gentle series afterwards is whole.
    assert b.ctl("ping") == {"ok": True}
    before = inp
    sid2, n2 = 32, 10
    tx.start(sid2, (H, W), np.uint16)
    for fid in range(n2):
        tx.send_parts(ff.parts(sid2, fid, tx.seq))
        time.sleep(0.05)
    time.sleep(0.3)
    tx.end(sid2)
    end = rx.wait_series_end(sid2, timeout=15)
    assert not end[1].flags & proto.FLAG_ABORTED
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "vd.sums" and m[1].series_id == sid2) >= n2,
                timeout=5, what="vd.sums of the second series")
    ids = sorted(m[1].frame_id for m in rx.snapshot("vd.sums") if m[1].series_id == sid2)
    assert ids == list(range(n2))
    assert not end[1].flags & proto.FLAG_INCOMPLETE  # the whole series after it
    assert not any(m[1].flags & proto.FLAG_INCOMPLETE for m in rx.snapshot("vd.sums")
                   if m[1].series_id == sid2)
    after = b.stats()["input"]
    assert after["frames"] - before["frames"] == n2
    assert after["dropped_total"] == before["dropped_total"]
    assert after["series"] == 2 and after["messages"] - before["messages"] == n2 + 2
    tx.close()


def test_sigterm_drain_loses_nothing(ports, zctx, start_beamd, receivers):
    sid = 41
    cfg = make_config(ports, slow_stages(scan=True), mode="pull", push=True, pool_frames=8,
                      input_hwm=2)
    b = start_beamd(cfg)
    rx = Receiver(zctx, ports.ep_push, kind=zmq.PULL)
    receivers.append(rx)
    tx = Sender(zctx, ports.ep_input, zmq.PUSH, sndhwm=2, send_timeout=2)
    ff = FastFrames(frame_array())
    stop = threading.Event()
    sent = []

    def sender():
        tx.start(sid, (H, W), np.uint16)
        for fid in range(5000):
            if stop.is_set():
                return
            try:
                tx.send_parts(ff.parts(sid, fid, tx.seq))
            except zmq.Again:
                return  # beamd stopped reading: it is draining
            sent.append(fid)

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    try:
        b.wait_stats(lambda s: s["input"]["frames"] >= 20, timeout=20, what="20 frames in")
        b.signal(signal.SIGTERM)
        rc = b.wait(30)
    finally:
        stop.set()
        t.join(5)
    assert rc == 0, "beamd exited with %s after SIGTERM" % rc
    m = re.search(r"drained: (\d+) frames in, (\d+) results out", b.stderr())
    assert m, "no 'drained:' line in the log"
    accepted = int(m.group(1))
    assert 20 <= accepted <= len(sent), (accepted, len(sent))
    end = rx.wait_series_end(sid, timeout=10)
    assert end[1].flags & proto.FLAG_ABORTED, "the cut series must end ABORTED"
    msgs = rx.snapshot()
    ids = collections.Counter(x[1].frame_id for x in msgs if x[0] == "vd.sums")
    # Pull mode accepts frames in order, so the accepted ones are 0..N-1.
    assert sorted(ids) == list(range(accepted)), \
        "results for %d frames, beamd accepted %d" % (len(ids), accepted)
    assert set(ids.values()) == {1}
    finals = [i for i, x in enumerate(msgs) if x[0] == "vd.image" and x[1].flags & proto.FLAG_FINAL]
    assert finals, "no final vd.image result"
    end_at = [i for i, x in enumerate(msgs) if x[0] == "beamd.series" and
              x[1].type == proto.SERIES_END][0]
    assert finals[-1] < end_at, "final results must precede SERIES_END"
    img = msgs[finals[-1]][2]
    assert img.shape == (len(SLOW_ROIS), 16, 16)
    # Scan pixel p holds frame p's sum (frames are identical here); frames
    # past the drain point left NaN.
    ref = float(frame_array().astype(np.float64).sum())
    flat = img[0].ravel()
    k = min(accepted, 256)
    assert np.all(flat[:k] == np.float32(ref)) and np.all(np.isnan(flat[k:]))
    tx.close()


def pixel_rois(n):
    """n one-pixel rect ROIs over the first n pixels, row by row: results of
    8 n bytes, and a cheap series start."""
    return [{"name": "r%d" % i, "shape": "rect", "rect": [i % W, i // W, i % W + 1, i // W + 1]}
            for i in range(n)]


def ipc_push(cfg, tmp_path, zctx, push_hwm, rcvhwm):
    """PUSH over ipc (a unix socket buffers a few hundred KiB, where loopback
    TCP would take every result of a test into its buffers) and a PULL on
    it that reads nothing until the test does."""
    ep = "ipc://%s/push.ipc" % tmp_path
    cfg["output"]["push"] = ep
    cfg["output"]["push_hwm"] = push_hwm
    pull = zctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.setsockopt(zmq.RCVHWM, rcvhwm)
    pull.connect(ep)
    return pull


@pytest.mark.parametrize("copy_buffer", [0, 40000, None])
def test_push_stalled_consumer_small_results(ports, zctx, start_beamd, tmp_path, copy_buffer):
    """Small results go to the PUSH as copies within output.push_copy_buffer
    and without a copy past it (0: never copied; 40000 bytes: the first few
    of these 8 KiB results). A consumer that stops reading fills the unix
    socket, ZeroMQ's queue, the copy budget, then the stage's slots, and the
    input pauses; when it reads again every result arrives once, with the
    right values, whichever way it was sent."""
    n, sid, nroi = 400, 51, 1024
    vd = {"name": "vd", "kind": "roi_sum", "input": "frames", "backend": "cpu",
          "rois": pixel_rois(nroi), "queue": 4}
    cfg = make_config(ports, [vd], mode="pull", push=True, pool_frames=8, input_hwm=2)
    pull = ipc_push(cfg, tmp_path, zctx, push_hwm=8, rcvhwm=4)
    if copy_buffer is not None:
        cfg["output"]["push_copy_buffer"] = copy_buffer
    b = start_beamd(cfg)
    tx = Sender(zctx, ports.ep_input, zmq.PUSH, sndhwm=2, send_timeout=30)
    ff = FastFrames(frame_array())
    ref = frame_array().astype(np.float64).ravel()[:nroi]
    sent = []

    def sender():
        tx.start(sid, (H, W), np.uint16)
        for fid in range(n):
            tx.send_parts(ff.parts(sid, fid, tx.seq))
            sent.append(fid)
        tx.end(sid)

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    ids = collections.Counter()
    ended = False
    try:
        # Nobody reads: the pipeline must stop taking frames, not grow.
        b.wait_stats(lambda st: st["input"]["paused_s"] > 0.3, timeout=20, what="input paused")
        assert len(sent) < n, "every frame went in while the consumer read nothing"
        deadline = time.monotonic() + 60
        while not ended and time.monotonic() < deadline:
            if not pull.poll(1000):
                continue
            topic, h, v, _ = proto.decode_message(pull.recv_multipart())
            if topic == "vd.sums":
                assert v is not None and np.array_equal(v.astype(np.float64), ref), h.frame_id
                ids[h.frame_id] += 1
            ended = topic == "beamd.series" and h.type == proto.SERIES_END
    finally:
        t.join(30)
        pull.close()
        tx.close()
    assert ended, "no SERIES_END"
    assert sorted(ids) == list(range(n)), "missing: %s" % sorted(set(range(n)) - set(ids))
    assert set(ids.values()) == {1}
    push = b.stats()["outputs"]["push"]
    assert push["dropped"] == 0 and push["backlog"] == 0


def _cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_stalled_pipeline_with_peers_gone_does_not_spin(ports, zctx, start_beamd, tmp_path):
    """Input paused (the PUSH consumer stopped reading), then the sender and
    the consumer close their sockets: ZeroMQ queues commands on beamd's
    sockets that only a send, a receive or ZMQ_EVENTS processes. beamd
    must process them and sleep, not spin its loop on a ZMQ_FD that stays
    readable (a daemon left by a killed test run once did, for 17 minutes;
    this state does not reproduce that spin on the old code, it guards the
    state)."""
    vd = {"name": "vd", "kind": "roi_sum", "input": "frames", "backend": "cpu", "queue": 2,
          "rois": pixel_rois(256)}
    cfg = make_config(ports, [vd], mode="pull", push=True, pool_frames=4, input_hwm=2,
                      heartbeat="1s")
    pull = ipc_push(cfg, tmp_path, zctx, push_hwm=2, rcvhwm=1)
    b = start_beamd(cfg)
    # The sender waits out the stage's series start (the ROI masks), then
    # stops at the first send the stalled pipeline no longer takes.
    tx = Sender(zctx, ports.ep_input, zmq.PUSH, sndhwm=2, send_timeout=5)
    ff = FastFrames(frame_array())
    tx.start(61, (H, W), np.uint16)
    for fid in range(600):
        try:
            tx.send_parts(ff.parts(61, fid, tx.seq))
        except zmq.Again:
            break
    # The stage's series start (ROI masks over the frame) must be over
    # before the CPU is counted.
    b.wait_stats(lambda st: st["input"]["paused"] and stage(st, "vd")["results"] > 0 and
                 st["outputs"]["push"]["backlog"] > 0,
                 timeout=20, what="input paused behind a PUSH backlog")
    tx.close()
    pull.close()
    time.sleep(0.5)
    c0, t0 = _cpu_s(b.pid), time.monotonic()
    time.sleep(2.0)
    used = (_cpu_s(b.pid) - c0) / (time.monotonic() - t0)
    assert used < 0.25, "beamd used %.0f %% of a core while nothing could move" % (100 * used)
    assert b.alive()


def test_sigint_idle_exits_cleanly(ports, start_beamd):
    """SIGINT drains like SIGTERM; with nothing in flight it exits 0 at once."""
    b = start_beamd(make_config(ports, slow_stages(), mode="pull"))
    b.signal(signal.SIGINT)
    assert b.wait(10) == 0
    assert re.search(r"drained: 0 frames in, 0 results out", b.stderr())
