"""End to end: sender -> beamd (`com` stages) -> subscriber, on simulated
4D-STEM frames whose answer is known, checked against an independent
numpy implementation written from docs/com.md's definitions (the centre of
mass, LiberTEM's apply_correction / divergence / curl_2d, and the Fourier
iDPC).

The frames: a uniform disc at the reference centre moved by a chosen
shift: the integer part moves the disc, the fractional part is applied by
bilinear splatting (each pixel's value spread over the four pixels around
its new place), which keeps the total and moves the first moments by
exactly the shift. So the centre of mass is the chosen shift up to float32
rounding of the pixel values (~1e-6 pixels), and:
  - a shift that is a linear ramp over the scan has constant divergence
    (the sum of the ramp's slopes) and no curl, whatever the stencil;
  - a shift that is the gradient of a periodic potential integrates back
    to that potential (up to its mean, which iDPC sets to 0).

A last test runs beamd-sim's own 4D-STEM pattern (`--pattern stem`),
whose scan shape comes in the series metadata.

Tolerances: per-frame values against numpy 1e-9 pixels (float64 sums of
the same float32 pixels in another order; uint16 frames: exact); maps
(float32 out) against numpy 2e-6 x (1 + |value|); against the known
answers 1e-4 (the float32 rounding of the splatted frames, amplified at
most ~N / (2 pi) by the integration).
"""

import numpy as np
import zmq

from conftest import Receiver, Sender, make_config, proto, stage

H = W = 48
CX, CY, R = 24.0, 24.0, 12.0
DISC_R, DISC_V = 5, 1000.0
LABELS = ["field_x", "field_y", "magnitude", "divergence", "curl", "idpc"]


def disc_frame(shift_x, shift_y, dtype=np.float32, scale=1.0):
    """The disc centred on (CX + shift_x, CY + shift_y), by splatting."""
    nx, ny = int(np.floor(shift_x)), int(np.floor(shift_y))
    fx, fy = shift_x - nx, shift_y - ny
    y, x = np.mgrid[0:H, 0:W]
    base = ((x - CX) ** 2 + (y - CY) ** 2 <= DISC_R ** 2).astype(np.float64) * DISC_V
    base = np.roll(base, (ny, nx), axis=(0, 1))
    out = np.zeros((H, W))
    out += base * (1 - fx) * (1 - fy)
    out += np.roll(base, 1, axis=1) * fx * (1 - fy)
    out += np.roll(base, 1, axis=0) * (1 - fx) * fy
    out += np.roll(base, (1, 1), axis=(0, 1)) * fx * fy
    out *= scale
    if np.issubdtype(dtype, np.integer):
        return np.rint(out).astype(dtype)
    return out.astype(dtype)


# ---- the independent reference ------------------------------------------------

def com_ref(frame, cx=CX, cy=CY, r=R, ri=0.0):
    h, w = frame.shape
    y, x = np.mgrid[0:h, 0:w]
    d2 = (x - cx) ** 2 + (y - cy) ** 2
    inside = d2 <= r * r
    if ri > 0:
        inside &= d2 > ri * ri
    f = np.where(inside, frame.astype(np.float64), 0.0)
    s = f.sum()
    if s == 0:
        return np.array([np.nan] * 4 + [0.0])
    comx, comy = (f * x).sum() / s, (f * y).sum() / s
    return np.array([comx, comy, comx - cx, comy - cy, s])


