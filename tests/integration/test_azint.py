"""End to end: sender -> beamd (azint) -> subscriber, every published I(q),
sigma, count and cake compared with pyFAI's AzimuthalIntegrator
(integrate1d_ng / integrate2d_ng, method (split, "csr", "cython")) on the
same frames and geometry: tilted and rotated detector, mask, polarisation,
solid angle, Poisson errors, dummy values, radial and azimuth ranges, both
splitting modes, uint16 and float32 frames, all three
units, geometry from keys and from a .poni file pyFAI wrote.

Tolerance: bin positions rtol 1e-9; on bins with counts (count > 0),
count rtol 1e-5 and I, sigma rtol 1e-4. The cake's counts with bbox
splitting: rtol 1e-4 plus 1e-5 pixel, since pyFAI's χ box half-widths come
from float32 corner angles and agree with beamd's to about 1e-7 rad,
which moves the fractions of a pixel given to neighbouring χ bins by up to
~1e-6 (I, a ratio of two sums carrying the same fractions, still agrees
to 1e-4). Both sides build the same sparse
matrix (pyFAI's SplitBBoxIntegrator rules, float32 coefficients); the
differences are pyFAI's float32 preprocessing (signal, normalisation)
against beamd's double. A pixel whose centre (or box edge) lies within
rounding of a bin edge could land in the neighbour bin on one side only;
the frames here have none, and the test would show one (a count off by a
whole pixel). Empty bins (count 0) must be empty on both sides.
"""

import numpy as np
import pytest
import zmq

from conftest import Receiver, Sender, make_config, stage

pyFAI = pytest.importorskip("pyFAI", reason="pyFAI (python3-pyfai) is needed as the oracle")
from pyFAI.azimuthalIntegrator import AzimuthalIntegrator  # noqa: E402
from pyFAI.detectors import Detector  # noqa: E402

H, W = 96, 128
PIX1, PIX2 = 172e-6, 150e-6
GEOM = dict(dist=0.12, poni1=0.4 * H * PIX1, poni2=0.55 * W * PIX2, rot1=0.05, rot2=-0.03,
            rot3=0.4, wavelength=1.0e-10)


def _ai(geom):
    det = Detector(PIX1, PIX2, max_shape=(H, W))
    return AzimuthalIntegrator(detector=det, **geom)


def _frames(rng, n):
    """Rings plus Poisson noise, uint16; a few hot/dummy pixels."""
    y, x = np.mgrid[0:H, 0:W]
    r = np.hypot(y - 0.4 * H, x - 0.55 * W)
    base = 200 + 800 * np.exp(-((r % 23) - 11) ** 2 / 8.0)
    out = []
    for _ in range(n):
        f = rng.poisson(base).astype(np.uint16)
        f[rng.integers(0, H, 5), rng.integers(0, W, 5)] = 65535
        out.append(f)
    return out


CASES = {
    # tilt + rotation, bbox, mask, polarisation, solid angle, poisson, cake
    "bbox_q_cake": dict(cfg={"unit": "q_nm^-1", "npt": 150, "npt_azim": 36, "split": "bbox",
                             "polarization_factor": 0.95, "solid_angle": True,
                             "error_model": "poisson", "mask": True},
                        kw=dict(unit="q_nm^-1", polarization_factor=0.95, correctSolidAngle=True,
                                error_model="poisson"), split="bbox", npt_azim=36),
    # no splitting, 2theta, no solid angle, radial and azimuth ranges, dummy
    "none_2th_ranges": dict(cfg={"unit": "2th_deg", "npt": 80, "split": "none",
                                 "solid_angle": False, "radial_range": [2.0, 14.0],
                                 "azimuth_range": [-120.0, 60.0], "dummy": 65535,
                                 "error_model": "poisson"},
                            kw=dict(unit="2th_deg", correctSolidAngle=False,
                                    radial_range=(2.0, 14.0), azimuth_range=(-120.0, 60.0),
                                    dummy=65535, error_model="poisson"), split="no", npt_azim=0),
    # bbox with an azimuth range (1-D: whole pixels whose box meets it) and
    # a radial range, vertical polarisation, mask, float32 frames
    "bbox_qA_ranges": dict(cfg={"unit": "q_A^-1", "npt": 90, "split": "bbox", "mask": True,
                                "radial_range": [0.1, 0.9], "azimuth_range": [-30.0, 150.0],
                                "polarization_factor": -0.5, "error_model": "poisson"},
                           kw=dict(unit="q_A^-1", radial_range=(0.1, 0.9),
                                   azimuth_range=(-30.0, 150.0), polarization_factor=-0.5,
                                   error_model="poisson"), split="bbox", npt_azim=0,
                           dtype=np.float32),
    # .poni file (pyFAI's own writer), q in 1/A, none splitting with cake
    "poni_qA_none_cake": dict(cfg={"unit": "q_A^-1", "npt": 64, "npt_azim": 24, "split": "none",
                                   "poni": True, "dummy": 65535, "delta_dummy": 0.5},
                              kw=dict(unit="q_A^-1", dummy=65535, delta_dummy=0.5),
                              split="no", npt_azim=24),
}


