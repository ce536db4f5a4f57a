"""beamd-replay marks frames BAD from its command line (--bad-frames) or
from a dataset of the file (--bad-dataset), and the daemon's stages treat
them as bad: the xpcs_multitau results through replay equal the numpy
reference of scikit-beam's closed form with the same frames bad (the one
test_xpcs_multitau.py checks the live path against), and its info output
counts them. Option errors name the option, the file and the dataset."""

import json
import os
import subprocess

import h5py
import numpy as np

from conftest import REPO, Receiver, proto
from test_daemon_replay import replay_config, start_replay
from test_xpcs_multitau import (FRAME_TIME, LEVELS, NB, _compare, _results, labels_image,
                                multitau_numpy)

H, W = 24, 20
N = 45


def make_file(path, rng, bad_ds=None):
    lam = rng.uniform(0.5, 6.0, size=(H, W))
    frames = rng.poisson(lam, size=(N, H, W)).astype(np.uint16)
    with h5py.File(path, "w") as f:
        f.create_dataset("/entry/data/data", data=frames, chunks=(1, H, W))
        t = f.create_dataset("/entry/instrument/detector/frame_time", data=FRAME_TIME)
        t.attrs["units"] = "s"
        if bad_ds is not None:
            f["/entry/data/bad"] = bad_ds
    return frames


def run(tmp_path, ports, zctx, start_beamd, receivers, run_tool, frames_bad, *args):
    rng = np.random.default_rng(77)
    lab = labels_image(rng)
    np.save(tmp_path / "labels.npy", lab)
    st = {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu",
          "rois": {"file": str(tmp_path / "labels.npy")}, "levels": LEVELS, "buffers": NB,
          "publish_every": 20, "intensities": True}
    b = start_beamd(replay_config(ports, [st], shm="off"))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    frames = make_file(tmp_path / "scan.h5", rng, bad_ds=frames_bad.get("dataset"))
    srv = start_replay(run_tool, ports, tmp_path / "scan.h5", *args, "--stats-json")
    sid = 1
    rx.wait_series_end(sid, timeout=20)
    rx.wait_for(lambda ms: any(m[0] == "mt.if" and m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=5, what="final mt.if")
    got = _results(rx, sid)
    bad = frames_bad["bad"]
    ref = multitau_numpy(frames, bad, lab, LEVELS, NB)
    _compare(got["final"], ref, N, int(bad.sum()))
    for k in (20, 40):
        _compare(got[k], multitau_numpy(frames[:k], bad[:k], lab, LEVELS, NB), k,
                 int(bad[:k].sum()))
    srv.p.send_signal(2)
    srv.p.wait(10)
    stats = json.loads(open(srv.out_path).read().strip().splitlines()[-1])
    assert stats["bad_served"] == int(bad.sum()), stats
    return b


def test_bad_frames_from_the_command_line(tmp_path, ports, zctx, start_beamd, receivers,
                                          run_tool):
    bad = np.zeros(N, bool)
    bad[[9, 33]] = True
    bad[40:43] = True
    run(tmp_path, ports, zctx, start_beamd, receivers, run_tool, {"bad": bad},
        "--bad-frames", "9,33,40-42")


def test_bad_frames_from_a_dataset_and_the_list(tmp_path, ports, zctx, start_beamd, receivers,
                                                run_tool):
    ds = np.zeros(N, bool)  # h5py bool: an enum over int8
    ds[[3, 17]] = True
    bad = ds.copy()
    bad[30] = True
    run(tmp_path, ports, zctx, start_beamd, receivers, run_tool, {"bad": bad, "dataset": ds},
        "--bad-dataset", "/entry/data/bad", "--bad-frames", "30")


def test_bad_frame_option_errors(tmp_path):
    rng = np.random.default_rng(1)
    make_file(tmp_path / "s.h5", rng, bad_ds=np.zeros(N - 1, np.uint8))
    exe = os.path.join(REPO, os.environ.get("BEAMD_BUILD", "build"), "beamd-replay")

    def fails(*args):
        r = subprocess.run([exe, str(tmp_path / "s.h5"), "--bind", "ipc://%s/x" % tmp_path] +
                           list(args), capture_output=True, text=True, timeout=20)
        assert r.returncode != 0
        return r.returncode, r.stderr

    rc, err = fails("--bad-frames", "3,x")
    assert rc == 1 and "--bad-frames 3,x: expected frame indices" in err, err
    rc, err = fails("--bad-frames", "7-2")
    assert "FIRST <= LAST" in err, err
    rc, err = fails("--bad-frames", "45")
    assert "frame 45 is past the file's last frame 44" in err, err
    rc, err = fails("--bad-dataset", "/entry/data/bad")
    assert "dataset /entry/data/bad: 44 values for 45 frames" in err and "s.h5" in err, err
    rc, err = fails("--bad-dataset", "/entry/nothing")
    assert "dataset /entry/nothing: no such dataset" in err, err
    rc, err = fails("--bad-dataset", "entry/data/bad")
    assert rc == 2, err
