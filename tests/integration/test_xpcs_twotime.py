"""End to end: sender -> beamd (xpcs_twotime, pull mode) -> subscriber,
with c2, g2, g2_err, lags and info checked against an independent numpy
implementation of scikit-beam's definition (two_time_corr with
num_levels=1, then one_time_from_two_time), written from the note, not from
beamd's code:

    C[r, t1, t2] = mean_p(I_t1 I_t2) / (mean_p I_t1 * mean_p I_t2)

bad frames are NaN (so their rows and columns are NaN), a frame without
photons in an ROI gives 0/0 = NaN there, g2[k, r] = nanmean of diagonal k
and g2_err = nanstd / sqrt(len(diagonal)).

Three stages read the same frames: full (float64, partial results every
20 frames), band (float32 precision, width 8) and window (float64, the
last 16 frames). Tolerances: rtol 1e-10 for float64 (BLAS and numpy sum
in different orders); 2e-5 for float32 (24-bit mantissa, sums over a few
hundred pixels).
"""

import numpy as np
import zmq

from conftest import Receiver, Sender, make_config, proto

H, W = 24, 20
LABELS = (3, 7, 12, 30)  # gapped on purpose
FRAME_TIME = 0.01
BAND, WIN = 8, 16


def labels_image(rng):
    lab = rng.choice(np.array((0,) + LABELS, np.int32), size=(H, W))
    for k, v in enumerate(LABELS):  # every label present
        lab[0, k] = v
    return lab


def twotime_numpy(frames, bad, lab):
    """C [R, T, T] as scikit-beam defines it."""
    n = len(frames)
    x = frames.reshape(n, -1).astype(np.float64)
    x[np.asarray(bad, bool)] = np.nan
    flat = lab.reshape(-1)
    out = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for v in sorted(set(flat[flat > 0].tolist())):
            xr = x[:, flat == v]
            num = xr @ xr.T / xr.shape[1]
            mean = xr.mean(axis=1)
            out.append(num / np.outer(mean, mean))
    return np.array(out)


