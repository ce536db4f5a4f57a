"""End to end: a replayed NXmx file's pixel mask reaches the daemon as the
series' "pixel_mask" array (beamd-replay sends it as the SERIES_START
payload, PROTOCOL.md 7.1 and 13.5), so `mask: series` works on a replay as
on the live DECTRIS stream (test_series_geometry.py).

- a file with /entry/instrument/detector/pixel_mask replayed into roi_sum
  with `mask: series`: the masked hot pixel is in no sum (numpy over the
  unmasked pixels), while the same ROIs without the mask include it; the
  record stage writes the mask it received (uint32, the file's values, one
  above 16 bits sent as 2^16-1 with the uint16 frames), and replaying that
  recording gives the same masked sums again.
- a file without a mask, and one whose mask is not the frame shape: the
  series is refused by the stage with the reason logged (beamd-replay warns
  about the wrong shape and sends no mask).
- a server (a Python one) whose SERIES_START mask disagrees with its
  description, or whose payload part is short: the mask is refused,
  counted and logged with the reason, and the series still starts without
  it (the stage with `mask: series` refuses it, the one without sums every
  frame).
"""

import os
import re
import sys

import numpy as np

from conftest import REPO, Ports
import test_daemon_replay
from test_daemon_replay import (FakeServer, replay_config, start_recorder, start_replay,
                                wait_recorder)
from test_record_nxmx import rec_stage, wait_complete

sys.path.insert(0, os.path.join(REPO, "tools"))
import make_test_h5 as mk  # noqa: E402  (sets HDF5_PLUGIN_PATH before h5py loads)
import h5py  # noqa: E402

H, W = 40, 56
HOT = (12, 30)               # (y, x): inside the disk
CX, CY, R = 28.0, 14.0, 7.5
BIG = (3, 50)                # a mask value above 16 bits


def file_mask():
    mask = np.zeros((H, W), np.uint32)
    mask[HOT] = 8            # hot pixel (DECTRIS bit 3)
    mask[:, 9] = 1           # gap column
    mask[20, 4] = 2          # dead
    mask[BIG] = 1 << 31
    return mask


def write_file(path, n, mask=None, seed=4):
    data = mk.frames(n, (H, W), "uint16", seed)
    data[:, HOT[0], HOT[1]] = 60000 + np.arange(n)  # noisy, huge
    with h5py.File(path, "w") as f:
        mk._create(f, "/entry/data/data", data, "bslz4")
        if mask is not None:
            det = f.create_group("/entry/instrument/detector")
            det.attrs["NX_class"] = "NXdetector"
            det.create_dataset("pixel_mask", data=mask)
    return data


ROIS = [{"name": "bf", "shape": "disk", "center": [CX, CY], "radius": R},
        {"name": "all", "shape": "rect", "rect": [0, 0, W, H]}]


def stages(extra=()):
    return [{"name": "vs", "kind": "roi_sum", "backend": "cpu", "input": "frames",
             "mask": "series", "rois": ROIS},
            {"name": "vt", "kind": "roi_sum", "backend": "cpu", "input": "frames",
             "rois": ROIS}] + list(extra)


def replay_sums(tmp_path, start_beamd, run_tool, path, name, n, extra=()):
    """beamd-replay of path into a fresh daemon; beamd-record's vs and vt
    sums by frame id, and the daemon's replay counters."""
    ports = Ports()
    b = start_beamd(replay_config(ports, stages(extra)), name=name)
    out = tmp_path / ("results_" + name)
    rec = start_recorder(run_tool, ports, out)
    start_replay(run_tool, ports, path)
    wait_recorder(rec, b, 30)
    got = {}
    with h5py.File(str(out / "series_1.h5"), "r") as f:
        for st in ("vs", "vt"):
            g = f["/results/%s.sums" % st]
            got[st] = dict(zip(g["frame_id"][...].tolist(), g["data"][...]))
    rp = b.stats()["input"]["replay"]
    assert b.alive()
    return got, rp


def check_masked(got, data, mask):
    y, x = np.mgrid[0:H, 0:W]
    disk = (x - CX) ** 2 + (y - CY) ** 2 < R * R
    assert disk[HOT]
    good = mask == 0
    n = len(data)
    assert sorted(got["vs"]) == sorted(got["vt"]) == list(range(n))
    for k in range(n):
        f = data[k].astype(np.float64)
        vs, vt = got["vs"][k], got["vt"][k]
        assert vs[0] == f[disk & good].sum() and vs[1] == f[good].sum(), k
        assert vt[0] == f[disk].sum() and vt[1] == f.sum(), k
        assert vt[0] - vs[0] >= 60000  # the hot pixel is what the mask took out


