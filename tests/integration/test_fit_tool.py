"""beamd-fit end to end, CPU only: per-pixel damped-cosine maps of a scan file.

The scan is made here with h5py: every pixel of a 24x40 detector follows
e^(-t/tau)(a cos 2 pi f t + b sin 2 pi f t) + c with its own known
parameters, counted with Poisson noise as uint16, frames in
/entry/data/data, delays in /entry/data/delay. Variants: raw chunks of one
frame, bitshuffle-LZ4 (Debian's filter plugin, decoded by beamd's codec),
deflate chunks of 7 frames (so a rank's frame range must be rounded
to whole chunks), and an NXmx master linking two bitshuffle-LZ4 data files.

Checks:
- `mpirun -n 2` and one process give bitwise identical maps, and so do the
  three storage variants: every fit sees the same float32 trace and the
  engine's SIMD lanes never mix (docs/fit.md), so nothing may differ.
- the maps equal tests/tools/fit_run on the same traces, bitwise (the same
  engine, fit-major there, frame-major tiles here).
- truth recovery, with tolerances from the noise: the pulls
  (fit - truth) / error of tau, f and c have a robust spread (1.4826 MAD)
  within 0.85..1.2 (1 for a correct fit with correct errors; 960 pixels
  give about +-0.04 sampling spread; seen 1.01..1.04) and a median within
  0.2 (sampling +-0.04, plus the small bias of tau at this signal-to-
  noise: seen 0.09); 99 % of the fits converge (seen all).
- mask and ROI: unselected pixels read "not fitted" (NaN, status 255),
  selected ones equal the full run.
- bad input: missing dataset, x length mismatch, bad model name, CUDA
  asked for without a build or device -> a message naming the problem and
  exit 1 (2 for the command line).
- --backend auto: the CPU (bitwise maps1, and a notice saying why) where
  no device is seen; on a GPU machine the CUDA engine, whose maps agree
  with the CPU's within the engine's cross-check tolerances.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, HERE)
import make_test_h5 as mk  # noqa: E402  (sets HDF5_PLUGIN_PATH before h5py loads)
import h5py  # noqa: E402
import fit_ref as fr  # noqa: E402

BUILD = os.environ.get("BEAMD_BUILD", "build")
BUILD = BUILD if os.path.isabs(BUILD) else os.path.join(REPO, BUILD)
FIT = os.path.join(BUILD, "beamd-fit")
# Open MPI as root, on a 2-core machine, loopback only.
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]
H, W, T = 24, 40, 60
PARAMS = ["a", "b", "tau", "f", "c"]
BASE = ["--model", "damped_cosine", "--x", "/entry/data/delay", "--tile", "208", "--quiet"]


@pytest.fixture(autouse=True)
def _binaries():
    for p in (FIT, os.path.join(BUILD, "tests", "tools", "fit_run")):
        if not os.access(p, os.X_OK):
            pytest.fail("%s not built (make BUILD=%s)" % (p, BUILD))


def run(args, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def truth_maps(seed=5):
    rng = np.random.default_rng(seed)
    amp = rng.uniform(150, 400, (H, W))
    phase = rng.uniform(-np.pi, np.pi, (H, W))
    return {"a": amp * np.cos(phase), "b": -amp * np.sin(phase),
            "tau": rng.uniform(3, 9, (H, W)), "f": rng.uniform(0.15, 0.45, (H, W)),
            "c": rng.uniform(500, 800, (H, W))}


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    d = tmp_path_factory.mktemp("fit")
    tr = truth_maps()
    x = np.linspace(0, 15, T)
    X = x[:, None, None]
    mu = (np.exp(-X / tr["tau"]) * (tr["a"] * np.cos(2 * np.pi * tr["f"] * X)
                                    + tr["b"] * np.sin(2 * np.pi * tr["f"] * X)) + tr["c"])
    y = np.random.default_rng(6).poisson(mu).astype(np.uint16)
    mask = np.zeros((H, W), np.uint32)
    mask[3, 5] = 1
    mask[10:12, 20:30] = 4
    paths = {}
    for kind, kw in (("raw", dict(chunks=(1, H, W))),
                     ("bslz4", dict(chunks=(1, H, W), compression=mk.BSHUF_ID,
                                    compression_opts=(0, 2))),
                     ("gzip7", dict(chunks=(7, H, W), compression="gzip"))):
        p = str(d / ("scan_%s.h5" % kind))
        with h5py.File(p, "w") as f:
            f.create_dataset("/entry/data/data", data=y, **kw)
            f["/entry/data/delay"] = x
            f["/entry/data/delay_short"] = x[:-1]
            f["/entry/instrument/detector/pixel_mask"] = mask
        paths[kind] = p
    # NXmx master + two data files (external links data_000001, data_000002)
    # of 25 and 35 frames, delays in the master.
    for i, (a, b) in enumerate(((0, 25), (25, T)), 1):
        with h5py.File(str(d / ("scan_data_%06d.h5" % i)), "w") as f:
            f.create_dataset("/entry/data/data", data=y[a:b], chunks=(1, H, W),
                             compression=mk.BSHUF_ID, compression_opts=(0, 2))
    p = str(d / "scan_master.h5")
    with h5py.File(p, "w") as f:
        for i in (1, 2):
            f["/entry/data/data_%06d" % i] = h5py.ExternalLink("scan_data_%06d.h5" % i,
                                                               "/entry/data/data")
        f["/entry/data/delay"] = x
    paths["master"] = p
    # The plugin must really have compressed, else the test proves nothing.
    with h5py.File(paths["bslz4"]) as f:
        assert str(mk.BSHUF_ID) in f["/entry/data/data"]._filters
    return {"dir": d, "paths": paths, "truth": tr, "x": x, "y": y, "mask": mask}


def fit(scan_path, out, extra=(), ranks=0, timeout=120):
    args = [FIT, scan_path, "-o", out] + BASE + list(extra)
    if ranks:
        args = MPIRUN + ["-n", str(ranks)] + args + ["--threads", "1"]
    r = run(args, timeout)
    assert r.returncode == 0, r.stderr
    return load(out)


def load(path):
    with h5py.File(path) as f:
        g = f["/maps"]
        return {k: g[k][()] for k in g}, dict(g.attrs)


def same(a, b, keys=None):
    for k in keys or a:
        assert np.array_equal(a[k], b[k], equal_nan=True), k


@pytest.fixture(scope="module")
def maps1(scan):
    return fit(scan["paths"]["raw"], str(scan["dir"] / "m1.h5"))


def test_layout_and_attributes(scan, maps1):
    m, attrs = maps1
    for p in PARAMS:
        assert m[p].shape == (H, W) and m[p].dtype == np.float64
        assert m[p + "_err"].shape == (H, W)
    assert m["status"].dtype == np.uint8 and m["iters"].dtype == np.int32
    assert m["chi2"].shape == m["chi2_red"].shape == m["n_used"].shape == (H, W)
    assert np.array_equal(m["x"], scan["x"])
    assert attrs["model"] == "dcos" and list(attrs["parameters"]) == PARAMS
    assert attrs["estimator"] == "wls" and attrs["frames"] == T
    assert attrs["ranks"] == 1 and attrs["tile_pixels"] == 208
    assert attrs["x_source"].endswith("dataset /entry/data/delay")
    assert attrs["max_iter"] == 100 and attrs["ftol"] == 1e-6
    assert np.all(m["n_used"] == T)


def test_two_ranks_bitwise(scan, maps1):
    m2, attrs = fit(scan["paths"]["raw"], str(scan["dir"] / "m2.h5"), ranks=2)
    assert attrs["ranks"] == 2
    same(maps1[0], m2)


@pytest.mark.parametrize("kind", ["bslz4", "gzip7", "master"])
def test_codecs_and_chunks_bitwise(scan, maps1, kind):
    same(maps1[0], fit(scan["paths"][kind], str(scan["dir"] / ("k1_%s.h5" % kind)))[0])
    same(maps1[0], fit(scan["paths"][kind], str(scan["dir"] / ("k2_%s.h5" % kind)), ranks=2)[0])


def test_threads_and_tiles_do_not_change_bits(scan, maps1):
    m, _ = fit(scan["paths"]["raw"], str(scan["dir"] / "t.h5"), ["--threads", "2", "--tile", "1000"])
    same(maps1[0], m)


def test_equals_fit_run(scan, maps1):
    m = maps1[0]
    y = scan["y"].reshape(T, H * W).T.astype(np.float32)
    r = fr.run_fit("dcos", scan["x"].astype(np.float32), y)
    for k, p in enumerate(PARAMS):
        assert np.array_equal(m[p].ravel(), r["params"][:, k], equal_nan=True), p
        assert np.array_equal(m[p + "_err"].ravel(), r["errors"][:, k], equal_nan=True), p
    for k in ("chi2", "chi2_red", "iters", "status", "n_used"):
        assert np.array_equal(m[k].ravel(), r[k], equal_nan=True), k


def test_recovers_truth(scan, maps1):
    m, tr = maps1[0], scan["truth"]
    ok = m["status"] <= 1
    assert ok.mean() >= 0.99, np.bincount(m["status"].ravel())
    for p in ("tau", "f", "c"):
        pull = ((m[p] - tr[p]) / m[p + "_err"])[ok]
        spread = 1.4826 * np.median(np.abs(pull - np.median(pull)))  # robust sigma
        assert 0.85 < spread < 1.2, (p, spread)
        assert abs(np.median(pull)) < 0.2, (p, np.median(pull))
    amp = np.hypot(m["a"], m["b"])
    assert np.median(np.abs(amp / np.hypot(tr["a"], tr["b"]) - 1)) < 0.05


def test_mask_and_roi(scan, maps1):
    full = maps1[0]
    m, attrs = fit(scan["paths"]["raw"], str(scan["dir"] / "roi.h5"),
                   ["--mask", "/entry/instrument/detector/pixel_mask", "--roi", "2:20,4:35"])
    sel = np.zeros((H, W), bool)
    sel[2:20, 4:35] = True
    sel &= scan["mask"] == 0
    assert attrs["pixels_fitted"] == sel.sum()
    assert np.all(m["status"][~sel] == 255) and np.all(np.isnan(m["tau"][~sel]))
    assert np.all(m["iters"][~sel] == -1)
    for k in PARAMS + ["chi2", "status", "iters"]:
        assert np.array_equal(m[k][sel], full[k][sel], equal_nan=True), k
    m2, _ = fit(scan["paths"]["raw"], str(scan["dir"] / "roi2.h5"),
                ["--mask", scan["paths"]["raw"] + ":/entry/instrument/detector/pixel_mask",
                 "--roi", "2:20,4:35"], ranks=2)
    same(m, m2)


def test_estimator_bounds_p0_match_fit_run(scan):
    y = scan["y"].reshape(T, H * W).T.astype(np.float32)
    xf = scan["x"].astype(np.float32)
    lo = [-np.inf, -np.inf, 1.0, 0.05, 0.0]
    hi = [np.inf, np.inf, 20.0, 0.6, np.inf]
    bounds = ["--bound", "tau=1:20", "--bound", "f=0.05:0.6", "--bound", "c=0:"]
    for est in ("poisson", "mle"):
        m, attrs = fit(scan["paths"]["raw"], str(scan["dir"] / ("e_%s.h5" % est)),
                       ["--estimator", est] + bounds, ranks=2)
        assert attrs["estimator"] == est and list(attrs["lower_bounds"]) == lo
        r = fr.run_fit("dcos", xf, y, estimator=est, lo=lo, hi=hi)
        for k, p in enumerate(PARAMS):
            assert np.array_equal(m[p].ravel(), r["params"][:, k], equal_nan=True), (est, p)
    p0 = [200.0, 0.0, 5.0, 0.3, 650.0]
    m, attrs = fit(scan["paths"]["raw"], str(scan["dir"] / "p0.h5"),
                   ["--p0", "a=200,b=0,tau=5", "--p0", "f=0.3,c=650", "--fix", "c=650"])
    assert attrs["init"] == "given" and list(attrs["p0"]) == p0
    assert np.all(m["c"][m["status"] <= 1] == 650.0)
    r = fr.run_fit("dcos", xf, y, p0=np.tile(p0, (H * W, 1)),
                   lo=[-np.inf, -np.inf, -np.inf, -np.inf, 650.0],
                   hi=[np.inf, np.inf, np.inf, np.inf, 650.0])
    assert np.array_equal(m["tau"].ravel(), r["params"][:, 2], equal_nan=True)


def test_x_step(scan, maps1):
    # The delays are uniform, 15/(T-1) apart: --x-step gives the same x in
    # float32, hence the same maps.
    step = "%.17g" % (15.0 / (T - 1))
    args = [FIT, scan["paths"]["raw"], "-o", str(scan["dir"] / "xs.h5"), "--model", "dcos",
            "--x-step", step, "--tile", "208", "--quiet"]
    r = run(args)
    assert r.returncode == 0, r.stderr
    m, attrs = load(str(scan["dir"] / "xs.h5"))
    assert "k *" in attrs["x_source"]
    if np.array_equal(m["x"].astype(np.float32), scan["x"].astype(np.float32)):
        same(maps1[0], m, PARAMS)


def test_progress_line(scan):
    r = run([FIT, scan["paths"]["raw"], "-o", str(scan["dir"] / "p.h5"), "--model", "dcos",
             "--x", "/entry/data/delay", "--tile", "64", "--progress"])
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if "pixels (" in l]
    assert lines and "fits/s" in lines[-1] and "left" in lines[-1] and "100%" in lines[-1]
    assert "status: converged" in r.stderr
    q = run([FIT, scan["paths"]["raw"], "-o", str(scan["dir"] / "p.h5"), "--model", "dcos",
             "--x", "/entry/data/delay"])
    assert q.returncode == 0 and "pixels (" not in q.stderr  # stderr is no terminal


def has_cuda_device():
    """What beamd-fit --backend auto would pick, from its own notice."""
    return _auto_probe()[0] == "cuda"


_probe = {}


def _auto_probe():
    if "r" not in _probe:
        # a command that fails after the backend is chosen: nothing is read
        r = run([FIT, "/nonexistent.h5", "-o", "/nonexistent/x.h5", "--model", "dcos",
                 "--backend", "auto"])
        w = "--backend auto -> "
        line = next((ln for ln in r.stderr.splitlines() if w in ln), "")
        _probe["r"] = (line.split(w, 1)[1].split()[0] if line else "", r.stderr)
    return _probe["r"]


def test_backend_auto(scan, maps1):
    picked, err = _auto_probe()
    assert picked in ("cpu", "cuda"), err
    out = str(scan["dir"] / "auto.h5")
    args = [FIT, scan["paths"]["raw"], "-o", out] + [a for a in BASE if a != "--quiet"]
    r = run(args + ["--backend", "auto"])
    assert r.returncode == 0, r.stderr
    assert "--backend auto -> " + picked in r.stderr, r.stderr
    m, attrs = load(out)
    assert attrs["backend"] == picked
    c = maps1[0]
    if picked == "cpu":
        assert "CUDA" in r.stderr  # why not: built without CUDA, or no device
        same(c, m)
        return
    # the CUDA engine (docs/fit.md "CUDA"): statuses equal, parameters within
    # 5 % of the CPU's standard error + 2e-5 relative
    assert attrs["isa"].startswith("cuda:")
    assert np.array_equal(m["status"], c["status"])
    for p in PARAMS:
        tol = 0.05 * np.nan_to_num(c[p + "_err"]) + 2e-5 * (np.abs(c[p]) + 0.01)
        d = np.abs(m[p] - c[p])
        assert np.all((d <= tol) | (np.isnan(m[p]) & np.isnan(c[p]))), p
    r = run(args + ["--backend", "cuda", "--cuda-starts", "host", "-o", out + "h"])
    assert r.returncode == 0, r.stderr


def test_backend_cuda_refused_without_device(scan, tmp_path):
    if has_cuda_device():
        pytest.skip("a CUDA device is usable here: --backend cuda runs (test_backend_auto)")
    r = run([FIT, scan["paths"]["raw"], "-o", str(tmp_path / "c.h5")] + BASE +
            ["--backend", "cuda"])
    assert r.returncode == 1, r.stderr
    assert "--backend cuda: " in r.stderr and "use --backend cpu" in r.stderr, r.stderr
    assert ("built with CUDA=0" in r.stderr) or ("no usable CUDA device" in r.stderr), r.stderr
    assert not os.path.exists(str(tmp_path / "c.h5"))


@pytest.mark.parametrize("ranks", [0, 2])
def test_errors(scan, tmp_path, ranks):
    raw = scan["paths"]["raw"]
    out = str(tmp_path / "e.h5")

    def bad(extra, code, *words):
        args = [FIT, raw, "-o", out] + extra
        if ranks:
            args = MPIRUN + ["-n", str(ranks)] + args
        r = run(args)
        assert r.returncode == code, (extra, r.returncode, r.stderr)
        for w in words:
            assert w in r.stderr, (extra, w, r.stderr)
        assert "Traceback" not in r.stderr and "MPI_ABORT" not in r.stderr
        return r.stderr

    e = bad(["--model", "dcos", "--x", "/entry/data/nope"], 1, "beamd-fit:", raw,
            "/entry/data/nope", "no such dataset")
    if ranks:
        assert e.count("no such dataset") == 1  # rank 0 speaks for all
    bad(["--model", "dcos", "--dataset", "/entry/data/missing"], 1, raw, "/entry/data/missing")
    bad(["--model", "dcos", "--x", "/entry/data/delay_short"], 1, "/entry/data/delay_short",
        "%d values" % (T - 1), "%d frames" % T)
    bad(["--model", "damped_cosinus", "--x", "/entry/data/delay"], 2,
        "bad value for --model: 'damped_cosinus'", "dcos")
    bad(["--model", "dcos", "--bound", "omega=0:1"], 2, "no such parameter", "tau")
    bad(["--model", "dcos", "--p0", "a=1,b=2"], 2, "every parameter")
    if not has_cuda_device():
        bad(["--model", "dcos", "--backend", "cuda"], 1, "--backend cuda", "use --backend cpu")
    bad(["--model", "dcos", "--backend", "gpu"], 2, "bad value for --backend", "cpu, cuda or auto")
    bad(["--model", "dcos", "--cuda-starts", "gpu"], 2, "device or host")
    bad(["--model", "dcos", "--roi", "0:30,0:10"], 1, "outside")
    assert not os.path.exists(out)


def test_corrupt_chunk_names_file_dataset_frame(scan, tmp_path):
    p = str(tmp_path / "bad.h5")
    with h5py.File(p, "w") as f:
        d = f.create_dataset("/entry/data/data", (T, H, W), "uint16", chunks=(1, H, W),
                             compression=mk.BSHUF_ID, compression_opts=(0, 2))
        d[...] = scan["y"]
        f["/entry/data/delay"] = scan["x"]
    with h5py.File(p, "r+") as f:  # garble frame 37's stored chunk
        ds = f["/entry/data/data"]
        info = ds.id.get_chunk_info_by_coord((37, 0, 0))
    with open(p, "r+b") as fh:
        fh.seek(info.byte_offset + 16)
        fh.write(b"\xff" * 32)
    r = run(MPIRUN + ["-n", "2", FIT, p, "-o", str(tmp_path / "m.h5")] + BASE)
    assert r.returncode == 1, r.stderr
    assert p in r.stderr and "/entry/data/data" in r.stderr and "frame 37" in r.stderr, r.stderr
