"""End to end: sender -> beamd (correct -> roi_sum) -> subscriber, with every
published sum checked against numpy over the same masks.

Tolerance: none, the comparison is exact. The corrected pixels are
float32 values (raw - dark) / flat with integer raw and dark below 2^24
and flat in {1, 2, 4}, so each one is exact (a multiple of 1/4 far below
2^24), and their float64 sums (at most 2^13 terms of size < 2^17) are
exact in any summation order. Any difference is therefore a bug, not
rounding.
"""

import numpy as np
import zmq

from conftest import (Receiver, Sender, correct_ref, make_config, proto,
                      roi_masks, stage)

H, W = 64, 80
ROIS = [
    {"name": "bf", "shape": "disk", "center": [40.0, 30.0], "radius": 12.5},
    {"name": "adf", "shape": "annulus", "radii": [10, 25]},
    {"name": "box", "shape": "rect", "rect": [5, 8, 37, 20]},
]


def _stages(tmp_path, h, w, rng, with_flat=True, with_mask=True):
    dark = rng.integers(0, 50, size=(h, w)).astype(np.float32)
    np.save(tmp_path / "dark.npy", dark)
    corr = {"name": "corr", "kind": "correct", "backend": "cpu",
            "dark": str(tmp_path / "dark.npy")}
    flat = mask = None
    if with_flat:
        flat = rng.choice(np.array([1.0, 2.0, 4.0], np.float32), size=(h, w))
        np.save(tmp_path / "flat.npy", flat)
        corr["flat"] = str(tmp_path / "flat.npy")
    if with_mask:
        mask = np.zeros((h, w), np.uint8)
        mask[rng.integers(0, h, 20), rng.integers(0, w, 20)] = 1
        np.save(tmp_path / "mask.npy", mask)
        corr["mask"] = str(tmp_path / "mask.npy")
    stages = [corr, {"name": "vd", "kind": "roi_sum", "input": "corr", "backend": "cpu",
                     "rois": ROIS}]
    return stages, dark, flat, mask


def _daemon(stages, ports, zctx, start_beamd, receivers):
    """A pull-mode beamd running stages, a subscriber to its results and a
    PUSH sender to its input."""
    b = start_beamd(make_config(ports, stages, mode="pull"))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    return b, rx, Sender(zctx, ports.ep_input, zmq.PUSH)


def _check_results(rx, series_id, frames, dark, flat, mask, h, w):
    """frames: {frame_id: raw array}. Every frame has exactly one vd.sums
    and one corr.frame, both equal to the numpy reference."""
    masks = roi_masks(ROIS, h, w)
    sums = [m for m in rx.snapshot("vd.sums") if m[1].series_id == series_id]
    corrs = [m for m in rx.snapshot("corr.frame") if m[1].series_id == series_id]
    assert sorted(m[1].frame_id for m in sums) == sorted(frames), "vd.sums frame ids"
    assert sorted(m[1].frame_id for m in corrs) == sorted(frames), "corr.frame frame ids"
    for _, hdr, arr, _ in corrs:
        ref = correct_ref(frames[hdr.frame_id], dark, flat, mask)
        assert arr.dtype == np.float32 and arr.shape == (h, w)
        assert np.array_equal(arr, ref), "corr.frame %d differs from numpy" % hdr.frame_id
    for _, hdr, arr, _ in sums:
        assert hdr.type == proto.RESULT
        assert arr.dtype == np.float64 and arr.shape == (len(ROIS),)
        c = correct_ref(frames[hdr.frame_id], dark, flat, mask).astype(np.float64)
        ref = np.array([c[m].sum() for m in masks])
        assert np.array_equal(arr, ref), \
            "frame %d: vd.sums %r != numpy %r" % (hdr.frame_id, arr.tolist(), ref.tolist())
    # The descriptor rides on the first result of the series.
    first = sums[0]
    assert first[1].flags & proto.FLAG_META and first[3] is not None
    assert first[3]["stage"] == "vd" and first[3]["output"] == "sums"
    assert first[3]["labels"] == [r["name"] for r in ROIS]
    assert first[3]["dtype"] == "float64" and first[3]["shape"] == [len(ROIS)]


def test_python_sender_roi_sums_match_numpy(tmp_path, ports, zctx, start_beamd, receivers):
    rng = np.random.default_rng(7)
    stages, dark, flat, mask = _stages(tmp_path, H, W, rng)
    b, rx, tx = _daemon(stages, ports, zctx, start_beamd, receivers)
    sid = 11
    frames = {}
    tx.start(sid, (H, W), np.uint16)
    for fid in range(24):
        raw = rng.integers(0, 60000, size=(H, W)).astype(np.uint16)
        raw[0, 0] = 65535  # extreme values go through too
        frames[fid] = raw
        tx.frame(sid, fid, raw, codec=("raw", "lz4", "bslz4")[fid % 3])
    tx.end(sid)
    end = rx.wait_series_end(sid, timeout=15)
    assert not end[1].flags & proto.FLAG_ABORTED
    # SERIES_END leaves only after every stage finished the series, so all
    # results were published before it; give the SUB a moment to drain.
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "vd.sums" and m[1].series_id == sid) >= 24,
                timeout=5, what="24 vd.sums")
    assert not rx.decode_errors(), rx.decode_errors()
    _check_results(rx, sid, frames, dark, flat, mask, H, W)
    starts = [m for m in rx.snapshot("beamd.series") if m[1].type == proto.SERIES_START]
    assert [m[1].series_id for m in starts] == [sid]
    st = b.stats()
    assert st["input"]["frames"] == 24 and st["input"]["malformed"] == 0
    assert stage(st, "vd")["frames_out"] == 24 and stage(st, "corr")["errors"] == 0
    tx.close()


