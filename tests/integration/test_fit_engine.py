"""The batched fitter (pipeline/fit.h) against SciPy on the same data.

tests/tools/fit_run runs the engine on raw files; numpy simulates, SciPy
(python3-scipy) fits the same float32 data from the true parameters, so
its answer is the least-squares minimum near the truth.
(a) every model, clean and noisy: beamd (SIMD path and reference) reaches
    SciPy's parameters within 5 % of SciPy's standard errors, or a χ² no
    worse than SciPy's + 1e-5 relative; errors within 3 %; on clean data
    parameters within 1e-4 relative;
(b) truth recovery: pulls (fit - truth) / error ~ N(0, 1);
(c) Poisson: LSE with w = 1/max(y, 1) against curve_fit(sigma=sqrt(max(y,1)))
    and MLE against least_squares on signed deviance residuals;
(d) bounds respected, a binding bound gives status "bound" and SciPy trf's χ²;
(e) every status; NaN, constant and too-short traces leave their
    neighbours bit-identical;
(f) layouts, per-fit x, range splitting and ISA levels agree.
"""
import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import fit_ref as fr  # noqa: E402

scipy_opt = pytest.importorskip("scipy.optimize")
if not os.path.exists(os.path.join(fr.build_dir(), "tests", "tools", "fit_run")):
    pytest.skip("fit_run not built", allow_module_level=True)

ST = {n: i for i, n in enumerate(fr.STATUS)}

# model: (x grid, truth, relative spread of the truth per fit, noise sigma)
CASES = {
    "dcos": (np.linspace(0, 10, 100), [1.0, 0.5, 4.0, 0.8, 0.2], 0.1, 0.05),
    "dcos_t0": (np.linspace(-2, 10, 120), [1.0, 0.5, 4.0, 0.8, 0.2, 1.0], 0.1, 0.05),
    "dcos2": (np.linspace(0, 10, 200), [1.0, 0.3, 5.0, 0.7, 0.5, -0.2, 3.0, 1.9, 0.1], 0.05, 0.03),
    "exp": (np.geomspace(1e-3, 10, 127), [0.3, 0.5, 1.0], 0.2, 0.005),
    "stretch": (np.geomspace(1e-3, 10, 127), [0.3, 0.5, 0.8, 1.0], 0.1, 0.003),
    "stretch_xt": (np.geomspace(1e-3, 10, 127), [0.3, 0.5, 1.3, 1.0], 0.1, 0.003),
    "exp2": (np.geomspace(1e-3, 100, 127), [0.2, 0.05, 0.15, 5.0, 1.0], 0.1, 0.002),
    "gauss": (np.linspace(-5, 5, 101), [2.0, 0.3, 0.7, 0.5, 0.1], 0.1, 0.05),
    "lorentz": (np.linspace(-5, 5, 101), [2.0, -0.4, 0.5, 0.5, 0.1], 0.1, 0.05),
    "poly": (np.linspace(-1, 1, 50), [0.5, -1.0, 0.3, 2.0], 0.3, 0.05),
}
# t0 is seen only through the kink where the flat stretch ends: its guess
# needs bounds within about half a period (docs/fit.md).
BOUNDS = {
    "dcos_t0": (np.array([-np.inf] * 5 + [0.6]), np.array([np.inf] * 5 + [1.4])),
}

# Known weak starts: double exponentials are ill-posed; dcos_t0's residual
# has a shallow minimum per sample interval near the kink, and its start
# (the change-point scan, docs/fit.md "Initial guesses") lands in SciPy's
# basin for ~97 % of noisy traces (measured: 465/480 over seeds 1-5 of
# this case's data; 24/24 exp2 noisy).
MIN_FRAC = {"exp2": 0.9, "dcos_t0": 0.9}


def simulate(model, n, noise, seed=0, degree=3):
    x, truth, spread, _ = CASES[model]
    P, f = fr.model_fn(model, degree)
    rng = np.random.default_rng(seed)
    truths = np.array(truth) * (1 + spread * rng.standard_normal((n, P)))
    y = np.array([f(x, *t) for t in truths]) + noise * rng.standard_normal((n, len(x)))
    return x, truths, y.astype(np.float32)


def scipy_fit(model, x, y, p0, sigma=None, bounds=None, degree=3):
    P, f = fr.model_fn(model, degree)
    x = x.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = dict(p0=p0, sigma=sigma, maxfev=20000)
        if bounds is not None:
            kw["bounds"] = bounds
        else:
            kw["method"] = "lm"
        popt, pcov = scipy_opt.curve_fit(f, x, y.astype(np.float64), **kw)
    r = (y - f(x, *popt)) / (1 if sigma is None else sigma)
    return popt, np.sqrt(np.diag(pcov)), float(np.sum(r ** 2))


