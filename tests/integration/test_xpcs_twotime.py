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

test_twotime_levels checks num_levels 2 and 3 (scikit-beam's multi-tau
two-time) against a numpy emulation of two_time_corr's loop, and a static
speckle series whose answer is known in closed form.
"""

import subprocess

import numpy as np
import pytest
import zmq

from conftest import Receiver, Sender, binary, make_config, proto, to_yaml

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


# ---- multi-tau levels: two_time_corr(labels, images, T, num_bufs, num_levels)


def two_time_corr_numpy(frames, bad, lab, num_bufs, num_levels):
    """scikit-beam's lazy_two_time + two_time_state_to_results, emulated
    from the note's semantics with numpy: frames one by one into per-level
    lists (a level-L frame is the mean of the last two level-(L-1) frames,
    made when the level's toggle says a pair is complete), each level-L
    frame with its mean time (level 0: 1, 2, ...; level L: the mean of its
    two halves' times), pairs at lags i (0..nb-1 at level 0, nb/2..nb-1
    above, i < frames at that level) written at int(t - 1 + s),
    int(t - 1 - lag + s), s = 1 - 2^(L-1) .. 2^(L-1) (level 0: s = 0), as
    tmp / (pi fi) * num_pixels; then tril + tril.T - diag. Bad frames are
    NaN images (bad_to_nan_gen). Returns C [R, T, T] and the mask of the
    cells written."""
    T = len(frames)
    flat = lab.reshape(-1)
    sel = flat > 0
    uniq = sorted(set(flat[sel].tolist()))
    lab1 = np.searchsorted(uniq, flat[sel]) + 1
    npix = np.bincount(lab1)[1:]
    R = len(uniq)
    C = np.zeros((R, T, T))
    seen = np.zeros((T, T), bool)
    lvl = [[] for _ in range(num_levels)]
    times = [[] for _ in range(num_levels)]
    toggle = [False] * num_levels

    def process(L, t):
        cur = lvl[L][-1]
        n = len(lvl[L])
        for i in range(num_bufs // 2 if L else 0, min(n, num_bufs)):
            past = lvl[L][-1 - i]
            with np.errstate(divide="ignore", invalid="ignore"):
                tmp = np.bincount(lab1, weights=past * cur)[1:]
                pi = np.bincount(lab1, weights=past)[1:]
                fi = np.bincount(lab1, weights=cur)[1:]
                v = tmp / (pi * fi) * npix
            lag = i * 2 ** L
            t1, t2 = t - 1, t - 1 - lag
            ns = 2 ** (L - 1) if L else 0
            for s in (range(-ns + 1, ns + 1) if L else (0,)):
                C[:, int(t1 + s), int(t2 + s)] = v
                seen[int(t1 + s), int(t2 + s)] = True

    for k in range(T):
        img = frames[k].reshape(-1)[sel].astype(np.float64)
        if bad[k]:
            img = np.full_like(img, np.nan)
        lvl[0].append(img)
        times[0].append(k + 1)
        process(0, k + 1)
        L = 1
        while L < num_levels:
            if not toggle[L]:
                toggle[L] = True
                break
            toggle[L] = False
            lvl[L].append((lvl[L - 1][-2] + lvl[L - 1][-1]) / 2)
            times[L].append((times[L - 1][-2] + times[L - 1][-1]) / 2.0)
            process(L, times[L][-1])
            L += 1
    for r in range(R):
        x = C[r]
        C[r] = np.tril(x) + np.tril(x).T - np.diag(np.diag(x))
    seen = seen | seen.T
    return C, seen


def multi_tau_lags(num_bufs, num_levels):
    """skbeam.core.utils.multi_tau_lags, as (level, lag) pairs."""
    out = [(0, i) for i in range(num_bufs)]
    for L in range(1, num_levels):
        out += [(L, (num_bufs // 2 + j) * 2 ** L) for j in range(num_bufs // 2)]
    return out


def g2_from_written(C, seen, num_bufs, num_levels):
    """g2 [K, R] and g2_err: nanmean (nanstd / sqrt(cells)) over the cells
    written on each multi-tau lag's diagonal, for the lags written; lags."""
    R, T = C.shape[0], C.shape[1]
    g2, err, lags = [], [], []
    for L, lag in multi_tau_lags(num_bufs, num_levels):
        if lag >= T:
            break
        w = np.diag(seen, k=lag)
        if not w.any():
            break
        lags.append(lag)
        with np.errstate(invalid="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                d = np.array([np.diag(C[r], k=lag)[w] for r in range(R)])
                g2.append(np.nanmean(d, axis=1))
                err.append(np.nanstd(d, axis=1) / np.sqrt(w.sum()))
    # the lags written are a prefix of the list: nothing written after a gap
    K = len(lags)
    for L, lag in multi_tau_lags(num_bufs, num_levels)[K:]:
        assert lag >= T or not np.diag(seen, k=lag).any(), lag
    return np.array(g2), np.array(err), np.array(lags, float)


LEVEL_STAGES = (("l2", 4, 2, "float64"), ("l3", 6, 3, "float64"), ("l3f", 6, 3, "float32"))


def test_twotime_levels(tmp_path, ports, zctx, start_beamd, receivers):
    rng = np.random.default_rng(23)
    lab = labels_image(rng)
    np.save(tmp_path / "labels.npy", lab)
    rois = {"file": str(tmp_path / "labels.npy")}
    common = {"kind": "xpcs_twotime", "backend": "cpu", "rois": rois, "errors": True, "mode": "full",
              "max_frames": 64}
    stages = [dict(common, name=nm, num_bufs=nb, num_levels=nl, precision=pr,
                   **({"publish_every": 20} if nm == "l2" else {}))
              for nm, nb, nl, pr in LEVEL_STAGES]
    start_beamd(make_config(ports, stages, mode="pull", pool_frames=64))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)

    # series 3: Poisson frames with a bad frame and a dark ROI frame;
    # 45 frames: incomplete trailing blocks at levels 1 and 2
    sid, n = 3, 45
    frames = rng.poisson(rng.uniform(0.5, 6.0, size=(H, W)), size=(n, H, W)).astype(np.uint16)
    frames[6][lab == 12] = 0
    frames[7][lab == 12] = 0  # a whole level-1 frame dark in ROI 12: NaN there
    bad = np.zeros(n, bool)
    bad[[9, 33]] = True
    # series 4: static speckle, so C = Np sum(I^2) / (sum I)^2 in every cell written, at every level
    sid2, n2 = 4, 40
    speckle = rng.integers(1, 50, size=(H, W)).astype(np.uint16)
    for s_, m_, fr, bd in ((sid, n, frames, bad), (sid2, n2, np.repeat(speckle[None], n2, 0), np.zeros(n2, bool))):
        tx.start(s_, (H, W), np.uint16, meta={"frame_time": FRAME_TIME})
        for k in range(m_):
            tx.frame(s_, k, fr[k], flags=proto.FLAG_BAD if bd[k] else 0)
        tx.end(s_)
        rx.wait_series_end(s_, timeout=15)
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0].endswith(".info") and m[1].flags & proto.FLAG_FINAL) >= 6,
                timeout=10, what="six final info")
    assert not rx.decode_errors()

    for nm, nb, nl, pr in LEVEL_STAGES:
        got = _results(rx, sid, nm)
        keys = [20, 40, "final"] if nm == "l2" else ["final"]
        assert sorted(got, key=str) == sorted(keys, key=str), (nm, list(got))
        for key in keys:
            m = n if key == "final" else key
            ref, seen = two_time_corr_numpy(frames[:m], bad[:m], lab, nb, nl)
            res = got[key]
            c2 = res["c2"][1]
            assert c2.dtype == (np.float32 if pr == "float32" else np.float64)
            assert c2.shape == (len(LABELS), m, m)
            hi = seen & ~(np.abs(np.subtract.outer(np.arange(m), np.arange(m))) < nb)
            assert hi.any() and (~seen).any()
            if pr == "float64":
                # level >= 1: scikit-beam's arithmetic on exact integer sums, to the bit;
                # level 0: BLAS products (exact) divided in beamd's order, to round-off;
                # cells of no pair: exactly 0
                np.testing.assert_array_equal(c2[:, hi], ref[:, hi], err_msg="%s %s level >= 1" % (nm, key))
                np.testing.assert_allclose(c2, ref, rtol=1e-13, atol=0, err_msg="%s %s c2" % (nm, key))
                assert (c2[:, ~seen] == 0).all()
                rtol = 1e-12
            else:
                np.testing.assert_allclose(c2, ref, rtol=2e-5, atol=0, err_msg="%s %s c2" % (nm, key))
                rtol = 2e-5
            g2, err, lags = g2_from_written(ref, seen, nb, nl)
            assert res["g2"][1].shape == (len(lags), len(LABELS))
            np.testing.assert_allclose(res["g2"][1], g2, rtol=rtol, atol=0, err_msg="%s g2" % nm)
            np.testing.assert_allclose(res["g2_err"][1], err, rtol=rtol * 100, atol=0, err_msg="%s g2_err" % nm)
            np.testing.assert_allclose(res["lags"][1], lags * FRAME_TIME, rtol=1e-15, atol=0)
            assert np.isfinite(res["g2"][1]).mean() > 0.9
            assert res["info"][1].tolist()[:4] == [m, int(bad[:m].sum()), 0, m]
        # frames 6, 7 (level-1 frame 3) dark in ROI 12: NaN in its level-0 cells and in
        # the level-1 pair (3, 3 + nb/2) at cells (6 + nb + m, 6 + m), in that ROI only
        r12 = LABELS.index(12)
        c2 = got["final"]["c2"][1]
        assert np.isnan(c2[r12, 6:8, 6:8]).all()
        assert np.isnan(c2[r12, [6 + nb, 7 + nb], [6, 7]]).all()
        assert np.isfinite(c2[r12 - 1, [6 + nb, 7 + nb], [6, 7]]).all() and np.isfinite(c2[r12 - 1, 7, 6])

    # static speckle: the closed form
    flat = lab.reshape(-1)
    want = np.array([(flat == v).sum() * (speckle.reshape(-1)[flat == v].astype(float) ** 2).sum()
                     / speckle.reshape(-1)[flat == v].astype(float).sum() ** 2 for v in LABELS])
    for nm, nb, nl, pr in LEVEL_STAGES:
        res = _results(rx, sid2, nm)["final"]
        c2 = res["c2"][1]
        _, seen = two_time_corr_numpy(np.zeros((n2, 1, 1)), np.zeros(n2, bool), np.ones((1, 1), int), nb, nl)
        rt = 1e-6 if pr == "float32" else 1e-14
        for r in range(len(LABELS)):
            np.testing.assert_allclose(c2[r][seen], want[r], rtol=rt, atol=0)
            assert (c2[r][~seen] == 0).all()
        np.testing.assert_allclose(res["g2"][1], np.broadcast_to(want, res["g2"][1].shape), rtol=rt, atol=0)
        # lags: 0..nb-1, then (nb/2 + j) 2^L; 40 frames have level-2 pairs up to lag 5 * 4
        lags = [lag for L, lag in multi_tau_lags(nb, nl) if lag < n2 and (n2 >> L) > lag >> L]
        np.testing.assert_allclose(res["lags"][1], np.array(lags) * FRAME_TIME, rtol=1e-15, atol=0)