def test_simulator_counter_roi_sums_match_numpy(tmp_path, ports, zctx, start_beamd, receivers,
                                                run_tool):
    h, w, n = 48, 64, 30
    rng = np.random.default_rng(3)
    stages, dark, flat, mask = _stages(tmp_path, h, w, rng, with_flat=False)
    cfg = make_config(ports, stages, mode="pull")
    start_beamd(cfg)
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    sim = run_tool("beamd-sim", ["--socket", "push", "--bind", ports.ep_input, "--shape",
                                 "%dx%d" % (h, w), "--dtype", "uint16", "--pattern", "counter",
                                 "--frames", str(n), "--series", "1", "--series-id", "5",
                                 "--quiet"])
    assert sim.wait(30) == 0, sim.stderr()
    rx.wait_series_end(5, timeout=15)
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "vd.sums") >= n, timeout=5,
                what="%d vd.sums" % n)
    ids = sorted(m[1].frame_id for m in rx.snapshot("vd.sums"))
    assert len(ids) == n and len(set(ids)) == n
    # Counter pattern: pixel i (raster order) of frame f is (f + i) mod 65536.
    idx = np.arange(h * w, dtype=np.int64).reshape(h, w)
    frames = {f: ((f + idx) & 0xFFFF).astype(np.uint16) for f in ids}
    _check_results(rx, 5, frames, dark, None, mask, h, w)


def test_correct_fused_into_roi_sum(tmp_path, ports, zctx, start_beamd, receivers):
    """correct unpublished -> roi_sum on its thread (auto): the two fuse
    (correct makes only the tiles roi_sum reads, stats `fused`), and the
    sums are the numpy ones exactly, as on roi_sum's own thread (no fusion)
    in a second daemon. 300 x 400 is larger than one tile; a CORRUPT frame
    goes the ordinary way (NaN sums)."""
    h, w, n = 300, 400, 12
    rng = np.random.default_rng(11)
    stages, dark, flat, mask = _stages(tmp_path, h, w, rng)
    stages[0]["publish"] = False
    frames = {fid: rng.integers(0, 60000, size=(h, w)).astype(np.uint16) for fid in range(n)}
    masks = roi_masks(ROIS, h, w)
    for mode, fused in (("auto", n), ("own", 0)):
        stages[1]["thread"] = mode
        b, rx, tx = _daemon(stages, ports, zctx, start_beamd, receivers)
        sid = 40 + fused
        tx.start(sid, (h, w), np.uint16)
        for fid in range(n):
            tx.frame(sid, fid, frames[fid], codec=("raw", "bslz4")[fid % 2])
        tx.frame(sid, n, None, flags=proto.FLAG_CORRUPT, shape=(h, w), dtype=np.uint16)
        tx.end(sid)
        rx.wait_series_end(sid, timeout=15)
        rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "vd.sums") >= n + 1, timeout=5,
                    what="%d vd.sums" % (n + 1))
        got = {m[1].frame_id: m[2] for m in rx.snapshot("vd.sums")}
        assert not rx.snapshot("corr.frame")
        for fid in range(n):
            c = correct_ref(frames[fid], dark, flat, mask).astype(np.float64)
            ref = np.array([c[m].sum() for m in masks])
            assert np.array_equal(got[fid], ref), (mode, fid, got[fid].tolist(), ref.tolist())
        assert np.isnan(got[n]).all()
        st = b.stats()
        assert stage(st, "corr")["fused"] == fused, stage(st, "corr")
        assert stage(st, "vd")["frames_in"] == n + 1 and stage(st, "vd")["errors"] == 0
        assert stage(st, "vd")["runs_on"] == ("corr" if mode == "auto" else None)
        tx.close()
        b.kill()


def test_scan_image_shape_from_the_series(ports, zctx, start_beamd, receivers, run_tool):
    """beamd-sim's 4D-STEM pattern sends its scan shape in the series
    metadata: roi_sum, given no scan_shape, builds the virtual-detector
    image from it, each pixel the sum of the frame scanned there."""
    h = w = 32
    n = 25  # beamd-sim makes it a 5 x 5 raster (ceil(sqrt(n)) wide)
    stages = [{"name": "vd", "kind": "roi_sum", "backend": "cpu", "image_every": 1000,
               "rois": [{"name": "bf", "shape": "disk", "radius": 4}]}]
    start_beamd(make_config(ports, stages, mode="pull"))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    sim = run_tool("beamd-sim", ["--socket", "push", "--bind", ports.ep_input, "--shape",
                                 "%dx%d" % (h, w), "--dtype", "uint16", "--pattern", "stem",
                                 "--frames", str(n), "--series", "1",
                                 "--series-id", "9", "--quiet"])
    assert sim.wait(30) == 0, sim.stderr()
    rx.wait_series_end(9, timeout=15)
    rx.wait_for(lambda ms: any(m[0] == "vd.image" and m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=5, what="the final vd.image")
    sums = {m[1].frame_id: m[2][0] for m in rx.snapshot("vd.sums")}
    img = [m for m in rx.snapshot("vd.image") if m[1].flags & proto.FLAG_FINAL][-1][2]
    assert img.shape == (1, 5, 5)
    assert np.array_equal(img[0].ravel(), np.array([sums[f] for f in range(n)], np.float32))