def check_against_scipy(model, res, x, y, truths, sigma=None, clean=False, min_frac=1.0):
    n = len(y)
    good = 0
    worst = []
    for i in range(n):
        popt, perr, chi2 = scipy_fit(model, x, y[i], truths[i], sigma=sigma)
        p, e = res["params"][i], res["errors"][i]
        if clean:
            ok = np.all(np.abs(p - popt) <= 1e-4 * np.maximum(np.abs(popt), np.max(np.abs(popt))))
        else:
            same = np.all(np.abs(p - popt) <= 0.05 * perr)
            better = res["chi2"][i] <= chi2 * (1 + 1e-5)
            errs = np.all(np.abs(e - perr) <= 0.03 * perr)
            ok = (same or better) and (errs or not same)
        good += bool(ok) and res["status"][i] in (ST["converged"], ST["bound"])
        if not ok:
            worst.append((i, p, popt, res["chi2"][i], chi2))
    assert good >= min_frac * n, "%s: %d/%d agree with SciPy; first misses %r" % (
        model, good, n, worst[:2])


@pytest.mark.parametrize("model", sorted(CASES))
@pytest.mark.parametrize("impl", ["cpu", "ref"])
def test_noisy_against_scipy(model, impl):
    x, truths, y = simulate(model, 24, CASES[model][3], seed=1)
    lo, hi = BOUNDS.get(model, (None, None))
    res = fr.run_fit(model, x, y, impl=impl, degree=3, lo=lo, hi=hi)
    check_against_scipy(model, res, x, y, truths, min_frac=MIN_FRAC.get(model, 1.0))


@pytest.mark.parametrize("model", sorted(CASES))
def test_clean_against_scipy(model):
    x, truths, y = simulate(model, 16, 0.0, seed=2)
    lo, hi = BOUNDS.get(model, (None, None))
    res = fr.run_fit(model, x, y, degree=3, lo=lo, hi=hi)
    check_against_scipy(model, res, x, y, truths, clean=True, min_frac=MIN_FRAC.get(model, 1.0))


@pytest.mark.parametrize("model", ["dcos", "stretch", "gauss"])
def test_pulls(model):
    n = 400
    x, truths, y = simulate(model, n, CASES[model][3], seed=3)
    res = fr.run_fit(model, x, y)
    ok = res["status"] == ST["converged"]
    assert ok.mean() > 0.98
    pull = (res["params"][ok] - truths[ok]) / res["errors"][ok]
    assert np.all(np.abs(pull.mean(axis=0)) < 0.2), pull.mean(axis=0)
    assert np.all(np.abs(pull.std(axis=0) - 1) < 0.15), pull.std(axis=0)


def poisson_data(n, seed=4):
    x = np.linspace(-5, 5, 81)
    truth = np.array([40.0, 0.2, 0.8, 5.0, 0.3])
    rng = np.random.default_rng(seed)
    truths = truth * (1 + 0.05 * rng.standard_normal((n, 5)))
    lam = np.array([fr.MODELS["gauss"][1](x, *t) for t in truths])
    return x, truths, rng.poisson(lam).astype(np.float32)


def test_poisson_weights_against_curve_fit():
    x, truths, y = poisson_data(16)
    res = fr.run_fit("gauss", x, y, estimator="poisson")
    for i in range(len(y)):
        sig = np.sqrt(np.maximum(y[i].astype(np.float64), 1))
        popt, perr, _ = scipy_fit("gauss", x, y[i], truths[i], sigma=sig)
        assert np.all(np.abs(res["params"][i] - popt) <= 0.05 * perr), (res["params"][i], popt)
        assert np.all(np.abs(res["errors"][i] - perr) <= 0.03 * perr)


def test_mle_against_least_squares():
    x, truths, y = poisson_data(16, seed=5)
    f = fr.MODELS["gauss"][1]
    res = fr.run_fit("gauss", x, y, estimator="mle")
    xd = x.astype(np.float64)
    for i in range(len(y)):
        yi = y[i].astype(np.float64)

        def resid(p):
            m = np.maximum(f(xd, *p), 1e-300)
            dev = 2 * (m - yi) - 2 * np.where(yi > 0, yi * np.log(np.where(yi > 0, m / np.maximum(yi, 1e-300), 1)), 0)
            return np.sign(m - yi) * np.sqrt(np.maximum(dev, 0))

        ls = scipy_opt.least_squares(resid, truths[i], method="lm", xtol=1e-12, ftol=1e-12)
        m = f(xd, *ls.x)
        eps = 1e-6 * np.maximum(np.abs(ls.x), 1e-3)
        J = np.array([(f(xd, *(ls.x + eps[j] * np.eye(5)[j])) - f(xd, *(ls.x - eps[j] * np.eye(5)[j])))
                      / (2 * eps[j]) for j in range(5)]).T
        err = np.sqrt(np.diag(np.linalg.inv(J.T @ (J / m[:, None]))))
        assert res["status"][i] == ST["converged"]
        assert np.all(np.abs(res["params"][i] - ls.x) <= 0.05 * err), (res["params"][i], ls.x)
        assert np.all(np.abs(res["errors"][i] - err) <= 0.03 * err)
        assert abs(res["chi2"][i] - 2 * ls.cost) <= 1e-4 * res["chi2"][i] + 1e-6


