"""Frames a series loses before the pipeline are absent frames for XPCS,
never bridged over: xpcs_multitau skips their pairs and xpcs_twotime gives
their rows and columns NaN, exactly as the numpy references of
test_xpcs_multitau.py / test_xpcs_twotime.py with those frames bad; every
result published after the first loss is INCOMPLETE with the count so far,
and the SERIES_END says how many frames the series lost.

The loss is made deterministic: frames 9, 10 and 33 are sent with another
geometry, which ingest refuses (input.shape_mismatch) and counts as lost
from the series; the frames around them flow normally. The same accounting
covers live drops and transport gaps (test_daemon_flow.py)."""

import numpy as np
import zmq

from conftest import Receiver, Sender, make_config, proto
import test_xpcs_multitau as mt
import test_xpcs_twotime as tt

LOST = [9, 10, 33]
N = 45


def run(tmp_path, ports, zctx, start_beamd, receivers, stages, H, W, rng, lab, wait):
    np.save(tmp_path / "labels.npy", lab)
    b = start_beamd(make_config(ports, stages, mode="pull", pool_frames=64))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    lam = rng.uniform(0.5, 6.0, size=(H, W))
    frames = rng.poisson(lam, size=(N, H, W)).astype(np.uint16)
    sid = 5
    tx.start(sid, (H, W), np.uint16, meta={"frame_time": mt.FRAME_TIME})
    for k in range(N):
        if k in LOST:
            tx.frame(sid, k, np.zeros((H, W + 1), np.uint16))  # refused: another geometry
        else:
            tx.frame(sid, k, frames[k])
    tx.end(sid)
    end = rx.wait_series_end(sid, timeout=15)
    rx.wait_for(wait, timeout=10, what="final results")
    assert not rx.decode_errors()
    assert end[1].flags & proto.FLAG_INCOMPLETE and end[3] == {"missing_frames": len(LOST)}, end
    st = b.stats()["input"]
    assert st["shape_mismatch"] == len(LOST) and st["frames"] == N - len(LOST), st
    bad = np.zeros(N, bool)
    bad[LOST] = True
    return rx, sid, frames, bad


def check_flags(rx, sid, prefix):
    """A result is flagged when it is published after a loss: ingest runs
    ahead of the stages, so one for an earlier frame may be flagged too,
    and its count is the count at publishing, at least the losses before
    its frame. Per topic, in publishing order, the counts never decrease."""
    res = [m for m in rx.snapshot() if m[0].startswith(prefix) and m[1].series_id == sid]
    last = {}
    for topic, hdr, arr, meta in res:
        if hdr.frame_id >= LOST[0]:
            assert hdr.flags & proto.FLAG_INCOMPLETE, (topic, hdr.frame_id)
        if hdr.flags & proto.FLAG_INCOMPLETE:
            n = meta and meta.get("missing_frames")
            assert isinstance(n, int), (topic, hdr.frame_id, meta)
            assert sum(1 for k in LOST if k <= hdr.frame_id) <= n <= len(LOST), \
                (topic, hdr.frame_id, n)
            assert n >= last.get(topic, 0), (topic, hdr.frame_id, n, last)
            last[topic] = n
    assert last, "no result flagged INCOMPLETE"


def test_multitau_skips_lost_frames(tmp_path, ports, zctx, start_beamd, receivers):
    rng = np.random.default_rng(2024)
    lab = mt.labels_image(rng)
    st = {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu",
          "rois": {"file": str(tmp_path / "labels.npy")}, "levels": mt.LEVELS,
          "buffers": mt.NB, "publish_every": 20, "intensities": True}
    rx, sid, frames, bad = run(
        tmp_path, ports, zctx, start_beamd, receivers, [st], mt.H, mt.W, rng, lab,
        lambda ms: any(m[0] == "mt.if" and m[1].flags & proto.FLAG_FINAL for m in ms))
    got = mt._results(rx, sid)
    # Partial results come every 20 frames the stage counted, lost ones too.
    assert sorted(k for k in got if k != "final") == [20, 40], sorted(got)
    for k in (20, 40, "final"):
        m = N if k == "final" else k
        mt._compare(got[k], mt.multitau_numpy(frames[:m], bad[:m], lab, mt.LEVELS, mt.NB), m,
                    int(bad[:m].sum()))
    check_flags(rx, sid, "mt.")


def test_twotime_nan_rows_for_lost_frames(tmp_path, ports, zctx, start_beamd, receivers):
    rng = np.random.default_rng(7)
    lab = tt.labels_image(rng)
    st = {"name": "tt", "kind": "xpcs_twotime", "backend": "cpu", "mode": "full",
          "max_frames": 64, "rois": {"file": str(tmp_path / "labels.npy")}, "errors": True}
    rx, sid, frames, bad = run(
        tmp_path, ports, zctx, start_beamd, receivers, [st], tt.H, tt.W, rng, lab,
        lambda ms: any(m[0] == "tt.info" and m[1].flags & proto.FLAG_FINAL for m in ms))
    got = tt._results(rx, sid, "tt")
    ref = tt.twotime_numpy(frames, bad, lab)
    c2 = got["final"]["c2"][1]
    assert c2.shape == (len(tt.LABELS), N, N)
    np.testing.assert_allclose(c2, ref, rtol=1e-10, atol=0)
    assert np.isnan(c2[:, LOST, :]).all() and np.isnan(c2[:, :, LOST]).all()
    tt._check_g2(got["final"], ref, 1e-10)
    assert got["final"]["info"][1].tolist()[:2] == [N, len(LOST)]
    check_flags(rx, sid, "tt.")
