"""beamd-view and the `fit` stage: parameter maps and fitted curves.

- display forms (WebSocket, synthetic source): a labelled 3-D stack (a fit's
  params [param, y, x]) comes with every plane, one array per label, each
  downsampled like an image; a categorical image (integer dtype, string
  labels: a fit's status) is downsampled by the block maximum even when
  --downsample is mean; an unlabelled 3-D array sends every plane, named by index.
- the page with hand-made maps (NaN, outliers, every status code): planes
  selectable by label, 1-99 % colour limits (numpy's percentiles), NaN in
  its own colour, status as categories with counts, the pixel readout of
  every parameter ± error, chi2 and status, on hover and pinned by a click.
- the page with a hand-made fit of curves: data paired with the fit by
  frame id when newer data already came, no bar for a NaN error, the data
  topic found by shape (never the _err one) and switched from the select.
- the real daemon, source pixels: beamd-sim --pattern pumpprobe -> fit
  (model dcos), the page draws the final params/errors/chi2/status maps with
  the values the daemon published.
- the real daemon, source result: beamd-sim --pattern xpcs -> xpcs_multitau
  (per_pixel, so g2_err) -> fit (model exp) on mt.g2+g2_err+lags; the page
  plots, per ROI, g2 with error bars and the fitted curve on a log lag axis,
  lists the parameters ± errors, and switches fits.

The page's state is read back through window.beamdView (panels, the
offscreen image, the fit view's counts), never just "it loaded".
Screenshots go to $BEAMD_ARTEFACTS (default BUILD/test-artefacts/view).
"""
import json
import os
import subprocess
import time

import numpy as np
import pytest

from conftest import Proc, Receiver, make_config, proto
from test_fit_stage import g2fit_stages
from test_view import ARTEFACTS, Pub, View, block_reduce, wait_joined
from viewclient import Browser

BUILD = os.environ.get("BEAMD_BUILD", "build")
SIM = os.path.join(BUILD, "beamd-sim")
STATUS = ["converged", "bound", "max_iter", "singular", "bad_input", "too_few"]
STATUS_RGB = {"converged": (67, 160, 71), "singular": (229, 57, 53)}
VIRIDIS_TOP = (253, 231, 37)
NAN_GREY = (128, 128, 128)


@pytest.fixture
def pub(zctx):
    p = Pub(zctx)
    yield p
    p.close()


def fit_desc(topic, array, axes, labels=None):
    stage, output = topic.split(".")
    d = {"stage": stage, "kind": "fit", "output": output, "dtype": str(array.dtype),
         "shape": list(array.shape), "units": "", "axes": axes}
    if labels is not None:
        d["labels"] = labels
    return d


def browser():
    try:
        return Browser()
    except (FileNotFoundError, RuntimeError) as e:
        pytest.skip("headless chromium not usable here: %s" % e)


def nan_list(v):
    """A page array (NaN arrives as null) as float32."""
    return np.array([np.nan if x is None else x for x in v], np.float32)


# ---- display forms ------------------------------------------------------------------