def test_bounds():
    x, truths, y = simulate("stretch", 16, CASES["stretch"][3], seed=6)
    lo = np.array([0.0, 0.0, 0.9, -np.inf])  # beta >= 0.9 binds (truth 0.8)
    hi = np.array([1.0, np.inf, 2.0, np.inf])
    res = fr.run_fit("stretch", x, y, lo=lo, hi=hi)
    p = res["params"]
    assert np.all(p >= lo) and np.all(p <= hi)
    assert np.all(res["status"] == ST["bound"])
    assert np.all(p[:, 2] == 0.9)
    for i in range(len(y)):
        _, _, chi2 = scipy_fit("stretch", x, y[i], np.clip(truths[i], lo + 1e-9, hi - 1e-9),
                               bounds=(lo, hi))
        assert res["chi2"][i] <= chi2 * (1 + 1e-4)


def test_statuses_and_isolation():
    x, truths, y = simulate("dcos", 40, 0.05, seed=7)
    base = fr.run_fit("dcos", x, y)
    bad = y.copy()
    bad[3, 10] = np.nan                 # bad_input
    bad[7, :] = 0.25                    # constant: bad_input
    bad[20, 50] = np.inf                # bad_input
    w = np.ones_like(bad)
    w[11, 4:] = 0                       # 4 points left for 5 parameters: too_few
    w[12, 7] = -1                       # negative weight: bad_input
    res = fr.run_fit("dcos", x, bad, w=w)
    st = res["status"]
    assert st[3] == st[7] == st[20] == st[12] == ST["bad_input"]
    assert st[11] == ST["too_few"] and res["n_used"][11] == 4
    for i in (3, 7, 11, 12, 20):
        assert np.all(np.isnan(res["params"][i]))
    others = [i for i in range(40) if i not in (3, 7, 11, 12, 20)]
    for k in ("params", "errors", "chi2", "iters", "status"):
        assert np.array_equal(res[k][others], base[k][others]), k
    # max_iter: one pass allowed
    r1 = fr.run_fit("dcos", x, y[:4], extra=["--max-iter", "1"])
    assert np.all(r1["status"] == ST["max_iter"])
    # singular: no oscillation amplitude, so tau and f have no effect
    p0 = np.tile([0.0, 0.0, 4.0, 0.8, 0.2], (4, 1))
    for impl in ("cpu", "ref"):
        r2 = fr.run_fit("dcos", x, y[:4], p0=p0, impl=impl)
        assert np.all(r2["status"] == ST["singular"]), r2["status"]
    # a non-finite start is bad input
    p0 = np.tile([np.nan, 0.0, 4.0, 0.8, 0.2], (4, 1))
    assert np.all(fr.run_fit("dcos", x, y[:4], p0=p0)["status"] == ST["bad_input"])


def test_layouts_ranges_isas():
    x, truths, y = simulate("dcos", 37, 0.05, seed=8)
    a = fr.run_fit("dcos", x, y)
    for extra in (["--layout", "point"], ["--chunk", "5"]):
        b = fr.run_fit("dcos", x, y, extra=extra)
        for k in ("params", "errors", "chi2", "status", "iters"):
            assert np.array_equal(a[k], b[k]), (extra, k)
    c = fr.run_fit("dcos", np.tile(x, (37, 1)), y)
    assert np.allclose(c["params"], a["params"], rtol=0, atol=0.01 * np.nanmin(a["errors"]))
    ref = fr.run_fit("dcos", x, y, impl="ref")
    for isa in ("sse2", "avx2", "avx512"):
        r = fr.run_fit("dcos", x, y, extra=["--isa", isa])
        assert np.all(r["status"] == ref["status"])
        assert np.all(np.abs(r["params"] - ref["params"]) <= 0.02 * ref["errors"]), isa
        assert np.all(np.abs(r["errors"] - ref["errors"]) <= 1e-3 * ref["errors"]), isa
