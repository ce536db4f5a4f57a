"""beamd-record's APS-8IDI XPCS layout (docs/recording.md, "XPCS results in
the APS layout"), checked with h5py.

Results of xpcs_multitau / xpcs_twotime stages are made in Python with the
descriptor shape beamd's graph emits (pipeline/graph.c describe_out: stage,
kind, output, dtype, shape, axes, units, per_frame, series_id, labels) and
fed to beamd-record; the files must then hold the paths pyXpcsViewer's
nexus reader opens (READER_PATHS below, from its aps_8idi key map, QMap
loader and XpcsFile.load_data) with the right shapes, dtypes and values.
One test runs the real daemon with xpcs_multitau into the recorder.
Every wait has a deadline.
"""
import h5py
import numpy as np
import pytest
import zmq

from conftest import Proc, binary, make_config, proto
from test_record import Feed, recorder, stats_of  # noqa: F401 (fixture)

LABELS = [3, 7, 12, 30]
FT = 0.01
META = {"detector": "sim", "frame_time": FT, "energy": 12000.0, "distance": 5.0,
        "pixel_size": [7.5e-5, 7.5e-5], "beam_center": [10.0, 12.0], "count_time": 0.009}
H, W = 24, 20

# What pyXpcsViewer (src/pyxpcsviewer/core/...) reads when it opens a
# multi-tau file; a missing one makes the open fail.
READER_PATHS = [
    "/entry/instrument/bluesky/metadata",  # ftype_utils.isNeXusFile
    "/xpcs/qmap/dynamic_v_list_dim0", "/xpcs/qmap/static_v_list_dim0",
    "/xpcs/qmap/dynamic_v_list_dim1", "/xpcs/qmap/static_v_list_dim1",
    "/xpcs/qmap/beam_center_x", "/xpcs/qmap/beam_center_y",
    "/xpcs/qmap/detector_distance", "/xpcs/qmap/pixel_size",
    "/xpcs/qmap/static_index_mapping", "/xpcs/qmap/dynamic_index_mapping",
    "/xpcs/qmap/static_num_pts", "/xpcs/qmap/dynamic_num_pts",
    "/xpcs/qmap/map_names", "/xpcs/qmap/map_units",
    "/entry/instrument/incident_beam/incident_energy",
    "/xpcs/temporal_mean/scattering_1d", "/xpcs/temporal_mean/scattering_1d_segments",
    "/xpcs/spatial_mean/intensity_vs_time",
    "/entry/instrument/detector_1/frame_time", "/entry/instrument/detector_1/count_time",
    "/entry/start_time",
    "/xpcs/multitau/delay_list", "/xpcs/multitau/normalized_g2",
    "/xpcs/multitau/normalized_g2_err",
    "/xpcs/multitau/config/stride_frame", "/xpcs/multitau/config/avg_frame",
]
QMAP_PATHS = ["/xpcs/qmap/mask", "/xpcs/qmap/dynamic_roi_map", "/xpcs/qmap/static_roi_map"]


def desc(stage, kind, output, dtype, shape, axes, units="", labels=LABELS, sid=1):
    d = {"stage": stage, "kind": kind, "output": output, "dtype": dtype, "shape": list(shape),
         "axes": list(axes), "units": units, "per_frame": False, "series_id": sid}
    if labels is not None:
        d["labels"] = list(labels)
    return d


