"""beamd-sim --pattern pca checked against its own ground truth, and
beamd-pca-rebuild checked on a file in the beamd-record layout and end to
end (simulator -> beamd pca stage -> beamd-record -> rebuild).

The simulator promises (docs/tools.md) frames lambda = mean_image +
sum_i c_i B_i with c_i ~ N(0, strengths[i]^2) and B the orthonormal basis
it writes with --pca-basis-file, plus noise, spikes, outlier blobs on the
frames listed in the metadata and, with --pca-drift-at, the rotated basis
from that frame on. The frames are received over PUSH/PULL and decoded
with the Python twin of proto/ (not with beamd).

Tolerances. 64x64 frames (P = 4096), mean level 1000 (Poisson variance
about 1000 per pixel), strengths 2000, 1500, 1000 (eigenvalues 4e6 ..
1e6), N = 400 frames per subspace: for a spiked covariance the angle
between a sample and a true direction is about
sqrt(sigma^2 / l * P / N) = sqrt(1000 / 1e6 * 10) = 0.1 rad (5.7 deg) for
the weakest one (less for the others), so the largest principal angle
must be below 10 deg, where a wrong basis (a transposed image, a
different DCT order, the pre-drift basis) is at 60-90 deg. The sample
variance along B_i is strengths[i]^2 (1 + O(sqrt(2 / N) = 7 %)) plus the
noise variance 1000: checked to 25 %. The peak pixel deviation (three
sigma, twice the RMS of a DCT image) stays below the mean image's 750
floor, so no pixel is clipped at 0 and the model is exactly linear.
Binaries come from $BEAMD_BUILD (default build/); every step is bounded.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "python"))
from conftest import free_ports  # noqa: E402
from beamd import proto  # noqa: E402  (the Python twin of proto/, an independent decoder)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BUILD = os.environ.get("BEAMD_BUILD", "build")
SIM = os.path.join(BUILD, "beamd-sim")
REBUILD = os.path.join(ROOT, "tools", "beamd-pca-rebuild")

H = W = 64
MEAN = 1000.0
STRENGTHS = (2000.0, 1500.0, 1000.0)
MAX_ANGLE_DEG = 10.0
VAR_RTOL = 0.25


@pytest.fixture(autouse=True)
def _binary():
    if not os.access(SIM, os.X_OK):
        pytest.fail(f"{SIM} not built (make BUILD={BUILD} {SIM})")



def receive(args, timeout_ms=20000):
    """Runs beamd-sim on PUSH into a PULL here; returns (metadata, frames (N, H, W),
    frame ids)."""
    port = free_ports(1)[0]
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVTIMEO, timeout_ms)
    pull.connect(f"tcp://127.0.0.1:{port}")
    meta, frames, fids, sim = None, [], [], None
    try:
        sim = subprocess.Popen([SIM, "--bind", f"tcp://127.0.0.1:{port}", "--socket", "push",
                                "--quiet"] + args, stderr=subprocess.PIPE, text=True)
        while True:
            _, h, a, md = proto.decode_message(pull.recv_multipart())
            if h.type == proto.SERIES_START:
                meta = md
            elif h.type == proto.FRAME:
                frames.append(a)
                fids.append(h.frame_id)
            elif h.type == proto.SERIES_END:
                break
        _, err = sim.communicate(timeout=15)
        assert sim.returncode == 0, err
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
            sim.wait()
        pull.close(0)
        ctx.term()
    return meta, np.array(frames), np.array(fids)


def pca_args(frames, seed, *extra):
    return ["--pattern", "pca", "--shape", f"{H}x{W}", "--frames", str(frames),
            "--mean", str(MEAN), "--pca-strengths", ",".join(str(s) for s in STRENGTHS),
            "--seed", str(seed)] + list(extra)


def principal_angles_deg(a, b):
    """Principal angles between the row spaces of a (k, P) and b (k, P)."""
    qa, _ = np.linalg.qr(a.reshape(a.shape[0], -1).T.astype(np.float64))
    qb, _ = np.linalg.qr(b.reshape(b.shape[0], -1).T.astype(np.float64))
    s = np.clip(np.linalg.svd(qa.T @ qb, compute_uv=False), -1.0, 1.0)
    return np.degrees(np.arccos(s))


def top_subspace(frames, k):
    x = frames.reshape(len(frames), -1).astype(np.float64)
    x -= x.mean(axis=0)
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    return vt[:k], s


def mean_image(meta_mean):
    cy, cx = (H - 1) / 2.0, (W - 1) / 2.0
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    ms = min(H, W) / 4.0
    return meta_mean * (0.75 + 0.5 * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * ms * ms)))


def test_subspace_outliers_and_mean(tmp_path):
    bfile = tmp_path / "basis.npy"
    meta, frames, fids = receive(pca_args(400, 3, "--pca-outliers", "4",
                                          "--pca-basis-file", str(bfile)))
    p = meta["pca"]
    k = len(STRENGTHS)
    assert p["k"] == k and np.allclose(p["strengths"], STRENGTHS)
    assert p["drift_at"] is None and p["noise"] == "poisson"
    assert p["basis_file"] == str(bfile)
    assert list(fids) == list(range(400)) and frames.dtype == np.uint16
    basis = np.load(bfile)
    assert basis.shape == (k, H, W) and basis.dtype == np.float32
    gram = basis.reshape(k, -1).astype(np.float64) @ basis.reshape(k, -1).T
    assert np.abs(gram - np.eye(k)).max() < 1e-5

    out = p["outlier_frames"]
    assert len(out) == 4 and len(set(out)) == 4 and all(0 <= o < 400 for o in out)
    # Residual against the true model: the outliers' blobs stick out of it.
    x = frames.reshape(len(frames), -1).astype(np.float64) - mean_image(MEAN).ravel()
    b = basis.reshape(k, -1).astype(np.float64)
    resid = np.linalg.norm(x - (x @ b.T) @ b, axis=1)
    assert sorted(np.argsort(resid)[-4:].tolist()) == sorted(out)
    clean = np.delete(frames, out, axis=0)
    assert np.max(np.sort(resid)[:-4]) * 3 < np.min(resid[out])

    v, s = top_subspace(clean, k)
    ang = principal_angles_deg(v, basis)
    assert ang.max() < MAX_ANGLE_DEG, ang
    # Variance along each true direction: strength^2 + the Poisson noise.
    xc = clean.reshape(len(clean), -1).astype(np.float64)
    var = ((xc - xc.mean(axis=0)) @ b.T).var(axis=0)
    want = np.array(STRENGTHS) ** 2 + MEAN
    assert np.all(np.abs(var / want - 1) < VAR_RTOL), (var, want)
    # The mean frame of the metadata's formula; sampling error about
    # sqrt((1000 + 31^2 + 23^2 + 16^2) / 396) = 2.4 counts.
    assert np.abs(clean.mean(axis=0) - mean_image(MEAN)).max() < 15.0


def test_drift_changes_the_subspace(tmp_path):
    bfile = tmp_path / "basis.npy"
    meta, frames, _ = receive(pca_args(800, 5, "--pca-drift-at", "400", "--pca-drift-angle",
                                       "60", "--pca-basis-file", str(bfile)))
    p = meta["pca"]
    assert p["drift_at"] == 400 and p["drift_angle_deg"] == 60.0
    basis = np.load(bfile)
    k = len(STRENGTHS)
    assert basis.shape == (2, k, H, W)
    # The promise: every principal angle between the two bases is the angle.
    assert np.allclose(principal_angles_deg(basis[0], basis[1]), 60.0, atol=0.01)
    before, _ = top_subspace(frames[:400], k)
    after, _ = top_subspace(frames[400:], k)
    assert principal_angles_deg(before, basis[0]).max() < MAX_ANGLE_DEG
    assert principal_angles_deg(after, basis[1]).max() < MAX_ANGLE_DEG
    assert principal_angles_deg(after, basis[0]).min() > 60.0 - MAX_ANGLE_DEG


def test_noise_free_frames_have_rank_k(tmp_path):
    """float32 with gaussian:0: frames are exactly mean + sum c_i B_i."""
    bfile = tmp_path / "basis.npy"
    meta, frames, _ = receive(pca_args(60, 7, "--dtype", "float32", "--pca-noise",
                                       "gaussian:0", "--pca-basis-file", str(bfile)))
    assert meta["pca"]["noise"] == "gaussian" and meta["pca"]["noise_sigma"] == 0.0
    k = len(STRENGTHS)
    _, s = top_subspace(frames, k + 1)
    assert s[k] < 1e-4 * s[0], s[:k + 1]
    basis = np.load(bfile).reshape(k, -1).astype(np.float64)
    x = frames.reshape(len(frames), -1).astype(np.float64) - mean_image(MEAN).ravel()
    assert np.abs(x - (x @ basis.T) @ basis).max() < 0.05


def test_seed_reproducible_and_spikes():
    args = pca_args(40, 11, "--pca-spikes", "0.001", "--pca-outliers", "2")
    m1, f1, _ = receive(args)
    m2, f2, _ = receive(args)
    m3, f3, _ = receive(pca_args(40, 12, "--pca-spikes", "0.001", "--pca-outliers", "2"))
    assert m1 == m2 and np.array_equal(f1, f2)
    assert not np.array_equal(f1, f3)
    # round(0.001 * 4096) = 4 spikes of 50 x mean per frame, far above any
    # other pixel (below 1.25 * mean + 3 sigma of the components + blob 10 x mean).
    assert m1["pca"]["spikes_per_frame"] == 4 and m1["pca"]["spike_height"] == 50 * MEAN
    hot = (f1 > 30 * MEAN).reshape(len(f1), -1).sum(axis=1)
    assert hot.max() <= 4 and hot.mean() > 3.8  # two spikes may share a pixel


@pytest.mark.parametrize("args,why", [
    (["--pca-strengths", "1,x"], "pca-strengths"),
    (["--pca-strengths", ",".join(["1"] * 33)], "at most 32"),
    (["--pca-noise", "gauss"], "poisson or gaussian"),
    (["--pca-outliers", "600", "--frames", "1000"], "at most half"),
    (["--pca-drift-angle", "91"], "pca-drift-angle"),
    (["--shape", "2x2", "--pca-drift-at", "5"], "do not fit"),
    (["--pca-drift-angle", "30"], "needs --pca-drift-at"),
])
def test_bad_options(args, why):
    r = subprocess.run([SIM, "--pattern", "pca"] + args, capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 2 and why in r.stderr, r.stderr


def test_pca_option_needs_pattern():
    r = subprocess.run([SIM, "--pca-spikes", "0.1"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "--pattern pca only" in r.stderr


# ---- beamd-pca-rebuild ------------------------------------------------------

def write_record(path, fids, scores, comps, means, comp_fids, comp_flags, stage="p"):
    """A file in beamd-record's layout (docs/recording.md), every mode."""
    import h5py
    with h5py.File(path, "w") as f:
        f.create_group("entry").attrs["writer"] = "beamd-record"
        s = f.create_group("series")
        s.attrs["frame_dtype"] = "uint16"
        s.attrs["frame_shape"] = np.array([comps.shape[2], comps.shape[3]], np.uint64)
        r = f.create_group("results")
        g = r.create_group(f"{stage}.scores")
        g.attrs["mode"] = "every"
        g["data"] = scores.astype(np.float32)
        g["frame_id"] = np.asarray(fids, np.uint64)
        g["flags"] = np.zeros(len(fids), np.uint32)
        for name, d in (("components", comps), ("mean", means)):
            g = r.create_group(f"{stage}.{name}")
            g.attrs["mode"] = "every"
            g["data"] = d.astype(np.float32)
            g["frame_id"] = np.asarray(comp_fids, np.uint64)
            g["flags"] = np.asarray(comp_flags, np.uint32)
        # An unrelated topic the stage search must not pick.
        g = r.create_group("other.sums")
        g["data"] = np.zeros((3, 1), np.float32)
        g["frame_id"] = np.arange(3, dtype=np.uint64)