def test_labelled_stack_and_categorical_display_forms(run_tool, pub):
    v = View(run_tool, [pub.ep], args=["--max-side", "32"])
    wait_joined(pub, v)
    rng = np.random.default_rng(5)
    params = rng.normal(size=(3, 70, 90)).astype(np.float32)
    params[1, 3:5, 7:9] = np.nan
    status = rng.integers(0, 6, size=(70, 90)).astype(np.uint8)
    plain = rng.normal(size=(3, 70, 90)).astype(np.float32)
    c = v.client()
    got = {}

    def need(h, a):
        if h["type"] == "result" and h.get("desc"):
            got[h["topic"]] = (h, a)
        return len(got) == 3
    deadline = time.monotonic() + 15
    while len(got) < 3 and time.monotonic() < deadline:
        pub.result("fx.params", params, meta=fit_desc("fx.params", params, ["param", "", ""],
                                                      ["a", "tau", "c"]))
        pub.result("fx.status", status, meta=fit_desc("fx.status", status, ["", ""], STATUS))
        pub.result("other.stack", plain, meta={"stage": "other", "output": "stack",
                                               "dtype": "float32", "shape": [3, 70, 90],
                                               "axes": ["", "", ""], "units": ""})
        try:
            c.until(need, timeout=1.0)
        except AssertionError:
            pass
    c.close()
    assert len(got) == 3, sorted(got)
    h, a = got["fx.params"]
    d = h["data"]
    assert d["stack"] is True and d["planes"] == 3 and d["factor"] == [3, 3]
    assert [x["name"] for x in d["arrays"]] == ["a", "tau", "c"]
    assert a.shape == (3, 24, 30)
    for k in range(3):
        np.testing.assert_allclose(a[k], block_reduce(params[k], 3), rtol=1e-6, atol=1e-6)
    assert d["arrays"][1]["nonfinite"] == 0  # the NaN block has finite neighbours: mean of those
    h, a = got["fx.status"]
    assert h["data"]["categorical"] is True and h["data"]["downsample"] == "max"
    np.testing.assert_array_equal(a, block_reduce(status.astype(np.float32), 3, use_max=True))
    h, a = got["other.stack"]  # unlabelled: every plane too, named by index
    assert h["data"]["stack"] is True and [x["name"] for x in h["data"]["arrays"]] == ["0", "1", "2"]
    for k in range(3):
        np.testing.assert_allclose(a[k], block_reduce(plain[k], 3), rtol=1e-6, atol=1e-6)


# ---- the page, hand-made maps -------------------------------------------------------

H, W = 30, 40


def synthetic_maps():
    rng = np.random.default_rng(11)
    params = np.stack([rng.normal(1.0, 0.1, (H, W)), rng.normal(50.0, 5.0, (H, W)),
                       rng.normal(0.0, 1.0, (H, W))]).astype(np.float32)
    errors = np.abs(rng.normal(0.0, 0.05, (3, H, W))).astype(np.float32) + 0.01
    status = rng.choice(6, size=(H, W), p=[0.8, 0.08, 0.05, 0.03, 0.02, 0.02]).astype(np.uint8)
    bad = np.zeros((H, W), bool)
    bad[2, 3:9] = True  # failed fits: NaN
    params[:, bad] = np.nan
    errors[:, bad] = np.nan
    status[bad] = 3
    params[1, 10, 10:14] = 1e6  # outliers a min-max scale would be stretched by
    chi2 = rng.gamma(4.0, 0.25, (H, W)).astype(np.float32)
    chi2[bad] = np.nan
    return params, errors, status, chi2, bad