def maps_ref(sx, sy, rot_deg=0.0, flip_y=False):
    """LiberTEM: flip, then rotate the (y, x) vector; np.gradient
    divergence and curl over scan (row, column); Fourier iDPC."""
    yp = -sy if flip_y else sy
    t = np.deg2rad(rot_deg)
    fy = np.cos(t) * yp + np.sin(t) * sx
    fx = -np.sin(t) * yp + np.cos(t) * sx
    div = np.gradient(fy, axis=0) + np.gradient(fx, axis=1)
    curl = np.gradient(fy, axis=1) - np.gradient(fx, axis=0)
    ny, nx = sx.shape
    ky = np.fft.fftfreq(ny)[:, None]
    kx = np.fft.fftfreq(nx)[None, :]
    k2 = kx ** 2 + ky ** 2
    k2[0, 0] = 1.0
    good = np.isfinite(fx) & np.isfinite(fy)
    num = kx * np.fft.fft2(np.where(good, fx, 0)) + ky * np.fft.fft2(np.where(good, fy, 0))
    phi_k = num / (2j * np.pi * k2)
    phi_k[0, 0] = 0
    idpc = np.where(good, np.fft.ifft2(phi_k).real, np.nan)
    return np.stack([fx, fy, np.hypot(fx, fy), div, curl, idpc])


# ---- helpers ------------------------------------------------------------------

def _start(tmp_path, ports, zctx, start_beamd, receivers, stages):
    b = start_beamd(make_config(ports, stages, mode="pull"))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    return b, rx, Sender(zctx, ports.ep_input, zmq.PUSH)


def _send(tx, rx, sid, frames, scan_shape, send_ids=None):
    tx.start(sid, (H, W), frames[0].dtype, meta={"detector": "test", "scan_shape": list(scan_shape)})
    for fid in (send_ids if send_ids is not None else range(len(frames))):
        tx.frame(sid, fid, frames[fid])
    tx.end(sid)
    rx.wait_series_end(sid, timeout=20)


def _final_maps(rx, topic, sid):
    rx.wait_for(lambda ms: any(m[0] == topic and m[1].series_id == sid and
                               m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=10, what="final " + topic)
    maps = [m for m in rx.snapshot(topic) if m[1].series_id == sid]
    final = [m for m in maps if m[1].flags & proto.FLAG_FINAL]
    assert len(final) == 1, [m[1].flags for m in maps]
    return final[0], maps


def _per_frame(rx, topic, sid, n):
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == topic and m[1].series_id == sid) >= n,
                timeout=10, what="%d %s" % (n, topic))
    return {m[1].frame_id: m[2] for m in rx.snapshot(topic) if m[1].series_id == sid}


def _close(a, b, atol, rtol, what):
    bad = ~(np.abs(a - b) <= atol + rtol * np.abs(b))
    bad &= ~(np.isnan(a) & np.isnan(b))
    assert not bad.any(), "%s: %d differ, worst at %s: %r vs %r" % (
        what, bad.sum(), np.unravel_index(np.argmax(np.where(bad, np.abs(a - b), 0)), a.shape),
        a[bad][:5], b[bad][:5])


# ---- tests --------------------------------------------------------------------

