"""End-to-end physics check of xpcs_multitau: beamd-sim --pattern xpcs
(speckle with a known relaxation rate per ring, docs/tools.md) pushes
frames into beamd (pull mode) running xpcs_multitau on the sim's own
label file; the final g2 of every ring is fitted and the rate Gamma and
contrast beta compared with the ground truth of the SERIES_START metadata
(read from a 1-frame run of the sim with the same arguments: the truth
depends on the arguments only, and the daemon is the only consumer of the
real run).

Model fitted. For the counts, g2(k) - 1 = beta exp(-2 Gamma k dt) for k >= 1
(lag 0 carries the shot noise 1/mean and is left out, as the sim's
documentation says). Multi-tau level L correlates means of b = 2^L frames,
which for lags of i >= 1 blocks multiplies that by the exact factor
K(b) = (1 - r^b)(1 - r^-b) / (b^2 (1 - r)(1 - r^-1)), r = exp(-2 Gamma dt)
(K(1) = 1): fitting the bare exponential to the higher levels would bias
Gamma by a few per cent, the block factor removes that bias. Fitted lags:
g2 - 1 above beta e^-3 (about 1.5 decay times), least squares with beta
solved in closed form for each Gamma.

Tolerances. The statistical error of g2 at a lag is about
sqrt(c / (npix * N / n_corr)) with n_corr = 1/(2 Gamma dt) frames the
correlation time and c ~ 3 for beta = 1 exponential speckle: here
(128x128, 4 rings of 800..5600 pixels, 10000 frames, Gamma 4..40/s at
1 ms) that is 0.3 .. 0.9 % of g2 - 1 per lag, worst for the small, slow
inner ring; the lags are strongly correlated, so the fitted Gamma is
good to about 2 % there (seen: 3.6 % with 6000 frames, scaling as
1/sqrt(N)) and under 1 % on the outer rings. Bounds: 8 % on Gamma and
0.06 on beta (beta = 1), about three standard errors of the worst ring,
with the seed fixed so the test is deterministic. Also checked: the fit is not trivially loose (the
truth of the neighbouring ring, a factor 2.15 away, is rejected) and the
lag-0 value shows the shot-noise term 1/mean within 0.05.
Run time about 12 s.
"""
import subprocess

import numpy as np
import zmq

from conftest import Receiver, binary, free_ports, make_config, proto

SHAPE = (128, 128)
RINGS, MEAN, FT, NFRAMES = 4, 20, 0.001, 10000
RATE_MIN, RATE_MAX = 4.0, 40.0
LEVELS, NB = 10, 8


def sim_args(nframes, label_file):
    return ["--pattern", "xpcs", "--shape", "%dx%d" % SHAPE, "--frames", str(nframes),
            "--mean", str(MEAN), "--xpcs-rings", str(RINGS), "--xpcs-rate-min", str(RATE_MIN),
            "--xpcs-rate-max", str(RATE_MAX), "--xpcs-modes", "1", "--frame-time", str(FT),
            "--seed", "11", "--dtype", "uint16", "--label-file", str(label_file)]


def truth(zctx, port, label_file):
    """SERIES_START metadata of the sim with these arguments."""
    pull = zctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVTIMEO, 10000)
    pull.connect("tcp://127.0.0.1:%d" % port)
    sim = subprocess.Popen([binary("beamd-sim"), "--bind", "tcp://127.0.0.1:%d" % port,
                            "--socket", "push", "--quiet"] + sim_args(1, label_file))
    meta = None
    try:
        # drain to SERIES_END: the sim's PUSH blocks on undelivered messages
        while True:
            _, h, _, md = proto.decode_message(pull.recv_multipart())
            if h.type == proto.SERIES_START:
                meta = md["xpcs"]
            elif h.type == proto.SERIES_END:
                return meta
    finally:
        pull.close(0)
        sim.wait(timeout=10)


