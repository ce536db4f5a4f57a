"""End to end: stages that take their mask and beam centre from the series
(`mask: series`, `center: series`), fed by a DECTRIS stream v1 with
header_detail "all" (the detector's pixel mask and its geometry: beam
centre, energy, distance, pixel size).

- roi_sum: a masked pixel holding a huge value enters no sum (numpy over
  the unmasked pixels), while the same ROIs without the mask include it;
  the disk centred by the series is the disk centred by the typed-in
  numbers.
- xpcs_multitau on q rings with centre, mask and q geometry from the
  series: bit-identical to the same rings with everything typed in (the
  mask as a file), and equal to numpy's closed form on labels computed
  here from the q formula with the mask's pixels removed; xpcs_twotime
  (the same ROI code) bit-identical between the two configs as well.
- a series without the mask or the centre is refused at its start, with
  the reason in the log.
"""

import json

import numpy as np

from conftest import Receiver, proto
from test_daemon_dectris import (H, W, Detector, dectris_config, v1_end, v1_header, v1_image,
                                 v1_config)
from test_xpcs_multitau import multitau_numpy

CX, CY = 20.5, 24.25          # v1_config's beam_center_x, beam_center_y
EV, DIST, PIX = 12400.0, 0.125, 7.5e-05
HOT = (24, 21)                # (y, x): in the disk and in a ring
LEVELS, NB = 3, 4


def series_mask():
    mask = np.zeros((H, W), np.uint32)
    mask[HOT] = 8             # hot pixel (DECTRIS bit 3)
    mask[:, 17] = 1           # a gap column through the rings
    mask[30, 5] = 2           # dead
    return mask


def detector_frames(n, seed):
    rng = np.random.default_rng(seed)
    f = rng.poisson(rng.uniform(1, 20, size=(H, W)), size=(n, H, W)).astype(np.uint16)
    f[:, HOT[0], HOT[1]] = rng.integers(50000, 65000, size=n)  # noisy, huge
    return f


def qmap():
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    r = np.hypot(x - CX, y - CY)
    lam = 12398.419843320026 / EV
    return 4 * np.pi / lam * np.sin(np.arctan(r * PIX / DIST) / 2)


Q_EDGES = [0.001, 0.03, 0.06, 0.09]


def ring_labels(mask):
    q = qmap()
    lab = np.zeros((H, W), np.int32)
    for k in range(len(Q_EDGES) - 1):
        lab[(q >= Q_EDGES[k]) & (q < Q_EDGES[k + 1])] = k + 1
    lab[mask != 0] = 0
    return lab


def send_series(det, sid, data, mask, detail="all", drop=()):
    parts = v1_header(sid, detail, len(data), mask=mask)
    if drop:  # a detector config without these keys
        cfg = {k: v for k, v in v1_config(len(data)).items() if k not in drop}
        parts[1] = json.dumps(cfg).encode()
    det.send(parts)
    for i, a in enumerate(data):
        det.send(v1_image(sid, i, a))
    det.send(v1_end(sid))


def by_stage(rx, sid):
    out = {}
    for topic, hdr, arr, meta in rx.snapshot():
        if hdr.series_id != sid or "." not in topic or topic.startswith("beamd."):
            continue
        name, output = topic.split(".", 1)
        key = "final" if hdr.flags & proto.FLAG_FINAL else hdr.frame_id
        out.setdefault(name, {})[(key, output)] = arr
    return out


