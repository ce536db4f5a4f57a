"""The Python client (tools/python/beamd_client) against real sockets and a
real daemon: every dtype and shape the protocol allows round-trips through
Publisher -> Subscriber; results from beamd arrive as numpy arrays with
their descriptors; Control drives the control endpoint; ReplayServer feeds
beamd's replay input losslessly; LivePlot picks its view from descriptors;
g2_with_lags joins an xpcs_multitau stage's g2 with its lag times and
to_xarray labels a result; the package installs with pip offline and
leaves its source tree as it was."""

import os
import subprocess
import sys

import numpy as np
import pytest
import zmq

from conftest import REPO, free_ports, make_config, roi_masks  # noqa: F401

from beamd import proto
from beamd_client import (Control, ControlError, Publisher, ReplayServer, Result, SeriesEvent,
                          Subscriber, g2_with_lags, to_xarray)

DTYPES = [d for d in proto.DTYPES if d != "none"]
SHAPES = [(7,), (1,), (3, 5), (1, 1), (2, 3, 4), (2, 1, 3, 2), (33, 17)]


def _array(rng, dtype, shape):
    dt = np.dtype(dtype)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind == "f":
        a = rng.standard_normal(shape).astype(dt)
        a.flat[0] = np.inf if a.size > 1 else a.flat[0]
        return a
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    a.flat[0] = info.max
    return a


@pytest.mark.parametrize("codec", ["raw", "lz4", "bslz4"])
def test_every_dtype_and_shape_round_trips(zctx, codec):
    rng = np.random.default_rng(7)
    port, = free_ports(1)
    ep = "tcp://127.0.0.1:%d" % port
    sent = []
    with Subscriber(ep, pull=True, context=zctx) as sub:
        # beamd-style: the subscriber's PULL connects, the publisher binds.
        pub = Publisher(ep, kind="push", context=zctx)
        try:
            for dt in DTYPES:
                for shape in SHAPES:
                    a = _array(rng, dt, shape)
                    parts = proto.encode_message(proto.RESULT, array=a, topic="t.%s" % dt,
                                                 series_id=3, frame_id=len(sent), codec=codec,
                                                 flags=proto.FLAG_PARTIAL,
                                                 meta={"stage": "t", "output": dt, "dtype": dt,
                                                       "shape": list(shape), "units": "u",
                                                       "axes": ["a%d" % i for i in range(len(shape))]})
                    pub.sock.send_multipart(parts)
                    sent.append(a)
            got = list(sub.results(timeout=5, count=len(sent)))
        finally:
            pub.close()
    assert len(got) == len(sent)
    for i, (a, r) in enumerate(zip(sent, got)):
        assert isinstance(r, Result) and r.frame_id == i and r.series_id == 3
        assert r.array.dtype == a.dtype and r.array.shape == a.shape, r
        assert r.array.tobytes() == a.tobytes(), "frame %d (%s %s) differs" % (i, a.dtype, a.shape)
        assert r.partial and not r.final and r.stage == "t" and r.output == str(a.dtype)
        assert r.units == "u" and r.axes == ["a%d" % k for k in range(a.ndim)]


def test_malformed_messages_are_counted_not_raised(zctx):
    port, = free_ports(1)
    ep = "tcp://127.0.0.1:%d" % port
    with Subscriber(ep, pull=True, context=zctx) as sub:
        push = zctx.socket(zmq.PUSH)
        push.bind(ep)
        good = proto.encode_message(proto.RESULT, array=np.arange(4.0), topic="x.y")
        push.send_multipart([b"x.y", b"\x89BMD" + b"\0" * 10])
        push.send_multipart([b""])
        push.send_multipart(good)
        r = sub.recv(timeout=5)
        push.close(linger=0)
    assert r is not None and r.topic == "x.y" and r.array.tolist() == [0, 1, 2, 3]
    assert sub.malformed == 2 and sub.last_error


def _roi_stage():
    return [{"name": "vd", "kind": "roi_sum", "input": "frames", "backend": "cpu",
             "rois": [{"name": "all", "shape": "rect", "rect": [0, 0, 16, 16]},
                      {"name": "corner", "shape": "rect", "rect": [0, 0, 4, 4]}]}]


