"""beamd-view: planes of 3-D results, physical image axes, histories, NaN, series.

Hand-made results from a synthetic publisher (test_view.Pub), drawn by
headless Chromium; the page's state is read back through window.beamdView
and checked against numpy, and canvas pixels are read where it matters:
- a 3-D float result [roi, y, x] with ROI labels: the plane select lists the
  labels, and the drawn plane (values and colours) follows the select and
  the slider; a complex [mode, y, x] stack: each mode's magnitude and phase;
- an image whose descriptor gives {origin, step, units} per axis (as
  ptycho_dm's object does): rulers in µm whose ticks sit where numpy puts
  those coordinates, drawn in the tick colour; an image of the series'
  scan_shape gets the series' scan_step; one without either has no rulers;
- an error history [iteration, metric] whose metrics include "iteration":
  the other metrics are drawn against that column's values (pixels at the
  expected x), with log y on demand;
- NaN in its own colour for every colour map, distinct from every entry of
  the map; the series list one line per series however often its start and
  end are resent.
Screenshots go to $BEAMD_ARTEFACTS (default BUILD/test-artefacts/view).
"""
import os
import time

import numpy as np
import pytest

from conftest import proto
from test_view import ARTEFACTS, Pub, View, wait_joined
from viewclient import Browser


@pytest.fixture
def pub(zctx):
    p = Pub(zctx)
    yield p
    p.close()


def browser():
    try:
        return Browser()
    except (FileNotFoundError, RuntimeError) as e:
        pytest.skip("headless chromium not usable here: %s" % e)


def d(topic, a, axes, labels=None, units=""):
    stage, output = topic.split(".")
    r = {"stage": stage, "output": output, "dtype": str(a.dtype), "shape": list(a.shape),
         "units": units, "axes": axes}
    if labels is not None:
        r["labels"] = labels
    return r


def nan_list(v):
    return np.array([np.nan if x is None else x for x in v], np.float32)


OFF_PX = """(() => { const p = beamdView.panels.get(%r);
    const d = p.off.getContext('2d').getImageData(0, 0, p.img.w, p.img.h).data;
    const px = []; for (let i = 0; i < d.length; i += 4) px.push([d[i], d[i+1], d[i+2]]);
    return {w: p.img.w, h: p.img.h, plane: Array.from(p.img.plane), name: p.img.plane_name,
            part: p.img.part, px, opts: Array.from(p.opts.plane.options, o => o.textContent),
            axis: p.opts.plane.parentNode.firstChild.textContent, ticks: p.img.ticks,
            axes: p.img.axes, zoom: p.zoom, factor: p.img.factor, cw: p.canvas.width,
            ch: p.canvas.height, hover: p.hoverText}; })()"""


def canvas_px(br, topic, pts):
    return br.eval("""(() => { const p = beamdView.panels.get(%r), c = p.canvas.getContext('2d');
        return %s.map(([x, y]) => Array.from(c.getImageData(x, y, 1, 1).data.slice(0, 3))); })()"""
                   % (topic, [[int(x), int(y)] for x, y in pts]))


def select_plane(br, topic, value, part=None):
    br.eval("""(() => { const p = beamdView.panels.get(%r); p.opts.plane.value = '%s';
        %s p.opts.plane.onchange(); })()""" % (
        topic, value, "" if part is None else "p.opts.part.value = '%s';" % part))