def test_browser_parameter_maps_synthetic(run_tool, pub):
    v = View(run_tool, [pub.ep])
    wait_joined(pub, v)
    params, errors, status, chi2, bad = synthetic_maps()
    labels = ["beta", "tau", "d"]
    os.makedirs(ARTEFACTS, exist_ok=True)
    br = browser()

    def publish():
        pub.result("fx.params", params, meta=fit_desc("fx.params", params, ["param", "", ""], labels))
        pub.result("fx.errors", errors, meta=fit_desc("fx.errors", errors, ["param", "", ""], labels))
        pub.result("fx.chi2", chi2, meta=fit_desc("fx.chi2", chi2, ["", ""]))
        pub.result("fx.status", status, meta=fit_desc("fx.status", status, ["", ""], STATUS))
    try:
        br.goto("http://127.0.0.1:%d/?topics=fx.params,fx.status,fx.chi2" % v.port)
        br.wait("window.beamdView && beamdView.connected", 15, "the WebSocket to open")
        t_end = time.monotonic() + 20
        ok = False
        while time.monotonic() < t_end and not ok:
            publish()
            time.sleep(0.3)
            ok = br.eval("['fx.params','fx.status','fx.chi2'].every(t => (beamdView.drawn[t] || 0) > 0)"
                         " && beamdView.latest.has('fx.errors')")
        assert ok, "maps not drawn within 20 s"
        kinds = br.eval("Object.fromEntries(Array.from(beamdView.panels.values()).map(p => [p.name, p.kind]))")
        assert kinds == {"fx.params": "image", "fx.status": "image", "fx.chi2": "image"}, kinds
        # planes by label; the second one selected
        opts = br.eval("Array.from(beamdView.panels.get('fx.params').opts.plane.options, o => o.textContent)")
        assert opts == labels
        br.eval("(() => { const p = beamdView.panels.get('fx.params'); p.opts.plane.value = '1';"
                " p.opts.plane.onchange(); })()")
        br.wait("beamdView.panels.get('fx.params').img.plane_name == 'tau'", 10, "plane tau drawn")
        img = br.eval("""(() => { const p = beamdView.panels.get('fx.params');
            const d = p.off.getContext('2d').getImageData(0, 0, p.img.w, p.img.h).data;
            const px = []; for (let i = 0; i < d.length; i += 4) px.push([d[i], d[i+1], d[i+2]]);
            return {w: p.img.w, h: p.img.h, plane: Array.from(p.img.plane), limits: p.img.limits,
                    px, legend: p.legend.textContent, lo: p.opts.lo.value, mode: p.opts.limits.value}; })()""")
        assert (img["w"], img["h"]) == (W, H)
        np.testing.assert_array_equal(nan_list(img["plane"]), params[1].ravel())
        # robust limits: the 1st and 99th percentiles of the finite values, not the outliers
        assert img["mode"] == "1"
        want = np.percentile(params[1][np.isfinite(params[1])].astype(np.float64), [1, 99])
        np.testing.assert_allclose(img["limits"], want, rtol=1e-5)
        assert img["limits"][1] < 100, img["limits"]
        px = np.array(img["px"]).reshape(H, W, 3)
        # NaN in its own colour, exactly where the fits failed
        is_nan = (px == NAN_GREY).all(axis=2)
        np.testing.assert_array_equal(is_nan, bad)
        assert "NaN/Inf %d" % bad.sum() in img["legend"]
        # outliers clip to the top of the map
        assert (px[10, 10:14] == VIRIDIS_TOP).all()
        # the status map: categories with their counts
        st = br.eval("""(() => { const p = beamdView.panels.get('fx.status');
            const d = p.off.getContext('2d').getImageData(0, 0, p.img.w, p.img.h).data;
            const px = []; for (let i = 0; i < d.length; i += 4) px.push([d[i], d[i+1], d[i+2]]);
            return {counts: p.img.counts, cats: p.img.categories, legend: p.legend.textContent, px,
                    cbar: p.cbar.style.display}; })()""")
        assert st["cats"] == STATUS
        np.testing.assert_array_equal(st["counts"][:6], np.bincount(status.ravel(), minlength=6))
        for k, name in enumerate(STATUS):
            assert "%s %d" % (name, (status == k).sum()) in st["legend"], st["legend"]
        spx = np.array(st["px"]).reshape(H, W, 3)
        assert (spx[status == 0] == STATUS_RGB["converged"]).all()
        assert (spx[status == 3] == STATUS_RGB["singular"]).all()
        assert st["cbar"] == "none"
        # the readout of one pixel: every parameter ± error, chi2, status
        y, x = 7, 12
        r = br.eval("beamdView.fitPixel('fx', %d, %d)" % (x, y))
        assert [q["name"] for q in r["values"]] == labels
        for j, q in enumerate(r["values"]):
            assert q["v"] == pytest.approx(float(params[j, y, x]), rel=1e-6)
            assert q["e"] == pytest.approx(float(errors[j, y, x]), rel=1e-6)
        assert r["chi2"] == pytest.approx(float(chi2[y, x]), rel=1e-6)
        assert r["status_name"] == STATUS[status[y, x]]
        # a click on that pixel pins it under the image (of the status panel too)
        for topic in ("fx.params", "fx.status"):
            txt = br.eval("""(() => { const p = beamdView.panels.get('%s');
                const r = p.canvas.getBoundingClientRect(), z = p.zoom;
                const cx = z.x + (%d + 0.5) * z.s, cy = z.y + (%d + 0.5) * z.s;
                p.canvas.dispatchEvent(new MouseEvent('click', {clientX: r.left + cx * r.width / p.canvas.width,
                    clientY: r.top + cy * r.height / p.canvas.height, bubbles: true}));
                return p.readout.textContent; })()""" % (topic, x, y))
            assert txt.startswith("pinned x %d, y %d:" % (x, y)), txt
            assert "tau" in txt and STATUS[status[y, x]] in txt and "±" in txt, txt
        br.screenshot(os.path.join(ARTEFACTS, "view-fit-maps-synthetic.png"))
        assert br.eval("beamdView.errors.length") == 0, br.eval("beamdView.errors")
    finally:
        br.close()