def run_rebuild(*args):
    return subprocess.run([REBUILD] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=30)


@pytest.fixture
def record(tmp_path):
    rng = np.random.default_rng(0)
    k, h, w, n = 4, 12, 10, 50
    fids = np.arange(16, 16 + n)[::-1]  # arrival order need not be frame order
    scores = rng.normal(size=(n, k)).astype(np.float32)
    comps = rng.normal(size=(2, k, h, w)).astype(np.float32)
    means = rng.normal(size=(2, h, w)).astype(np.float32)
    path = tmp_path / "rec.h5"
    write_record(path, fids, scores, comps, means, [31, 65], [1 << 3, 1 << 4])
    return path, fids, scores, comps, means


def expected(scores, comps, means, row, sel):
    k = comps.shape[1]
    e = means[row].reshape(1, -1).astype(np.float64) + \
        scores[sel].astype(np.float64) @ comps[row].reshape(k, -1)
    return e.reshape((len(sel),) + means.shape[1:])


def test_rebuild_npy_final_model(record, tmp_path):
    path, fids, scores, comps, means = record
    out = tmp_path / "out.npy"
    r = run_rebuild(path, "-o", out, "--first", 20, "--last", 29)
    assert r.returncode == 0, r.stderr
    got = np.load(out)
    got_ids = np.load(tmp_path / "out.frame_id.npy")
    assert list(got_ids) == list(range(20, 30))
    sel = [int(np.nonzero(fids == i)[0][0]) for i in range(20, 30)]
    assert got.shape == (10, 12, 10) and got.dtype == np.float32
    assert np.abs(got - expected(scores, comps, means, 1, sel)).max() < 1e-4
    assert "compression" in r.stderr and "FINAL" in r.stderr