def test_ramp_divergence_curl_and_rotation(tmp_path, ports, zctx, start_beamd, receivers):
    ny, nx = 8, 10
    iy, ix = np.mgrid[0:ny, 0:nx]
    sx = 0.13 * ix - 0.6   # d/dx = 0.13
    sy = 0.07 * iy - 0.25  # d/dy = 0.07
    frames = [disc_frame(sx.flat[p], sy.flat[p]) for p in range(ny * nx)]
    common = {"kind": "com", "backend": "cpu", "cx": CX, "cy": CY, "r": R, "image_every": 16}
    stages = [dict(common, name="dpc"),
              dict(common, name="rot", scan_rotation=30.0, flip_y=True, ri=1.5)]
    b, rx, tx = _start(tmp_path, ports, zctx, start_beamd, receivers, stages)
    _send(tx, rx, 3, frames, (ny, nx))

    # Per frame: the known shift, and numpy's centre of mass exactly.
    got = _per_frame(rx, "dpc.com", 3, ny * nx)
    assert sorted(got) == list(range(ny * nx))
    for fid, v in got.items():
        assert v.dtype == np.float64 and v.shape == (5,)
        _close(v, com_ref(frames[fid]), 1e-9, 1e-12, "dpc.com frame %d" % fid)
        _close(v[2:4], np.array([sx.flat[fid], sy.flat[fid]]), 1e-5, 0, "known shift %d" % fid)
    rot = _per_frame(rx, "rot.com", 3, ny * nx)
    for fid, v in rot.items():
        _close(v, com_ref(frames[fid], ri=1.5), 1e-9, 1e-12, "rot.com frame %d" % fid)

    # Maps: PARTIAL every 16 frames, then one FINAL (complete: no INCOMPLETE).
    final, maps = _final_maps(rx, "dpc.maps", 3)
    partial = [m for m in maps if m[1].flags & proto.FLAG_PARTIAL]
    assert len(partial) == ny * nx // 16
    assert not final[1].flags & (proto.FLAG_INCOMPLETE | proto.FLAG_ABORTED)
    a = final[2]
    assert a.dtype == np.float32 and a.shape == (6, ny, nx)
    shifts = np.array([got[p][2:4] for p in range(ny * nx)])
    ref = maps_ref(shifts[:, 0].reshape(ny, nx), shifts[:, 1].reshape(ny, nx))
    _close(a, ref, 2e-6, 2e-6, "dpc.maps vs numpy")
    _close(a[3], np.full((ny, nx), 0.20), 1e-4, 0, "divergence of the ramp")
    _close(a[4], np.zeros((ny, nx)), 1e-4, 0, "curl of the ramp")
    first = [m for m in maps if m[3] is not None][0]
    assert first[3]["labels"] == LABELS and first[3]["shape"] == [6, ny, nx]

    # Rotated and flipped: against numpy's LiberTEM transform.
    final, _ = _final_maps(rx, "rot.maps", 3)
    shifts = np.array([rot[p][2:4] for p in range(ny * nx)])
    ref = maps_ref(shifts[:, 0].reshape(ny, nx), shifts[:, 1].reshape(ny, nx), 30.0, True)
    _close(final[2], ref, 2e-6, 2e-6, "rot.maps vs numpy")
    st = b.stats()
    assert stage(st, "dpc")["errors"] == 0 and stage(st, "rot")["errors"] == 0
    tx.close()


def test_idpc_recovers_the_potential(tmp_path, ports, zctx, start_beamd, receivers):
    ny, nx = 16, 15  # one even size (a Nyquist row), one odd
    iy, ix = np.mgrid[0:ny, 0:nx]
    a, b_ = 2 * np.pi * ix / nx, 2 * np.pi * (2 * ix / nx + iy / ny)
    phi = 3.0 * np.sin(a) + 2.0 * np.cos(b_)
    sx = 3.0 * np.cos(a) * 2 * np.pi / nx - 2.0 * np.sin(b_) * 2 * np.pi * 2 / nx
    sy = -2.0 * np.sin(b_) * 2 * np.pi / ny
    assert np.abs(sx).max() < 4 and np.abs(sy).max() < 4
    frames = [disc_frame(sx.flat[p], sy.flat[p]) for p in range(ny * nx)]
    stages = [{"name": "dpc", "kind": "com", "backend": "cpu", "cx": CX, "cy": CY, "r": R}]
    _, rx, tx = _start(tmp_path, ports, zctx, start_beamd, receivers, stages)
    _send(tx, rx, 8, frames, (ny, nx))
    got = _per_frame(rx, "dpc.com", 8, ny * nx)
    final, _ = _final_maps(rx, "dpc.maps", 8)
    shifts = np.array([got[p][2:4] for p in range(ny * nx)])
    ref = maps_ref(shifts[:, 0].reshape(ny, nx), shifts[:, 1].reshape(ny, nx))
    _close(final[2], ref, 2e-6, 2e-6, "maps vs numpy")
    _close(final[2][5], phi - phi.mean(), 1e-4, 0, "iDPC vs the potential")
    _close(ref[5], phi - phi.mean(), 1e-4, 0, "numpy iDPC vs the potential")
    tx.close()