def test_browser_fit_curves_pair_data_by_frame(run_tool, pub):
    """Hand-made g2, g2_err, lags and a fit of them: the fit view draws the
    data of the fit's own frame id when newer data already arrived, finds
    the data topic by shape (not the _err one), and the data select
    switches it to another topic of that shape."""
    v = View(run_tool, [pub.ep])
    wait_joined(pub, v)
    nl, nr = 20, 3
    lags = np.geomspace(1e-3, 1.0, nl)
    lags[0] = 0.0
    rng = np.random.default_rng(2)

    def g2_of(fid):
        return (1 + 0.5 * np.exp(-2 * lags[:, None] * (5.0 * (1 + np.arange(nr)))) +
                0.01 * fid + rng.normal(0, 0.003, (nl, nr))).astype(np.float32)
    err = np.full((nl, nr), 0.01, np.float32)
    err[5, 1] = np.nan
    model = (1 + 0.5 * np.exp(-2 * lags[:, None] * (5.0 * (1 + np.arange(nr))))).astype(np.float64)
    params = np.array([[0.5, 0.1 / (1 + i), 1.0] for i in range(nr)])
    perr = params * 0.01
    g2s = {fid: g2_of(fid) for fid in (1, 2, 3)}

    def meta(topic, a, axes, kind, labels=None):
        d = fit_desc(topic, a, axes, labels)
        d["kind"] = kind
        return d

    def send_data(fid, topics=("mt.g2", "mt.g2_err", "mt.lags", "alt.g2")):
        g = g2s[fid]
        for t, a, axes in (("mt.g2", g, ["lag", "roi"]), ("mt.g2_err", err, ["lag", "roi"]),
                           ("mt.lags", lags.astype(np.float32), ["lag"]),
                           ("alt.g2", g + 1, ["lag", "roi"])):
            if t in topics:
                pub.result(t, a, frame_id=fid, meta=meta(t, a, axes, "xpcs_multitau"))

    def send_fit(fid):
        for t, a, axes, lab in (("g2fit.params", params, ["fit", "param"], ["a", "tau", "d"]),
                                ("g2fit.errors", perr, ["fit", "param"], ["a", "tau", "d"]),
                                ("g2fit.status", np.array([0, 1, 0], np.uint8), ["fit"], STATUS),
                                ("g2fit.chi2", np.array([1.0, 1.1, 0.9]), ["fit"], None),
                                ("g2fit.curves", model, ["point", "fit"], None)):
            pub.result(t, a, frame_id=fid, meta=meta(t, a, axes, "fit", lab))
    br = browser()
    try:
        br.goto("http://127.0.0.1:%d/?topics=g2fit.curves" % v.port)
        br.wait("window.beamdView && beamdView.connected", 15, "the WebSocket to open")
        t_end = time.monotonic() + 20
        ok = False
        while time.monotonic() < t_end and not ok:
            send_data(1)
            send_fit(1)
            time.sleep(0.3)
            ok = br.eval("(() => { const p = beamdView.panels.get('g2fit.curves');"
                         " return !!(p && p.fit && p.fit.data == 'mt.g2' && p.fit.rows[0].values.length); })()")
        assert ok, "the fit view never showed its data: %s" % br.eval(
            "JSON.stringify({fit: (beamdView.panels.get('g2fit.curves') || {}).fit, err: beamdView.errors,"
            " info: (beamdView.panels.get('g2fit.curves') || {info: {}}).info.textContent,"
            " topics: Array.from(beamdView.topics.values()).map(t => [t.topic, t.shape])})")
        # data of frame 2, the fit of frame 2, then newer data (frame 3)
        send_data(2)
        time.sleep(0.4)
        send_fit(2)
        time.sleep(0.4)
        send_data(3, topics=("mt.g2",))
        br.wait("beamdView.latest.get('mt.g2').h.frame_id == 3 && "
                "beamdView.panels.get('g2fit.curves').last.h.frame_id == 2", 10, "frames 2 and 3")
        br.wait("(() => { const p = beamdView.panels.get('g2fit.curves'); p.pending = p.last;"
                " return true; })()", 5)
        time.sleep(0.3)
        f = br.eval("beamdView.panels.get('g2fit.curves').fit")
        assert f["data"] == "mt.g2" and f["errors"] == "mt.g2_err" and f["data_frame"] == 2, f
        np.testing.assert_array_equal(nan_list(f["data_y"]), g2s[2][:, 0])
        np.testing.assert_allclose(f["model_y"], model[:, 0].astype(np.float32))
        assert f["points"] == nl - 1 and f["bars"] == nl - 1 and f["model"] == nl - 1, f  # lag 0 off the log axis
        assert f["names"] == ["roi 0", "roi 1", "roi 2"] and f["logx"] is True, f
        # fit 1: its NaN error is no bar; status bound
        br.eval("(() => { const p = beamdView.panels.get('g2fit.curves'); p.opts.fit.value = '1';"
                " p.opts.fit.onchange(); })()")
        br.wait("beamdView.panels.get('g2fit.curves').fit.rows[0].fit == 1", 10, "fit 1")
        f = br.eval("beamdView.panels.get('g2fit.curves').fit")
        assert f["bars"] == nl - 2 and f["rows"][0]["status_name"] == "bound", f
        np.testing.assert_allclose([q["v"] for q in f["rows"][0]["values"]], params[1], rtol=1e-6)
        np.testing.assert_allclose([q["e"] for q in f["rows"][0]["values"]], perr[1], rtol=1e-6)
        # the candidates: both g2 topics, never the _err one; the select switches
        opts = br.eval("Array.from(beamdView.panels.get('g2fit.curves').opts.data.options, o => o.value)")
        assert opts[0] == "" and sorted(opts[1:]) == ["alt.g2", "mt.g2"], opts
        br.eval("(() => { const p = beamdView.panels.get('g2fit.curves'); p.opts.data.value = 'alt.g2';"
                " p.opts.data.onchange(); })()")
        send_data(2)
        send_fit(2)
        br.wait("beamdView.panels.get('g2fit.curves').fit.data == 'alt.g2'", 10, "the other data topic")
        f = br.eval("beamdView.panels.get('g2fit.curves').fit")
        np.testing.assert_array_equal(nan_list(f["data_y"]), g2s[2][:, 1] + 1)
        assert f["errors"] is None and f["bars"] == 0, f  # alt.g2 has no alt.g2_err
        br.screenshot(os.path.join(ARTEFACTS, "view-fit-curves-synthetic.png"))
        assert br.eval("beamdView.errors.length") == 0, br.eval("beamdView.errors")
    finally:
        br.close()