def lag_steps(levels, nb):
    lags = list(range(nb))
    for lev in range(1, levels):
        lags += [(nb // 2 + j) * 2 ** lev for j in range(nb // 2)]
    return np.array(lags)


def block_factor(rate, block):
    r = np.exp(-2 * rate * FT)
    b = block.astype(np.float64)
    return np.where(b == 1, 1.0, (1 - r ** b) * (1 - r ** -b) / (b * b * (1 - r) * (1 - 1 / r)))


def fit(lag_frames, block, y):
    """Least-squares (Gamma, beta) of y = beta exp(-2 Gamma tau) K(block)."""
    tau = lag_frames * FT

    def resid(g):
        m = np.exp(-2 * g * tau) * block_factor(g, block)
        beta = np.dot(m, y) / np.dot(m, m)
        return np.sum((y - beta * m) ** 2), beta

    grid = np.exp(np.linspace(np.log(0.1), np.log(1000), 2000))
    k = int(np.argmin([resid(g)[0] for g in grid]))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    for _ in range(80):  # golden section on the bracket
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        if resid(a)[0] < resid(b)[0]:
            hi = b
        else:
            lo = a
    g = 0.5 * (lo + hi)
    return g, resid(g)[1]


def test_multitau_recovers_sim_rates(tmp_path, ports, zctx, start_beamd, receivers):
    lab_file = tmp_path / "labels.npy"
    t = truth(zctx, free_ports(1)[0], lab_file)
    assert len(t["rings"]) == RINGS and t["beta"] == 1.0
    st = {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu", "rois": {"file": str(lab_file)},
          "levels": LEVELS, "buffers": NB, "publish_every": 0}
    start_beamd(make_config(ports, [st], mode="pull", pool_frames=64))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    sim = subprocess.Popen([binary("beamd-sim"), "--bind", ports.ep_input, "--socket", "push",
                            "--quiet"] + sim_args(NFRAMES, lab_file))
    try:
        # lags is published last of info, g2, lags
        rx.wait_for(lambda ms: any(m[0] == "mt.lags" and m[1].flags & proto.FLAG_FINAL for m in ms),
                    timeout=45, what="final mt.lags")
        assert sim.wait(timeout=10) == 0
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
    res = {m[0]: m for m in rx.snapshot() if m[0].startswith("mt.") and m[1].flags & proto.FLAG_FINAL}
    info = res["mt.info"][2]
    assert info[0] == NFRAMES and info[1] == 0
    g2 = res["mt.g2"][2]
    metas = {m[0]: m[3] for m in rx.snapshot() if m[0].startswith("mt.") and m[3]}
    assert metas["mt.g2"]["labels"] == [r["label"] for r in t["rings"]]
    rows = g2.shape[0]
    lags = lag_steps(LEVELS, NB)[:rows]
    np.testing.assert_allclose(res["mt.lags"][2], lags * FT, rtol=1e-12)
    block = np.array([1] * NB + [2 ** lev for lev in range(1, LEVELS) for _ in range(NB // 2)])[:rows]
    fits = []
    for r, ring in enumerate(t["rings"]):
        y = g2[1:, r] - 1
        use = y > t["beta"] * np.exp(-3)
        assert use.sum() >= 8, (ring, use.sum())
        gam, beta = fit(lags[1:][use], block[1:][use], y[use])
        fits.append((ring["rate"], gam, beta))
        assert abs(gam / ring["rate"] - 1) <= 0.08, fits
        assert abs(beta - t["beta"]) <= 0.06, fits
        # lag 0: beta + shot noise 1/mean
        assert abs(g2[0, r] - 1 - (t["beta"] + 1.0 / MEAN)) <= 0.05, (r, g2[0, r])
        if r > 0:  # neighbouring truths are rejected: the bound is not trivially loose
            assert abs(gam / t["rings"][r - 1]["rate"] - 1) > 0.08
    print("rate truth/fit/beta:", fits)