def test_incomplete_scan_and_integer_frames(tmp_path, ports, zctx, start_beamd, receivers):
    ny, nx = 4, 4
    rng = np.random.default_rng(5)
    shifts = rng.uniform(-2, 2, size=(ny * nx, 2))
    frames = [disc_frame(s[0], s[1], np.uint16, 30.0) for s in shifts]
    frames[5] = np.zeros((H, W), np.uint16)  # empty: NaN
    stages = [{"name": "dpc", "kind": "com", "backend": "cpu", "cx": CX, "cy": CY, "r": R}]
    _, rx, tx = _start(tmp_path, ports, zctx, start_beamd, receivers, stages)
    sent = [p for p in range(ny * nx) if p not in (9, 14)]
    _send(tx, rx, 4, frames, (ny, nx), send_ids=sent)
    got = _per_frame(rx, "dpc.com", 4, len(sent))
    for fid in sent:
        # uint16 pixels: the sums are exact integers, the same as numpy's.
        ref = com_ref(frames[fid])
        assert np.array_equal(got[fid], ref, equal_nan=True), (fid, got[fid], ref)
    assert np.isnan(got[5][:4]).all() and got[5][4] == 0
    final, _ = _final_maps(rx, "dpc.maps", 4)
    assert final[1].flags & proto.FLAG_INCOMPLETE, "positions 9 and 14 never came"
    m = final[2]
    assert np.isnan(m[0].flat[9]) and np.isnan(m[0].flat[14]) and np.isnan(m[0].flat[5])
    sx = np.full(ny * nx, np.nan)
    sy = np.full(ny * nx, np.nan)
    for fid in sent:
        sx[fid], sy[fid] = got[fid][2], got[fid][3]
    _close(m, maps_ref(sx.reshape(ny, nx), sy.reshape(ny, nx)), 2e-6, 2e-6, "maps vs numpy")
    tx.close()


def test_simulator_stem_scan(tmp_path, ports, zctx, start_beamd, receivers, run_tool):
    """beamd-sim's stem pattern: the bright-field disc (radius h/8, centred
    on (w/2, h/2)) deflected by (lround(2 cos(2 pi iy/ny)), lround(2 sin(2 pi
    ix/nx))) pixels over a nearly empty background (mean 0.01), the scan
    shape in the series metadata. The centre of mass is that deflection up
    to the few background counts inside the disc: ~5 expected counts at
    <= 14 pixels against a disc of >= 788, so well under 0.25 pixels (the
    simulator is seeded; the bound is what the physics allows, not a fit)."""
    h = w = 64
    n = 64  # an 8 x 8 raster
    stages = [{"name": "dpc", "kind": "com", "backend": "cpu", "cx": w / 2, "cy": h / 2,
               "r": h / 8 + 4, "image_every": 32}]
    start_beamd(make_config(ports, stages, mode="pull"))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    sim = run_tool("beamd-sim", ["--socket", "push", "--bind", ports.ep_input, "--shape",
                                 "%dx%d" % (h, w), "--dtype", "uint16", "--pattern", "stem",
                                 "--mean", "0.01", "--frames", str(n), "--series", "1",
                                 "--series-id", "5", "--quiet"])
    assert sim.wait(30) == 0, sim.stderr()
    rx.wait_series_end(5, timeout=15)
    got = _per_frame(rx, "dpc.com", 5, n)
    ny = nx = 8

    def lround(v):
        return np.sign(v) * np.floor(np.abs(v) + 0.5)

    for fid, v in got.items():
        iy, ix = divmod(fid % (ny * nx), nx)
        want = (lround(2 * np.cos(2 * np.pi * iy / ny)), lround(2 * np.sin(2 * np.pi * ix / nx)))
        _close(v[2:4], np.array(want), 0.25, 0, "frame %d shift" % fid)
    final, maps = _final_maps(rx, "dpc.maps", 5)
    assert final[2].shape == (6, ny, nx)  # the scan shape came from the metadata
    assert len([m for m in maps if m[1].flags & proto.FLAG_PARTIAL]) == n // 32
    shifts = np.array([got[p][2:4] for p in range(ny * nx)])
    ref = maps_ref(shifts[:, 0].reshape(ny, nx), shifts[:, 1].reshape(ny, nx))
    _close(final[2], ref, 2e-6, 2e-6, "maps vs numpy")