# ---- the real daemon: source pixels (pump-probe maps) -------------------------------

PH, PW, PN, T0 = 24, 24, 160, 0.5


def test_browser_pumpprobe_maps_from_the_daemon(tmp_path, ports, zctx, start_beamd, receivers,
                                                 procs, run_tool):
    st = {"name": "pp", "kind": "fit", "backend": "cpu", "source": "pixels", "model": "dcos",
          "x": "delay", "x_offset": -T0, "range": [0, 1e9], "estimator": "mle",
          "max_frames": 256, "threads": 2}
    start_beamd(make_config(ports, [st], mode="pull", pool_frames=64, out_hwm=100000))
    v = View(run_tool, [ports.ep_publish], control=ports.ep_control)
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    time.sleep(0.5)  # the viewer's SUB joins too
    sim = Proc("beamd-sim", [SIM, "--bind", ports.ep_input, "--socket", "push", "--quiet",
                             "--series-id", "4", "--pattern", "pumpprobe", "--shape",
                             "%dx%d" % (PH, PW), "--frames", str(PN), "--mean", "400",
                             "--pp-t0", str(T0), "--seed", "3"], tmp_path, procs)
    assert sim.wait(30) == 0, sim.stderr()
    rx.wait_series_end(4, timeout=30)
    rx.wait_for(lambda ms: any(m[0] == "pp.status" and m[1].flags & proto.FLAG_FINAL for m in ms),
                timeout=30, what="final pp.status")
    res = {t[3:]: a for t, h, a, _ in rx.snapshot()
           if t.startswith("pp.") and h.series_id == 4 and h.flags & proto.FLAG_FINAL}
    params, errors, status, chi2 = res["params"], res["errors"], res["status"], res["chi2"]
    assert params.shape == (5, PH, PW)
    os.makedirs(ARTEFACTS, exist_ok=True)
    br = browser()
    try:
        br.goto("http://127.0.0.1:%d/" % v.port)
        br.wait("window.beamdView && beamdView.connected", 15, "the WebSocket to open")
        # all four maps open by themselves, as images
        br.wait("['pp.params','pp.errors','pp.chi2','pp.status'].every(t => (beamdView.drawn[t] || 0) > 0)",
                20, "the four maps drawn")
        kinds = br.eval("Object.fromEntries(Array.from(document.querySelectorAll('#topics li'))"
                        ".map(l => [l.dataset.topic, l.dataset.kind]))")
        assert all(kinds["pp." + o] == "image" for o in ("params", "errors", "chi2", "status")), kinds
        opts = br.eval("Array.from(beamdView.panels.get('pp.params').opts.plane.options, o => o.textContent)")
        assert opts == ["a", "b", "tau", "f", "c"]
        for j, name in enumerate(opts):
            br.eval("(() => { const p = beamdView.panels.get('pp.params'); p.opts.plane.value = '%d';"
                    " p.opts.plane.onchange(); })()" % j)
            br.wait("beamdView.panels.get('pp.params').img.plane_name == '%s'" % name, 10,
                    "plane %s drawn" % name)
            got = br.eval("(() => { const p = beamdView.panels.get('pp.params');"
                          " return {plane: Array.from(p.img.plane), limits: p.img.limits}; })()")
            np.testing.assert_array_equal(nan_list(got["plane"]).reshape(PH, PW), params[j])
            want = np.percentile(params[j].astype(np.float64), [1, 99])
            np.testing.assert_allclose(got["limits"], want, rtol=1e-5)
        sc = br.eval("beamdView.panels.get('pp.status').img.counts")
        np.testing.assert_array_equal(sc[:6], np.bincount(status.ravel(), minlength=6))
        chi = br.eval("Array.from(beamdView.panels.get('pp.chi2').img.plane)")
        np.testing.assert_array_equal(nan_list(chi).reshape(PH, PW), chi2)
        y, x = 7, 5
        r = br.eval("beamdView.fitPixel('pp', %d, %d)" % (x, y))
        assert [q["name"] for q in r["values"]] == ["a", "b", "tau", "f", "c"]
        np.testing.assert_allclose([q["v"] for q in r["values"]], params[:, y, x], rtol=1e-6)
        np.testing.assert_allclose([q["e"] for q in r["values"]], errors[:, y, x], rtol=1e-6)
        assert r["status_name"] == STATUS[status[y, x]]
        assert r["chi2"] == pytest.approx(float(chi2[y, x]), rel=1e-6)
        br.screenshot(os.path.join(ARTEFACTS, "view-fit-pumpprobe.png"))
        assert br.eval("beamdView.errors.length") == 0, br.eval("beamdView.errors")
    finally:
        br.close()