def check_config(tmp_path, ports, stage):
    path = tmp_path / "bad.yaml"
    path.write_text(to_yaml(make_config(ports, [stage])))
    r = subprocess.run([binary("beamd"), "--check-config", str(path)], capture_output=True, text=True,
                       timeout=20)
    return r.returncode, r.stdout + r.stderr, str(path)


@pytest.mark.parametrize("extra,want", [
    ({"num_bufs": 5, "num_levels": 2}, "num_bufs must be even"),
    ({"num_levels": 3}, "num_levels 3 needs num_bufs"),
    ({"num_bufs": 8, "num_levels": 2, "mode": "band"}, "need mode full"),
    ({"num_bufs": 8, "num_levels": 2, "publish_rows": 10}, "publish_rows cannot be combined"),
    ({"num_bufs": 8, "num_levels": 17}, "num_levels"),
])
def test_levels_config_errors(tmp_path, ports, extra, want):
    np.save(tmp_path / "labels.npy", np.ones((4, 4), np.int32))
    st = {"name": "tt", "kind": "xpcs_twotime", "rois": {"file": str(tmp_path / "labels.npy")}, **extra}
    rc, out, path = check_config(tmp_path, ports, st)
    assert rc == 1, out
    assert want in out, out
    line = next(l for l in out.splitlines() if want in l)
    assert line.startswith(path + ":"), line
    assert line.split(":")[1].isdigit() and line.split(":")[2].isdigit(), line
