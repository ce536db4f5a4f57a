"""End to end: sender -> beamd (xpcs_multitau, pull mode) -> subscriber,
with g2, G, IP, IF, the lag list and the output length checked against an
independent numpy implementation of scikit-beam's closed form
(docs/xpcs.md): level-L frames are means of 2^L input frames, bad frames
are NaN (and spoil the level frames containing them), and for each lag
channel the pairs without NaN give

    G  = mean_k mean_p x_k[p] x_{k+i}[p],  IP = mean_k mean_p x_k[p],
    IF = mean_k mean_p x_{k+i}[p],         g2 = G / (IP IF),

output rows stopping at the first row where any ROI has IP == 0.

Tolerance: rtol 1e-12. beamd sums integers exactly and divides once;
numpy's means round at every step, so the two differ by a few ulps.
"""

import h5py
import numpy as np

from conftest import Receiver, Sender, make_config, proto

H, W = 24, 20
LABELS = (3, 7, 12, 30)  # gapped on purpose
LEVELS, NB = 4, 6
FRAME_TIME = 0.01


def labels_image(rng):
    lab = rng.choice(np.array((0,) + LABELS, np.int32), size=(H, W))
    for k, v in enumerate(LABELS):  # every label present
        lab[0, k] = v
    return lab


def lag_steps(levels, nb):
    """skbeam.core.utils.multi_tau_lags"""
    lags = list(range(nb))
    for lev in range(1, levels):
        lags += [(nb // 2 + j) * 2 ** lev for j in range(nb // 2)]
    return np.array(lags, np.int64)


def multitau_numpy(frames, bad, lab, levels, nb):
    """The closed form, written from the note, not from beamd's code."""
    n = len(frames)
    x = frames.reshape(n, -1).astype(np.float64)
    x[np.asarray(bad, bool)] = np.nan
    flat = lab.reshape(-1)
    masks = [flat == v for v in sorted(set(flat[flat > 0].tolist()))]
    nlags = (levels + 1) * nb // 2
    G, IP, IF = (np.zeros((nlags, len(masks))) for _ in range(3))
    paired = np.zeros(nlags, bool)
    for lev in range(levels):
        nl = n >> lev
        xl = x[:nl << lev].reshape(nl, 2 ** lev, -1).mean(axis=1)
        for i in range(nb // 2 if lev else 0, nb):
            t = lev * nb // 2 + i
            if nl <= i:
                continue
            a, b = xl[:nl - i], xl[i:]
            good = ~(np.isnan(a).any(axis=1) | np.isnan(b).any(axis=1))
            if not good.any():
                continue
            a, b = a[good], b[good]
            paired[t] = True
            for r, m in enumerate(masks):
                G[t, r] = np.mean(np.mean(a[:, m] * b[:, m], axis=1))
                IP[t, r] = np.mean(np.mean(a[:, m], axis=1))
                IF[t, r] = np.mean(np.mean(b[:, m], axis=1))
    zero = (IP == 0).any(axis=1)
    rows = int(np.argmax(zero)) if zero.any() else nlags
    dark = -1
    if rows < nlags and (IP[rows] != 0).any():
        dark = [v for v, z in zip(sorted(set(flat[flat > 0].tolist())), IP[rows] == 0) if z][0]
    with np.errstate(divide="ignore", invalid="ignore"):
        g2 = G / (IP * IF)
    # intensity_rows: pairs: every leading lag with pairs, dark ROIs or not
    prow = int(np.argmin(paired)) if not paired.all() else nlags
    return {"rows": rows, "g2": g2[:rows], "G": G[:rows], "IP": IP[:rows], "IF": IF[:rows],
            "lags": lag_steps(levels, nb)[:rows], "dark": dark, "nlags": nlags,
            "pair_rows": prow, "G_all": G[:prow], "IP_all": IP[:prow], "IF_all": IF[:prow],
            "lags_all": lag_steps(levels, nb)[:prow]}


def multitau_per_pixel_numpy(frames, bad, lab, levels, nb):
    """normalization: per_pixel (docs/xpcs.md), from the doc's formula:
    per pixel and lag, G, IP, IF are means over the good pairs of level
    means; g2_p = G / (IP IF) for pixels with IP, IF != 0; per ROI the mean
    of g2_p and np.std(g2_p) / sqrt(count)."""
    n = len(frames)
    x = frames.reshape(n, -1).astype(np.float64)
    x[np.asarray(bad, bool)] = np.nan
    flat = lab.reshape(-1)
    masks = [flat == v for v in sorted(set(flat[flat > 0].tolist()))]
    nlags = (levels + 1) * nb // 2
    g2, err = np.full((nlags, len(masks)), np.nan), np.full((nlags, len(masks)), np.nan)
    for lev in range(levels):
        nl = n >> lev
        xl = x[:nl << lev].reshape(nl, 2 ** lev, -1).mean(axis=1)
        for i in range(nb // 2 if lev else 0, nb):
            t = lev * nb // 2 + i
            if nl <= i:
                continue
            a, b = xl[:nl - i], xl[i:]
            good = ~(np.isnan(a).any(axis=1) | np.isnan(b).any(axis=1))
            if not good.any():
                continue
            a, b = a[good], b[good]
            G, IP, IF = (a * b).mean(axis=0), a.mean(axis=0), b.mean(axis=0)
            for r, m in enumerate(masks):
                ok = m & (IP != 0) & (IF != 0)
                gp = G[ok] / (IP[ok] * IF[ok])
                g2[t, r] = gp.mean()
                err[t, r] = gp.std() / np.sqrt(gp.size)
    return g2, err


def _start(tmp_path, ports, zctx, start_beamd, receivers, rois, **extra):
    st = {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu", "rois": rois,
          "levels": LEVELS, "buffers": NB, "publish_every": 20, "intensities": True, **extra}
    start_beamd(make_config(ports, [st], mode="pull", pool_frames=64))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    return rx, Sender(zctx, ports.ep_input, __import__("zmq").PUSH)


def _send_series(tx, sid, frames, bad=None, meta=None):
    """SERIES_START, every frame (BAD where bad says), SERIES_END."""
    n, h, w = frames.shape
    tx.start(sid, (h, w), np.uint16, meta=meta)
    for k in range(n):
        tx.frame(sid, k, frames[k], flags=proto.FLAG_BAD if bad is not None and bad[k] else 0)
    tx.end(sid)


def _results(rx, sid):
    """{(frames so far, final): {output: (header, array, meta)}}"""
    out = {}
    for topic, hdr, arr, meta in rx.snapshot():
        if not topic.startswith("mt.") or hdr.series_id != sid:
            continue
        final = bool(hdr.flags & proto.FLAG_FINAL)
        assert final or hdr.flags & proto.FLAG_PARTIAL, topic
        key = "final" if final else hdr.frame_id + 1
        out.setdefault(key, {})[topic[3:]] = (hdr, arr, meta)
    return out


def _compare(res, ref, nframes, nbad):
    info = res["info"][1]
    assert info.dtype == np.int64 and info.shape == (6,)
    assert info.tolist() == [nframes, nbad, ref["rows"], ref["nlags"], ref["dark"],
                             ref["rows"] if ref["rows"] < ref["nlags"] else -1]
    if ref["rows"] == 0:
        assert "g2" not in res and "lags" not in res
        return
    lags = res["lags"][1]
    assert lags.shape == (ref["rows"],)
    np.testing.assert_allclose(lags, ref["lags"] * FRAME_TIME, rtol=1e-15, atol=0)
    for name, out in (("g2", "g2"), ("G", "g_num"), ("IP", "ip"), ("IF", "if")):
        got = res[out][1]
        assert got.dtype == np.float64 and got.shape == (ref["rows"], len(LABELS)), name
        np.testing.assert_allclose(got, ref[name], rtol=1e-12, atol=0, err_msg=name)


def test_multitau_matches_numpy(tmp_path, ports, zctx, start_beamd, receivers):
    rng = np.random.default_rng(2024)
    lab = labels_image(rng)
    np.save(tmp_path / "labels.npy", lab)
    rx, tx = _start(tmp_path, ports, zctx, start_beamd, receivers,
                    {"file": str(tmp_path / "labels.npy")})
    sid, n = 4, 45
    lam = rng.uniform(0.5, 6.0, size=(H, W))
    frames = rng.poisson(lam, size=(n, H, W)).astype(np.uint16)
    bad = np.zeros(n, bool)
    bad[[9, 33]] = True  # spoil level-3 frames 1 and 4: lag row 13 has no pair
    _send_series(tx, sid, frames, bad, meta={"frame_time": FRAME_TIME})
    rx.wait_series_end(sid, timeout=15)
    rx.wait_for(lambda ms: any(m[0] == "mt.if" and m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=5, what="final mt.if")
    assert not rx.decode_errors()
    got = _results(rx, sid)
    assert sorted(k for k in got if k != "final") == [20, 40]
    for k in (20, 40, "final"):
        m = n if k == "final" else k
        ref = multitau_numpy(frames[:m], bad[:m], lab, LEVELS, NB)
        _compare(got[k], ref, m, int(bad[:m].sum()))
    ref = multitau_numpy(frames, bad, lab, LEVELS, NB)
    assert ref["rows"] == 13 and ref["dark"] == -1  # the case the comment promises
    # descriptors: ROI columns are the label values; lags in seconds
    metas = {t: mm for t, h, a, mm in rx.snapshot() if t.startswith("mt.") and mm}
    assert metas["mt.g2"]["labels"] == list(LABELS)
    assert metas["mt.g2"]["axes"] == ["lag", "roi"]
    assert metas["mt.lags"]["units"] == "s"


def test_dark_roi_empties_output(tmp_path, ports, zctx, start_beamd, receivers):
    """scikit-beam truncates at the first zero past intensity of ANY ROI: a
    dark ROI leaves no rows; info names the dark label. The label image is
    HDF5 here."""
    rng = np.random.default_rng(5)
    lab = labels_image(rng)
    with h5py.File(tmp_path / "labels.h5", "w") as f:
        f["/qmap/labels"] = lab
    rx, tx = _start(tmp_path, ports, zctx, start_beamd, receivers,
                    {"file": str(tmp_path / "labels.h5"), "dataset": "/qmap/labels"})
    sid, n = 9, 24
    frames = rng.poisson(3.0, size=(n, H, W)).astype(np.uint16)
    frames[:, lab == 12] = 0
    _send_series(tx, sid, frames)
    rx.wait_series_end(sid, timeout=15)
    rx.wait_for(lambda ms: any(m[0] == "mt.info" and m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=5, what="final mt.info")
    got = _results(rx, sid)
    ref = multitau_numpy(frames, np.zeros(n, bool), lab, LEVELS, NB)
    assert ref["rows"] == 0 and ref["dark"] == 12
    assert sorted(k for k in got if k != "final") == [20]
    for k in (20, "final"):
        m = n if k == "final" else k
        _compare(got[k], multitau_numpy(frames[:m], np.zeros(m, bool), lab, LEVELS, NB), m, 0)


def test_dark_roi_keeps_intensities_with_pairs_rows(tmp_path, ports, zctx, start_beamd, receivers):
    """intensity_rows: pairs: a dark ROI still cuts g2 (none here), but G,
    IP and IF of every ROI (the dark one's zeros included) and the lags
    are published for every lag that has pairs, against numpy."""
    rng = np.random.default_rng(6)
    lab = labels_image(rng)
    np.save(tmp_path / "labels.npy", lab)
    rx, tx = _start(tmp_path, ports, zctx, start_beamd, receivers,
                    {"file": str(tmp_path / "labels.npy")}, intensity_rows="pairs")
    sid, n = 10, 24
    frames = rng.poisson(3.0, size=(n, H, W)).astype(np.uint16)
    frames[:, lab == 12] = 0
    _send_series(tx, sid, frames, meta={"frame_time": FRAME_TIME})
    rx.wait_series_end(sid, timeout=15)
    rx.wait_for(lambda ms: any(m[0] == "mt.info" and m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=5, what="final mt.info")
    got = _results(rx, sid)
    for k in (20, "final"):
        m = n if k == "final" else k
        ref = multitau_numpy(frames[:m], np.zeros(m, bool), lab, LEVELS, NB)
        assert ref["rows"] == 0 and ref["dark"] == 12 and ref["pair_rows"] > 8, ref["pair_rows"]
        res = got[k]
        assert "g2" not in res
        assert res["info"][1].tolist()[2] == 0  # g2 rows: cut as before
        np.testing.assert_allclose(res["lags"][1], ref["lags_all"] * FRAME_TIME, rtol=1e-15, atol=0)
        dark_col = sorted(set(lab[lab > 0].tolist())).index(12)
        for name, out in (("G_all", "g_num"), ("IP_all", "ip"), ("IF_all", "if")):
            a = res[out][1]
            assert a.shape == (ref["pair_rows"], len(LABELS)), (name, a.shape)
            np.testing.assert_allclose(a, ref[name], rtol=1e-12, atol=0, err_msg=name)
            assert (a[:, dark_col] == 0).all(), name


def test_intensity_rows_pairs_needs_intensities(tmp_path, ports, start_beamd):
    st = {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu",
          "rois": {"file": str(tmp_path / "l.npy")}, "intensity_rows": "pairs"}
    np.save(tmp_path / "l.npy", np.ones((H, W), np.int32))
    b = start_beamd(make_config(ports, [st], mode="pull"), ready=False)
    assert b.wait(10) == 1, b.stderr()
    assert "intensity_rows: pairs needs intensities: true" in b.stderr()


def test_per_pixel_matches_numpy(tmp_path, ports, zctx, start_beamd, receivers):
    """normalization: per_pixel: g2 and g2_err against numpy, on sparse
    counts (mean 0.3-2 per pixel, so many pixels have IP or IF == 0 at
    some lag and are left out as the doc says); G/IP/IF and the rows are
    those of roi mode. Tolerance rtol 1e-12 for g2 (exact integer sums, one
    division per pixel); g2_err is a root of a sum of squared deviations,
    compared to 1e-10 of g2."""
    rng = np.random.default_rng(77)
    lab = labels_image(rng)
    np.save(tmp_path / "labels.npy", lab)
    rx, tx = _start(tmp_path, ports, zctx, start_beamd, receivers,
                    {"file": str(tmp_path / "labels.npy")}, normalization="per_pixel")
    sid, n = 6, 44
    lam = rng.uniform(0.3, 2.0, size=(H, W))
    frames = rng.poisson(lam, size=(n, H, W)).astype(np.uint16)
    bad = np.zeros(n, bool)
    bad[15] = True
    _send_series(tx, sid, frames, bad, meta={"frame_time": FRAME_TIME})
    rx.wait_series_end(sid, timeout=15)
    rx.wait_for(lambda ms: any(m[0] == "mt.if" and m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=5, what="final mt.if")  # published last
    assert not rx.decode_errors()
    got = _results(rx, sid)
    assert sorted(k for k in got if k != "final") == [20, 40]
    for k in (20, 40, "final"):
        m = n if k == "final" else k
        ref = multitau_numpy(frames[:m], bad[:m], lab, LEVELS, NB)
        res = got[k]
        rows = ref["rows"]
        assert res["info"][1][2] == rows and rows > NB
        g2, err = multitau_per_pixel_numpy(frames[:m], bad[:m], lab, LEVELS, NB)
        for name in ("G", "IP", "IF"):
            out = {"G": "g_num", "IP": "ip", "IF": "if"}[name]
            np.testing.assert_allclose(res[out][1], ref[name], rtol=1e-12, atol=0, err_msg=name)
        assert res["g2"][1].shape == (rows, len(LABELS)) and res["g2_err"][1].shape == (rows, len(LABELS))
        np.testing.assert_allclose(res["g2"][1], g2[:rows], rtol=1e-12, atol=0, err_msg="g2")
        assert np.all(np.abs(res["g2_err"][1] - err[:rows]) <= 1e-10 * np.abs(g2[:rows])), "g2_err"
        # per-pixel and ROI normalisation differ on non-uniform ROIs
        assert not np.allclose(res["g2"][1], ref["g2"], rtol=1e-3)
    metas = {t: mm for t, h, a, mm in rx.snapshot() if t.startswith("mt.") and mm}
    assert metas["mt.g2_err"]["labels"] == list(LABELS)


def test_threads_bit_identical(tmp_path, ports, zctx, start_beamd, receivers):
    """threads 1, 2 and 3 (roi and per_pixel) on the same frames publish the
    same bits: 128x128 frames, two ROIs of about 8000 pixels (two 4096-pixel
    blocks each), so the tiles of threads 2 and 3 cut through the ROIs; a
    few bright frames on one half make some tiles int64 and others int16.
    threads 1 also against numpy."""
    h, w = 128, 128
    rng = np.random.default_rng(31)
    lab = np.where(np.arange(h)[:, None] < h // 2, 5, 8).astype(np.int32) * np.ones((1, w), np.int32)
    lab[rng.random((h, w)) < 0.05] = 0
    np.save(tmp_path / "labels.npy", lab)
    rois = {"file": str(tmp_path / "labels.npy")}
    base = {"kind": "xpcs_multitau", "backend": "cpu", "rois": rois, "levels": LEVELS,
            "buffers": NB, "publish_every": 16, "intensities": True}
    stages = [dict(base, name="t%d" % t, threads=t) for t in (1, 2, 3)]
    stages += [dict(base, name="p%d" % t, threads=t, normalization="per_pixel") for t in (1, 3)]
    start_beamd(make_config(ports, stages, mode="pull", pool_frames=64))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, __import__("zmq").PUSH)
    sid, n = 12, 40
    frames = rng.poisson(rng.uniform(1.0, 8.0, size=(h, w)), size=(n, h, w)).astype(np.uint16)
    frames[5::9, h // 2:] += 20000  # above int16 once two are summed
    bad = np.zeros(n, bool)
    bad[13] = True
    _send_series(tx, sid, frames, bad, meta={"frame_time": FRAME_TIME})
    rx.wait_series_end(sid, timeout=30)
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0].endswith(".if") and m[1].flags & proto.FLAG_FINAL) >= 5,
                timeout=20, what="five final if")
    assert not rx.decode_errors()
    got = {}
    for topic, hdr, arr, meta in rx.snapshot():
        if hdr.series_id != sid or "." not in topic:
            continue
        name, out = topic.split(".", 1)
        key = "final" if hdr.flags & proto.FLAG_FINAL else hdr.frame_id + 1
        got.setdefault(name, {})[(key, out)] = arr
    for ref_name, names, outs in (("t1", ("t2", "t3"), ("g2", "g_num", "ip", "if", "lags", "info")),
                                  ("p1", ("p3",), ("g2", "g2_err", "g_num", "ip", "if", "info"))):
        ref = got[ref_name]
        assert ("final", "g2") in ref and (16, "g2") in ref and (32, "g2") in ref
        for name in names:
            assert set(got[name]) == set(ref), name
            for key in ref:
                if key[1] in outs:
                    a, b = got[name][key], ref[key]
                    assert a.dtype == b.dtype and a.shape == b.shape, (name, key)
                    assert a.tobytes() == b.tobytes(), (name, key)
    want = multitau_numpy(frames, bad, lab, LEVELS, NB)
    np.testing.assert_allclose(got["t1"][("final", "g2")], want["g2"], rtol=1e-12, atol=0)