def one_time_from_two_time(c):
    """skbeam.core.correlation.one_time_from_two_time, calc_errors=True,
    as [lag, roi]."""
    R, T = c.shape[0], c.shape[2]
    g2, err = np.zeros((T, R)), np.zeros((T, R))
    with np.errstate(invalid="ignore"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for r in range(R):
                for k in range(T):
                    d = np.diag(c[r], k=k)
                    g2[k, r] = np.nanmean(d)
                    err[k, r] = np.nanstd(d) / np.sqrt(len(d))
    return g2, err


def _results(rx, sid, name):
    out = {}
    for topic, hdr, arr, meta in rx.snapshot():
        if not topic.startswith(name + ".") or hdr.series_id != sid:
            continue
        final = bool(hdr.flags & proto.FLAG_FINAL)
        assert final or hdr.flags & proto.FLAG_PARTIAL, topic
        key = "final" if final else hdr.frame_id + 1
        out.setdefault(key, {})[topic[len(name) + 1:]] = (hdr, arr, meta)
    return out


def _check_g2(res, c, rtol, K=None):
    g2, err = one_time_from_two_time(c)
    K = c.shape[2] if K is None else K
    assert res["g2"][1].shape == (K, len(LABELS))
    np.testing.assert_allclose(res["g2"][1], g2[:K], rtol=rtol, atol=0, err_msg="g2")
    np.testing.assert_allclose(res["g2_err"][1], err[:K], rtol=rtol * 100, atol=0, err_msg="g2_err")
    np.testing.assert_allclose(res["lags"][1], np.arange(K) * FRAME_TIME, rtol=1e-15, atol=0)
    assert np.isfinite(res["g2"][1]).mean() > 0.9  # not a NaN flood


def test_twotime_matches_numpy(tmp_path, ports, zctx, start_beamd, receivers):
    rng = np.random.default_rng(7)
    lab = labels_image(rng)
    np.save(tmp_path / "labels.npy", lab)
    rois = {"file": str(tmp_path / "labels.npy")}
    common = {"kind": "xpcs_twotime", "backend": "cpu", "rois": rois, "errors": True}
    stages = [dict(common, name="tt", mode="full", max_frames=64, publish_every=20),
              dict(common, name="tb", mode="band", width=BAND, precision="float32"),
              dict(common, name="tw", mode="window", width=WIN)]
    start_beamd(make_config(ports, stages, mode="pull", pool_frames=64))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)

    sid, n = 3, 45
    lam = rng.uniform(0.5, 6.0, size=(H, W))
    frames = rng.poisson(lam, size=(n, H, W)).astype(np.uint16)
    frames[6][lab == 12] = 0  # no photon in ROI 12: NaN there only
    bad = np.zeros(n, bool)
    bad[[9, 33]] = True
    tx.start(sid, (H, W), np.uint16, meta={"frame_time": FRAME_TIME})
    for k in range(n):
        tx.frame(sid, k, frames[k], flags=proto.FLAG_BAD if bad[k] else 0)
    tx.end(sid)
    rx.wait_series_end(sid, timeout=15)
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0].endswith(".info") and m[1].flags & proto.FLAG_FINAL) >= 3,
                timeout=10, what="three final info")
    assert not rx.decode_errors()

    # full: partial results at 20 and 40 frames, then the final one
    got = _results(rx, sid, "tt")
    assert sorted(k for k in got if k != "final") == [20, 40]
    for k in (20, 40, "final"):
        m = n if k == "final" else k
        ref = twotime_numpy(frames[:m], bad[:m], lab)
        res = got[k]
        c2 = res["c2"][1]
        assert c2.dtype == np.float64 and c2.shape == (len(LABELS), m, m)
        np.testing.assert_allclose(c2, ref, rtol=1e-10, atol=0, err_msg="c2 at %s" % k)
        _check_g2(res, ref, 1e-10)
        info = res["info"][1].tolist()
        assert info == [m, int(bad[:m].sum()), 0, m, 1 if m > 6 else 0, 0], info
    ref = twotime_numpy(frames, bad, lab)
    # the zero-photon frame is NaN in ROI 12 only
    r12 = LABELS.index(12)
    assert np.isnan(ref[r12, 6]).all() and np.isfinite(ref[r12 - 1, 6, :9]).all()
    metas = {t: mm for t, h, a, mm in rx.snapshot() if t.startswith("tt.") and mm}
    assert metas["tt.c2"]["labels"] == list(LABELS)
    assert metas["tt.g2"]["axes"] == ["lag", "roi"]
    assert metas["tt.lags"]["units"] == "s"

    # band: c2[r, t, k] = C(t - k, t), float32
    res = _results(rx, sid, "tb")["final"]
    c2 = res["c2"][1]
    assert c2.dtype == np.float32 and c2.shape == (len(LABELS), n, BAND)
    want = np.full((len(LABELS), n, BAND), np.nan)
    for t in range(n):
        for k in range(min(BAND, t + 1)):
            want[:, t, k] = ref[:, t - k, t]
    np.testing.assert_allclose(c2, want, rtol=2e-5, atol=0, err_msg="band c2")
    _check_g2(res, ref, 2e-5, K=BAND)

    # window: the last WIN frames
    res = _results(rx, sid, "tw")["final"]
    c2 = res["c2"][1]
    assert c2.shape == (len(LABELS), WIN, WIN)
    np.testing.assert_allclose(c2, ref[:, n - WIN:, n - WIN:], rtol=1e-10, atol=0, err_msg="window c2")
    _check_g2(res, ref[:, n - WIN:, n - WIN:], 1e-10)
    assert res["info"][1].tolist()[5] == n - WIN


def _blocks(rx, sid, name):
    """[(c2_rows array, c2_rows_at list, flags)] in the order sent; each
    c2_rows is followed by its c2_rows_at."""
    out, pending = [], None
    for topic, hdr, arr, meta in rx.snapshot():
        if hdr.series_id != sid:
            continue
        if topic == name + ".c2_rows":
            assert pending is None, "two blocks without c2_rows_at"
            pending = (arr, hdr.flags)
        elif topic == name + ".c2_rows_at":
            assert pending is not None and arr.dtype == np.int64 and arr.shape == (4,)
            out.append((pending[0], arr.tolist(), pending[1]))
            pending = None
    assert pending is None
    return out


