#!/usr/bin/python3
"""Batched fitter figures (bench/run.py --only fit, or this file alone).

The same float32 data go to beamd (bench/fit, one thread, median of --reps
runs) and to SciPy (scipy.optimize.least_squares, one fit per call, on a
subset, median of 3 runs) in the same run, so the ratio compares like with
like on this machine. SciPy starts from the true parameters, beamd from
its own automatic guess, so the ratio favours SciPy.

  damped cosine T=100 and T=1000   beamd vs least_squares(method="lm") and
                                   method="trf" with bounds
  g2 stretched, 1000 q x 127 lags  beamd (bounded, pyXpcsViewer form) vs
                                   least_squares trf with the same bounds
  XANI-shaped 4M x T=100           extrapolated x40 from a 100k-trace run

Needs numpy and scipy (python3-scipy); prints a table, returns a dict."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import fit_ref as fr  # noqa: E402


def dcos_data(n, T, seed):
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 10, T)
    truths = np.array([1.0, 0.5, 4.0, 0.8, 0.2]) * (1 + 0.1 * rng.standard_normal((n, 5)))
    f = fr.MODELS["dcos"][1]
    y = f(x[None, :], *[truths[:, j:j + 1] for j in range(5)]) + 0.05 * rng.standard_normal((n, T))
    return x, truths, y.astype(np.float32)


def g2_data(n, seed):
    rng = np.random.default_rng(seed)
    # multi-tau lags: 8 per level doubling after the first 16 (127 lags)
    lags = np.concatenate([np.arange(1, 17)] + [np.arange(8, 16) * 2 ** (l) for l in range(1, 15)])[:127]
    x = lags * 1e-5
    truths = np.column_stack([0.2 + 0.05 * rng.random(n), np.exp(rng.uniform(np.log(1e-4), np.log(1e-1), n)),
                              0.6 + 0.5 * rng.random(n), 1.0 + 0.01 * rng.standard_normal(n)])
    f = fr.MODELS["stretch"][1]
    y = f(x[None, :], *[truths[:, j:j + 1] for j in range(4)]) + 0.003 * rng.standard_normal((n, len(x)))
    lo = np.array([0.0, 1e-6, 0.2, 0.9])
    hi = np.array([1.0, 10.0, 2.0, 1.1])
    return x, truths, y.astype(np.float32), lo, hi


def beamd(build, model, x, y, reps, lo=None, hi=None):
    exe = os.path.join(build, "bench", "fit")
    with tempfile.TemporaryDirectory() as d:
        y.tofile(os.path.join(d, "y.f32"))
        np.asarray(x, dtype=np.float32).tofile(os.path.join(d, "x.f32"))
        if lo is not None:
            np.asarray(lo, np.float64).tofile(os.path.join(d, "lo.f64"))
            np.asarray(hi, np.float64).tofile(os.path.join(d, "hi.f64"))
        p = subprocess.run([exe, "--in", d, "--model", model, "--fits", str(y.shape[0]),
                            "--points", str(y.shape[1]), "--reps", str(reps)],
                           capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise RuntimeError("bench/fit failed: " + p.stderr)
    return json.loads(p.stdout)


def scipy_rate(model, x, y, truths, method, bounds=None, reps=3):
    from scipy.optimize import least_squares
    f = fr.MODELS[model][1]
    xd = x.astype(np.float64)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(len(y)):
            yi = y[i].astype(np.float64)
            kw = {} if bounds is None else {"bounds": bounds}
            p0 = truths[i] if bounds is None else np.clip(truths[i], bounds[0] + 1e-12, bounds[1] - 1e-12)
            least_squares(lambda p: f(xd, *p) - yi, p0, method=method, **kw)
        times.append(time.perf_counter() - t0)
    return len(y) / statistics.median(times)


def run(build, reps=5, log=print, quick=False):
    res = {}
    rows = []
    sub = 20 if quick else 200
    for T, n in ((100, 20000), (1000, 4000)):
        x, truths, y = dcos_data(n if not quick else n // 10, T, seed=T)
        b = beamd(build, "dcos", x, y, reps)
        s_lm = scipy_rate("dcos", x, y[:max(5, sub // (T // 100))], truths, "lm")
        bnds = (np.array([-10, -10, 0.01, 0.0, -10]), np.array([10, 10, 100, 5, 10]))
        s_trf = scipy_rate("dcos", x, y[:max(5, sub // (T // 100) // 4)], truths, "trf", bnds)
        res["dcos_T%d" % T] = {"beamd": b, "scipy_lm_fits_per_s": s_lm, "scipy_trf_fits_per_s": s_trf}
        rows.append(("damped cosine T=%d" % T, b["fits_per_s"], s_lm, s_trf, b))
    x, truths, y, lo, hi = g2_data(1000, seed=7)
    b = beamd(build, "stretch", x, y, reps, lo, hi)
    s_trf = scipy_rate("stretch", x, y[:max(5, sub // 4)], truths, "trf", (lo, hi))
    res["g2_stretch_1000x127"] = {"beamd": b, "scipy_trf_fits_per_s": s_trf,
                                  "beamd_ms_per_1000": 1e3 * b["median_s"] * 1000 / y.shape[0]}
    rows.append(("g2 stretched 127 lags", b["fits_per_s"], None, s_trf, b))
    n = 10000 if quick else 100000
    x, truths, y = dcos_data(n, 100, seed=11)
    b = beamd(build, "dcos", x, y, max(1, reps // 2))
    res["xani_4M_T100"] = {"beamd": b, "subset": n,
                           "cpu_s_4M_extrapolated": b["median_s"] * 4e6 / n}
    log("%-26s %12s %12s %8s %12s %8s %s" % ("fit (1 core)", "beamd fits/s", "scipy lm", "ratio",
                                              "scipy trf", "ratio", "beamd statuses / iters"))
    for name, bf, lm, trf, bb in rows:
        log("%-26s %12.0f %12s %8s %12s %8s %s / %.1f" % (
            name, bf, "%.0f" % lm if lm else "-", "%.0fx" % (bf / lm) if lm else "-",
            "%.0f" % trf, "%.0fx" % (bf / trf), bb["status"], bb["mean_iters"]))
    g = res["g2_stretch_1000x127"]
    log("g2: 1000 q-bins x 127 lags in %.1f ms on one core (median of %d; aim <= 50 ms)" % (
        g["beamd_ms_per_1000"], reps))
    xa = res["xani_4M_T100"]
    log("XANI 4M traces x T=100: %.1f CPU s on one core, extrapolated x%.0f from %d traces "
        "(%.0f fits/s, %s)" % (xa["cpu_s_4M_extrapolated"], 4e6 / n, n, xa["beamd"]["fits_per_s"],
                               xa["beamd"]["isa"]))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a tenth of the data")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = run(a.build, a.reps, quick=a.quick)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
