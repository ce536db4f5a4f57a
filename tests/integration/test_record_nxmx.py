"""The record stage writes NXmx: the detector metadata of the series, with
units, where NXmx readers (beamd-replay among them, docs/replay.md) look
for it. Round trips, each read back with h5py and through beamd-replay
into a second daemon whose own record stage shows the series metadata it
received:

- a DECTRIS stream v1 (header_detail "all": geometry, energy, times and
  the pixel mask) -> record -> file with /entry/definition NXmx, NX_class
  on every group, each field in its NXmx unit; beamd-replay of that file
  -> the daemon sees the same energy, distance, pixel size, beam centre,
  frame and count time, and a pixel_mask reference to a dataset equal to
  the detector's mask.
- an Eiger-style NXmx master replayed -> record -> beamd-replay: the same
  series metadata as the replay of the master itself.
"""

import json
import os
import sys
import time

import numpy as np
import pytest

from conftest import REPO, Ports
from test_daemon_dectris import H, W, Detector, dectris_config, v1_end, v1_header, v1_image
from test_daemon_replay import replay_config, start_replay

sys.path.insert(0, os.path.join(REPO, "tools"))
import make_test_h5 as mk  # noqa: E402  (sets HDF5_PLUGIN_PATH before h5py loads)
import h5py  # noqa: E402

GEOMETRY = ("detector", "energy", "distance", "pixel_size", "beam_center", "frame_time",
            "count_time")


def rec_stage(d):
    return {"name": "rec", "kind": "record", "input": "frames", "dir": str(d), "queue": 64}


def wait_complete(path, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            try:
                with h5py.File(path, "r") as f:
                    if bool(f["/entry"].attrs["complete"]):
                        return
            except OSError:
                pass
        time.sleep(0.05)
    pytest.fail("%s not complete within %d s (dir: %s)" %
                (path, timeout, sorted(os.listdir(os.path.dirname(path)))))


def series_meta(path):
    with h5py.File(path, "r") as f:
        v = f["/series"].attrs["metadata_json"]
    return json.loads(v.decode() if isinstance(v, bytes) else v)


def s(v):
    v = v[()] if hasattr(v, "shape") else v
    return v.decode() if isinstance(v, bytes) else v


def replayed_meta(tmp_path, start_beamd, run_tool, path, name):
    """beamd-replay of `path` into a fresh daemon that records it: the
    series metadata that daemon received, and its recording."""
    ports = Ports()
    out = tmp_path / name
    b = start_beamd(replay_config(ports, [rec_stage(out)]), name=name)
    start_replay(run_tool, ports, path)
    got = str(out / "series_1.h5")
    wait_complete(got)
    assert b.alive()
    return series_meta(got), got


def test_dectris_stream_round_trip(tmp_path, ports, zctx, start_beamd, run_tool):
    n = 5
    rng = np.random.default_rng(3)
    data = [rng.integers(0, 4000, size=(H, W)).astype(np.uint16) for _ in range(n)]
    mask = np.zeros((H, W), np.uint32)
    mask[:, 17] = 1   # gap
    mask[30, 5] = 2   # dead
    mask[2, 3] = 8    # hot
    b = start_beamd(dectris_config(ports, [rec_stage(tmp_path / "rec")]))
    det = Detector(zctx, ports.ep_input)
    det.send(v1_header(6, "all", n, mask=mask))
    for i, a in enumerate(data):
        det.send(v1_image(6, i, a))
    det.send(v1_end(6))
    path = str(tmp_path / "rec" / "series_6.h5")
    wait_complete(path)
    m1 = series_meta(path)
    assert m1["energy"] == 12400.0 and m1["beam_center"] == [24.25, 20.5]  # what v1_config says

    with h5py.File(path, "r") as f:
        assert s(f["/entry/definition"]) == "NXmx"
        for g, cls in (("/entry", "NXentry"), ("/entry/data", "NXdata"),
                       ("/entry/instrument", "NXinstrument"),
                       ("/entry/instrument/detector", "NXdetector"),
                       ("/entry/instrument/beam", "NXbeam")):
            assert s(f[g].attrs["NX_class"]) == cls, g
        d = f["/entry/instrument/detector"]
        for name, value, units in (("detector_distance", 0.125, "m"),
                                   ("x_pixel_size", 7.5e-05, "m"), ("y_pixel_size", 7.5e-05, "m"),
                                   ("beam_center_x", 20.5, "pixel"),
                                   ("beam_center_y", 24.25, "pixel"),
                                   ("count_time", 0.0009, "s"), ("frame_time", 0.001, "s")):
            assert d[name][()] == value and s(d[name].attrs["units"]) == units, name
        assert s(d["description"]) == m1["detector"]
        assert d["bit_depth_readout"][()] == 12  # the detector's, not the 16 of the images
        pm = d["pixel_mask"]
        assert pm.dtype == np.uint32 and np.array_equal(pm[...], mask)
        bm = f["/entry/instrument/beam"]
        assert bm["incident_energy"][()] == 12400.0 and s(bm["incident_energy"].attrs["units"]) == "eV"
        assert bm["incident_wavelength"][()] == pytest.approx(12398.419843320026 / 12400.0, rel=1e-14)
        assert s(bm["incident_wavelength"].attrs["units"]) == "angstrom"
        assert d["data"].id == f["/entry/data/data"].id  # one dataset, linked into the detector
        # what the record stage wrote before stays
        assert f["/entry/data/data"].shape == (n, H, W)
        assert f["/entry/data/frame_id"][...].tolist() == list(range(n))
        assert int(f["/entry"].attrs["series_id"]) == 6
        assert s(f["/entry"].attrs["writer"]) == "beamd record stage"

    m2, got = replayed_meta(tmp_path, start_beamd, run_tool, path, "replayed")
    for k in GEOMETRY:
        assert m2[k] == pytest.approx(m1[k], rel=1e-15), k
    ref = m2["pixel_mask"]
    assert ref["file"] == os.path.abspath(path)
    assert ref["dataset"] == "/entry/instrument/detector/pixel_mask"
    with h5py.File(ref["file"], "r") as f:
        assert np.array_equal(f[ref["dataset"]][...], mask)
    with h5py.File(got, "r") as f:
        for i in range(n):
            assert np.array_equal(f["/entry/data/data"][i], data[i]), i


def test_replayed_master_round_trip(tmp_path, start_beamd, run_tool):
    master, data, _ = mk.make_master(str(tmp_path / "eiger"), name="scan", nfiles=2, per_file=4,
                                     shape=(H, W), kind="bslz4")
    m1, first = replayed_meta(tmp_path, start_beamd, run_tool, master, "first")
    m = mk.MASTER_META
    assert m1["detector"] == m["detector"] and m1["beam_center"] == list(m["beam_center"])
    assert m1["distance"] == pytest.approx(m["distance_mm"] * 1e-3)
    m2, _ = replayed_meta(tmp_path, start_beamd, run_tool, first, "second")
    for k in GEOMETRY:
        assert m2[k] == pytest.approx(m1[k], rel=1e-15), k
    assert m2["nframes"] == m1["nframes"] == len(data)