def test_mask_and_center_from_series(tmp_path, ports, zctx, start_beamd, receivers):
    mask = series_mask()
    np.save(tmp_path / "mask.npy", mask)
    assert ring_labels(mask)[HOT] == 0 and ring_labels(np.zeros_like(mask))[HOT] > 0
    disk = {"name": "bf", "shape": "disk", "radius": 6}
    whole = {"name": "all", "shape": "rect", "rect": [0, 0, W, H]}
    q_rois = {"q": Q_EDGES}
    stages = [
        {"name": "vs", "kind": "roi_sum", "backend": "cpu", "input": "frames", "mask": "series",
         "rois": [dict(disk, center="series"), whole]},
        {"name": "vt", "kind": "roi_sum", "backend": "cpu", "input": "frames",
         "rois": [dict(disk, center=[CX, CY]), whole]},
        {"name": "ms", "kind": "xpcs_multitau", "backend": "cpu", "input": "frames",
         "levels": LEVELS, "buffers": NB, "intensities": True,
         "rois": dict(q_rois, center="series", mask="series")},
        {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu", "input": "frames",
         "levels": LEVELS, "buffers": NB, "intensities": True,
         "rois": dict(q_rois, center=[CX, CY], energy=EV, distance=DIST, pixel_size=PIX,
                      mask=str(tmp_path / "mask.npy"))},
        {"name": "ts", "kind": "xpcs_twotime", "backend": "cpu", "input": "frames",
         "rois": dict(q_rois, center="series", mask="series")},
        {"name": "tt", "kind": "xpcs_twotime", "backend": "cpu", "input": "frames",
         "rois": dict(q_rois, center=[CX, CY], energy=EV, distance=DIST, pixel_size=PIX,
                      mask=str(tmp_path / "mask.npy"))},
    ]
    b = start_beamd(dectris_config(ports, stages))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    det = Detector(zctx, ports.ep_input)
    sid, n = 6, 16
    data = detector_frames(n, 5)
    send_series(det, sid, data, mask)
    finals = {(st, out) for st in ("ms", "mt") for out in ("g2", "lags", "info", "g_num", "ip", "if")}
    finals |= {(st, out) for st in ("ts", "tt") for out in ("c2", "g2", "lags", "info")}
    rx.wait_for(lambda ms: finals <= {tuple(m[0].split(".", 1)) for m in ms if m[1].series_id == sid
                                      and m[1].flags & proto.FLAG_FINAL},
                timeout=20, what="the final results of the four xpcs stages")
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "vs.sums" and m[1].series_id == sid) >= n
                and sum(1 for m in ms if m[0] == "vt.sums" and m[1].series_id == sid) >= n,
                timeout=10, what="every sum")
    got = by_stage(rx, sid)
    y, x = np.mgrid[0:H, 0:W]
    in_disk = (x - CX) ** 2 + (y - CY) ** 2 < 36
    good = mask == 0
    for k in range(n):
        f = data[k].astype(np.float64)
        vs, vt = got["vs"][(k, "sums")], got["vt"][(k, "sums")]
        assert vs[0] == f[in_disk & good].sum() and vs[1] == f[good].sum(), k
        assert vt[0] == f[in_disk].sum() and vt[1] == f.sum(), k
        assert vt[0] - vs[0] >= 50000  # the hot pixel is what the mask took out
    ms, mt = got["ms"], got["mt"]
    assert set(ms) == set(mt)
    for key in ms:
        if key[1] != "lags":
            assert ms[key].tobytes() == mt[key].tobytes(), key
    ts, tt = got["ts"], got["tt"]
    assert ts and set(ts) == set(tt)
    for key in ts:
        assert ts[key].tobytes() == tt[key].tobytes(), key
    ref = multitau_numpy(data, np.zeros(n, bool), ring_labels(mask), LEVELS, NB)
    assert ref["rows"] > 0
    for name, out in (("g2", "g2"), ("G", "g_num"), ("IP", "ip"), ("IF", "if")):
        np.testing.assert_allclose(ms[("final", out)], ref[name], rtol=1e-12, atol=0, err_msg=name)
    # Without the mask the hot pixel would be in ring 1's intensity.
    unmasked = multitau_numpy(data, np.zeros(n, bool), ring_labels(np.zeros_like(mask)), LEVELS, NB)
    assert not np.allclose(unmasked["IP"][:, 0], ref["IP"][:, 0], rtol=1e-3)


def test_series_without_mask_or_center_refused(tmp_path, ports, zctx, start_beamd, receivers):
    stages = [{"name": "vs", "kind": "roi_sum", "backend": "cpu", "input": "frames",
               "mask": "series", "rois": [{"name": "a", "shape": "rect", "rect": [0, 0, 4, 4]}]},
              {"name": "ms", "kind": "xpcs_multitau", "backend": "cpu", "input": "frames",
               "rois": {"center": "series", "radii": [0, 5, 10]}}]
    b = start_beamd(dectris_config(ports, stages))
    det = Detector(zctx, ports.ep_input)
    data = detector_frames(3, 1)
    send_series(det, 7, data, None, detail="basic")  # config, but no arrays
    b.wait_log(r'roi_sum: mask: series, but series 7 carries no "pixel_mask" array', timeout=10)
    send_series(det, 8, data, None, detail="all", drop=("beam_center_x", "beam_center_y"))
    b.wait_log(r"xpcs_multitau: rois.center: series, but the metadata of series 8 has no beam_center",
               timeout=10)
    assert b.alive()
