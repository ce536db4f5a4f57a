"""beamd-sim --pattern xpcs checked against its own ground truth.

The simulator promises (docs/tools.md) that in ring r of the label image
the intensity has g2(k) - 1 = beta * exp(-2 * rate_r * k * frame_time),
with beta = 1 / --xpcs-modes, and that the counts are Poisson samples of
it, so for counts the same holds at lags k >= 1 and g2(0) - 1 = beta +
1/mean. The metadata carries rate_r, beta, the ring edges and the centre.
These tests receive the frames over PUSH/PULL, decode them with the Python
twin of proto/ (not with beamd), estimate g2 per ring with a direct time
average written here, and compare with the metadata.

Estimator and tolerances. g2(k) = <n_t n_{t+k}> / <n>^2 over all pixels of
a ring and all t, for k = 1..K_r where the expected g2 - 1 is still above
0.15 * beta; rate and beta come from a least-squares line through
ln(g2(k) - 1). Statistical error: a ring of P pixels over T frames holds
about P * T * 2 rate dt independent intensity samples per lag (one per
correlation time); with 128x128 frames, 4 rings, T = 2000, dt = 1 ms and
rates 20..200 1/s the worst ring (ring 1: 812 pixels, rate 20) has about
6.5e4, so each g2(k) is known to about 1 %, and the fitted rate, whose
lags are strongly correlated, to about 1.5-2 % (seen over seeds 1-3: at
most 3.4 %). The bounds below (8 % on the rate, 0.05 on beta, 0.03 on
g2(0) - 1) are 4-5 standard errors, and still far tighter than the
factor 2.15 between neighbouring ring rates or the factor 2 of a g1/g2
mix-up. Dense data (--mean 20) keeps shot noise out of the way.
Binaries come from $BEAMD_BUILD (default build/); every step is bounded.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "python"))
from conftest import free_ports  # noqa: E402
from beamd import proto  # noqa: E402  (the Python twin of proto/, an independent decoder)

BUILD = os.environ.get("BEAMD_BUILD", "build")
SIM = os.path.join(BUILD, "beamd-sim")

SHAPE = (128, 128)
NFRAMES = 2000
RINGS = 4
RATE_MIN, RATE_MAX = 20.0, 200.0
FRAME_TIME = 0.001
MEAN = 20.0
RATE_RTOL = 0.08
BETA_ATOL = 0.05
G2_0_ATOL = 0.03


@pytest.fixture(autouse=True)
def _binary():
    if not os.access(SIM, os.X_OK):
        pytest.fail(f"{SIM} not built (make BUILD={BUILD} {SIM})")



def receive(args, timeout_ms=20000):
    """Runs beamd-sim on PUSH into a PULL here; returns (metadata, frames
    (N, H, W), series ids, simulator stderr)."""
    port = free_ports(1)[0]
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVTIMEO, timeout_ms)
    pull.connect(f"tcp://127.0.0.1:{port}")
    meta, frames, sids, ends, sim = None, [], [], 0, None
    nseries = int(args[args.index("--series") + 1]) if "--series" in args else 1
    try:
        sim = subprocess.Popen([SIM, "--bind", f"tcp://127.0.0.1:{port}", "--socket", "push",
                                "--quiet"] + args, stderr=subprocess.PIPE, text=True)
        while ends < nseries:
            _, h, a, md = proto.decode_message(pull.recv_multipart())
            if h.type == proto.SERIES_START:
                meta = md
            elif h.type == proto.FRAME:
                frames.append(a)
                sids.append(h.series_id)
            elif h.type == proto.SERIES_END:
                ends += 1
        _, err = sim.communicate(timeout=15)
        assert sim.returncode == 0, err
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
            sim.wait()
        pull.close(0)
        ctx.term()
    return meta, np.array(frames), sids, err


def xpcs_args(modes, seed, label_file=None):
    a = ["--pattern", "xpcs", "--shape", f"{SHAPE[0]}x{SHAPE[1]}", "--frames", str(NFRAMES),
         "--mean", str(MEAN), "--xpcs-rings", str(RINGS), "--xpcs-rate-min", str(RATE_MIN),
         "--xpcs-rate-max", str(RATE_MAX), "--xpcs-modes", str(modes),
         "--frame-time", str(FRAME_TIME), "--seed", str(seed)]
    if label_file:
        a += ["--label-file", str(label_file)]
    return a


def expected_labels(x, shape):
    """The label rule of docs/tools.md, from the metadata alone."""
    cy, cx = x["center"]
    y, xx = np.mgrid[0:shape[0], 0:shape[1]].astype(np.float64)
    d = np.sqrt((xx - cx) * (xx - cx) + (y - cy) * (y - cy))
    lab = np.zeros(shape, np.uint16)
    for r, ring in enumerate(x["rings"]):
        lab[(d >= ring["r_in"]) & (d < ring["r_out"])] = r + 1
    return lab


def fit_ring(counts, rate, dt):
    """counts (T, P) float64 -> (fitted rate, fitted beta, g2(0) - 1, mean)."""
    m = counts.mean()
    kmax = int(np.ceil(-np.log(0.15) / (2.0 * rate * dt)))
    ks = np.arange(1, kmax + 1)
    g2 = np.array([(counts[:-k] * counts[k:]).mean() for k in ks]) / (m * m)
    assert np.all(g2 > 1.0), g2  # a log of a non-positive number would hide a failure
    slope, icpt = np.polyfit(ks.astype(np.float64), np.log(g2 - 1.0), 1)
    g20 = (counts * counts).mean() / (m * m) - 1.0
    return -slope / (2.0 * dt), float(np.exp(icpt)), g20, m


@pytest.mark.parametrize("modes,seed", [(1, 1), (2, 5)])
def test_g2_per_ring_matches_truth(tmp_path, modes, seed):
    lab_path = tmp_path / "labels.npy"
    meta, frames, _, _ = receive(xpcs_args(modes, seed, lab_path))
    assert frames.shape == (NFRAMES,) + SHAPE and frames.dtype == np.uint16
    assert meta["pattern"] == "xpcs" and meta["frame_time"] == pytest.approx(FRAME_TIME)
    x = meta["xpcs"]
    assert x["beta"] == pytest.approx(1.0 / modes) and x["modes"] == modes
    assert x["frame_time"] == pytest.approx(FRAME_TIME)
    assert len(x["rings"]) == RINGS
    # Truth: log-spaced rates, innermost slowest; ring edges equal-width up
    # to the inscribed circle.
    want_rates = RATE_MIN * (RATE_MAX / RATE_MIN) ** (np.arange(RINGS) / (RINGS - 1))
    np.testing.assert_allclose([r["rate"] for r in x["rings"]], want_rates, rtol=1e-4)
    assert x["rings"][-1]["r_out"] == pytest.approx(min(SHAPE) / 2.0)

    lab = np.load(lab_path)
    assert lab.dtype == np.uint16 and lab.shape == SHAPE
    np.testing.assert_array_equal(lab, expected_labels(x, SHAPE))
    assert [int((lab == r + 1).sum()) for r in range(RINGS)] == [r["npix"] for r in x["rings"]]

    flat = frames.reshape(NFRAMES, -1)
    assert not flat[:, lab.ravel() == 0].any(), "pixels outside the rings must stay 0"
    for r, ring in enumerate(x["rings"]):
        counts = flat[:, lab.ravel() == r + 1].astype(np.float64)
        rate, beta, g20, m = fit_ring(counts, ring["rate"], x["frame_time"])
        what = f"ring {r + 1} ({counts.shape[1]} px, modes {modes})"
        assert abs(m - MEAN) <= 0.05 * MEAN, f"{what}: mean {m}"
        assert abs(rate - ring["rate"]) <= RATE_RTOL * ring["rate"], \
            f"{what}: fitted rate {rate:.3f}, truth {ring['rate']:.3f}"
        assert abs(beta - x["beta"]) <= BETA_ATOL, f"{what}: fitted beta {beta:.4f}"
        assert abs(g20 - (x["beta"] + 1.0 / m)) <= G2_0_ATOL, \
            f"{what}: g2(0) - 1 = {g20:.4f}, expected beta + 1/mean"


def small_args(seed, extra=()):
    return ["--pattern", "xpcs", "--shape", "48x40", "--frames", "25", "--mean", "0.05",
            "--xpcs-rings", "3", "--seed", str(seed), "--dtype", "uint32"] + list(extra)


def test_seed_reproducible_and_series_distinct():
    meta1, a, _, _ = receive(small_args(7))
    _, b, _, _ = receive(small_args(7))
    _, c, _, _ = receive(small_args(8))
    assert a.dtype == np.uint32 and a.shape == (25, 48, 40)
    assert a.sum() > 0  # sparse (mean 0.05) still has photons
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert json.dumps(meta1["xpcs"], sort_keys=True)  # serialisable ground truth
    # A second series restarts the process with its own stream: a new movie,
    # while the first series is unchanged by adding it.
    _, two, sids, _ = receive(small_args(7, ["--series", "2"]))
    s1 = two[[i for i, s in enumerate(sids) if s == 1]]
    s2 = two[[i for i, s in enumerate(sids) if s == 2]]
    np.testing.assert_array_equal(s1, a)
    assert s2.shape == s1.shape and not np.array_equal(s1, s2)


def test_xpcs_bad_options(tmp_path):
    def rc_of(args):
        p = subprocess.run([SIM, "--bind", f"tcp://127.0.0.1:{free_ports(1)[0]}",
                            "--wait-subscribers", "0", "--frames", "2", "--quiet"] + args,
                           capture_output=True, text=True, timeout=10)
        return p.returncode, p.stderr
    for args, msg in [
            (["--xpcs-rings", "4"], "applies to --pattern xpcs only"),
            (["--label-file", str(tmp_path / "l.npy")], "applies to --pattern xpcs only"),
            (["--pattern", "xpcs", "--shape", "9x7", "--xpcs-rings", "4"], "thinner than one pixel"),
            (["--pattern", "xpcs", "--xpcs-rate-min", "10", "--xpcs-rate-max", "5"], "above"),
            (["--pattern", "xpcs", "--xpcs-modes", "0"], "xpcs-modes"),
            (["--pattern", "xpcs", "--xpcs-rate-min", "1e-5"], "cannot resolve")]:
        rc, err = rc_of(args)
        assert rc == 2 and msg in err, (args, rc, err)
    rc, err = rc_of(["--pattern", "xpcs", "--label-file", str(tmp_path / "no" / "l.npy")])
    assert rc == 1 and "label file" in err, err