def _run(tmp_path, ports, zctx, start_beamd, receivers, case, frames, mask, threads):
    c = CASES[case]
    st = {"name": "az", "kind": "azint", "backend": "cpu", "threads": threads}
    for k, v in c["cfg"].items():
        if k in ("mask", "poni"):
            continue
        st[k] = v
    if c["cfg"].get("mask"):
        np.save(tmp_path / "mask.npy", mask)
        st["mask"] = str(tmp_path / "mask.npy")
    if c["cfg"].get("poni"):
        _ai(GEOM).write(str(tmp_path / "g.poni"))
        st["poni"] = str(tmp_path / "g.poni")
    else:
        st.update({k: v for k, v in GEOM.items()})
        st["pixel1"], st["pixel2"] = PIX1, PIX2
    cfg = make_config(ports, [st], mode="pull")
    b = start_beamd(cfg)
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    sid = 3
    tx.start(sid, (H, W), frames[0].dtype)
    for fid, f in enumerate(frames):
        tx.frame(sid, fid, f)
    tx.end(sid)
    rx.wait_series_end(sid, timeout=20)
    n = len(frames)
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "az.intensity") >= n, timeout=5, what="az.intensity")
    assert not rx.decode_errors(), rx.decode_errors()
    assert stage(b.stats(), "az")["errors"] == 0
    tx.close()
    return rx


def _cake_ref(frame, npt, npt_azim, method, kw):
    """pyFAI's cake, from a fresh integrator each time until two agree.
    pyFAI 0.21.3's 2-D CSR builder without splitting (calc_lut_2d,
    do_split false) leaves the box half-widths d0, d1 uninitialised: they
    are usually 0 (the right answer), but now and then stack garbage that
    empties or shifts the whole cake (seen about once in 50 builds)."""
    prev = None
    for _ in range(6):
        ref = _ai(GEOM).integrate2d_ng(frame, npt, npt_azim, method=method, **kw)
        cnt = np.asarray(ref.count)
        if prev is not None and cnt.sum() > 0 and np.array_equal(cnt, np.asarray(prev.count)):
            return ref
        prev = ref
    pytest.fail("pyFAI's integrate2d_ng gave no two equal cakes in 6 tries")


def _by_frame(rx, topic):
    return {m[1].frame_id: m[2] for m in rx.snapshot(topic)}


def _close(a, b, rtol, what, atol=1e-300):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    bad = ~(np.abs(a - b) <= rtol * np.abs(b) + atol)
    assert not bad.any(), "%s: %d bins differ, first at %s: beamd %r pyFAI %r" % (
        what, bad.sum(), np.argwhere(bad)[0], a[bad][:3], b[bad][:3])


def _compare(got_I, got_s, got_c, ref, what, crtol=1e-5, catol=1e-300):
    cnt = np.asarray(ref.count)
    has = cnt > 0
    assert np.array_equal(got_c > 0, has), what + ": empty bins differ"
    _close(got_c[has], cnt[has], crtol, what + " count", atol=catol)
    _close(got_I[has], np.asarray(ref.intensity)[has], 1e-4, what + " I")
    if got_s is not None:
        _close(got_s[has], np.asarray(ref.sigma)[has], 1e-4, what + " sigma")