def test_rebuild_h5_partial_row(record, tmp_path):
    import h5py
    path, fids, scores, comps, means = record
    out = tmp_path / "out.h5"
    r = run_rebuild(path, "-o", out, "--model", "row:0", "--quiet")
    assert r.returncode == 0, r.stderr
    with h5py.File(out, "r") as f:
        got, got_ids = f["data"][()], f["frame_id"][()]
    order = np.argsort(fids)
    assert list(got_ids) == sorted(fids.tolist())
    assert np.abs(got - expected(scores, comps, means, 0, order)).max() < 1e-4
    # The two models give different frames: the row really was used.
    assert np.abs(got - expected(scores, comps, means, 1, order)).max() > 0.1


def test_rebuild_bad_input(record, tmp_path):
    path = record[0]
    r = run_rebuild(path, "-o", tmp_path / "o.npy", "--first", 1000)
    assert r.returncode == 1 and "no scores" in r.stderr
    r = run_rebuild(path, "-o", tmp_path / "o.npy", "--stage", "nope")
    assert r.returncode == 1 and "no /results/nope.scores" in r.stderr
    r = run_rebuild(path, "-o", tmp_path / "o.npy", "--model", "row:7")
    assert r.returncode == 1 and "2 rows" in r.stderr
    r = run_rebuild(path, "-o", tmp_path / "o.txt")
    assert r.returncode == 2
    r = run_rebuild(tmp_path / "missing.h5", "-o", tmp_path / "o.npy")
    assert r.returncode == 1 and "missing.h5" in r.stderr


