#!/usr/bin/python3
"""Batched fitter figures (bench/run.py --only fit, or this file alone).

The same float32 data go to beamd (bench/fit, one thread, median of --reps
runs) and to SciPy (scipy.optimize.least_squares, one fit per call, on a
subset, median of 3 runs) in the same run, so the ratio compares like with
like on this machine. SciPy starts from the true parameters. beamd runs
twice: from its own automatic guess (the ratio then favours SciPy) and
from the same true parameters (--init given: same data, same starts).
Rates are per second of wall time and per second of CPU time (the
process's for SciPy, the fitting thread's for beamd); on a shared host
the CPU-time ratio is the steadier one.

  damped cosine T=100 and T=1000   beamd vs least_squares(method="lm"),
                                   with the finite-difference Jacobian and
                                   with the analytic one (jac=, as beamd
                                   uses), and method="trf" with bounds
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


def beamd(build, model, x, y, reps, lo=None, hi=None, p0=None):
    exe = os.path.join(build, "bench", "fit")
    with tempfile.TemporaryDirectory() as d:
        y.tofile(os.path.join(d, "y.f32"))
        if p0 is not None:
            np.asarray(p0, np.float64).tofile(os.path.join(d, "p0.f64"))
        np.asarray(x, dtype=np.float32).tofile(os.path.join(d, "x.f32"))
        if lo is not None:
            np.asarray(lo, np.float64).tofile(os.path.join(d, "lo.f64"))
            np.asarray(hi, np.float64).tofile(os.path.join(d, "hi.f64"))
        p = subprocess.run([exe, "--in", d, "--model", model, "--fits", str(y.shape[0]),
                            "--points", str(y.shape[1]), "--reps", str(reps)]
                           + (["--init", "given"] if p0 is not None else []),
                           capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise RuntimeError("bench/fit failed: " + p.stderr)
    return json.loads(p.stdout)


def dcos_jac(x, a, b, tau, f, c):
    """Analytic Jacobian of the dcos model (columns a b tau f c)."""
    e = np.exp(-x / tau)
    co, si = np.cos(2 * np.pi * f * x), np.sin(2 * np.pi * f * x)
    osc = a * co + b * si
    return np.column_stack([e * co, e * si, e * osc * x / tau ** 2,
                            e * (-a * si + b * co) * 2 * np.pi * x, np.ones_like(x)])


def scipy_rate(model, x, y, truths, method, bounds=None, reps=3, jac=None):
    """(fits per wall second, fits per CPU second) of least_squares."""
    from scipy.optimize import least_squares
    f = fr.MODELS[model][1]
    xd = x.astype(np.float64)
    walls, cpus = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(len(y)):
            yi = y[i].astype(np.float64)
            kw = {} if bounds is None else {"bounds": bounds}
            if jac is not None:
                kw["jac"] = lambda p: jac(xd, *p)
            p0 = truths[i] if bounds is None else np.clip(truths[i], bounds[0] + 1e-12, bounds[1] - 1e-12)
            least_squares(lambda p: f(xd, *p) - yi, p0, method=method, **kw)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return len(y) / statistics.median(walls), len(y) / statistics.median(cpus)


def run(build, reps=5, log=print, quick=False):
    res = {}
    rows = []
    sub = 20 if quick else 200
    for T, n in ((100, 20000), (1000, 4000)):
        x, truths, y = dcos_data(n if not quick else n // 10, T, seed=T)
        b = beamd(build, "dcos", x, y, reps)
        bg = beamd(build, "dcos", x, y, reps, p0=truths)
        ns = max(5, sub // (T // 100))
        s_lm = scipy_rate("dcos", x, y[:ns], truths, "lm")
        s_lmj = scipy_rate("dcos", x, y[:ns], truths, "lm", jac=dcos_jac)
        bnds = (np.array([-10, -10, 0.01, 0.0, -10]), np.array([10, 10, 100, 5, 10]))
        s_trf = scipy_rate("dcos", x, y[:max(5, ns // 4)], truths, "trf", bnds)
        res["dcos_T%d" % T] = {"beamd": b, "beamd_given": bg,
                               "scipy_lm_fits_per_s": s_lm[0], "scipy_lm_fits_per_cpu_s": s_lm[1],
                               "scipy_lm_jac_fits_per_s": s_lmj[0],
                               "scipy_lm_jac_fits_per_cpu_s": s_lmj[1],
                               "scipy_trf_fits_per_s": s_trf[0], "scipy_trf_fits_per_cpu_s": s_trf[1]}
        rows.append(("damped cosine T=%d" % T, b, bg, s_lm, s_lmj, s_trf))
    x, truths, y, lo, hi = g2_data(1000, seed=7)
    b = beamd(build, "stretch", x, y, reps, lo, hi)
    s_trf = scipy_rate("stretch", x, y[:max(5, sub // 4)], truths, "trf", (lo, hi))
    res["g2_stretch_1000x127"] = {"beamd": b, "scipy_trf_fits_per_s": s_trf[0],
                                  "scipy_trf_fits_per_cpu_s": s_trf[1],
                                  "beamd_ms_per_1000": 1e3 * b["median_s"] * 1000 / y.shape[0]}
    n = 10000 if quick else 100000
    x, truths, y = dcos_data(n, 100, seed=11)
    bx = beamd(build, "dcos", x, y, max(1, reps // 2))
    res["xani_4M_T100"] = {"beamd": bx, "subset": n,
                           "cpu_s_4M_extrapolated": bx["median_s"] * 4e6 / n}
    log("fit, 1 core; fits/s wall (CPU); ratio = beamd / SciPy, wall (CPU)")
    for name, b, bg, lm, lmj, trf in rows:
        log("%s: beamd auto %.0f (%.0f), from the truth %.0f (%.0f); statuses %s, iters %.1f / %.1f" % (
            name, b["fits_per_s"], b["fits_per_cpu_s"], bg["fits_per_s"], bg["fits_per_cpu_s"],
            b["status"], b["mean_iters"], bg["mean_iters"]))
        for sname, sr in (("lm", lm), ("lm+jac", lmj), ("trf+bounds", trf)):
            log("  scipy %-10s %8.0f (%8.0f)  ratio auto %5.0fx (%5.0fx)  same starts %5.0fx (%5.0fx)" % (
                sname, sr[0], sr[1], b["fits_per_s"] / sr[0], b["fits_per_cpu_s"] / sr[1],
                bg["fits_per_s"] / sr[0], bg["fits_per_cpu_s"] / sr[1]))
    g = res["g2_stretch_1000x127"]
    log("g2 stretched 127 lags: beamd %.0f fits/s (%.0f), scipy trf+bounds %.0f (%.0f): %.0fx (%.0fx)" % (
        g["beamd"]["fits_per_s"], g["beamd"]["fits_per_cpu_s"], g["scipy_trf_fits_per_s"],
        g["scipy_trf_fits_per_cpu_s"], g["beamd"]["fits_per_s"] / g["scipy_trf_fits_per_s"],
        g["beamd"]["fits_per_cpu_s"] / g["scipy_trf_fits_per_cpu_s"]))
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