@pytest.mark.parametrize("case", sorted(CASES))
def test_azint_matches_pyfai(case, tmp_path, ports, zctx, start_beamd, receivers):
    rng = np.random.default_rng(11)
    frames = [f.astype(CASES[case].get("dtype", np.uint16)) for f in _frames(rng, 4)]
    mask = np.zeros((H, W), np.uint8)
    mask[rng.integers(0, H, 60), rng.integers(0, W, 60)] = 1
    mask[:, :3] = 1
    c = CASES[case]
    threads = 3 if case == "bbox_q_cake" else 1
    rx = _run(tmp_path, ports, zctx, start_beamd, receivers, case, frames, mask, threads)
    ai = _ai(GEOM)
    kw = dict(c["kw"])
    if c["cfg"].get("mask"):
        kw["mask"] = mask
    method = (c["split"], "csr", "cython")
    npt = c["cfg"]["npt"]
    I, S, C = _by_frame(rx, "az.intensity"), _by_frame(rx, "az.sigma"), _by_frame(rx, "az.count")
    radial = rx.snapshot("az.radial")
    assert len(radial) == 1, "radial axis once per series"
    poisson = kw.get("error_model") == "poisson"
    for fid, f in enumerate(frames):
        ref = ai.integrate1d_ng(f, npt, method=method, **kw)
        if fid == 0:
            _close(radial[0][2], ref.radial, 1e-9, case + " radial")
        _compare(I[fid], S.get(fid) if poisson else None, C[fid], ref, "%s frame %d" % (case, fid))
    if c["npt_azim"]:
        kw2 = dict(kw)
        kw2.pop("azimuth_range", None)
        K, KS, KC = (_by_frame(rx, "az.cake"), _by_frame(rx, "az.cake_sigma"),
                     _by_frame(rx, "az.cake_count"))
        chi = rx.snapshot("az.chi")
        for fid, f in enumerate(frames):
            ref = _cake_ref(f, npt, c["npt_azim"], method, kw2)
            assert K[fid].shape == (c["npt_azim"], npt)
            if fid == 0:
                _close(chi[0][2], ref.azimuthal, 1e-9, case + " chi")
                # The cake's descriptor gives its axes' physical scale (for
                # viewers): uniform bins from the first centre, pyFAI's.
                meta = next(m[3] for m in rx.snapshot("az.cake") if m[3])
                lab = meta["labels"]
                assert meta["axes"] == ["chi", "radial"] and lab["chi"]["units"] == "deg"
                assert lab["radial"]["units"] == c["cfg"]["unit"]
                _close(lab["chi"]["origin"] + lab["chi"]["step"] * np.arange(c["npt_azim"]),
                       ref.azimuthal, 1e-9, case + " cake chi axis", atol=1e-9)
                _close(lab["radial"]["origin"] + lab["radial"]["step"] * np.arange(npt),
                       ref.radial, 1e-9, case + " cake radial axis", atol=1e-12)
            _compare(K[fid], KS.get(fid) if poisson else None, KC[fid], ref,
                     "%s cake frame %d" % (case, fid), crtol=1e-4, catol=1e-5)


def test_azint_bad_config_is_refused(tmp_path, ports, run_tool):
    """poni beside geometry keys, and a missing wavelength, are config errors
    with file:line:col."""
    import yaml
    _ai(GEOM).write(str(tmp_path / "g.poni"))
    bad = make_config(ports, [{"name": "az", "kind": "azint", "npt": 10,
                               "poni": str(tmp_path / "g.poni"), "dist": 0.1}])
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(bad))
    r = run_tool("beamd", ["--check-config", str(p)])
    assert r.wait(20) == 1
    assert "dist and poni are exclusive" in r.stderr() and "bad.yaml:" in r.stderr()
    geo = {k: v for k, v in GEOM.items() if k != "wavelength"}
    bad = make_config(ports, [dict({"name": "az", "kind": "azint", "npt": 10,
                                    "pixel1": PIX1, "pixel2": PIX2}, **geo)])
    p.write_text(yaml.safe_dump(bad))
    r = run_tool("beamd", ["--check-config", str(p)])
    assert r.wait(20) == 1
    assert "wavelength is required without a poni file" in r.stderr()
