#!/usr/bin/python3
"""Azimuthal integration figure (bench/README.md, "Azimuthal integration").

beamd's CPU `azint` stage driven through its ops ($BUILD/bench/azint_stage:
no graph, no socket) beside pyFAI's CSR integrator (integrate1d_ng,
method ("bbox", "csr", "cython"), error_model poisson, polarisation) on
the same geometry and frame size in the same run: 2167x2070 uint16
(4.5 Mpx), 1000 bins, bbox splitting; threads 1 and 2 on both sides
(pyFAI's OpenMP through OMP_NUM_THREADS, in a child process each).
frames/s is the median of --reps runs of --frames frames; the matrix
build (series start for beamd, the first call for pyFAI) is reported
apart. Noisy on a shared machine: compare the ratio, measured side by side.

    /usr/bin/python3 bench/azint.py [--build build] [--frames 5] [--reps 3] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys

H, W, NPT = 2167, 2070, 1000

PYFAI = r"""
import json, sys, time
import numpy as np
from pyFAI.azimuthalIntegrator import AzimuthalIntegrator
from pyFAI.detectors import Detector
H, W, NPT, frames, reps = %d, %d, %d, %d, %d
det = Detector(172e-6, 172e-6, max_shape=(H, W))
ai = AzimuthalIntegrator(dist=0.3, poni1=0.45 * H * 172e-6, poni2=0.52 * W * 172e-6, rot1=0.01,
                         rot2=0.02, rot3=0, wavelength=1e-10, detector=det)
rng = np.random.default_rng(7)
bank = [rng.integers(100, 1124, size=(H, W)).astype(np.uint16) for _ in range(2)]
kw = dict(method=("bbox", "csr", "cython"), unit="q_nm^-1", error_model="poisson",
          polarization_factor=0.99)
t0 = time.perf_counter()
ai.integrate1d_ng(bank[0], NPT, **kw)
build = time.perf_counter() - t0
fps = []
for r in range(reps):
    a = time.perf_counter()
    for i in range(frames):
        ai.integrate1d_ng(bank[i %% 2], NPT, **kw)
    fps.append(frames / (time.perf_counter() - a))
fps.sort()
print(json.dumps({"build_s": build, "fps_median": fps[len(fps) // 2], "fps_all": fps}))
"""


def beamd_case(build, threads, frames, reps, split="bbox"):
    exe = os.path.join(build, "bench", "azint_stage")
    p = subprocess.run([exe, "--h", str(H), "--w", str(W), "--npt", str(NPT), "--split", split,
                        "--threads", str(threads), "--frames", str(frames), "--reps", str(reps)],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("azint_stage failed: " + p.stderr.strip())
    return json.loads(p.stdout.strip().splitlines()[-1])


def pyfai_case(threads, frames, reps):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, "-c", PYFAI % (H, W, NPT, frames, reps)],
                       capture_output=True, text=True, timeout=300, env=env)
    if p.returncode != 0:
        raise RuntimeError("pyFAI case failed: " + p.stderr.strip()[-400:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(build, frames=5, reps=3, log=print):
    try:
        import pyFAI  # noqa: F401
        have_pyfai = True
    except ImportError:
        have_pyfai = False
        log("  pyFAI is not importable: beamd figures only")
    rows = []
    for th in (1, 2):
        b = beamd_case(build, th, frames, reps)
        row = {"threads": th, "beamd": b}
        msg = "  %dx%d uint16, %d bins, bbox, threads %d: beamd %6.1f frames/s (CSR build %.2f s)" % (
            H, W, NPT, th, b["fps_median"], b["build_s"])
        if have_pyfai:
            f = pyfai_case(th, frames, reps)
            row["pyfai"] = f
            row["ratio"] = b["fps_median"] / f["fps_median"]
            msg += ", pyFAI csr %6.1f frames/s (first call %.2f s): %.2fx" % (
                f["fps_median"], f["build_s"], row["ratio"])
        log(msg)
        rows.append(row)
    nb = beamd_case(build, 1, frames, reps, split="none")
    log("  split none, threads 1: beamd %6.1f frames/s" % nb["fps_median"])
    return {"cases": rows, "none_threads1": nb, "load1": os.getloadavg()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BEAMD_BUILD", "build"))
    ap.add_argument("--frames", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = run(a.build, a.frames, a.reps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