def test_results_control_and_publisher_against_beamd(ports, start_beamd, zctx):
    b = start_beamd(make_config(ports, _roi_stage(), mode="pull", push=True))
    frames = np.random.default_rng(1).integers(0, 1000, (20, 16, 16), dtype=np.uint16)
    with Subscriber(ports.ep_push, pull=True, series=True, context=zctx) as sub, \
            Publisher(ports.ep_input, kind="push", context=zctx) as pub, \
            Control(ports.ep_control, context=zctx) as ctl:
        assert ctl.ping()["ok"] is True
        assert pub.series(frames, series_id=9, meta={"frame_time": 0.001}) == 20
        items = list(sub.results(timeout=10, until_final=None, count=22))
        st = ctl.stats()
        vd = ctl.stage_stats("vd")
        with pytest.raises(ControlError, match="refused|error|unknown"):
            ctl.command("no-such-command")
    kinds = [i.kind if not isinstance(i, Result) else "result" for i in items]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("result") == 20
    res = [i for i in items if isinstance(i, Result)]
    assert [r.frame_id for r in res] == list(range(20))
    for r in res:
        assert r.topic == "vd.sums" and r.series_id == 9
        f = frames[r.frame_id].astype(np.float64)
        assert r.array.tolist() == [f.sum(), f[:4, :4].sum()]
    assert res[0].descriptor["stage"] == "vd" and res[0].axes == ["roi"]
    assert res[0].labels("roi") == ["all", "corner"]
    assert res[0].labels(0) == ["all", "corner"]
    assert items[0].meta.get("frame_time") == 0.001
    assert vd["frames_in"] == 20 and st["input"]["frames"] == 20


def test_unreachable_control_times_out_clearly(zctx):
    port, = free_ports(1)
    with Control("tcp://127.0.0.1:%d" % port, timeout=0.3, context=zctx) as ctl:
        with pytest.raises(ControlError, match="no reply .* within 0.3 s"):
            ctl.status()


def test_replay_server_feeds_beamd_losslessly(ports, start_beamd, zctx):
    cfg = make_config(ports, _roi_stage(), mode="replay", push=True, pool_frames=8)
    cfg["input"]["replay"] = {"credit": 4, "timeout": "2s"}
    frames = np.random.default_rng(2).integers(0, 60000, (57, 16, 16), dtype=np.uint16)
    with ReplayServer(ports.ep_input, frames, series_id=4, codec="bslz4",
                      meta={"energy": 8000.0}, context=zctx) as srv, \
            Subscriber(ports.ep_push, pull=True, context=zctx) as sub:
        b = start_beamd(cfg)
        res = list(sub.results(timeout=10, count=57))
        st = b.wait_stats(lambda s: s["input"]["frames"] == 57, what="57 frames in")
    assert sorted(r.frame_id for r in res) == list(range(57))
    for r in res:
        f = frames[r.frame_id].astype(np.float64)
        assert r.array[0] == f.sum() and r.series_id == 4
    assert srv.served == 57 and srv.requests >= 57 // 4
    assert st["input"]["replay"]["eof"] is True


def test_live_plot_chooses_views_from_descriptors():
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    from beamd_client.live import LivePlot, choose_view

    def res(topic, a, desc):
        h = proto.Header(type=proto.RESULT, series_id=1, frame_id=5, flags=proto.FLAG_FINAL)
        return Result(topic, h, a, desc, 0.0)

    g2 = res("g2.g2", np.ones((6, 3)) + np.linspace(1, 0, 6)[:, None],
             {"axes": ["lag", "roi"], "labels": ["q1", "q2", "q3"]})
    obj = res("dm.object", np.exp(1j * np.linspace(0, 3, 64)).reshape(8, 8), {"axes": ["y", "x"]})
    img = res("preview.frame", np.arange(64.0).reshape(8, 8), {"axes": ["y", "x"], "units": "counts"})
    assert [choose_view(r) for r in (g2, obj, img)] == ["curves", "complex", "image"]

    class FakeSub:
        def __init__(self, items):
            self.items = items

        def latest(self, timeout):
            return self.items

    lags = res("g2.lags", np.array([0, 1e-3, 2e-3, 3e-3, 4e-3, 6e-3]), {"units": "s"})
    lp = LivePlot(FakeSub({"g2.g2": g2, "g2.lags": lags}), "g2.g2")
    assert lp.update(0) is True
    ax = lp.fig.axes[0]
    assert ax.get_xscale() == "log" and len(ax.lines) == 3
    # lag 0 is dropped from the log axis; x is tau in seconds from g2.lags
    assert ax.lines[0].get_xdata().tolist() == [1e-3, 2e-3, 3e-3, 4e-3, 6e-3]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["q1", "q2", "q3"]
    lp2 = LivePlot(FakeSub({"dm.object": obj}), "dm.object")
    assert lp2.update(0) and len(lp2.fig.axes) == 4  # magnitude, phase + colour bars


