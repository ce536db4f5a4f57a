"""numpy models of pipeline/fit.h and a runner for tests/tools/fit_run,
shared by test_fit_engine.py and bench/fit.py.

The formulas are written again here from docs/fit.md, independently of the
C code, so a wrong C model cannot hide behind its own reference."""
import os
import subprocess
import tempfile

import numpy as np

TWO_PI = 2 * np.pi


def _dcos1(x, a, b, tau, f):
    return np.exp(-x / tau) * (a * np.cos(TWO_PI * f * x) + b * np.sin(TWO_PI * f * x))


def _stretch(x, a, tau, beta, d):
    z = np.clip(x, 0, None) / tau
    return a * np.exp(-2 * z ** beta) + d


def _stretch_xt(x, a, tau, beta, d):
    z = 2 * np.clip(x, 0, None) / tau
    return a * np.exp(-(z ** beta)) + d


MODELS = {
    "dcos": (5, lambda x, a, b, tau, f, c: _dcos1(x, a, b, tau, f) + c),
    "dcos_t0": (6, lambda x, a, b, tau, f, c, t0: _dcos1(np.maximum(x - t0, 0), a, b, tau, f) + c),
    "dcos2": (9, lambda x, a1, b1, t1, f1, a2, b2, t2, f2, c:
              _dcos1(x, a1, b1, t1, f1) + _dcos1(x, a2, b2, t2, f2) + c),
    "exp": (3, lambda x, a, tau, d: a * np.exp(-2 * x / tau) + d),
    "stretch": (4, _stretch),
    "stretch_xt": (4, _stretch_xt),
    "exp2": (5, lambda x, a1, t1, a2, t2, d: a1 * np.exp(-2 * x / t1) + a2 * np.exp(-2 * x / t2) + d),
    "gauss": (5, lambda x, A, mu, s, c0, c1: A * np.exp(-0.5 * ((x - mu) / s) ** 2) + c0 + c1 * x),
    "lorentz": (5, lambda x, A, mu, g, c0, c1: A / (1 + ((x - mu) / g) ** 2) + c0 + c1 * x),
}
STATUS = ["converged", "bound", "max_iter", "singular", "bad_input", "too_few"]


def model_fn(name, degree=0):
    if name == "poly":
        return degree + 1, lambda x, *c: np.polyval(np.array(c[::-1]), x)
    return MODELS[name]


def build_dir():
    return os.environ.get("BEAMD_BUILD", "build")


def run_fit(model, x, y, w=None, p0=None, lo=None, hi=None, impl="cpu", estimator="lse",
            degree=0, extra=(), timeout=600):
    """Runs fit_run on y (N x T); x shared (T) or per fit (N x T). Returns a
    dict of the outputs plus 'seconds' and 'isa'."""
    exe = os.path.join(build_dir(), "tests", "tools", "fit_run")
    y = np.ascontiguousarray(y, dtype=np.float32)
    N, T = y.shape
    P = model_fn(model, degree)[0]
    with tempfile.TemporaryDirectory() as d:
        y.tofile(os.path.join(d, "y.f32"))
        x = np.asarray(x, dtype=np.float32)
        x.tofile(os.path.join(d, "x.f32"))
        args = [exe, "--in", d, "--out", d, "--model", model, "--fits", str(N), "--points",
                str(T), "--impl", impl, "--estimator", estimator, "--degree", str(degree)]
        if x.ndim == 2:
            args.append("--per-fit-x")
        if w is not None:
            np.asarray(w, dtype=np.float32).tofile(os.path.join(d, "w.f32"))
        if p0 is not None:
            np.asarray(p0, dtype=np.float64).reshape(N, P).tofile(os.path.join(d, "p0.f64"))
            args += ["--init", "given"]
        if lo is not None:
            np.asarray(lo, dtype=np.float64).tofile(os.path.join(d, "lo.f64"))
        if hi is not None:
            np.asarray(hi, dtype=np.float64).tofile(os.path.join(d, "hi.f64"))
        p = subprocess.run(args + list(extra), capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError("fit_run failed: " + p.stderr)
        out = dict(kv.split("=") for kv in p.stdout.split())
        r = {"seconds": float(out["seconds"]), "isa": out["isa"]}
        for name, dt, shape in (("params", "f8", (N, P)), ("errors", "f8", (N, P)),
                                ("cov", "f8", (N, P, P)), ("chi2", "f8", (N,)),
                                ("chi2_red", "f8", (N,)), ("iters", "i4", (N,)),
                                ("n_used", "i4", (N,)), ("status", "u1", (N,))):
            r[name] = np.fromfile(os.path.join(d, name + "." + dt.replace("f8", "f64")
                                               .replace("i4", "i32").replace("u1", "u8")),
                                  dtype=dt).reshape(shape)
        return r