def test_twotime_row_blocks(tmp_path, ports, zctx, start_beamd, receivers):
    """publish_rows: c2 row blocks published while the series runs (PARTIAL)
    and the rest at SERIES_END (FINAL), each with c2_rows_at [row0, rows,
    col0, frames]. Stitched with numpy they are the FINAL c2 (which is
    unchanged) and scikit-beam's closed form: full (columns 0..row0+rows-1,
    the rest by symmetry), band (the same rows of c2) and window (columns
    in the ring when the block completed)."""
    rng = np.random.default_rng(11)
    lab = labels_image(rng)
    np.save(tmp_path / "labels.npy", lab)
    rois = {"file": str(tmp_path / "labels.npy")}
    common = {"kind": "xpcs_twotime", "backend": "cpu", "rois": rois}
    stages = [dict(common, name="rf", mode="full", max_frames=64, publish_rows=6),
              dict(common, name="rb", mode="band", width=BAND, publish_rows=10, precision="float32"),
              dict(common, name="rw", mode="window", width=WIN, publish_rows=7)]
    start_beamd(make_config(ports, stages, mode="pull", pool_frames=64))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    sid, n = 5, 45
    frames = rng.poisson(rng.uniform(0.5, 6.0, size=(H, W)), size=(n, H, W)).astype(np.uint16)
    frames[6][lab == 12] = 0
    bad = np.zeros(n, bool)
    bad[[9, 33]] = True
    tx.start(sid, (H, W), np.uint16, meta={"frame_time": FRAME_TIME})
    for k in range(n):
        tx.frame(sid, k, frames[k], flags=proto.FLAG_BAD if bad[k] else 0)
    tx.end(sid)
    rx.wait_series_end(sid, timeout=15)
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0].endswith(".info") and m[1].flags & proto.FLAG_FINAL) >= 3,
                timeout=10, what="three final info")
    assert not rx.decode_errors()
    ref = twotime_numpy(frames, bad, lab)
    R = len(LABELS)
    metas = {t: mm for t, h, a, mm in rx.snapshot() if t.startswith("r") and mm}
    assert metas["rf.c2_rows"]["axes"] == ["roi", "t1", "t2"] and metas["rf.c2_rows"]["labels"] == list(LABELS)
    assert metas["rb.c2_rows"]["axes"] == ["roi", "t1", "lag"]
    for name, N, rtol in (("rf", 6, 1e-10), ("rb", 10, 2e-5), ("rw", 7, 1e-10)):
        blocks = _blocks(rx, sid, name)
        assert len(blocks) == -(-n // N), name
        final = _results(rx, sid, name)["final"]["c2"][1]
        stitched = np.full((R, n, n), np.nan)
        seen = np.zeros((R, n, n), bool)
        band = np.full((R, n, BAND), np.nan)
        nxt = 0
        for arr, (row0, rows, col0, nfr), flags in blocks:
            last = row0 + rows == n and n % N != 0
            assert row0 == nxt and rows == (n - row0 if last else N), (name, row0, rows)
            assert nfr == (n if last else row0 + rows)  # sent when its last frame arrived
            assert flags & (proto.FLAG_FINAL if last else proto.FLAG_PARTIAL), (name, row0)
            nxt = row0 + rows
            if name == "rb":
                assert col0 == 0 and arr.shape == (R, rows, BAND)
                band[:, row0:row0 + rows] = arr
                continue
            c1 = row0 + rows
            assert col0 == (max(0, c1 - WIN) if name == "rw" else 0)
            assert arr.shape == (R, rows, c1 - col0)
            np.testing.assert_allclose(arr, ref[:, row0:c1, col0:c1], rtol=rtol, atol=0,
                                       err_msg="%s block at %d" % (name, row0))
            stitched[:, row0:c1, col0:c1] = arr
            seen[:, row0:c1, col0:c1] = True
        assert nxt == n
        if name == "rb":
            np.testing.assert_allclose(band, final, rtol=rtol, atol=0, err_msg="band stitched")
            continue
        mirror = np.swapaxes(stitched, 1, 2)
        stitched = np.where(seen, stitched, mirror)  # the upper triangle by symmetry
        s = n - WIN if name == "rw" else 0
        np.testing.assert_allclose(stitched[:, s:, s:], final, rtol=rtol, atol=0, err_msg=name + " stitched")
        np.testing.assert_allclose(stitched[:, s:, s:], ref[:, s:, s:], rtol=rtol, atol=0)