def lag_steps(levels, nb):
    lags = list(range(nb))
    for lev in range(1, levels):
        lags += [(nb // 2 + j) * 2 ** lev for j in range(nb // 2)]
    return np.array(lags, np.float64)


def send_multitau(feed, sid, fid, g2, lags_s, flags, info_frames, stage="mt", err=None,
                  with_desc=True, lag_units="s", labels=LABELS):
    rows, R = g2.shape
    nl = len(lags_s)

    def d(output, dtype, shape, axes, units="", labels=labels):
        return desc(stage, "xpcs_multitau", output, dtype, shape, axes, units, labels, sid)
    d = d if with_desc else None
    feed.result(stage + ".info", sid, fid,
                np.array([info_frames, 0, rows, nl, -1, -1], np.int64),
                d("info", "int64", [6], ["field"],
                  labels=["frames", "bad_frames", "rows", "nlags", "dark_label", "dark_row"])
                if d else None, flags=flags)
    feed.result(stage + ".g2", sid, fid, g2,
                d("g2", "float64", [nl, R], ["lag", "roi"]) if d else None, flags=flags)
    feed.result(stage + ".lags", sid, fid, lags_s[:rows],
                d("lags", "float64", [nl], ["lag"], units=lag_units, labels=None) if d else None,
                flags=flags)
    if err is not None:
        feed.result(stage + ".g2_err", sid, fid, err,
                    d("g2_err", "float64", [nl, R], ["lag", "roi"]) if d else None, flags=flags)


def write_labels(path):
    rng = np.random.default_rng(3)
    lab = rng.choice(np.array([0] + LABELS, np.int32), size=(H, W))
    for k, v in enumerate(LABELS):
        lab[0, k] = v
    with h5py.File(path, "w") as f:
        f["/qmap/labels"] = lab
    return lab


def finish(p, feed, sid, out):
    feed.end(sid)
    assert p.wait(20) == 0, p.stderr()
    return out / ("series_%d.h5" % sid)


def test_multitau_aps_layout(tmp_path, zctx, recorder):
    lab = write_labels(tmp_path / "labels.h5")
    feed = Feed(zctx)
    # SWMR starts after the first result: the layout must still be written.
    p = recorder(feed, "--series", "1", "--timeout", "15", "--swmr-after", "1",
                 "--xpcs-qmap", str(tmp_path / "labels.h5") + ":/qmap/labels")
    sid = 5
    feed.start(sid, meta=META, shape=(H, W))
    lags = lag_steps(4, 6) * FT
    rng = np.random.default_rng(1)
    g2p = 1 + rng.random((9, 4))
    send_multitau(feed, sid, 19, g2p, lags, proto.FLAG_PARTIAL, 20)
    g2 = 1 + rng.random((13, 4))
    err = rng.random((13, 4)) * 0.01
    send_multitau(feed, sid, 44, g2, lags, proto.FLAG_FINAL, 45, err=err)
    # a replayed partial after the final changes nothing
    send_multitau(feed, sid, 39, g2p, lags, proto.FLAG_PARTIAL, 40, with_desc=False)
    path = finish(p, feed, sid, p.out_dir)
    with h5py.File(path, "r") as f:
        for k in READER_PATHS + QMAP_PATHS:
            assert k in f, k
        x = f["/xpcs"]
        assert x.attrs["source_stage"] == "mt" and x.attrs["analysis"] == "xpcs_multitau"
        assert bool(x.attrs["final"])
        g = f["/xpcs/multitau/normalized_g2"]
        assert g.dtype == np.float64 and g.shape == (12, 4)  # lag 0 left out
        np.testing.assert_array_equal(g[()], g2[1:])
        np.testing.assert_array_equal(f["/xpcs/multitau/normalized_g2_err"][()], err[1:])
        dl = f["/xpcs/multitau/delay_list"]
        assert dl.shape == (12,) and dl.attrs["units"] == "frames"
        np.testing.assert_allclose(dl[()], lag_steps(4, 6)[1:13], rtol=1e-12)
        assert f["/xpcs/multitau/config/stride_frame"][()] == 1
        assert f["/xpcs/multitau/config/avg_frame"][()] == 1
        # the viewer's t_el = delay_list * frame_time * stride * avg
        t0 = f["/entry/instrument/detector_1/frame_time"][()]
        np.testing.assert_allclose(dl[()] * t0, lags[1:13], rtol=1e-12)
        assert f["/entry/instrument/incident_beam/incident_energy"][()] == 12.0
        assert f["/entry/instrument/detector_1/count_time"][()] == 0.009
        assert f["/entry/instrument/detector_1/x_pixel_size"][()] == 7.5e-5
        assert f["/xpcs/qmap/detector_distance"][()] == 5.0
        assert f["/xpcs/qmap/pixel_size"][()] == 7.5e-5
        assert f["/xpcs/qmap/beam_center_x"][()] == 10.0
        assert f["/xpcs/qmap/beam_center_y"][()] == 12.0
        # q-map: APS numbering (column k of g2 <-> pixel value k+1)
        dq = f["/xpcs/qmap/dynamic_roi_map"][()]
        assert dq.shape == (H, W) and dq.dtype == np.int32
        ref = np.zeros((H, W), np.int32)
        for k, v in enumerate(LABELS):
            ref[lab == v] = k + 1
        np.testing.assert_array_equal(dq, ref)
        np.testing.assert_array_equal(f["/xpcs/qmap/mask"][()], (lab > 0).astype(np.uint8))
        np.testing.assert_array_equal(f["/xpcs/qmap/dynamic_v_list_dim0"][()], LABELS)
        np.testing.assert_array_equal(f["/xpcs/qmap/dynamic_num_pts"][()], [4, 1])
        np.testing.assert_array_equal(f["/xpcs/qmap/dynamic_index_mapping"][()], np.arange(4))
        assert [s.decode() for s in f["/xpcs/qmap/map_names"][()]] == ["roi", "none"]
        assert f["/xpcs/qmap"].attrs["hash"]
        # required by the readers, not computed by beamd: NaN and listed
        missing = set(x.attrs["beamd_unavailable"])
        assert missing == {"/xpcs/temporal_mean/scattering_1d",
                           "/xpcs/temporal_mean/scattering_1d_segments",
                           "/xpcs/spatial_mean/intensity_vs_time",
                           "/xpcs/temporal_mean/scattering_2d"}
        assert np.isnan(f["/xpcs/temporal_mean/scattering_1d"][()]).all()
        assert f["/xpcs/temporal_mean/scattering_1d"].shape == (1, 4)
        assert f["/xpcs/spatial_mean/intensity_vs_time"].shape == (2, 45)
        # the generic layout is still there and keeps every g2 as it came,
        # 9 rows, the final 13, the replayed partial 9 again
        # (docs/recording.md, "Results whose shape changes")
        r = f["/results/mt.g2"]
        assert r["data"].shape == (3, 13, 4)
        assert r["data"].maxshape == (None, len(lags), 4)  # the declared shape
        np.testing.assert_array_equal(r["shape"][()], [[9, 4], [13, 4], [9, 4]])
        np.testing.assert_array_equal(r["data"][0, :9], g2p)
        assert np.isnan(r["data"][0, 9:]).all()
        np.testing.assert_array_equal(r["data"][1], g2)
        np.testing.assert_array_equal(r["data"][2, :9], g2p)
        assert r.attrs["mismatched_skipped"] == 0 and r.attrs["reshaped"] == 1
        assert bool(f["/entry"].attrs["complete"])


def test_without_qmap_or_metadata(tmp_path, zctx, recorder):
    """Late subscriber (no SERIES_START) and no --xpcs-qmap: what cannot be
    had is NaN or absent, and listed; lags in frames are taken as they are."""
    feed = Feed(zctx)
    p = recorder(feed, "--series", "1", "--timeout", "15")
    sid = 6
    g2 = 1 + np.arange(10, dtype=np.float64).reshape(5, 2)
    lags = np.array([0, 1, 2, 3, 4], np.float64)
    send_multitau(feed, sid, 9, g2, lags, proto.FLAG_FINAL, 10, lag_units="frames", labels=[4, 8])
    path = finish(p, feed, sid, p.out_dir)
    with h5py.File(path, "r") as f:
        for k in QMAP_PATHS:
            assert k not in f, k
        missing = set(f["/xpcs"].attrs["beamd_unavailable"])
        assert set(QMAP_PATHS) <= missing
        assert "/xpcs/multitau/normalized_g2_err" in missing
        assert "/entry/instrument/incident_beam/incident_energy" in missing
        assert np.isnan(f["/xpcs/multitau/normalized_g2_err"][()]).all()
        assert np.isnan(f["/entry/instrument/detector_1/frame_time"][()])
        np.testing.assert_array_equal(f["/xpcs/multitau/normalized_g2"][()], g2[1:])
        np.testing.assert_array_equal(f["/xpcs/multitau/delay_list"][()], [1, 2, 3, 4])
        np.testing.assert_array_equal(f["/xpcs/qmap/dynamic_v_list_dim0"][()], [4, 8])
        assert bool(f["/series"].attrs["metadata_missing"])


def test_layout_none_and_other_kinds(tmp_path, zctx, recorder):
    feed = Feed(zctx)
    p = recorder(feed, "--series", "1", "--timeout", "15", "--xpcs-layout", "none")
    sid = 7
    feed.start(sid, meta=META, shape=(H, W))
    send_multitau(feed, sid, 9, np.ones((3, 4)), lag_steps(2, 4) * FT, proto.FLAG_FINAL, 10)
    path = finish(p, feed, sid, p.out_dir)
    with h5py.File(path, "r") as f:
        assert "/xpcs" not in f and "/entry/instrument" not in f
        assert f["/results/mt.g2/data"].shape == (1, 3, 4)
    # a non-xpcs kind with the same output names gets no APS layout
    feed2 = Feed(zctx)
    p = recorder(feed2, "--series", "1", "--timeout", "15")
    feed2.start(8, meta=META, shape=(H, W))
    feed2.result("vd.g2", 8, 0, np.ones((3, 4)),
                 desc("vd", "roi_sum", "g2", "float64", [3, 4], ["lag", "roi"], sid=8),
                 flags=proto.FLAG_FINAL)
    feed2.result("vd.lags", 8, 0, np.ones(3),
                 desc("vd", "roi_sum", "lags", "float64", [3], ["lag"], sid=8),
                 flags=proto.FLAG_FINAL)
    path = finish(p, feed2, 8, p.out_dir)
    with h5py.File(path, "r") as f:
        assert "/xpcs" not in f


def test_twotime_aps_layout(tmp_path, zctx, recorder):
    feed = Feed(zctx)
    p = recorder(feed, "--series", "1", "--timeout", "15")
    sid, R, T = 9, 2, 6
    feed.start(sid, meta=META, shape=(H, W))
    rng = np.random.default_rng(4)
    c2 = rng.random((R, T, T)).astype(np.float32)
    c2 = (c2 + c2.transpose(0, 2, 1)) / 2  # C(t1, t2) is symmetric
    g2 = 1 + rng.random((T, R))
    lags = np.arange(T) * FT
    d = lambda *a, **k: desc("tt", "xpcs_twotime", *a, labels=[5, 9], sid=sid, **k)  # noqa: E731
    feed.result("tt.c2", sid, 5, c2, d("c2", "float32", [R, T, T], ["roi", "t1", "t2"]),
                flags=proto.FLAG_FINAL)
    feed.result("tt.g2", sid, 5, g2, d("g2", "float64", [T, R], ["lag", "roi"]),
                flags=proto.FLAG_FINAL)
    feed.result("tt.lags", sid, 5, lags, d("lags", "float64", [T], ["lag"], units="s"),
                flags=proto.FLAG_FINAL)
    path = finish(p, feed, sid, p.out_dir)
    with h5py.File(path, "r") as f:
        assert f["/xpcs"].attrs["analysis"] == "xpcs_twotime"
        cm = f["/xpcs/twotime/correlation_map"]
        assert sorted(cm) == ["c2_00001", "c2_00002"]
        for r in range(R):
            half = cm["c2_%05d" % (r + 1)][()]
            assert half.shape == (T, T)
            assert not np.tril(half, -1).any()
            # how pyXpcsViewer's twotime_utils.read_single_c2 rebuilds it
            full = half + half.T
            full[np.diag_indices(T)] /= 2
            np.testing.assert_allclose(full, c2[r], rtol=1e-6)
        np.testing.assert_array_equal(f["/xpcs/twotime/processed_bins"][()], [1, 2])
        np.testing.assert_array_equal(f["/xpcs/twotime/normalized_g2"][()], g2)
        np.testing.assert_allclose(f["/xpcs/twotime/delay_list"][()], np.arange(T), atol=1e-12)
        np.testing.assert_array_equal(f["/xpcs/qmap/dynamic_v_list_dim0"][()], [5, 9])
        assert f["/xpcs/twotime/config/avg_frame"][()] == 1
        assert "/entry/instrument/bluesky/metadata" in f


def test_bad_qmap_option(tmp_path):
    import subprocess
    r = subprocess.run([binary("beamd-record"), "--dir", str(tmp_path), "--xpcs-qmap",
                        str(tmp_path / "nope.h5"), "--timeout", "1"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "nope.h5" in r.stderr and "No such file" in r.stderr
    r = subprocess.run([binary("beamd-record"), "--xpcs-layout", "nexus"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "xpcs-layout" in r.stderr


def test_daemon_multitau_end_to_end(tmp_path, ports, zctx, start_beamd, procs, receivers):
    """Real beamd (xpcs_multitau, lossless push output) -> beamd-record; the
    final g2 and lags are also taken from beamd's publish socket."""
    import json
    import time
    from conftest import Receiver, Sender
    lab = write_labels(tmp_path / "labels.h5")
    st = {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu",
          "rois": {"file": str(tmp_path / "labels.h5"), "dataset": "/qmap/labels"},
          "levels": 4, "buffers": 6, "publish_every": 20}
    start_beamd(make_config(ports, [st], mode="pull", pool_frames=64, push=True))
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    out = tmp_path / "rec"
    out.mkdir()
    p = Proc("beamd-record", [binary("beamd-record"), "--pull", "--connect", ports.ep_push,
                              "--dir", str(out), "--series", "1", "--timeout", "20",
                              "--stats-json", "--xpcs-qmap",
                              str(tmp_path / "labels.h5") + ":/qmap/labels"], tmp_path, procs)
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    rng = np.random.default_rng(8)
    n = 45
    frames = rng.poisson(rng.uniform(1, 5, (H, W)), size=(n, H, W)).astype(np.uint16)
    time.sleep(0.5)  # the recorder's PULL connects to beamd's PUSH
    sid = 11
    tx.start(sid, (H, W), np.uint16, meta=META)
    for k in range(n):
        tx.frame(sid, k, frames[k])
    tx.end(sid)
    assert p.wait(25) == 0, p.stderr()
    rx.wait_for(lambda ms: any(m[0] == "mt.lags" and m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=5, what="final mt.lags")
    fin = {t: a for t, h, a, m in rx.snapshot()
           if h.series_id == sid and h.flags & proto.FLAG_FINAL}
    g2, lags = fin["mt.g2"], fin["mt.lags"]
    assert lags[0] == 0 and len(lags) == g2.shape[0] > 2
    with h5py.File(out / ("series_%d.h5" % sid), "r") as f:
        for k in READER_PATHS + QMAP_PATHS:
            assert k in f, k
        dj = json.loads(f["/results/mt.g2/data"].attrs["descriptor_json"])
        assert dj["kind"] == "xpcs_multitau" and dj["labels"] == LABELS
        assert bool(f["/xpcs"].attrs["final"])
        np.testing.assert_array_equal(f["/xpcs/multitau/normalized_g2"][()], g2[1:])
        dl = f["/xpcs/multitau/delay_list"][()]
        np.testing.assert_allclose(dl * FT, lags[1:], rtol=1e-12)
        np.testing.assert_allclose(dl, lag_steps(4, 6)[1:len(lags)], rtol=1e-12)
        assert f["/xpcs/spatial_mean/intensity_vs_time"].shape == (2, n)
        ref = np.zeros((H, W), np.int32)
        for k, v in enumerate(LABELS):
            ref[lab == v] = k + 1
        np.testing.assert_array_equal(f["/xpcs/qmap/dynamic_roi_map"][()], ref)
    assert stats_of(p)["series_complete"] == 1