def test_replayed_mask_used_and_recorded(tmp_path, start_beamd, run_tool):
    n = 6
    mask = file_mask()
    path = str(tmp_path / "masked.h5")
    data = write_file(path, n, mask)
    rec_dir = tmp_path / "rec"
    got, rp = replay_sums(tmp_path, start_beamd, run_tool, path, "first", n, [rec_stage(rec_dir)])
    check_masked(got, data, mask)
    assert rp["masks"] == 1 and rp["mask_refused"] == 0, rp

    recorded = str(rec_dir / "series_1.h5")
    wait_complete(recorded)
    sent = mask.copy()
    sent[BIG] = 65535  # what uint16 frames can carry: 2^16-1, still bad
    with h5py.File(recorded, "r") as f:
        pm = f["/entry/instrument/detector/pixel_mask"]
        assert pm.dtype == np.uint32 and np.array_equal(pm[...], sent)
        assert np.array_equal(f["/entry/data/data"][...], data)

    # beamd's own recording replayed: the same masked sums.
    again, rp2 = replay_sums(tmp_path, start_beamd, run_tool, recorded, "second", n)
    check_masked(again, data, mask)
    assert rp2["masks"] == 1, rp2


def test_replay_without_mask_refused(tmp_path, start_beamd, run_tool):
    for name, mask in (("none", None), ("shape", np.zeros((W, H), np.uint32))):
        ports = Ports()
        path = str(tmp_path / ("%s.h5" % name))
        write_file(path, 3, mask)
        b = start_beamd(replay_config(ports, stages()[:1]), name=name)
        srv = start_replay(run_tool, ports, path)
        b.wait_log(r'roi_sum: mask: series, but series 1 carries no "pixel_mask" array',
                   timeout=10)
        if mask is not None:
            assert "shape is not the frame shape [40, 56]" in srv.stderr()
        assert b.stats()["input"]["replay"]["masks"] == 0
        assert b.alive()


class MaskServer(FakeServer):
    """FakeServer whose SERIES_START carries a uint16 mask payload with the
    description `desc`, its payload part cut by `cut` bytes."""

    def __init__(self, zctx, ep, frames, desc, cut):
        self.desc, self.cut = desc, cut

        def inline(req, k, frame):
            k2 = min(len(frames), k + req["credit"])
            return k2, [p for i in range(k, k2) for p in frame(i)], {}

        super().__init__(zctx, ep, frames, inline)

    def _msg(self, kind, **kw):
        if kind != self.proto.SERIES_START:
            return super()._msg(kind, **kw)
        kw.pop("shape"), kw.pop("dtype")
        parts = super()._msg(kind, array=np.ones((H, W), np.uint16),
                             meta={"detector": "fake", "mask": self.desc}, **kw)
        if self.cut:
            parts[1] = parts[1][:-self.cut]
        return parts


def test_bad_mask_refused_series_goes_on(tmp_path, ports, zctx, start_beamd, run_tool):
    n = 5
    frames = mk.frames(n, (H, W), "uint16", 2)
    good = {"array": "pixel_mask", "dtype": "uint16", "shape": [H, W]}
    cases = [(dict(good, dtype="uint32"), 0, "a mask dtype that is not the frames' real dtype"),
             (good, 2, "a mask payload that is not one raw part of the frame size")]
    old = (test_daemon_replay.H, test_daemon_replay.W)
    test_daemon_replay.H, test_daemon_replay.W = H, W  # FakeServer's frame geometry
    try:
        for i, (desc, cut, why) in enumerate(cases):
            p = ports if i == 0 else Ports()
            srv = MaskServer(zctx, p.ep_input, frames, desc, cut)
            try:
                b = start_beamd(replay_config(p, stages()), name="bad%d" % i)
                out = tmp_path / ("results%d" % i)
                rec = start_recorder(run_tool, p, out)
                wait_recorder(rec, b, 20)
                b.wait_log(re.escape("replay: series 1: pixel mask refused: " + why), timeout=5)
                b.wait_log(r'roi_sum: mask: series, but series 1 carries no "pixel_mask" array',
                           timeout=5)
                rp = b.stats()["input"]["replay"]
                assert rp["mask_refused"] == 1 and rp["masks"] == 0, rp
                with h5py.File(str(out / "series_1.h5"), "r") as f:
                    g = f["/results/vt.sums"]
                    assert sorted(g["frame_id"][...].tolist()) == list(range(n))
                    assert "vs.sums" not in f["/results"]
                assert b.alive()
            finally:
                srv.close()
    finally:
        test_daemon_replay.H, test_daemon_replay.W = old