# ---- end to end: beamd-sim -> beamd pca -> beamd-record -> rebuild -----------

E2E_B = 16
E2E_N = 160


def test_end_to_end_rebuild(tmp_path, procs, ports, start_beamd):
    """Noise-free float32 rank-3 frames from the simulator through a pca
    stage, recorded with beamd-record and rebuilt: frames of batch j were
    scored by the model published at the end of batch j - 1
    (publish_every = batch), so rebuilding each batch with that model row
    must give the sent frames back to float32 rounding. Frames of the first
    batch get no scores (docs/pca.md)."""
    import h5py
    from conftest import Proc, binary, make_config
    st = {"name": "pc", "kind": "pca", "backend": "cpu", "components": 3, "batch": E2E_B,
          "publish_every": E2E_B, "denoised_rate": 0}
    start_beamd(make_config(ports, [st], mode="pull", push=True, pool_frames=64))
    out = tmp_path / "rec"
    out.mkdir()
    rec = Proc("beamd-record", [binary("beamd-record"), "--pull", "--connect", ports.ep_push,
                                "--dir", str(out), "--series", "1", "--timeout", "30"],
               tmp_path, procs)
    sim = Proc("beamd-sim", [SIM, "--bind", ports.ep_input, "--socket", "push", "--quiet",
                             "--series-id", "5"] +
               pca_args(E2E_N, 9, "--dtype", "float32", "--pca-noise", "gaussian:0"),
               tmp_path, procs)
    assert sim.wait(30) == 0, sim.stderr()
    assert rec.wait(30) == 0, rec.stderr()
    files = sorted(out.glob("*.h5"))
    assert len(files) == 1, os.listdir(out)
    with h5py.File(files[0], "r") as f:
        cfid = f["results/pc.components/frame_id"][()]
        sfid = np.sort(f["results/pc.scores/frame_id"][()])
    assert list(sfid) == list(range(E2E_B, E2E_N))
    # The same frames again, straight from the simulator (same seed, first
    # series of the run).
    _, sent, _ = receive(pca_args(E2E_N, 9, "--dtype", "float32", "--pca-noise", "gaussian:0"))
    scale = np.abs(sent).max()
    for j in range(1, E2E_N // E2E_B):
        row = int(np.nonzero(cfid == E2E_B * j - 1)[0][0])
        o = tmp_path / f"b{j}.npy"
        r = run_rebuild(files[0], "-o", o, "--first", E2E_B * j, "--last", E2E_B * j + E2E_B - 1,
                        "--model", f"row:{row}", "--quiet")
        assert r.returncode == 0, r.stderr
        got = np.load(o)
        want = sent[E2E_B * j:E2E_B * (j + 1)]
        err = np.abs(got - want).max()
        # Measured 4e-4 on a scale of 1300 (float32 rounding); the row of
        # a neighbouring batch misses by whole counts.
        assert err < 1e-5 * scale, (j, err, scale)
    # The FINAL model is another model: frames scored by early ones do not
    # come back exactly, which is what docs/pca.md warns about.
    r = run_rebuild(files[0], "-o", tmp_path / "fin.npy", "--first", E2E_B,
                    "--last", 2 * E2E_B - 1)
    assert r.returncode == 0 and "FINAL" in r.stderr and "compression" in r.stderr, r.stderr


# ---- robust: beamd-sim spikes and outliers through two pca stages ------------

RB_N = 480
RB_B = 32


def test_robust_stage_on_sim_spikes(tmp_path, procs, ports, zctx, start_beamd, receivers):
    """beamd-sim --pca-spikes 0.002 (round(0.002 * 4096) = 8 spikes of 50 x
    mean = 5e4 counts in every frame) and 3 outlier frames, into a plain
    (pp) and a robust (pr) pca stage of one beamd.

    - robust final components to the true basis: below MAX_ANGLE_DEG
      (10 deg, the bound the clean frames' own SVD meets above); plain
      above 45 deg: the spikes are white noise of variance
      8 / 4096 * 5e4^2 = 4.9e6 per pixel, above the strongest component's
      4e6, so the plain model is made of spikes;
    - the sparse output holds the spikes (the pixels above 30 x mean, which
      nothing else reaches: test_seed_reproducible_and_spikes) and nothing
      else: |s| > 25 x mean, recall and precision >= 0.99 over the sparse
      frames of non-outlier frames;
    - the outlier frames (metadata) have the three largest robust
      residuals and are flagged.
    Ground truth: the same frames again from the simulator (same seed)."""
    from conftest import Proc, Receiver, make_config
    bfile = tmp_path / "basis.npy"
    args = pca_args(RB_N, 21, "--pca-spikes", "0.002", "--pca-outliers", "3",
                    "--pca-basis-file", str(bfile))
    common = {"kind": "pca", "backend": "cpu", "components": 3, "batch": RB_B,
              "publish_every": 100000}
    stages = [dict(common, name="pp", denoised_rate=0),
              dict(common, name="pr", robust=True, denoised_rate=1000)]
    start_beamd(make_config(ports, stages, mode="pull", pool_frames=64, out_hwm=100000))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    sim = Proc("beamd-sim", [SIM, "--bind", ports.ep_input, "--socket", "push", "--quiet",
                             "--series-id", "6"] + args, tmp_path, procs)
    assert sim.wait(30) == 0, sim.stderr()
    rx.wait_series_end(6, timeout=30)
    for st in ("pp", "pr"):
        rx.wait_for(lambda ms, st=st: any(m[0] == st + ".components" and
                                          m[1].flags & proto.FLAG_FINAL for m in ms),
                    timeout=10, what="final %s.components" % st)
    meta, frames, _ = receive(args)
    outl = meta["pca"]["outlier_frames"]
    basis = np.load(bfile)

    final, resid, flags, sparse = {}, {}, {}, {}
    for topic, hdr, arr, _ in rx.snapshot():
        if hdr.series_id != 6:
            continue
        if topic.endswith(".components") and hdr.flags & proto.FLAG_FINAL:
            final[topic[:2]] = arr
        elif topic == "pr.residual":
            resid[hdr.frame_id] = float(arr[0])
            flags[hdr.frame_id] = hdr.flags
        elif topic == "pr.sparse":
            sparse[hdr.frame_id] = arr
    ang_r = principal_angles_deg(final["pr"], basis).max()
    ang_p = principal_angles_deg(final["pp"], basis).max()
    print("to the true basis: robust %.1f deg, plain %.1f deg" % (ang_r, ang_p))
    assert ang_r < MAX_ANGLE_DEG
    assert ang_p > 45.0

    tp = fn = fp = n = 0
    for i, s in sparse.items():
        if i in outl:
            continue
        n += 1
        want = frames[i] > 30 * MEAN
        det = np.abs(s) > 25 * MEAN
        tp += int(np.sum(want & det))
        fn += int(np.sum(want & ~det))
        fp += int(np.sum(~want & det))
    print("sparse frames %d: spikes found %d, missed %d, false %d" % (n, tp, fn, fp))
    assert n >= 3 and tp >= 7 * n
    assert tp / (tp + fn) >= 0.99 and tp / (tp + fp) >= 0.99

    top = sorted(resid, key=resid.get)[-3:]
    print("largest robust residuals:", [(i, round(resid[i], 1)) for i in top], "outliers", outl)
    assert sorted(top) == sorted(outl)
    for i in outl:
        assert flags[i] & proto.FLAG_ANOMALY, i