# ---- the real daemon: source result (g2 fits per ROI) -------------------------------

RINGS = 4


def test_browser_g2_fit_curves_from_the_daemon(tmp_path, ports, zctx, start_beamd, receivers,
                                               procs, run_tool):
    lab = tmp_path / "labels.npy"
    args = ["--pattern", "xpcs", "--shape", "128x128", "--frames", "1200", "--mean", "20",
            "--xpcs-rings", str(RINGS), "--xpcs-rate-min", "20", "--xpcs-rate-max", "200",
            "--frame-time", "0.001", "--seed", "1", "--label-file", str(lab)]
    stages = g2fit_stages(lab, RINGS)
    start_beamd(make_config(ports, stages, mode="pull", pool_frames=64, out_hwm=100000))
    v = View(run_tool, [ports.ep_publish], control=ports.ep_control)
    rx = Receiver(zctx, ports.ep_publish)
    receivers.append(rx)
    rx.wait_live()
    time.sleep(0.5)  # the viewer's SUB joins too
    sim = Proc("beamd-sim", [SIM, "--bind", ports.ep_input, "--socket", "push", "--quiet",
                             "--series-id", "3"] + args, tmp_path, procs)
    assert sim.wait(60) == 0, sim.stderr()
    rx.wait_series_end(3, timeout=60)
    rx.wait_for(lambda ms: any(m[0] == "g2fit.curves" and m[1].flags & proto.FLAG_FINAL
                               for m in ms), timeout=30, what="final g2fit.curves")
    res = {t: (h, a) for t, h, a, _ in rx.snapshot()
           if h.series_id == 3 and h.flags & proto.FLAG_FINAL and t.split(".")[0] in ("mt", "g2fit")}
    g2, g2e, lags = res["mt.g2"][1], res["mt.g2_err"][1], res["mt.lags"][1]
    params, errors = res["g2fit.params"][1], res["g2fit.errors"][1]
    status, curves = res["g2fit.status"][1], res["g2fit.curves"][1]
    fid = res["g2fit.curves"][0].frame_id
    assert curves.shape == g2.shape and g2.shape[1] == RINGS
    os.makedirs(ARTEFACTS, exist_ok=True)
    br = browser()
    try:
        br.goto("http://127.0.0.1:%d/" % v.port)
        br.wait("window.beamdView && beamdView.connected", 15, "the WebSocket to open")
        kinds = br.wait("(() => { const k = Object.fromEntries(Array.from(document.querySelectorAll"
                        "('#topics li')).map(l => [l.dataset.topic, l.dataset.kind]));"
                        " return k['g2fit.curves'] && k['g2fit.params'] && k; })()", 20, "fit topics")
        assert kinds["g2fit.curves"] == "fit" and kinds["g2fit.params"] == "fittable", kinds
        assert kinds["g2fit.status"] == "table" and kinds["mt.g2"] == "curves", kinds
        br.wait("(() => { const p = beamdView.panels.get('g2fit.curves');"
                " return p && p.fit && p.fit.data == 'mt.g2' && p.fit.errors == 'mt.g2_err'"
                " && p.fit.rows.length == 1 && p.fit.rows[0].values.length == 3; })()", 20,
                "the fit panel with its data points and parameters")
        f = br.eval("beamdView.panels.get('g2fit.curves').fit")
        assert f["n_fits"] == RINGS and f["n_points"] == g2.shape[0] and f["logx"] is True, f
        assert f["index"] == "0" and f["data_frame"] == fid, f
        np.testing.assert_allclose(f["x"], lags[:g2.shape[0]], rtol=1e-6)
        pos = lags[:g2.shape[0]] > 0  # a log axis has no room for lag 0
        for i in range(RINGS):
            if i:
                br.eval("(() => { const p = beamdView.panels.get('g2fit.curves');"
                        " p.opts.fit.value = '%d'; p.opts.fit.onchange(); })()" % i)
                br.wait("beamdView.panels.get('g2fit.curves').fit.rows[0].fit == %d" % i, 10,
                        "fit %d shown" % i)
                f = br.eval("beamdView.panels.get('g2fit.curves').fit")
            ok = pos & np.isfinite(g2[:, i])
            assert f["points"] == ok.sum(), (i, f["points"], ok.sum())
            assert f["bars"] == (ok & np.isfinite(g2e[:, i]) & (g2e[:, i] > 0)).sum(), i
            assert f["model"] == (pos & np.isfinite(curves[:, i])).sum(), i
            row = f["rows"][0]
            assert [q["name"] for q in row["values"]] == ["a", "tau", "d"]
            np.testing.assert_allclose([q["v"] for q in row["values"]], params[i], rtol=1e-6)
            np.testing.assert_allclose([q["e"] for q in row["values"]], errors[i], rtol=1e-6)
            assert row["status_name"] == STATUS[status[i]]
        # the canvas: data points (blue) and the model (orange) of the fit shown
        px = br.eval("""(() => { const p = beamdView.panels.get('g2fit.curves');
            const d = p.canvas.getContext('2d').getImageData(0, 0, p.canvas.width, p.canvas.height).data;
            const want = [[79,140,201],[242,142,43]];
            return want.map(c => { let k = 0; for (let i = 0; i < d.length; i += 4)
                if (d[i] == c[0] && d[i+1] == c[1] && d[i+2] == c[2]) k++; return k; }); })()""")
        assert px[0] > 50 and px[1] > 30, px
        tab = br.eval("beamdView.panels.get('g2fit.curves').table.textContent")
        assert "tau" in tab and "±" in tab and STATUS[status[RINGS - 1]] in tab, tab
        br.screenshot(os.path.join(ARTEFACTS, "view-fit-g2.png"))
        # all fits at once: data and model per ROI, one table row each
        br.eval("(() => { const p = beamdView.panels.get('g2fit.curves');"
                " p.opts.fit.value = 'all'; p.opts.fit.onchange(); })()")
        br.wait("beamdView.panels.get('g2fit.curves').fit.rows.length == %d" % RINGS, 10, "all fits")
        f = br.eval("beamdView.panels.get('g2fit.curves').fit")
        assert br.eval("beamdView.panels.get('g2fit.curves').curves") == 2 * RINGS
        assert f["points"] == sum((pos & np.isfinite(g2[:, i])).sum() for i in range(RINGS))
        # the [fit][param] table lists value ± error per ROI
        if not br.eval("beamdView.panels.has('g2fit.params')"):
            br.eval("document.querySelector('#topics li[data-topic=\"g2fit.params\"]').click()")
        txt = br.wait("(() => { const p = beamdView.panels.get('g2fit.params');"
                      " return p && p.pre.textContent.includes('±') && p.pre.textContent; })()",
                      10, "the params table")
        lines = txt.splitlines()
        assert lines[0].split() == ["fit", "a", "tau", "d"] and len(lines) == RINGS + 1, txt
        # row 0: "0  a ± ea  tau ± etau  d ± ed": values to 4 significant digits, errors to 2
        cells = lines[1].split()
        assert cells[0] == "0" and cells[2] == cells[5] == "±", cells
        np.testing.assert_allclose([float(cells[k]) for k in (1, 4, 7)], params[0], rtol=1e-3)
        np.testing.assert_allclose([float(cells[k]) for k in (3, 6, 9)], errors[0], rtol=0.05)
        br.screenshot(os.path.join(ARTEFACTS, "view-fit-g2-all.png"))
        assert br.eval("beamdView.errors.length") == 0, br.eval("beamdView.errors")
    finally:
        br.close()
