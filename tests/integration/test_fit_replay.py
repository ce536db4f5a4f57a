"""A pump-probe series through the daemon gives the maps beamd-fit gives on
the same data (issue 16: "a pump-probe series -> maps equal to beamd-fit's
on the same data").

One file, written by `beamd-sim --pattern pumpprobe --write-h5` (frames,
/entry/data/delay, truth maps), goes
- through beamd-fit (--x /entry/data/delay), and
- through beamd-replay (--meta-list /entry/data/delay puts the delays in the
  series metadata as "delay") into a daemon whose `fit` stages (source
  pixels) read x from that list (x: delay) or from each frame's scan
  position (x: pos_x; the file also holds /entry/sample/positions with the
  delays in the x column, so replay sets flag POS and pos[0] = delay), with
  beamd-record on the daemon's PUSH output recording the maps.

Same model (dcos), estimator (mle), automatic starts and max_iter (100):
the maps must be equal **bitwise** after beamd-fit's float64 maps are
rounded to the stage's float32 outputs. Both hand the engine the same
float32 [frame][pixel] traces (uint16 counts converted exactly) and the same
float32 x (the float64 delay rounded once: replay writes it into the JSON
with 17 digits, which round-trips; x_scale 1 and x_offset 0 change nothing;
the scan position is stored in metres and multiplied by 1.0), and the
engine's fits are SIMD lanes of 16-fit blocks that never mix, so neither the
tile nor the thread split changes a bit (docs/fit.md). Any difference would
be a real discrepancy between the two paths, not rounding.

The `every` preview: with every = 60, the PARTIAL maps published after frame
60 equal beamd-fit's maps of a file holding the first 60 frames only.

Every wait has a deadline.
"""
import json
import os

import h5py
import numpy as np
import pytest

from conftest import make_config, proto

H, W, N = 24, 24, 120
EVERY = 60
MEAN = 400.0
SERIES = 1  # beamd-replay's default --series-id
PARAMS = ["a", "b", "tau", "f", "c"]
FINAL, PARTIAL, INCOMPLETE = proto.FLAG_FINAL, proto.FLAG_PARTIAL, proto.FLAG_INCOMPLETE


def fit_stage(name, x, **kw):
    st = {"name": name, "kind": "fit", "input": "frames", "backend": "cpu", "source": "pixels",
          "model": "dcos", "x": x, "estimator": "mle", "max_iter": 100, "max_frames": 256,
          "threads": 2}
    st.update(kw)
    return st


def replay_config(ports, stages):
    cfg = make_config(ports, stages, mode="replay", push=True, pool_frames=32,
                      frame_bytes="1Mi")
    cfg["input"]["replay"] = {"credit": 16, "timeout": "2s"}
    return cfg


def write_scan(run_tool, path, truth):
    p = run_tool("beamd-sim", ["--pattern", "pumpprobe", "--shape", "%dx%d" % (H, W),
                               "--frames", str(N), "--mean", str(MEAN), "--pp-t0", "0",
                               "--pp-delay-min", "0", "--pp-delay-max", "9", "--seed", "5",
                               "--write-h5", str(path), "--pp-truth", str(truth), "--quiet"])
    assert p.wait(60) == 0, p.stderr()


def beamd_fit(run_tool, scan, out):
    p = run_tool("beamd-fit", [str(scan), "-o", str(out), "--model", "dcos", "--x",
                               "/entry/data/delay", "--estimator", "mle", "--max-iter", "100",
                               "--threads", "1", "--quiet"])
    assert p.wait(120) == 0, p.stderr()
    with h5py.File(str(out), "r") as f:
        g = f["/maps"]
        return {"params": np.stack([g[k][()] for k in PARAMS]),
                "errors": np.stack([g[k + "_err"][()] for k in PARAMS]),
                "chi2": g["chi2_red"][()], "status": g["status"][()]}


def recorded(path, stage):
    """{output: [(frame_id, flags, data)]} of one stage's topics."""
    out = {}
    with h5py.File(str(path), "r") as f:
        assert bool(f["/entry"].attrs["complete"]) is True
        for o in ("params", "errors", "chi2", "status"):
            g = f["/results/%s.%s" % (stage, o)]
            out[o] = list(zip(g["frame_id"][()].tolist(), g["flags"][()].tolist(), g["data"][()]))
    return out


def one(rows, want, absent=0):
    """The data of the only row whose flags have `want` and not `absent`."""
    got = [r for r in rows if r[1] & want and not r[1] & absent]
    assert len(got) == 1, [(fid, hex(fl)) for fid, fl, _ in rows]
    return got[0]


def check_equal(stage_maps, ref, what):
    """Bitwise: the stage's float32 maps are beamd-fit's float64 ones
    rounded to float32 (NaN == NaN)."""
    np.testing.assert_array_equal(stage_maps["status"], ref["status"], err_msg=what + " status")
    for k in ("params", "errors", "chi2"):
        a = stage_maps[k]
        b = ref[k].astype(np.float32)
        assert a.dtype == np.float32 and a.shape == b.shape, (what, k, a.dtype, a.shape)
        same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
        if not same.all():
            i = np.argwhere(~same)[:5].tolist()
            pytest.fail("%s %s: %d of %d values differ from beamd-fit's, first at %s: %r vs %r"
                        % (what, k, (~same).sum(), same.size, i,
                           [a[tuple(j)] for j in i], [b[tuple(j)] for j in i]))


