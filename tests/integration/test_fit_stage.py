"""The `fit` stage through the daemon: source result on xpcs_multitau's g2
(beamd-sim --pattern xpcs, known relaxation rate per ring), and config
errors refused at file:line:col.

g2 fit: xpcs_multitau (per_pixel, so g2_err exists) publishes g2 [lag][roi],
g2_err and lags (s); the fit stage reads all three (input:
mt.g2+g2_err+lags), fits model exp, a exp(-2x/tau) + d, with w = 1/g2_err^2
over lags > 0. The simulator's g2 - 1 = beta exp(-2 rate t), so 1/tau must
recover each ring's rate: within 10 % (test_sim_xpcs.py's direct estimate
holds 8 % on 2000 frames; here 1500), a within 0.1 of beta = 1, every
status converged or bound."""
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "python"))
from conftest import Proc, Receiver, make_config, to_yaml, binary  # noqa: E402
from beamd import proto  # noqa: E402

BUILD = os.environ.get("BEAMD_BUILD", "build")
SIM = os.path.join(BUILD, "beamd-sim")
RATE_MIN, RATE_MAX, RINGS, DT = 20.0, 200.0, 4, 0.001


def g2fit_stages(lab, rings=RINGS):
    """xpcs_multitau -> fit (source result, exp on g2 vs lags, g2_err as
    weights) on beamd-sim's xpcs ring labels, written to lab first: the
    label file must exist when the config is loaded."""
    subprocess.run([SIM, "--bind", "tcp://127.0.0.1:1", "--frames", "2", "--pattern", "xpcs",
                    "--shape", "128x128", "--xpcs-rings", str(rings), "--label-file", str(lab),
                    "--wait-subs", "0", "--quiet", "--rate", "1000"], timeout=20)
    assert lab.exists()
    return [
        {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu", "rois": {"file": str(lab)},
         "levels": 6, "buffers": 16, "normalization": "per_pixel", "publish_every": 100000},
        {"name": "g2fit", "kind": "fit", "backend": "cpu", "source": "result",
         "input": "mt.g2+g2_err+lags", "model": "exp", "x": "lags", "weights": "g2_err",
         "range": [1e-6, 1e9], "bounds": {"tau": [0, "inf"]}},
    ]


def test_g2_fit_recovers_ring_rates(tmp_path, ports, zctx, start_beamd, receivers, procs):
    lab = tmp_path / "labels.npy"
    args = ["--pattern", "xpcs", "--shape", "128x128", "--frames", "1500", "--mean", "20",
            "--xpcs-rings", str(RINGS), "--xpcs-rate-min", str(RATE_MIN), "--xpcs-rate-max",
            str(RATE_MAX), "--frame-time", str(DT), "--seed", "1", "--label-file", str(lab)]
    stages = g2fit_stages(lab)
    start_beamd(make_config(ports, stages, mode="pull", pool_frames=64, out_hwm=100000))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    sim = Proc("beamd-sim", [SIM, "--bind", ports.ep_input, "--socket", "push", "--quiet",
                             "--series-id", "3"] + args, tmp_path, procs)
    assert sim.wait(60) == 0, sim.stderr()
    rx.wait_series_end(3, timeout=60)
    rx.wait_for(lambda ms: any(m[0] == "g2fit.curves" and m[1].flags & proto.FLAG_FINAL
                               for m in ms), timeout=20, what="final g2fit.curves")
    res = {t[6:]: (h, a) for t, h, a, _ in rx.snapshot()
           if t.startswith("g2fit.") and h.flags & proto.FLAG_FINAL and h.series_id == 3}
    params, status = res["params"][1], res["status"][1]
    assert params.shape == (RINGS, 3) and status.shape == (RINGS,)
    assert set(status.tolist()) <= {0, 1}, status
    rates = 1.0 / params[:, 1]
    want = RATE_MIN * (RATE_MAX / RATE_MIN) ** (np.arange(RINGS) / (RINGS - 1))
    print("fitted rates", rates, "truth", want, "contrast", params[:, 0])
    np.testing.assert_allclose(rates, want, rtol=0.10)
    np.testing.assert_allclose(params[:, 0], 1.0, atol=0.1)
    curves = res["curves"][1]
    assert curves.shape[1] == RINGS and np.isfinite(curves).all()


def check_config(tmp_path, ports, stage):
    cfg = make_config(ports, [stage])
    path = tmp_path / "bad.yaml"
    path.write_text(to_yaml(cfg))
    r = subprocess.run([binary("beamd"), "--check-config", str(path)], capture_output=True,
                       text=True, timeout=20)
    return r.returncode, r.stdout + r.stderr, str(path)


@pytest.mark.parametrize("extra,want", [
    ({"model": "dampedcos"}, "unknown model"),
    ({"model": "dcos", "bounds": {"tau": [0, "inf"], "omega": [0, 1]}},
     'model dcos has no parameter "omega"'),
    ({"model": "exp", "initial": {"a": 1, "tau": 1}}, "give every parameter"),
    ({"model": "dcos", "max_frames": 4096, "memory": "4Ki"}, "cannot hold even one pixel"),
])
def test_config_errors_at_file_line_col(tmp_path, ports, extra, want):
    st = {"name": "f", "kind": "fit", **extra}
    rc, out, path = check_config(tmp_path, ports, st)
    assert rc == 1, out
    assert want in out, out
    line = next(l for l in out.splitlines() if want in l)
    assert line.startswith(path + ":"), line
    assert line.split(":")[1].isdigit() and line.split(":")[2].isdigit(), line


def test_memory_limit_refuses_series(tmp_path, ports, zctx, start_beamd, receivers, procs):
    """A series whose trace buffer exceeds memory is refused with the place
    of `memory` in the config and the figure it needed."""
    st = {"name": "f", "kind": "fit", "backend": "cpu", "model": "dcos", "max_frames": 1000,
          "memory": "1Mi"}
    b = start_beamd(make_config(ports, [st], mode="pull", pool_frames=16))
    sim = Proc("beamd-sim", [SIM, "--bind", ports.ep_input, "--socket", "push", "--quiet",
                             "--frames", "4", "--shape", "64x64"], tmp_path, procs)
    assert sim.wait(30) == 0, sim.stderr()
    b.wait_log(r"memory 1048576 bytes is below", timeout=10)