def _tree(root):
    return sorted(os.path.relpath(os.path.join(d, n), root)
                  for d, dirs, names in os.walk(root) for n in dirs + names)


def test_pip_installs_offline(tmp_path):
    """From a copy of tools/python (so a failure cannot dirty the checkout):
    the install works offline and writes nothing into the source tree (no
    build/, no *.egg-info: tools/python/build_backend.py builds on a copy)."""
    import shutil
    src = tmp_path / "src"
    shutil.copytree(os.path.join(REPO, "tools", "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    before = _tree(src)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("pip is not installed")
    assert r.returncode == 0, r.stderr
    assert _tree(src) == before, sorted(set(_tree(src)) - set(before))
    assert sorted(os.listdir(target)) == ["beamd", "beamd_client", "beamd_client-1.0.0.dist-info"]
    code = ("import sys; sys.path.insert(0, %r); import beamd_client, beamd; "
            "print(beamd_client.__file__)" % str(target))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(tmp_path), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(target))


# ---- g2 with its lags, xarray ------------------------------------------------------

MT_LABELS = (2, 5, 9)
MT_LEVELS, MT_NB = 3, 4


def _multi_tau_lags(levels, nb):
    """skbeam.core.utils.multi_tau_lags, in frames."""
    lags = list(range(nb))
    for lev in range(1, levels):
        lags += [(nb // 2 + j) * 2 ** lev for j in range(nb // 2)]
    return np.array(lags, np.float64)


def _g2_series(tmp_path, ports, start_beamd, zctx, meta):
    lab = np.zeros((12, 10), np.int32)
    lab[:4], lab[4:8], lab[8:] = MT_LABELS
    np.save(tmp_path / "labels.npy", lab)
    st = {"name": "mt", "kind": "xpcs_multitau", "backend": "cpu", "levels": MT_LEVELS,
          "buffers": MT_NB, "publish_every": 0, "rois": {"file": str(tmp_path / "labels.npy")}}
    start_beamd(make_config(ports, [st], mode="pull", push=True))
    frames = np.random.default_rng(5).poisson(4.0, (40, 12, 10)).astype(np.uint16)
    out = []
    with Subscriber(ports.ep_push, pull=True, series=True, context=zctx) as sub, \
            Publisher(ports.ep_input, kind="push", context=zctx) as pub:
        pub.series(frames, series_id=3, meta=meta)
        for r in sub.results(timeout=10):
            if isinstance(r, SeriesEvent) and r.kind == "end":
                break
            if isinstance(r, Result):
                out.append(r)
    return out


def test_g2_with_lags_from_beamd(tmp_path, ports, start_beamd, zctx):
    res = _g2_series(tmp_path, ports, start_beamd, zctx, {"frame_time": 0.002})
    final = {r.topic: r for r in res if r.final}
    assert {"mt.g2", "mt.lags"} <= set(final), sorted(final)
    c = g2_with_lags(res)  # the newest per topic: the FINAL publish
    assert c.stage == "mt" and c.final and c.series_id == 3 and c.lag_units == "s"
    rows = final["mt.g2"].array.shape[0]
    assert rows == len(_multi_tau_lags(MT_LEVELS, MT_NB))
    np.testing.assert_allclose(c.lags, _multi_tau_lags(MT_LEVELS, MT_NB) * 0.002, rtol=1e-15)
    assert c.rois == list(MT_LABELS) and c.g2.shape == (rows, 3)
    curves = c.curves()
    assert list(curves) == list(MT_LABELS)
    for i, roi in enumerate(MT_LABELS):
        tau, g = curves[roi]
        assert tau is c.lags
        assert np.array_equal(g, final["mt.g2"].array[:, i])
    assert g2_with_lags(final, stage="mt").g2.tolist() == c.g2.tolist()


def test_g2_with_lags_in_frames_without_frame_time(tmp_path, ports, start_beamd, zctx):
    res = _g2_series(tmp_path, ports, start_beamd, zctx, {})
    c = g2_with_lags(res)
    assert c.lag_units == "frames"
    assert c.lags.tolist() == _multi_tau_lags(MT_LEVELS, MT_NB).tolist()
    s = g2_with_lags(res, frame_time=0.5)
    assert s.lag_units == "s" and s.lags.tolist() == (c.lags * 0.5).tolist()


def _res(topic, a, desc, frame_id=7, flags=proto.FLAG_FINAL):
    h = proto.Header(type=proto.RESULT, series_id=1, frame_id=frame_id, flags=flags)
    return Result(topic, h, np.asarray(a), desc, 0.0)


def test_g2_with_lags_refuses_what_does_not_fit():
    g2 = _res("a.g2", np.ones((3, 2)), {"axes": ["lag", "roi"], "labels": [4, 8]})
    lags = _res("a.lags", [0.0, 1.0, 2.0, 3.0], {"units": "s"})  # pairs rows: one more
    c = g2_with_lags({"a.g2": g2, "a.lags": lags})
    assert c.lags.tolist() == [0.0, 1.0, 2.0] and c.rois == [4, 8]
    t = g2_with_lags([_res("a.g2", np.ones((2, 3)), {"axes": ["roi", "lag"]}), lags])
    assert t.g2.shape == (3, 2) and t.rois == [0, 1]
    with pytest.raises(ValueError, match="different publishes"):
        g2_with_lags([g2, _res("a.lags", [0.0, 1.0, 2.0], {}, frame_id=6)])
    with pytest.raises(ValueError, match="no a.lags"):
        g2_with_lags([g2])
    with pytest.raises(ValueError, match="2 lags for 3 g2 rows"):
        g2_with_lags([g2, _res("a.lags", [0.0, 1.0], {})])
    with pytest.raises(ValueError, match="several stages"):
        g2_with_lags([g2, lags, _res("b.g2", np.ones((3, 2)), {})])
    with pytest.raises(ValueError, match="no <stage>.g2"):
        g2_with_lags([lags])


def test_to_xarray_labels_axes():
    xr = pytest.importorskip("xarray")
    r = _res("vd.sums", [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
             {"axes": ["t", "roi"], "labels": ["all", "corner"], "units": "counts"})
    d = to_xarray(r)
    assert isinstance(d, xr.DataArray) and d.dims == ("t", "roi") and d.name == "vd.sums"
    assert d.coords["roi"].values.tolist() == ["all", "corner"] and "t" not in d.coords
    assert d.sel(roi="corner").values.tolist() == [2.0, 4.0, 6.0]
    assert d.attrs["units"] == "counts" and d.attrs["final"] is True
    assert to_xarray(_res("x.y", np.zeros((2, 2, 2)), {})).dims == ("dim_0", "dim_1", "dim_2")
    g = g2_with_lags([_res("a.g2", [[1.5, 1.2], [1.1, 1.0]], {"axes": ["lag", "roi"],
                                                           "labels": [4, 8]}),
                      _res("a.lags", [0.0, 0.01], {"units": "s"})]).to_xarray()
    assert g.dims == ("lag", "roi") and g.sel(roi=8, lag=0.01).item() == 1.0
    assert g.attrs["lag_units"] == "s"


def test_to_xarray_without_xarray_says_what_to_install():
    code = ("import sys; sys.modules['xarray'] = None; sys.path.insert(0, %r); "
            "import numpy as np; from beamd_client import to_xarray\n"
            "try:\n    to_xarray(None)\nexcept ImportError as e:\n    print(e)"
            % os.path.join(REPO, "tools", "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "needs xarray" in r.stdout and "python3-xarray" in r.stdout