def test_daemon_maps_equal_beamd_fit(tmp_path, ports, start_beamd, run_tool):
    scan, truth_npy = tmp_path / "scan.h5", tmp_path / "truth.npy"
    write_scan(run_tool, scan, truth_npy)
    with h5py.File(str(scan), "r+") as f:
        delay = f["/entry/data/delay"][()]
        assert f["/entry/data/delay"].attrs["units"] == "ps"
        assert f["/entry/data/data"].shape == (N, H, W)
        np.testing.assert_array_equal(f["/entry/truth/params"][()], np.load(str(truth_npy)))
        # The delays as scan positions too (x column, metres), for x: pos_x.
        pos = np.zeros((N, 2))
        pos[:, 0] = delay
        f["/entry/sample/positions"] = pos
        f["/entry/sample/positions"].attrs["units"] = "m"
        first = f["/entry/data/data"][:EVERY]
    # The first EVERY frames alone, for the preview.
    head = tmp_path / "head.h5"
    with h5py.File(str(head), "w") as f:
        f.create_dataset("/entry/data/data", data=first, chunks=(1, H, W))
        f["/entry/data/delay"] = delay[:EVERY]
    ref = beamd_fit(run_tool, scan, tmp_path / "maps.h5")
    ref_head = beamd_fit(run_tool, head, tmp_path / "maps_head.h5")
    assert (ref["status"] == 0).mean() > 0.95, np.bincount(ref["status"].ravel())

    stages = [fit_stage("pp", "delay", every=EVERY), fit_stage("pq", "pos_x")]
    b = start_beamd(replay_config(ports, stages))
    rec_dir = tmp_path / "rec"
    rec_dir.mkdir()
    rec = run_tool("beamd-record", ["--pull", "--connect", ports.ep_push, "--dir", str(rec_dir),
                                    "--no-swmr", "--series", "1", "--timeout", "60",
                                    "--stats-json"])
    srv = run_tool("beamd-replay", [str(scan), "--bind", ports.ep_input, "--quiet",
                                    "--meta-list", "/entry/data/delay"])
    rc = rec.wait(90)
    if rc != 0:
        st = b.stats() if b.alive() else "beamd exited with %s" % b.p.returncode
        pytest.fail("beamd-record exited %d: %s\nbeamd stats: %s" %
                    (rc, rec.stderr().strip(), json.dumps(st)))
    srv.kill()
    path = rec_dir / ("series_%d.h5" % SERIES)
    with h5py.File(str(path), "r") as f:
        meta = {k: f["/series"].attrs[k] for k in f["/series"].attrs}
    # the list replay carried, as the stage saw it
    assert "delay" in meta and meta["delay_units"] in ("ps", b"ps"), sorted(meta)

    for stage in ("pp", "pq"):
        rows = recorded(path, stage)
        fin = {k: one(v, FINAL) for k, v in rows.items()}
        assert all(r[0] == N - 1 for r in fin.values()), {k: r[0] for k, r in fin.items()}
        assert not any(r[1] & INCOMPLETE for r in fin.values())
        check_equal({k: r[2] for k, r in fin.items()}, ref, stage + " final")

    # every 60: previews after frames 60 and 120 (frame ids 59, 119). A map
    # comes from many frames: it never carries the scan position (flag POS)
    # of the frame that triggered it.
    rows = recorded(path, "pp")
    for k, v in rows.items():
        prev = sorted(r[0] for r in v if r[1] & PARTIAL)
        assert prev == [EVERY - 1, N - 1], (k, prev)
        assert not any(r[1] & proto.FLAG_POS for r in v), (k, [hex(r[1]) for r in v])
    pre = {k: next(r for r in v if r[1] & PARTIAL and r[0] == EVERY - 1)[2]
           for k, v in rows.items()}
    check_equal(pre, ref_head, "pp preview after %d frames" % EVERY)
    pre_last = {k: next(r for r in v if r[1] & PARTIAL and r[0] == N - 1)[2]
                for k, v in rows.items()}
    check_equal(pre_last, ref, "pp preview after %d frames" % N)


def test_replay_meta_list_errors(tmp_path, run_tool, ports):
    """--meta-list names a dataset of one number per frame; anything else
    stops beamd-replay at start-up (exit 1) naming file and dataset, and a
    bad option is a command-line error (exit 2)."""
    scan = tmp_path / "scan.h5"
    with h5py.File(str(scan), "w") as f:
        f.create_dataset("/entry/data/data", data=np.zeros((5, 4, 4), np.uint16))
        f["/entry/data/delay"] = np.arange(4.0)  # one short
        f["/entry/data/label"] = np.array([b"a"] * 5)
    for spec, why in (("/entry/data/delay", "expected one value per frame, 5 values"),
                      ("/entry/data/nope", "no such dataset"),
                      ("/entry/data/label", "not numbers")):
        p = run_tool("beamd-replay", [str(scan), "--bind", ports.ep_input, "--quiet",
                                      "--meta-list", spec])
        assert p.wait(20) == 1, p.stderr()
        assert why in p.stderr() and str(scan) in p.stderr(), p.stderr()
    for spec in ("entry/data/delay", "=/entry/data/delay"):
        p = run_tool("beamd-replay", [str(scan), "--meta-list", spec])
        assert p.wait(20) == 2, p.stderr()