def test_browser_planes_axes_histories_nan_series(run_tool, pub):
    v = View(run_tool, [pub.ep])
    wait_joined(pub, v)
    rng = np.random.default_rng(21)
    c2 = np.stack([np.full((20, 30), 1.0), rng.normal(5, 1, (20, 30)), np.full((20, 30), 9.0)]
                  ).astype(np.float32)
    c2[1, 4, 5] = np.nan
    probe = (rng.normal(size=(2, 16, 16)) + 1j * rng.normal(size=(2, 16, 16))).astype(np.complex64)
    obj = rng.normal(size=(40, 50)).astype(np.float32)
    step, oy, ox = 2e-8, -3.0e-7, 1.0e-7
    obj_labels = {"y": {"origin": oy, "step": step, "units": "m"},
                  "x": {"origin": ox, "step": step, "units": "m"}}
    vd = rng.normal(size=(2, 8, 10)).astype(np.float32)
    iters = np.array([1, 2, 4, 8, 16, 32], np.float64)
    err = np.stack([iters, 1.0 / iters, 0.5 / iters, np.linspace(1e-3, 1e-1, 6)], axis=1)
    metrics = ["iteration", "fourier_error", "probe_change", "object_change"]
    nanimg = rng.normal(size=(24, 30)).astype(np.float32)
    nanmask = rng.random((24, 30)) < 0.1
    nanimg[nanmask] = np.nan
    topics = ["xt.c2", "dm.probe", "dm.object", "vd.image", "dm.error", "nn.img"]  # 6 panels at most
    meta = {"detector": "test", "nframes": 80, "scan_shape": [8, 10], "scan_step": 5e-9}

    def series(kind, sid=7):
        pub.parts(proto.encode_message(kind, topic="beamd.series", series_id=sid, shape=(16, 16),
                                       dtype=np.uint16, meta=meta if kind == proto.SERIES_START else {}))

    def publish():
        s = dict(series_id=7)
        pub.result("xt.c2", c2, meta=d("xt.c2", c2, ["roi", "t1", "t2"], [5, 7, 9]), **s)
        pub.result("dm.probe", probe, meta=d("dm.probe", probe, ["mode", "y", "x"]), **s)
        pub.result("dm.object", obj, meta=d("dm.object", obj, ["y", "x"], obj_labels), **s)
        pub.result("vd.image", vd, meta=d("vd.image", vd, ["roi", "y", "x"], ["a", "b"]), **s)
        pub.result("dm.error", err, meta=d("dm.error", err, ["iteration", "metric"], {"metric": metrics}), **s)
        pub.result("nn.img", nanimg, meta=d("nn.img", nanimg, ["y", "x"]), **s)

    os.makedirs(ARTEFACTS, exist_ok=True)
    br = browser()
    try:
        br.goto("http://127.0.0.1:%d/?topics=%s" % (v.port, ",".join(topics)))
        br.wait("window.beamdView && beamdView.connected", 15, "the WebSocket to open")
        t_end = time.monotonic() + 25
        ok = False
        while time.monotonic() < t_end and not ok:
            series(proto.SERIES_START)
            publish()
            time.sleep(0.4)
            ok = br.eval("%r.every(t => (beamdView.drawn[t] || 0) > 0) && beamdView.seriesInfo.has(7)"
                         % topics)
        assert ok, br.eval("JSON.stringify(beamdView.drawn)")
        kinds = br.eval("Object.fromEntries(Array.from(beamdView.panels.values()).map(p => [p.name, p.kind]))")
        assert kinds == {t: ("curves" if t == "dm.error" else "image") for t in topics}, kinds

        # -- 1. planes: labels, the select and the slider change the drawn plane
        r = br.eval(OFF_PX % "xt.c2")
        assert r["opts"] == ["5", "7", "9"] and r["axis"].strip() == "roi"
        np.testing.assert_array_equal(nan_list(r["plane"]), c2[0].ravel())
        select_plane(br, "xt.c2", 2)
        br.wait("beamdView.panels.get('xt.c2').img.plane_name == '9'", 10, "plane 9 drawn")
        r2 = br.eval(OFF_PX % "xt.c2")
        np.testing.assert_array_equal(nan_list(r2["plane"]), c2[2].ravel())
        br.eval("(() => { const p = beamdView.panels.get('xt.c2'); p.opts.planeSlider.value = '1';"
                " p.opts.planeSlider.oninput(); })()")
        br.wait("beamdView.panels.get('xt.c2').img.plane_name == '7'", 10, "plane 7 from the slider")
        r1 = br.eval(OFF_PX % "xt.c2")
        np.testing.assert_array_equal(nan_list(r1["plane"]), c2[1].ravel())
        px1 = np.array(r1["px"]).reshape(20, 30, 3)
        assert tuple(px1[4, 5]) == (128, 128, 128)  # its NaN
        # a constant plane is one colour; the noisy plane has many
        assert len({tuple(x) for x in r2["px"]}) == 1 and len({tuple(x) for x in r1["px"]}) > 20
        # complex stack: mode 1, magnitude then phase
        select_plane(br, "dm.probe", 1, part=0)
        br.wait("beamdView.panels.get('dm.probe').img.plane_index == 1", 10, "probe mode 1")
        r = br.eval(OFF_PX % "dm.probe")
        assert r["opts"] == ["0", "1"] and r["axis"].strip() == "mode" and r["part"] == "magnitude"
        np.testing.assert_allclose(nan_list(r["plane"]), np.abs(probe[1]).ravel(), rtol=1e-5)
        select_plane(br, "dm.probe", 1, part=1)
        br.wait("beamdView.panels.get('dm.probe').img.part == 'phase'", 10, "probe phase")
        r = br.eval(OFF_PX % "dm.probe")
        np.testing.assert_allclose(nan_list(r["plane"]), np.angle(probe[1]).ravel(), atol=1e-5)

        # -- 2. physical axes from the descriptor, from the series' scan step, none otherwise
        r = br.eval(OFF_PX % "dm.object")
        assert r["axes"]["x"]["source"] == "descriptor" and r["ticks"]["units"] == {"x": "µm", "y": "µm"}
        z, f = r["zoom"], r["factor"]
        for t in r["ticks"]["x"]:
            want = z["x"] + ((t["v"] - ox) / step + 0.5) / f[1] * z["s"]
            assert abs(t["c"] - want) < 1e-6, (t, want)
        for t in r["ticks"]["y"]:
            want = z["y"] + ((t["v"] - oy) / step + 0.5) / f[0] * z["s"]
            assert abs(t["c"] - want) < 1e-6, (t, want)
            assert abs(float(t["label"]) * 1e-6 - t["v"]) < 1e-12
        assert len(r["ticks"]["x"]) >= 2 and len(r["ticks"]["y"]) >= 2
        # the ticks are drawn: the tick colour at each x tick, in the bottom ruler
        xs = [round(t["c"]) for t in r["ticks"]["x"] if 60 < t["c"] < r["cw"] - 2]
        got = canvas_px(br, "dm.object", [(x, r["ch"] - 16) for x in xs])
        assert all(tuple(g) == (232, 234, 237) for g in got), got
        # hover: original pixel (10, 20) is at ox + 10 step, oy + 20 step
        br.eval("""(() => { const p = beamdView.panels.get('dm.object');
            const cx = p.zoom.x + 10.5 * p.zoom.s, cy = p.zoom.y + 20.5 * p.zoom.s;
            const r = p.canvas.getBoundingClientRect();
            p.canvas.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + cx * r.width / p.canvas.width,
              clientY: r.top + cy * r.height / p.canvas.height})); })()""")
        hover = br.eval("beamdView.panels.get('dm.object').hoverText")
        assert hover.startswith("x 10, y 20 (%g µm, %g µm)" % ((ox + 10 * step) * 1e6, (oy + 20 * step) * 1e6)), hover
        r = br.eval(OFF_PX % "vd.image")
        assert r["axes"]["x"]["source"] == "scan_step" and r["axes"]["x"]["step"] == 5e-9
        assert r["ticks"]["units"]["x"] == "nm"
        assert br.eval("beamdView.panels.get('nn.img').img.axes") is None  # neither the scan's nor the frame's shape

        # -- 4. the error history against its iteration column, log y on demand
        p = br.eval("beamdView.panels.get('dm.error').plotted")
        assert p["x"] == list(iters) and p["xlabel"] == "iteration"
        assert p["names"] == ["metric " + m for m in metrics[1:]]
        box = p["box"]
        W = br.eval("beamdView.panels.get('dm.error').canvas.width")
        H = br.eval("beamdView.panels.get('dm.error').canvas.height")
        sx = (W - box["L"] - box["R"]) / (box["x1"] - box["x0"])
        sy = (H - box["T"] - box["B"]) / (box["y1"] - box["y0"])
        pts = [(box["L"] + (x - box["x0"]) * sx, H - box["B"] - (y - box["y0"]) * sy)
               for x, y in zip(iters, err[:, 1])]
        assert abs(pts[-1][0] - (W - box["R"])) < 1e-6  # iteration 32 at the right edge, not index 5
        # the first curve's colour at each point (a 3 px dot; the right edge is clipped at W - R)
        got = canvas_px(br, "dm.error", [(min(round(x), W - box["R"] - 1), round(y)) for x, y in pts])
        assert all(np.abs(np.array(g) - (79, 140, 201)).max() <= 3 for g in got), got
        # and nothing of that curve where the row index would have put iteration 2 (x = index 1)
        idx = [(box["L"] + (i - box["x0"]) * sx, pts[1][1]) for i in (1,)]
        got = canvas_px(br, "dm.error", [(round(x), round(y)) for x, y in idx])
        assert np.abs(np.array(got[0]) - (79, 140, 201)).max() > 30, got
        br.eval("(() => { const p = beamdView.panels.get('dm.error'); p.opts.logy.checked = true;"
                " p.opts.logy.onchange(); })()")
        br.wait("beamdView.panels.get('dm.error').plotted.logy", 10, "log y")
        box = br.eval("beamdView.panels.get('dm.error').plotted.box")
        lo, hi = np.log10(err[:, 1:].min()), np.log10(err[:, 1:].max())
        assert box["logy"] and lo - 0.5 < box["y0"] < lo < hi < box["y1"] < hi + 0.5, box

        # -- 5. NaN: its own colour in every map, never one of the map's colours
        for cmap in br.eval("Object.keys(beamdView.luts)"):
            br.eval("(() => { const p = beamdView.panels.get('nn.img'); p.opts.cmap.value = %r;"
                    " p.opts.cmap.onchange(); })()" % cmap)
            br.wait("beamdView.panels.get('nn.img').img.nan_rgb.join() == beamdView.nanRGB(%r).join()"
                    " && beamdView.panels.get('nn.img').opts.cmap.value == %r && !beamdView.panels.get('nn.img').pending"
                    % (cmap, cmap), 10, "map " + cmap)
            lut = np.array(br.eval("Array.from(beamdView.luts[%r], v => [v & 255, (v >>> 8) & 255, (v >>> 16) & 255])"
                                   % cmap))
            nan = np.array(br.eval("beamdView.nanRGB(%r)" % cmap))
            assert np.sqrt(((lut - nan) ** 2).sum(axis=1)).min() > 40, cmap
            px = np.array(br.eval(OFF_PX % "nn.img")["px"]).reshape(24, 30, 3)
            np.testing.assert_array_equal((px == nan).all(axis=2), nanmask)
        br.screenshot(os.path.join(ARTEFACTS, "view-planes-axes.png"))

        # -- 5. the series list: one line per series, however often it is resent
        # (spaced out: the viewer sends only the newest message of a topic)
        for kind, sid in [(proto.SERIES_START, 7)] * 3 + [(proto.SERIES_END, 7), (proto.SERIES_START, 8)]:
            series(kind, sid)
            time.sleep(0.4)
        br.eval("beamdView.panels.get('nn.img').root.querySelector('.close').click()")  # resubscribes
        br.wait("beamdView.series.length == 2 && beamdView.series[1].includes('ended')", 10,
                "series lines (have %s)" % br.eval("JSON.stringify(beamdView.series)"))
        time.sleep(0.5)
        lines = br.eval("Array.from(document.querySelectorAll('#series li'), li => li.textContent)")
        assert len(lines) == 2 and lines[0].startswith("series 8") and lines[1].startswith("series 7"), lines
        assert "started · ended" in lines[1] and "80 frames" in lines[1]
    finally:
        br.close()
