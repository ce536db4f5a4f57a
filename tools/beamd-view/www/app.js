/* beamd-view page: plain JavaScript, canvas rendering, no build step.
 *
 * Messages (docs/viewer.md) are binary: u32 LE n, n bytes of JSON header,
 * padding to 4, float32 payload. Drawing is latest-wins too: a message
 * only replaces the pending one of its panel, and panels are drawn once
 * per animation frame, so a burst of results never queues up here.
 * window.beamdView exposes the state (what was received and drawn, and the
 * latencies) for tests and benchmarks.
 *
 * Fit results (stage kind `fit`, docs/fit.md) have views of their own:
 * parameter maps ([param, y, x], one labelled plane each) with robust
 * colour limits and a per-pixel readout of every parameter ± its error,
 * the status map as categories, and for fits of curves (source: result)
 * the data points the fit consumed, with error bars, under the model.
 */
'use strict';
(function () {
  const params = new URLSearchParams(location.search);
  const TOKEN = params.get('token');
  const STALE_S = 3;        // a topic silent this long (and 5 periods) is "stopped"
  const HIST_N = 600;       // points kept per scalar history
  const WINDOW = 2;         // results in flight to this page (see 'hello')
  const RECENT_N = 8;       // messages kept per topic that a fit view pairs by frame id

  const S = {
    hello: null, status: null, statsDoc: null, topicsMsg: null,
    topics: new Map(),      // name -> entry from the topic list
    panels: new Map(),      // name -> panel
    latest: new Map(),      // name -> last {h, a} received
    recent: new Map(),      // name -> last RECENT_N messages, of topics a fit view pairs by frame
    received: {}, drawn: {}, lastDrawn: {},
    latencies: [],          // ms, published -> drawn
    connected: false, unacked: 0, lastResultAt: 0, messages: 0, bytes: 0,
    rates: { t: [], fps: [], rps: [], drops: [] },
    series: [], seriesInfo: new Map(), hist: {}, closedByUser: new Set(), autoDone: new Set(),
    errors: [],
  };
  window.beamdView = S;

  const $ = (id) => document.getElementById(id);
  const nowMs = () => performance.timeOrigin + performance.now();
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const fmt = (v, d) => {
    if (v === null || v === undefined || Number.isNaN(v)) return '–';
    if (typeof v !== 'number') return String(v);
    if (d === undefined && Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(d === undefined ? 3 : d);
    return v.toFixed(d === undefined ? (a >= 100 ? 1 : 3) : d);
  };

  /* Fitted values: 4 significant digits (fmt's fixed 3 decimals would
   * flatten a tau of 0.0451 s to 0.045); their errors: 2. */
  const fmtP = (v, sig) => {
    if (v === null || v === undefined || Number.isNaN(v)) return '–';
    const a = Math.abs(v), k = sig || 4;
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(k - 1);
    return String(+v.toPrecision(k));
  };
  const fmtPE = (v, e) => fmtP(v) + (e !== null && e !== undefined ? ' ± ' + fmtP(e, 2) : '');

  /* ---- colour maps: 10 anchors of matplotlib's maps, linearly interpolated */
  const ANCHORS = {
    viridis: ['440154', '482878', '3e4989', '31688e', '26828e', '1f9e89', '35b779', '6ece58', 'b5de2b', 'fde725'],
    magma: ['000004', '180f3d', '440f76', '721f81', '9e2f7f', 'cd4071', 'f1605d', 'fd9668', 'feca8d', 'fcfdbf'],
    inferno: ['000004', '1b0c41', '4a0c6b', '781c6d', 'a52c60', 'cf4446', 'ed6925', 'fb9b06', 'f7d13d', 'fcffa4'],
    gray: ['000000', 'ffffff'],
    hot: ['000000', 'e60000', 'ffd200', 'ffffff'],
    hsv: ['ff0000', 'ffff00', '00ff00', '00ffff', '0000ff', 'ff00ff', 'ff0000'],
  };
  const LUTS = {};
  for (const [name, hex] of Object.entries(ANCHORS)) {
    const rgb = hex.map((h) => [0, 2, 4].map((i) => parseInt(h.substr(i, 2), 16)));
    const lut = new Uint32Array(256);
    for (let i = 0; i < 256; i++) {
      const x = (i / 255) * (rgb.length - 1), k = Math.min(Math.floor(x), rgb.length - 2), f = x - k;
      const c = [0, 1, 2].map((j) => Math.round(rgb[k][j] * (1 - f) + rgb[k + 1][j] * f));
      lut[i] = (255 << 24) | (c[2] << 16) | (c[1] << 8) | c[0]; // little-endian RGBA
    }
    LUTS[name] = lut;
  }
  const rgba = (r, g, b) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0; // little-endian RGBA
  /* NaN is drawn in a colour its map does not have: mid grey, magenta on gray. */
  const NAN_RGB = { gray: [255, 0, 255] };
  const nanRGB = (cmap) => NAN_RGB[cmap] || [128, 128, 128];
  S.luts = LUTS; S.nanRGB = nanRGB; // for tests: the NaN colour is in no map's range
  /* Categories (integer images whose descriptor labels name the values):
   * the fit status codes by name, anything else from the curve colours. */
  const STATUS_RGB = {
    converged: [67, 160, 71], bound: [253, 216, 53], max_iter: [251, 140, 0],
    singular: [229, 57, 53], bad_input: [142, 36, 170], too_few: [120, 144, 156],
  };
  const CURVE_COLOURS = ['#4f8cc9', '#f28e2b', '#59a14f', '#e15759', '#b07aa1', '#76b7b2',
    '#edc948', '#ff9da7', '#9c755f', '#bab0ac'];

  /* ---- message decoding ------------------------------------------------- */
  function decode(buf) {
    const dv = new DataView(buf);
    const n = dv.getUint32(0, true);
    const h = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, n)));
    const off = 4 + n + ((4 - ((4 + n) % 4)) % 4);
    const a = buf.byteLength > off ? new Float32Array(buf, off, (buf.byteLength - off) >> 2) : null;
    return { h, a };
  }

  /* ---- what a topic is: the view chosen from its descriptor -------------- */
  function isLagAxis(name) { return /^(lag|tau|delay|dt)$/i.test(name || ''); }
  function isIterAxis(name) { return /^(iteration|iter|epoch|step)$/i.test(name || ''); }
  function viewKind(t) {
    if (!t) return 'raw';
    if (!t.ok) return 'raw';
    if (t.topic === 'beamd.stats' || t.topic === 'beamd.series') return 'doc';
    if (t.msg_type && t.msg_type !== 'RESULT') return 'doc';
    const shape = t.shape || [];
    const n = shape.reduce((x, y) => x * y, 1);
    const d = t.desc || {};
    const axes = d.axes || [];
    if (shape.length === 0) return 'raw';
    if (d.kind === 'fit') {
      if (d.output === 'curves') return 'fit';
      if (shape.length === 2 && axes[0] === 'fit') return 'fittable';
      if (shape.length === 1 && axes[0] === 'fit') return 'table';
    }
    if (n === 1) return 'scalar';
    if (shape.length === 1) {
      if (d.per_frame && n <= 16) return 'scalars';
      if (Array.isArray(d.labels) && d.labels.length === n && typeof d.labels[0] === 'string') return 'table';
      if (n <= 8 && !isLagAxis(axes[0])) return 'table';
      return 'curve';
    }
    if (shape.length === 2 && (axes.some(isLagAxis) || Math.min(shape[0], shape[1]) <= 16)) return 'curves';
    return 'image';
  }
  function describe(t) {
    const d = t.desc;
    const parts = [];
    if (t.dtype) parts.push(t.dtype + '[' + (t.shape || []).join('×') + ']');
    if (d && d.axes && d.axes.length) parts.push('axes ' + d.axes.join(', '));
    if (d && d.units) parts.push(d.units);
    if (d && d.kind) parts.push(d.kind);
    return parts.join(' · ');
  }
  /* x values of a curve: the sibling "<stage>.lags" topic, else numeric
   * labels of the axis, else the index. */
  function xValues(name, axisName, n) {
    const d = (S.topics.get(name) || {}).desc || {};
    const stage = name.split('.')[0];
    if (isLagAxis(axisName)) {
      for (const sib of [stage + '.lags', stage + '.tau', stage + '.lag']) {
        const l = S.latest.get(sib);
        if (l && l.a && l.a.length >= n) {
          const u = ((S.topics.get(sib) || {}).desc || {}).units || '';
          return { x: l.a.subarray(0, n), label: 'τ' + (u ? ' (' + u + ')' : ''), log: true };
        }
      }
    }
    const lab = d.labels && !Array.isArray(d.labels) ? d.labels[axisName] : null;
    if (Array.isArray(lab) && lab.length >= n && typeof lab[0] === 'number')
      return { x: Float32Array.from(lab.slice(0, n)), label: axisName, log: isLagAxis(axisName) };
    const x = new Float32Array(n);
    for (let i = 0; i < n; i++) x[i] = i;
    return { x, label: axisName || 'index', log: false };
  }
  function curveNames(name, axisName, k) {
    const d = (S.topics.get(name) || {}).desc || {};
    let lab = null;
    if (Array.isArray(d.labels) && d.labels.length === k) lab = d.labels;
    else if (d.labels && Array.isArray(d.labels[axisName]) && d.labels[axisName].length === k) lab = d.labels[axisName];
    const out = [];
    for (let i = 0; i < k; i++) out.push((axisName || 'curve') + ' ' + (lab ? lab[i] : i));
    return out;
  }

  /* ---- panels ------------------------------------------------------------- */
  function makePanel(name) {
    const t = S.topics.get(name) || { topic: name };
    const kind = viewKind(t);
    const root = el('div', 'panel');
    root.dataset.topic = name;
    root.dataset.kind = kind;
    const title = el('div', 'title');
    title.append(el('span', 'name', name), el('span', 'dim small', kind));
    const close = el('span', 'close', '✕');
    close.title = 'hide';
    close.onclick = () => { S.closedByUser.add(name); removePanel(name); };
    title.append(close);
    const info = el('div', 'info');
    root.append(title, info);
    const p = { name, kind, root, info, pending: null, drawn: 0, hist: null, opts: {} };
    p.fitStage = (t.desc || {}).kind === 'fit' ? name.split('.')[0] : null;
    if (kind === 'image') buildImage(p);
    else if (kind === 'fit') buildFit(p);
    else if (kind === 'curves' || kind === 'curve' || kind === 'scalar' || kind === 'scalars') buildPlot(p);
    else { p.pre = el('pre'); root.append(p.pre); }
    $('panels').append(root);
    S.panels.set(name, p);
    const last = S.latest.get(name);
    if (last) p.pending = last;
    sendSubscribe();
    return p;
  }
  function removePanel(name) {
    const p = S.panels.get(name);
    if (!p) return;
    p.root.remove();
    S.panels.delete(name);
    sendSubscribe();
    renderTopics();
  }

  function control(p, label, input) {
    const l = el('label');
    l.append(label + ' ', input);
    p.controls.append(l);
    return input;
  }

  function buildImage(p) {
    p.controls = el('div', 'controls');
    const cm = el('select');
    for (const k of Object.keys(LUTS)) cm.append(new Option(k, k));
    p.opts.cmap = control(p, 'colours', cm);
    const auto = el('input'); auto.type = 'checkbox'; auto.checked = true;
    p.opts.auto = control(p, 'autoscale', auto);
    const lo = el('input'); lo.type = 'number'; lo.step = 'any';
    const hi = el('input'); hi.type = 'number'; hi.step = 'any';
    p.opts.lo = control(p, 'min', lo);
    p.opts.hi = control(p, 'max', hi);
    const logc = el('input'); logc.type = 'checkbox';
    p.opts.log = control(p, 'log', logc);
    const part = el('select');
    part.append(new Option('magnitude', '0'), new Option('phase', '1'));
    p.opts.part = control(p, 'part', part);
    p.opts.part.parentNode.style.display = 'none';
    /* Planes of a stack (a fit's parameters, c2 per ROI, probe modes): a
     * select by label (or index) and a slider to step through them. */
    const plane = el('select');
    p.opts.plane = control(p, 'plane', plane);
    p.opts.plane.parentNode.style.display = 'none';
    const slide = el('input'); slide.type = 'range'; slide.min = '0'; slide.step = '1'; slide.value = '0';
    p.opts.planeSlider = slide;
    plane.parentNode.append(' ', slide);
    slide.oninput = () => { plane.value = slide.value; if (p.last) p.pending = p.last; };
    /* Autoscale limits: min-max, or percentiles, which failed fits'
     * outliers cannot stretch (the default for fit maps). */
    const lim = el('select');
    lim.append(new Option('min–max', '0'), new Option('1–99 %', '1'), new Option('0.1–99.9 %', '0.1'));
    if (p.fitStage) lim.value = '1';
    p.opts.limits = control(p, 'limits', lim);
    const reset = el('button', '', 'reset view');
    p.controls.append(reset);
    p.canvas = el('canvas', 'view');
    p.canvas.width = 438; p.canvas.height = 340;
    p.cbar = el('canvas', 'cbar'); p.cbar.width = 256; p.cbar.height = 1;
    p.cbarLabels = el('div', 'cbarlabels');
    p.cbarLo = el('span'); p.cbarHi = el('span');
    p.cbarLabels.append(p.cbarLo, p.cbarHi);
    p.legend = el('div', 'legend');
    p.readout = el('div', 'readout');
    p.root.append(p.controls, p.canvas, p.cbar, p.cbarLabels, p.legend, p.readout);
    p.off = document.createElement('canvas');
    p.zoom = { s: 0, x: 0, y: 0 }; // s = 0: fit
    const redraw = () => { if (p.last) p.pending = p.last; };
    for (const c of [cm, auto, lo, hi, logc, part, plane, lim]) c.onchange = () => {
      if (c === lo || c === hi) auto.checked = false;
      redraw();
    };
    reset.onclick = () => { p.zoom = { s: 0, x: 0, y: 0 }; redraw(); };
    p.canvas.addEventListener('wheel', (ev) => {
      ev.preventDefault();
      fitIfNeeded(p);
      const r = p.canvas.getBoundingClientRect();
      const mx = (ev.clientX - r.left) * p.canvas.width / r.width;
      const my = (ev.clientY - r.top) * p.canvas.height / r.height;
      const f = ev.deltaY < 0 ? 1.25 : 0.8;
      p.zoom.x = mx - (mx - p.zoom.x) * f;
      p.zoom.y = my - (my - p.zoom.y) * f;
      p.zoom.s *= f;
      redraw();
    }, { passive: false });
    let drag = null, moved = 0;
    p.canvas.onmousedown = (ev) => { fitIfNeeded(p); moved = 0; drag = { x: ev.clientX, y: ev.clientY, zx: p.zoom.x, zy: p.zoom.y }; };
    window.addEventListener('mouseup', () => { drag = null; });
    /* A click (not a drag) pins the readout of that pixel below the image. */
    p.canvas.addEventListener('click', (ev) => {
      if (moved > 3) return;
      const r = p.canvas.getBoundingClientRect();
      const px = imagePixel(p, (ev.clientX - r.left) * p.canvas.width / r.width, (ev.clientY - r.top) * p.canvas.height / r.height);
      if (px) { p.pin = px; showReadout(p); }
    });
    p.canvas.addEventListener('mousemove', (ev) => {
      const r = p.canvas.getBoundingClientRect();
      const sx = p.canvas.width / r.width, sy = p.canvas.height / r.height;
      if (drag) {
        moved = Math.max(moved, Math.abs(ev.clientX - drag.x) + Math.abs(ev.clientY - drag.y));
        p.zoom.x = drag.zx + (ev.clientX - drag.x) * sx;
        p.zoom.y = drag.zy + (ev.clientY - drag.y) * sy;
        redraw();
        return;
      }
      hover(p, (ev.clientX - r.left) * sx, (ev.clientY - r.top) * sy);
    });
  }
  function fitIfNeeded(p) {
    if (p.zoom.s || !p.img) return;
    const s = Math.min(p.canvas.width / p.img.w, p.canvas.height / p.img.h);
    p.zoom = { s, x: (p.canvas.width - p.img.w * s) / 2, y: (p.canvas.height - p.img.h * s) / 2 };
  }
  /* The display pixel under canvas point (cx, cy), or null. */
  function imagePixel(p, cx, cy) {
    if (!p.img || !p.zoom.s) return null;
    const ix = Math.floor((cx - p.zoom.x) / p.zoom.s), iy = Math.floor((cy - p.zoom.y) / p.zoom.s);
    if (ix < 0 || iy < 0 || ix >= p.img.w || iy >= p.img.h) return null;
    return { ix, iy };
  }
  function hover(p, cx, cy) {
    const px = imagePixel(p, cx, cy);
    if (!px) { p.hoverText = ''; return; }
    const { ix, iy } = px;
    const v = p.img.plane[iy * p.img.w + ix];
    const f = p.img.factor;
    const cat = p.img.categories;
    p.hoverText = 'x ' + ix * f[1] + ', y ' + iy * f[0] + physText(p, ix * f[1], iy * f[0]) + ': ' +
      (cat && v === v && cat[v] !== undefined ? cat[v] + ' (' + v + ')' : fmt(v));
    if (p.fitStage) {
      const r = fitPixel(p.fitStage, ix * f[1], iy * f[0]);
      if (r) p.hoverText = readoutText(r);
    }
    p.info.textContent = p.infoText + '  |  ' + p.hoverText;
  }

  /* ---- physical axes of images --------------------------------------------- */
  /* Where an image's pixels have a size: the descriptor's labels of an axis
   * as {origin, step, units} (ptycho_dm's object); else, from the series
   * metadata (PROTOCOL.md §7), scan_step for a result of the scan's shape
   * (roi_sum's scan image) and pixel_size for one of the detector frame's
   * shape. null: pixel indices. Pixel j (original) is centred at
   * origin + j * step. */
  function imageAxes(h) {
    const d = h.desc || {}, axes = d.axes || [], shape = h.shape || [], nd = shape.length;
    if (nd < 2) return null;
    const lab = d.labels && typeof d.labels === 'object' && !Array.isArray(d.labels) ? d.labels : null;
    const out = {};
    ['y', 'x'].forEach((xy, i) => {
      const l = lab ? lab[axes[nd - 2 + i]] || lab[xy] : null;
      if (l && typeof l === 'object' && !Array.isArray(l) && l.step > 0 && l.units && l.units !== 'px')
        out[xy] = { origin: +l.origin || 0, step: +l.step, units: l.units, source: 'descriptor' };
    });
    if (out.x && out.y) return out;
    const ser = S.seriesInfo.get(h.series_id);
    if (!ser || !ser.doc) return null;
    const md = ser.doc, ny = shape[nd - 2], nx = shape[nd - 1];
    const pair = (v) => Array.isArray(v) ? (v.length === 2 ? [+v[0], +v[1]] : null) : [+v, +v];
    const use = (st, source) => {
      const s2 = pair(st);
      if (!s2 || !(s2[0] > 0) || !(s2[1] > 0)) return null;
      return { y: { origin: 0, step: s2[0], units: 'm', source }, x: { origin: 0, step: s2[1], units: 'm', source } };
    };
    const sc = md.scan_shape;
    if (Array.isArray(sc) && sc.length === 2 && sc[0] === ny && sc[1] === nx && md.scan_step !== undefined)
      return use(md.scan_step, 'scan_step');
    const fs = ser.shape || [];
    if (md.pixel_size !== undefined && fs.length >= 2 && fs[fs.length - 2] === ny && fs[fs.length - 1] === nx)
      return use(md.pixel_size, 'pixel_size');
    return null;
  }
  /* Metres in the unit that suits the extent. */
  function lengthUnit(units, extent) {
    if (units !== 'm') return { name: units, k: 1 };
    const a = Math.abs(extent);
    if (a >= 1) return { name: 'm', k: 1 };
    if (a >= 1e-3) return { name: 'mm', k: 1e3 };
    if (a >= 1e-6) return { name: 'µm', k: 1e6 };
    return { name: 'nm', k: 1e9 };
  }
  /* One unit for both axes (when both are lengths), from the larger extent. */
  function imageUnit(p, a) {
    const A = p.img.axes, f = p.img.factor;
    const ext = A.x.units === A.y.units ? Math.max(A.x.step * p.img.w * f[1], A.y.step * p.img.h * f[0])
      : a.step * (a === A.x ? p.img.w * f[1] : p.img.h * f[0]);
    return lengthUnit(a.units, ext);
  }
  const AX_B = 18, AX_L = 52, TICK_RGB = '#e8eaed';
  /* Rulers along the bottom and left edges over the image, in the axes'
   * units; returns the ticks drawn ({c: canvas coordinate, v: value in the
   * axis units, label}) per axis. */
  function drawImageAxes(p, ctx) {
    const A = p.img.axes, f = p.img.factor, z = p.zoom, Wc = p.canvas.width, Hc = p.canvas.height;
    const out = { x: [], y: [], units: {} };
    ctx.fillStyle = 'rgba(13,15,18,0.85)';
    ctx.fillRect(0, Hc - AX_B, Wc, AX_B);
    ctx.fillRect(0, 0, AX_L, Hc - AX_B);
    ctx.font = '10px sans-serif';
    for (const [xy, lo, hi, off, fac] of [['x', AX_L, Wc, z.x, f[1]], ['y', 0, Hc - AX_B, z.y, f[0]]]) {
      const a = A[xy];
      const val = (c) => a.origin + ((c - off) / z.s * fac - 0.5) * a.step;
      const pos = (v) => off + ((v - a.origin) / a.step + 0.5) / fac * z.s;
      const u = imageUnit(p, a);
      out.units[xy] = u.name;
      let v0 = val(lo) * u.k, v1 = val(hi) * u.k;
      if (v1 < v0) [v0, v1] = [v1, v0];
      const want = Math.max(2, Math.floor((hi - lo) / (xy === 'x' ? 80 : 50)));
      const raw = (v1 - v0) / want, e = Math.pow(10, Math.floor(Math.log10(raw || 1)));
      const d = e * ([1, 2, 5, 10].find((m) => raw / e <= m) || 10);
      ctx.fillStyle = TICK_RGB; ctx.strokeStyle = TICK_RGB; ctx.lineWidth = 1;
      for (let i = Math.ceil(v0 / d); i * d <= v1 && out[xy].length < 20; i++) {
        const v = Math.abs(i) < 1e-9 ? 0 : i * d, c = pos(v / u.k);
        const label = String(+v.toPrecision(6));
        out[xy].push({ c, v: v / u.k, label });
        const r = Math.round(c) + 0.5;
        ctx.beginPath();
        if (xy === 'x') {
          ctx.moveTo(r, Hc - AX_B); ctx.lineTo(r, Hc - AX_B + 5); ctx.stroke();
          ctx.fillText(label, r - 8, Hc - 3);
        } else {
          ctx.moveTo(AX_L - 5, r); ctx.lineTo(AX_L, r); ctx.stroke();
          ctx.fillText(label, 2, r + 3);
        }
      }
    }
    ctx.fillStyle = TICK_RGB;
    ctx.fillText(out.units.x === out.units.y ? out.units.x : out.units.y + ' / ' + out.units.x, 2, Hc - 3);
    return out;
  }
  /* "x, y" of an original pixel in the image's axis units, or ''. */
  function physText(p, x, y) {
    const A = p.img && p.img.axes;
    if (!A) return '';
    const f = (a, j) => { const u = imageUnit(p, a); return fmtP((a.origin + j * a.step) * u.k) + ' ' + u.name; };
    return ' (' + f(A.x, x) + ', ' + f(A.y, y) + ')';
  }

  /* ---- fit maps: one pixel's parameters ± errors, chi2 and status ------------- */
  /* x, y in original pixel coordinates; siblings <stage>.params, .errors,
   * .chi2, .status of the newest version received (of the same display
   * shape, so one index serves all). null when there is no params map. */
  function fitPixel(stage, x, y) {
    /* Of the params' frame where the others of that frame are still at hand. */
    const first = S.latest.get(stage + '.params') || S.latest.get(stage + '.chi2') || S.latest.get(stage + '.status');
    const get = (out) => {
      const m = first ? sameFrame(stage + '.' + out, first) : null;
      return m && m.a && m.h.data && (m.h.data.shape || []).length === 2 ? m : null;
    };
    const pm = get('params'), em = get('errors'), cm = get('chi2'), sm = get('status');
    const base = pm || cm || sm;
    if (!base) return null;
    const [H, W] = base.h.data.shape, f = base.h.data.factor || [1, 1];
    const ix = Math.floor(x / f[1]), iy = Math.floor(y / f[0]);
    if (ix < 0 || iy < 0 || ix >= W || iy >= H) return null;
    const same = (m) => m && m.h.data.shape[0] === H && m.h.data.shape[1] === W;
    const i = iy * W + ix, n = H * W;
    const r = { x, y, frame_id: base.h.frame_id, values: [] };
    if (pm) {
      const names = (pm.h.data.arrays || []).map((a) => a.name);
      for (let j = 0; j < names.length && (j + 1) * n <= pm.a.length; j++)
        r.values.push({ name: names[j], v: pm.a[j * n + i],
          e: same(em) && em.a.length >= (j + 1) * n ? em.a[j * n + i] : null });
    }
    if (same(cm)) r.chi2 = cm.a[i];
    if (same(sm)) {
      r.status = sm.a[i];
      const lab = ((S.topics.get(stage + '.status') || {}).desc || {}).labels;
      r.status_name = Array.isArray(lab) && lab[r.status] !== undefined ? lab[r.status] : String(r.status);
    }
    return r;
  }
  S.fitPixel = fitPixel;
  function readoutText(r) {
    const parts = r.values.map((q) => q.name + ' ' + fmtPE(q.v, q.e));
    if (r.chi2 !== undefined) parts.push('χ² ' + fmtP(r.chi2));
    if (r.status !== undefined) parts.push(r.status_name);
    return 'x ' + r.x + ', y ' + r.y + ': ' + parts.join(' · ');
  }
  function showReadout(p) {
    if (!p.pin || !p.img) { p.readout.textContent = ''; return; }
    const f = p.img.factor, x = p.pin.ix * f[1], y = p.pin.iy * f[0];
    const r = p.fitStage ? fitPixel(p.fitStage, x, y) : null;
    const v = p.img.plane[p.pin.iy * p.img.w + p.pin.ix];
    p.readoutData = r || { x, y, value: v };
    p.readout.textContent = 'pinned ' + (r ? readoutText(r) : 'x ' + x + ', y ' + y + ': ' + fmt(v));
  }

  /* Percentiles q0, q1 (0..1) of the finite values of a (linear between
   * order statistics, as numpy's default); a sample of 65536 when larger. */
  function percentiles(a, q0, q1, positive) {
    const n = a.length, step = n > 65536 ? n / 65536 : 1;
    const v = [];
    for (let i = 0; i < n; i += step) {
      const x = a[Math.floor(i)];
      if (Number.isFinite(x) && (!positive || x > 0)) v.push(x);
    }
    if (!v.length) return [null, null];
    const s = Float64Array.from(v).sort();
    const at = (q) => {
      const pos = q * (s.length - 1), k = Math.floor(pos), f = pos - k;
      return k + 1 < s.length ? s[k] * (1 - f) + s[k + 1] * f : s[k];
    };
    return [at(q0), at(q1)];
  }

  /* The plane select of a stack: options = labels (or indices), kept by
   * name; the slider follows it. */
  function syncPlanes(p, names, axis) {
    const sel = p.opts.plane;
    sel.parentNode.firstChild.textContent = (axis || 'plane') + ' ';
    const have = Array.from(sel.options, (o) => o.textContent);
    p.opts.planeSlider.max = String(names.length - 1);
    p.opts.planeSlider.value = sel.value || '0';
    if (have.length === names.length && have.every((x, i) => x === names[i])) return;
    const keep = sel.selectedIndex >= 0 ? have[sel.selectedIndex] : null;
    sel.textContent = '';
    names.forEach((nm, i) => sel.append(new Option(nm, String(i))));
    const j = names.indexOf(keep);
    sel.value = String(j >= 0 ? j : 0);
    p.opts.planeSlider.value = sel.value;
  }

  function drawImage(p, m) {
    const h = m.h, data = h.data || {}, shape = data.shape || [];
    const H = shape[0], W = shape[1];
    if (!m.a || !H || !W) { p.info.textContent = 'no data'; return false; }
    const arrays = data.arrays || [];
    const cplx = data.complex === undefined ? arrays.length > 1 && !data.stack : !!data.complex;
    const per = cplx ? 2 : 1; // arrays per plane: magnitude and phase of complex ones
    const stack = data.stack === undefined ? !cplx && arrays.length > 1 : !!data.stack && arrays.length > per;
    const desc = h.desc || {};
    const labels = Array.isArray(desc.labels) ? desc.labels : null;
    const categories = data.categorical && labels ? labels : null;
    p.opts.part.parentNode.style.display = cplx ? '' : 'none';
    p.opts.plane.parentNode.style.display = stack ? '' : 'none';
    if (stack) syncPlanes(p, arrays.filter((_, i) => i % per === 0).map((x) => x.name), (desc.axes || [])[0]);
    /* Colour-scale controls mean nothing for categories. */
    for (const c of [p.opts.cmap, p.opts.auto, p.opts.lo, p.opts.hi, p.opts.log, p.opts.limits])
      c.parentNode.style.display = categories ? 'none' : '';
    p.cbar.style.display = p.cbarLabels.style.display = categories ? 'none' : '';
    const pl = stack ? Math.min(+p.opts.plane.value || 0, arrays.length / per - 1) : 0;
    const phase = cplx && +p.opts.part.value === 1;
    const k = pl * per + (phase ? 1 : 0);
    if ((k + 1) * H * W > m.a.length) { p.info.textContent = 'short payload'; return false; }
    const plane = m.a.subarray(k * H * W, (k + 1) * H * W);
    const st = arrays[k] || {};
    let lo, hi;
    const logs = p.opts.log.checked && !categories;
    const q = parseFloat(p.opts.limits.value) || 0;
    if (p.opts.auto.checked) {
      lo = st.min; hi = st.max;
      if (phase) { lo = -Math.PI; hi = Math.PI; }
      else if (q > 0) [lo, hi] = percentiles(plane, q / 100, 1 - q / 100, logs);
      if (logs && !(q > 0)) {
        lo = Infinity;
        for (let i = 0; i < plane.length; i++) { const v = plane[i]; if (v > 0 && v < lo) lo = v; }
        if (!Number.isFinite(lo)) lo = 1;
      }
      if (lo !== null && lo !== undefined) p.opts.lo.value = +lo.toPrecision(5);
      if (hi !== null && hi !== undefined) p.opts.hi.value = +hi.toPrecision(5);
    } else {
      lo = parseFloat(p.opts.lo.value); hi = parseFloat(p.opts.hi.value);
    }
    if (!Number.isFinite(lo) || !Number.isFinite(hi)) { lo = 0; hi = 1; }
    const cmap = phase && p.opts.cmap.value === 'viridis' ? 'hsv' : p.opts.cmap.value;
    const lut = LUTS[cmap];
    const nan = nanRGB(cmap), nanPx = rgba(nan[0], nan[1], nan[2]);
    if (p.off.width !== W || p.off.height !== H) {
      p.off.width = W; p.off.height = H;
      p.imgData = null;
      if (p.img && (p.img.w !== W || p.img.h !== H)) p.zoom = { s: 0, x: 0, y: 0 };
    }
    const octx = p.off.getContext('2d');
    if (!p.imgData) p.imgData = octx.createImageData(W, H);
    const px = new Uint32Array(p.imgData.data.buffer);
    let counts = null, catPx = null;
    if (categories) {
      catPx = categories.map((nm, i) => {
        const c = STATUS_RGB[nm] || CURVE_COLOURS[i % CURVE_COLOURS.length].match(/\w\w/g).map((x) => parseInt(x, 16));
        return rgba(c[0], c[1], c[2]);
      });
      counts = new Array(categories.length + 1).fill(0); // the last: any other value
      for (let i = 0, n = W * H; i < n; i++) {
        const v = plane[i];
        if (v !== v) { px[i] = nanPx; continue; }
        const j = v >= 0 && v < categories.length && v === Math.floor(v) ? v : -1;
        if (j < 0) { px[i] = rgba(255, 255, 255); counts[categories.length]++; continue; }
        px[i] = catPx[j];
        counts[j]++;
      }
    } else {
      let a = logs ? Math.log10(lo > 0 ? lo : 1e-30) : lo;
      const b = logs ? Math.log10(hi > 0 ? hi : 1e-30) : hi;
      const scale = b > a ? 255 / (b - a) : 0;
      if (!(b > a)) a = a - 0.5;
      for (let i = 0, n = W * H; i < n; i++) {
        let v = plane[i];
        if (v !== v) { px[i] = nanPx; continue; }
        if (logs) v = v > 0 ? Math.log10(v) : a;
        let j = (v - a) * scale;
        j = j < 0 ? 0 : j > 255 ? 255 : j | 0;
        px[i] = lut[j];
      }
    }
    octx.putImageData(p.imgData, 0, 0);
    p.img = { w: W, h: H, plane, factor: data.factor || [1, 1], categories, counts,
      plane_name: stack ? st.name : null, plane_index: pl, part: cplx ? (phase ? 'phase' : 'magnitude') : null, limits: categories ? null : [lo, hi], nan_rgb: nan };
    fitIfNeeded(p);
    const ctx = p.canvas.getContext('2d');
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = '#000';
    ctx.fillRect(0, 0, p.canvas.width, p.canvas.height);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(p.off, p.zoom.x, p.zoom.y, W * p.zoom.s, H * p.zoom.s);
    p.img.axes = imageAxes(h);
    p.img.ticks = p.img.axes ? drawImageAxes(p, ctx) : null;
    /* Legend: the categories with their counts, or the NaN colour. */
    p.legend.textContent = '';
    const swatch = (c, text) => {
      const sp = el('span', 'item');
      const sw = el('span', 'swatch');
      sw.style.background = 'rgb(' + c.join(',') + ')';
      sp.append(sw, text);
      p.legend.append(sp);
    };
    if (categories) {
      categories.forEach((nm, i) => {
        const c = catPx[i];
        swatch([c & 255, (c >>> 8) & 255, (c >>> 16) & 255], nm + ' ' + counts[i]);
      });
      if (counts[categories.length]) swatch([255, 255, 255], 'other ' + counts[categories.length]);
    } else {
      const cb = p.cbar.getContext('2d');
      const cbd = cb.createImageData(256, 1);
      new Uint32Array(cbd.data.buffer).set(lut);
      cb.putImageData(cbd, 0, 0);
      const u = desc.units || '';
      p.cbarLo.textContent = fmt(lo) + (logs ? ' (log)' : '') + (q > 0 && p.opts.auto.checked ? ' (' + q + ' %)' : '');
      p.cbarHi.textContent = fmt(hi) + (u ? ' ' + u : '');
    }
    if (st.nonfinite) swatch(nan, 'NaN/Inf ' + st.nonfinite);
    const f = data.factor || [1, 1];
    p.infoText = 'series ' + h.series_id + ' frame ' + h.frame_id + ' · ' + (h.shape || []).join('×') +
      (f[0] > 1 || f[1] > 1 ? ' shown ' + W + '×' + H + ' (' + data.downsample + ' of ' + f[0] + '×' + f[1] + ')' : '') +
      (stack ? ' · ' + ((desc.axes || [])[0] || 'plane') + ' ' + st.name + ' (' + (pl + 1) + ' of ' + arrays.length / per + ')'
        : data.planes > 1 ? ' · plane 0 of ' + data.planes : '') +
      (h.flags & 16 ? ' · final' : h.flags & 8 ? ' · partial' : '') +
      (st.nonfinite ? ' · ' + st.nonfinite + ' NaN/Inf' : '') + (h.desc ? '' : ' · no descriptor (raw)');
    p.info.textContent = p.infoText + (p.hoverText ? '  |  ' + p.hoverText : '');
    showReadout(p);
    return true;
  }

  function buildPlot(p) {
    p.controls = el('div', 'controls');
    const lx = el('input'); lx.type = 'checkbox';
    const ly = el('input'); ly.type = 'checkbox';
    p.opts.logx = control(p, 'log x', lx);
    p.opts.logy = control(p, 'log y', ly);
    p.opts.logxAuto = true;
    lx.onchange = () => { p.opts.logxAuto = false; if (p.last) p.pending = p.last; };
    ly.onchange = () => { if (p.last) p.pending = p.last; };
    p.canvas = el('canvas', 'view');
    p.canvas.width = 438; p.canvas.height = 340;
    p.root.append(p.controls, p.canvas);
  }

  /* Line plot of curves [{x, y, name, mode?, err?, colour?}] with axes; log
   * axes drop values <= 0. mode 'line' (default: a line, and a dot per
   * point up to 64 points), 'model' (line only) or 'points' (dots, with
   * vertical bars y ± err where err is given). Each curve gets drawn (points
   * on the canvas) and bars (error bars drawn). */
  function plot(canvas, curves, o) {
    const ctx = canvas.getContext('2d');
    const W = canvas.width, H = canvas.height, L = 62, R = 10, T = 10, B = 36;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = '#0d0f12';
    ctx.fillRect(0, 0, W, H);
    const tx = o.logx ? (v) => (v > 0 ? Math.log10(v) : NaN) : (v) => v;
    const ty = o.logy ? (v) => (v > 0 ? Math.log10(v) : NaN) : (v) => v;
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const c of curves) for (let i = 0; i < c.y.length; i++) {
      const X = tx(c.x[i]), Y = ty(c.y[i]);
      if (!Number.isFinite(X) || !Number.isFinite(Y)) continue;
      if (X < x0) x0 = X; if (X > x1) x1 = X; if (Y < y0) y0 = Y; if (Y > y1) y1 = Y;
    }
    if (!(x1 >= x0) || !(y1 >= y0)) {
      ctx.fillStyle = '#9aa0a6'; ctx.fillText('no finite values', L + 10, T + 20); return 0;
    }
    if (x1 === x0) { x0 -= 0.5; x1 += 0.5; }
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const sx = (W - L - R) / (x1 - x0), sy = (H - T - B) / (y1 - y0);
    const X = (v) => L + (v - x0) * sx, Y = (v) => H - B - (v - y0) * sy;
    canvas.plotBox = { L, R, T, B, x0, x1, y0, y1, logx: !!o.logx, logy: !!o.logy };
    ctx.strokeStyle = '#2e323a'; ctx.fillStyle = '#9aa0a6'; ctx.font = '11px sans-serif';
    ctx.lineWidth = 1;
    const ticks = (a, b, log, px) => {
      const out = [], want = Math.max(2, Math.floor(px / 70));
      if (log) {
        for (let e = Math.floor(a); e <= Math.ceil(b); e++) if (e >= a && e <= b) out.push([e, '1e' + e]);
        if (out.length >= 2) return out;
      }
      const step = Math.pow(10, Math.floor(Math.log10((b - a) / want || 1)));
      const r = (b - a) / step;
      const m = [1, 2, 5, 10].find((k) => r / k <= want) || 10;
      const d = step * m;
      for (let i = Math.ceil(a / d); i * d <= b; i++) {
        const v = Math.abs(i) < 1e-9 ? 0 : i * d; // no -2.8e-17 for zero
        out.push([v, log ? fmt(Math.pow(10, v), 2) : fmt(v, d >= 1 ? 0 : undefined)]);
      }
      return out;
    };
    for (const [v, s] of ticks(x0, x1, o.logx, W - L - R)) {
      ctx.beginPath(); ctx.moveTo(X(v), T); ctx.lineTo(X(v), H - B); ctx.stroke();
      ctx.fillText(s, X(v) - 12, H - B + 13);
    }
    for (const [v, s] of ticks(y0, y1, o.logy, (H - T - B) * 2)) {
      ctx.beginPath(); ctx.moveTo(L, Y(v)); ctx.lineTo(W - R, Y(v)); ctx.stroke();
      ctx.fillText(s, 4, Y(v) + 4);
    }
    ctx.fillText(o.xlabel || '', W / 2 - 20, H - 6);
    ctx.fillText(o.ylabel || '', L + 4, T + 12);
    let drawnPts = 0, leg = 0;
    ctx.save();
    ctx.beginPath(); ctx.rect(L, T, W - L - R, H - T - B); ctx.clip();
    curves.forEach((c, k) => {
      ctx.strokeStyle = c.colour || CURVE_COLOURS[k % CURVE_COLOURS.length];
      ctx.fillStyle = ctx.strokeStyle;
      ctx.lineWidth = 1.5;
      const mode = c.mode || 'line';
      c.drawn = 0; c.bars = 0;
      ctx.beginPath();
      let pen = false;
      for (let i = 0; i < c.y.length; i++) {
        const xv = tx(c.x[i]), yv = ty(c.y[i]);
        if (!Number.isFinite(xv) || !Number.isFinite(yv)) { pen = false; continue; }
        c.drawn++; drawnPts++;
        if (mode === 'points') {
          ctx.fillRect(X(xv) - 2.5, Y(yv) - 2.5, 5, 5);
          const e = c.err ? c.err[i] : NaN;
          if (e > 0 && Number.isFinite(e)) {
            const top = ty(c.y[i] + e), bot = ty(c.y[i] - e);
            const yb = Number.isFinite(bot) ? Y(bot) : H - B, yt = Number.isFinite(top) ? Y(top) : T;
            ctx.moveTo(X(xv), yb); ctx.lineTo(X(xv), yt);
            ctx.moveTo(X(xv) - 2, yb); ctx.lineTo(X(xv) + 2, yb);
            ctx.moveTo(X(xv) - 2, yt); ctx.lineTo(X(xv) + 2, yt);
            c.bars++;
          }
          continue;
        }
        if (pen) ctx.lineTo(X(xv), Y(yv)); else ctx.moveTo(X(xv), Y(yv));
        pen = true;
        if (mode === 'line' && c.y.length <= 64) ctx.fillRect(X(xv) - 1.5, Y(yv) - 1.5, 3, 3);
      }
      ctx.stroke();
    });
    ctx.restore();
    curves.forEach((c, k) => {
      if (!(curves.length > 1 || c.name) || (c.name === '' && c.mode)) return;
      ctx.fillStyle = c.colour || CURVE_COLOURS[k % CURVE_COLOURS.length];
      ctx.fillText(c.name || '', W - R - 110, T + 12 + 13 * leg++);
    });
    return drawnPts;
  }

  function drawPlot(p, m) {
    const h = m.h, a = m.a, data = h.data || {}, shape = data.shape || [];
    const d = h.desc || {};
    const axes = d.axes || [];
    const units = d.units || '';
    let curves = [], xl = '', logx = false;
    if (!a) { p.info.textContent = 'no data'; return false; }
    if (p.kind === 'scalar' || p.kind === 'scalars') {
      const hist = S.hist[h.topic] || { t: [], v: [] };
      const t0 = hist.t.length ? hist.t[hist.t.length - 1] : 0;
      const x = Float32Array.from(hist.t, (v) => v - t0);
      const k = a.length;
      const names = k > 1 ? curveNames(h.topic, axes[0], k) : [''];
      for (let j = 0; j < k; j++) curves.push({ x, y: Float32Array.from(hist.v, (v) => v[j]), name: names[j] });
      xl = 'seconds (0 = latest)';
      p.infoText = 'latest ' + Array.from(a.slice(0, 4), (v) => fmt(v)).join(', ') + (units ? ' ' + units : '') +
        ' · frame ' + h.frame_id;
    } else if (shape.length === 1) {
      const xv = xValues(h.topic, axes[0], a.length);
      curves.push({ x: xv.x, y: a, name: '' });
      xl = xv.label; logx = xv.log;
      p.infoText = a.length + ' points · series ' + h.series_id + ' frame ' + h.frame_id;
    } else {
      /* 2-D: one curve per column (axis 1) when axis 0 is the lag axis, else per row. */
      let [n0, n1] = shape;
      const lagFirst = isLagAxis(axes[0]) || isIterAxis(axes[0]) || (!isLagAxis(axes[1]) && !isIterAxis(axes[1]) && n1 <= n0);
      const nx = lagFirst ? n0 : n1, k = lagFirst ? n1 : n0;
      const xAxis = lagFirst ? axes[0] : axes[1], cAxis = lagFirst ? axes[1] : axes[0];
      let xv = xValues(h.topic, xAxis, nx);
      const names = curveNames(h.topic, cAxis || 'roi', k);
      const col = (j) => {
        const y = new Float32Array(nx);
        for (let i = 0; i < nx; i++) y[i] = lagFirst ? a[i * n1 + j] : a[j * n1 + i];
        return y;
      };
      /* A history whose curves include the x axis itself (ptycho_dm's error
       * [iteration, metric] with a metric "iteration"): the metrics are
       * plotted against that column's values, not the row index. */
      const lab = d.labels && !Array.isArray(d.labels) ? d.labels[cAxis] : null;
      const xc = Array.isArray(lab) && lab.length === k && xAxis ? lab.indexOf(xAxis) : -1;
      if (xc >= 0) xv = { x: col(xc), label: xAxis, log: false };
      for (let j = 0; j < k; j++) if (j !== xc) curves.push({ x: xv.x, y: col(j), name: names[j] });
      xl = xv.label; logx = xv.log;
      p.infoText = k + ' curves × ' + nx + ' points · series ' + h.series_id + ' frame ' + h.frame_id +
        (h.flags & 16 ? ' · final' : h.flags & 8 ? ' · partial' : '');
    }
    if (p.opts.logxAuto) p.opts.logx.checked = logx;
    const n = plot(p.canvas, curves, {
      logx: p.opts.logx.checked, logy: p.opts.logy.checked, xlabel: xl,
      ylabel: (h.topic.split('.')[1] || h.topic) + (units ? ' (' + units + ')' : ''),
    });
    p.curves = curves.length;
    p.points = n;
    p.plotted = { x: Array.from(curves.length ? curves[0].x : []), xlabel: xl, names: curves.map((c) => c.name),
      logy: p.opts.logy.checked, box: p.canvas.plotBox };
    p.info.textContent = p.infoText + (h.desc ? '' : ' · no descriptor (raw)');
    return n > 0;
  }

  /* ---- fits of curves (source: result): data points under the model ---------- */
  function buildFit(p) {
    p.controls = el('div', 'controls');
    const fitSel = el('select');
    fitSel.append(new Option('all', 'all'));
    p.opts.fit = control(p, 'fit', fitSel);
    const dataSel = el('select');
    p.opts.data = control(p, 'data', dataSel);
    const lx = el('input'); lx.type = 'checkbox';
    const ly = el('input'); ly.type = 'checkbox';
    p.opts.logx = control(p, 'log x', lx);
    p.opts.logy = control(p, 'log y', ly);
    p.opts.logxAuto = true;
    const redraw = () => { if (p.last) p.pending = p.last; };
    lx.onchange = () => { p.opts.logxAuto = false; redraw(); };
    ly.onchange = redraw;
    fitSel.onchange = redraw;
    dataSel.onchange = () => { p.dataChoice = dataSel.value; sendSubscribe(); redraw(); };
    p.canvas = el('canvas', 'view');
    p.canvas.width = 438; p.canvas.height = 340;
    p.table = el('table', 'fitparams');
    const wrap = el('div', 'tablewrap');
    wrap.append(p.table);
    p.root.append(p.controls, p.canvas, wrap);
    p.fitIndex = 0;
  }

  /* The upstream output a fit of curves consumed: the descriptor does not
   * name it, so it is found as a topic of another stage with the curves'
   * published shape, not an error or x output (…_err, …lags): a lag axis,
   * then the fit's frame id (the fit copies its input's frame id), then an
   * …_err sibling (weights) preferred. ?fitdata=<fit stage>:<topic> or the
   * panel's select overrides. */
  const ERR_OUT = /(_err|_sigma|_std|_error|\.lags|\.tau|\.lag)$/;
  function fitDataCandidates(name) {
    const me = S.topics.get(name) || {}, shape = me.shape || [];
    const stage = name.split('.')[0];
    const lm = S.latest.get(name);
    const out = [];
    for (const t of S.topics.values()) {
      const st = t.topic.split('.')[0];
      if (st === stage || st === 'beamd' || !t.ok || ERR_OUT.test(t.topic)) continue;
      const ts = t.shape || [];
      if (ts.length !== shape.length || !ts.every((v, i) => v === shape[i])) continue;
      const d = t.desc || {};
      const l = S.latest.get(t.topic);
      const score = ((d.axes || []).some(isLagAxis) ? 4 : 0) +
        (l && lm && l.h.frame_id === lm.h.frame_id && l.h.series_id === lm.h.series_id ? 2 : 0) +
        (S.topics.has(t.topic + '_err') ? 1 : 0);
      out.push([score, t.topic]);
    }
    out.sort((a, b) => b[0] - a[0] || (a[1] < b[1] ? -1 : 1));
    return out.map((x) => x[1]);
  }
  function fitDataTopic(p) {
    const stage = p.name.split('.')[0];
    for (const w of (params.get('fitdata') || '').split(',')) {
      const [st, topic] = w.split(':');
      if (st === stage && topic) return topic;
    }
    if (p.dataChoice !== undefined) return p.dataChoice || null;
    /* A descriptor that names its input ("mt.g2+g2_err+lags") settles it. */
    const inp = ((S.topics.get(p.name) || {}).desc || {}).input;
    if (typeof inp === 'string' && /^[^.+]+\.[^+]+/.test(inp)) return inp.split('+')[0];
    return fitDataCandidates(p.name)[0] || null;
  }
  /* The message of topic of the same series and frame as m when one of the
   * last few received is, else the newest. */
  function sameFrame(topic, m) {
    const r = S.recent.get(topic) || [];
    for (let i = r.length - 1; i >= 0; i--)
      if (r[i].h.frame_id === m.h.frame_id && r[i].h.series_id === m.h.series_id) return r[i];
    return S.latest.get(topic) || null;
  }

  function drawFit(p, m) {
    const h = m.h, a = m.a, data = h.data || {}, shape = data.shape || [];
    if (!a || !shape.length) { p.info.textContent = 'no data'; return false; }
    const stage = h.topic.split('.')[0];
    const axes = (h.desc || {}).axes || [];
    /* Curves as [point][fit] or [fit][point] (axis names from the stage). */
    const fitAx = shape.length === 1 ? -1 : axes.indexOf('fit') >= 0 ? axes.indexOf('fit') : 1;
    const nf = fitAx < 0 ? 1 : shape[fitAx], np = fitAx < 0 ? shape[0] : shape[1 - fitAx];
    const at = (arr, t, i) => fitAx < 0 ? arr[t] : fitAx === 1 ? arr[t * nf + i] : arr[i * np + t];
    /* The data points and their errors. */
    const cands = fitDataCandidates(h.topic);
    const dataTopic = fitDataTopic(p);
    const sel = p.opts.data;
    const want = [''].concat(cands);
    if (dataTopic && !want.includes(dataTopic)) want.push(dataTopic);
    if (Array.from(sel.options, (o) => o.value).join('|') !== want.join('|')) {
      sel.textContent = '';
      for (const c of want) sel.append(new Option(c || 'none', c));
    }
    sel.value = dataTopic || '';
    const dm = dataTopic ? sameFrame(dataTopic, m) : null;
    const dOk = dm && dm.a && (dm.h.data.shape || []).join('x') === shape.join('x');
    const errTopic = dataTopic ? dataTopic + '_err' : null;
    const em = dOk && S.latest.has(errTopic) ? sameFrame(errTopic, dm) : null;
    const eOk = em && em.a && (em.h.data.shape || []).join('x') === shape.join('x');
    const dAxes = dOk ? (dm.h.desc || {}).axes || [] : [];
    const xAxis = dOk ? dAxes[fitAx < 0 ? 0 : 1 - fitAx] : axes[fitAx < 0 ? 0 : 1 - fitAx];
    const xv = xValues(dOk ? dataTopic : h.topic, xAxis, np);
    const names = dOk ? curveNames(dataTopic, dAxes[fitAx] || 'fit', nf) : curveNames(h.topic, 'fit', nf);
    /* The fit select: all, or one fit by name. */
    const fsel = p.opts.fit;
    if (fsel.options.length !== nf + 1) {
      const keep = p.fitBuilt ? fsel.value : '0';
      p.fitBuilt = true;
      fsel.textContent = '';
      fsel.append(new Option('all', 'all'));
      names.forEach((nm, i) => fsel.append(new Option(nm, String(i))));
      fsel.value = keep === 'all' || +keep < nf ? keep : '0';
      if (!fsel.value) fsel.value = '0';
    }
    const which = fsel.value === 'all' ? Array.from({ length: nf }, (_, i) => i) : [Math.min(+fsel.value || 0, nf - 1)];
    const curves = [];
    for (const i of which) {
      const one = which.length === 1;
      const cD = one ? CURVE_COLOURS[0] : CURVE_COLOURS[i % CURVE_COLOURS.length];
      const cM = one ? CURVE_COLOURS[1] : cD;
      const ym = new Float32Array(np);
      for (let t = 0; t < np; t++) ym[t] = at(a, t, i);
      /* The model first, so the data points are drawn on top of it. */
      curves.push({ x: xv.x, y: ym, mode: 'model', colour: cM, name: one ? 'fit' : names[i] });
      if (dOk) {
        const yd = new Float32Array(np), ye = eOk ? new Float32Array(np) : null;
        for (let t = 0; t < np; t++) { yd[t] = at(dm.a, t, i); if (ye) ye[t] = at(em.a, t, i); }
        curves.push({ x: xv.x, y: yd, err: ye, mode: 'points', colour: cD, name: one ? names[i] + ' data' : '' });
      }
    }
    if (p.opts.logxAuto) p.opts.logx.checked = xv.log;
    plot(p.canvas, curves, { logx: p.opts.logx.checked, logy: p.opts.logy.checked, xlabel: xv.label,
      ylabel: dOk ? dataTopic.split('.')[1] + (eOk ? ' ± ' + errTopic.split('.')[1] : '') : 'model' });
    /* The parameters of the fits shown, ± errors, chi2 and status. */
    const pm = sameFrame(stage + '.params', m), er = sameFrame(stage + '.errors', m);
    const cm = sameFrame(stage + '.chi2', m), sm = sameFrame(stage + '.status', m);
    const pnames = ((S.topics.get(stage + '.params') || {}).desc || {}).labels || [];
    const slab = ((S.topics.get(stage + '.status') || {}).desc || {}).labels || [];
    const P = pm && pm.a && pm.a.length % nf === 0 ? pm.a.length / nf : 0; // another fit count: none
    p.table.textContent = '';
    const hr = el('tr');
    hr.append(el('th', '', ''));
    for (let j = 0; j < P; j++) hr.append(el('th', '', pnames[j] !== undefined ? pnames[j] : 'p' + j));
    hr.append(el('th', '', 'χ²'), el('th', '', 'status'));
    p.table.append(hr);
    const rows = [];
    for (const i of which) {
      const tr = el('tr');
      tr.dataset.fit = i;
      tr.append(el('td', '', names[i]));
      const row = { fit: i, name: names[i], values: [] };
      for (let j = 0; j < P; j++) {
        const v = pm.a[i * P + j], e = er && er.a && er.a.length === pm.a.length ? er.a[i * P + j] : null;
        row.values.push({ name: pnames[j], v, e });
        tr.append(el('td', '', fmtPE(v, e)));
      }
      row.chi2 = cm && cm.a ? cm.a[i] : null;
      row.status = sm && sm.a ? sm.a[i] : null;
      row.status_name = row.status !== null ? (slab[row.status] !== undefined ? slab[row.status] : String(row.status)) : null;
      tr.append(el('td', '', fmtP(row.chi2)), el('td', row.status > 1 ? 'err' : '', row.status_name || '–'));
      p.table.append(tr);
      rows.push(row);
    }
    let pts = 0, bars = 0, model = 0;
    for (const c of curves) { if (c.mode === 'points') { pts += c.drawn; bars += c.bars; } else model += c.drawn; }
    const first = (mode) => { const c = curves.find((q) => q.mode === mode); return c ? Array.from(c.y) : null; };
    p.fit = { index: fsel.value, n_fits: nf, n_points: np, data: dOk ? dataTopic : null,
      data_y: first('points'), model_y: first('model'),
      data_frame: dOk ? dm.h.frame_id : null, errors: eOk ? errTopic : null, points: pts, bars, model,
      logx: p.opts.logx.checked, rows, names, x: Array.from(xv.x) };
    p.curves = curves.length;
    p.points = pts + model;
    p.infoText = nf + ' fits × ' + np + ' points · series ' + h.series_id + ' frame ' + h.frame_id +
      (h.flags & 16 ? ' · final' : h.flags & 8 ? ' · partial' : '') +
      (dOk ? ' · data ' + dataTopic + (dm.h.frame_id !== h.frame_id ? ' (frame ' + dm.h.frame_id + ')' : '')
        : ' · no data points' + (dataTopic ? ' (' + dataTopic + ' has another shape)' : ' (no topic of shape ' + shape.join('×') + ')'));
    p.info.textContent = p.infoText;
    return pts + model > 0;
  }

  /* A fit's [fit][param] result as a table: value ± error per parameter. */
  function fitTable(p, m) {
    const h = m.h, d = h.desc || {}, shape = h.shape || [];
    const stage = h.topic.split('.')[0];
    const nf = shape[0], P = shape[1];
    const pnames = Array.isArray(d.labels) ? d.labels : [];
    const em = d.output === 'params' ? sameFrame(stage + '.errors', m) : null;
    const rows = [['fit'].concat(Array.from({ length: P }, (_, j) => pnames[j] !== undefined ? pnames[j] : 'p' + j))];
    for (let i = 0; i < nf && i < 256; i++) {
      const r = [String(i)];
      for (let j = 0; j < P; j++) {
        const e = em && em.a && em.a.length === m.a.length ? em.a[i * P + j] : null;
        r.push(fmtPE(m.a[i * P + j], e));
      }
      rows.push(r);
    }
    const wid = rows[0].map((_, j) => Math.max(...rows.map((r) => r[j].length)) + 2);
    return rows.map((r) => r.map((c, j) => c.padEnd(wid[j])).join('')).join('\n');
  }

  function drawText(p, m) {
    const h = m.h;
    if (h.type === 'raw') {
      p.pre.textContent = 'cannot decode: ' + h.why + '\npart sizes: ' + (h.part_sizes || []).join(', ') +
        '\nfirst bytes: ' + (h.head_hex || '').replace(/(..)/g, '$1 ');
      p.info.textContent = 'raw';
    } else if (h.type === 'doc') {
      p.pre.textContent = JSON.stringify(h.doc, null, 1);
      p.info.textContent = (h.msg_type || '') + ' series ' + h.series_id;
    } else if (p.kind === 'fittable' && m.a) {
      p.pre.textContent = fitTable(p, m);
      p.info.textContent = 'series ' + h.series_id + ' frame ' + h.frame_id;
    } else {
      const d = h.desc || {};
      const lab = Array.isArray(d.labels) ? d.labels : null;
      /* A fit's status [fit]: the labels name the values, not the rows. */
      const cat = d.kind === 'fit' && d.output === 'status' && lab;
      const rows = [];
      for (let i = 0; m.a && i < m.a.length && i < 256; i++)
        rows.push(String(lab && !cat ? lab[i] : i).padEnd(14) +
          (cat && lab[m.a[i]] !== undefined ? lab[m.a[i]] : fmt(m.a[i])));
      p.pre.textContent = rows.join('\n');
      p.info.textContent = 'series ' + h.series_id + ' frame ' + h.frame_id + (h.desc ? '' : ' · no descriptor (raw)');
    }
    return true;
  }

  /* ---- drawing loop: newest message per panel, once per frame ---------------- */
  function frame() {
    for (const p of S.panels.values()) {
      const m = p.pending;
      if (!m) continue;
      p.pending = null;
      p.last = m;
      let ok = false;
      try {
        if (p.kind === 'image') ok = drawImage(p, m);
        else if (p.kind === 'fit') ok = drawFit(p, m);
        else if (p.canvas) ok = drawPlot(p, m);
        else ok = drawText(p, m);
      } catch (e) {
        S.errors.push(String(e));
        p.info.textContent = 'cannot draw: ' + e;
      }
      if (ok && m.fresh) {
        m.fresh = false;
        p.drawn++;
        S.drawn[p.name] = (S.drawn[p.name] || 0) + 1;
        const t = nowMs();
        S.lastDrawn[p.name] = { series_id: m.h.series_id, frame_id: m.h.frame_id, seq: m.h.seq, at: t };
        if (m.h.t_send_ns) {
          S.latencies.push({ topic: p.name, ms: t - m.h.t_send_ns / 1e6, viewer_ms: t - m.h.t_tx_ns / 1e6 });
          if (S.latencies.length > 5000) S.latencies.splice(0, 1000);
        }
        p.root.dataset.drawn = p.drawn;
      }
    }
    if (S.unacked > 0 && S.ws && S.ws.readyState === 1) {
      S.ws.send(JSON.stringify({ ack: S.unacked }));
      S.unacked = 0;
    }
    requestAnimationFrame(frame);
  }

  /* ---- topics, status, series --------------------------------------------------- */
  function renderTopics() {
    const ul = $('topics');
    ul.textContent = '';
    for (const t of S.topics.values()) {
      const li = el('li');
      li.dataset.topic = t.topic;
      const kind = viewKind(t);
      li.dataset.kind = kind;
      if (S.panels.has(t.topic)) li.classList.add('shown');
      /* Series events are rare by nature; only data topics go stale. */
      const stale = t.topic !== 'beamd.series' && t.age_s > Math.max(STALE_S, t.rate > 0 ? 5 / t.rate : 0);
      if (stale) li.classList.add('stale');
      const name = el('span', 'name', t.topic);
      li.append(name);
      if (t.raw) {
        const b = el('span', 'raw', 'raw');
        b.title = t.ok ? 'no result descriptor received (yet)' : t.why;
        li.append(b);
      }
      li.append(el('span', 'kind', kind));
      li.append(el('div', 'what', t.ok ? describe(t) : 'cannot decode: ' + t.why));
      li.append(el('div', 'what age', fmt(t.rate, 1) + '/s · ' + t.count + ' received · last ' +
        fmt(t.age_s, 1) + ' s ago' + (stale ? ' (stopped)' : '')));
      li.onclick = () => {
        if (S.panels.has(t.topic)) { S.closedByUser.add(t.topic); removePanel(t.topic); }
        else { S.closedByUser.delete(t.topic); makePanel(t.topic); renderTopics(); }
      };
      ul.append(li);
    }
    const m = S.topicsMsg;
    if (m) {
      $('subs').textContent = (m.subs || []).map((s) => s.endpoint + ': ' + s.messages + ' messages, ' +
        s.gaps + ' lost, ' + s.malformed + ' malformed' +
        (s.age_s === null ? ', nothing yet' : ', last ' + fmt(s.age_s, 1) + ' s ago')).join('; ') +
        (m.topics_overflow ? '; ' + m.topics_overflow + ' messages over the topic limit' : '');
    }
  }

  /* The panels opened without asking: images, lag curves, histories. */
  function autoOpen() {
    const want = params.get('topics');
    const order = { image: 0, fit: 0.5, curves: 1, fittable: 1.5, scalars: 2, scalar: 3, curve: 4, table: 5 };
    const cands = [];
    for (const t of S.topics.values()) {
      if (S.autoDone.has(t.topic)) continue;
      const k = viewKind(t);
      if (want) {
        if (want.split(',').includes(t.topic)) cands.push([0, t.topic]);
      } else if (k in order && t.topic.split('.')[1] !== 'lags') {
        cands.push([order[k], t.topic]);
      }
      if (k !== 'raw' || !t.ok) S.autoDone.add(t.topic);
    }
    cands.sort((a, b) => a[0] - b[0]);
    for (const [, name] of cands) {
      if (S.panels.size >= 6) break;
      if (!S.panels.has(name) && !S.closedByUser.has(name)) makePanel(name);
    }
  }

  function onTopics(h) {
    S.topicsMsg = h;
    for (const t of h.topics) {
      const old = S.topics.get(t.topic);
      S.topics.set(t.topic, t);
      /* A descriptor that arrived later can change the view. */
      const p = S.panels.get(t.topic);
      if (p && old && viewKind(old) !== viewKind(t)) { removePanel(t.topic); makePanel(t.topic); }
    }
    autoOpen();
    renderTopics();
    updateStream();
    sendSubscribe(); // a fit view's data topic may have appeared
  }

  function updateStream() {
    const b = $('stream');
    let newest = Infinity, n = 0;
    for (const t of S.topics.values()) {
      if (t.topic.startsWith('beamd.')) continue;
      n++;
      if (t.age_s >= 0 && t.age_s < newest) newest = t.age_s;
    }
    if (!S.connected) return;
    if (!n) { b.textContent = 'waiting for results'; b.className = 'badge'; return; }
    const since = newest + (nowMs() - S.topicsAt) / 1000;
    if (since > STALE_S) {
      b.textContent = 'stream stopped (last result ' + fmt(since, 0) + ' s ago)';
      b.className = 'badge warn';
    } else {
      b.textContent = 'live';
      b.className = 'badge ok';
    }
  }

  function onStatus(h) {
    S.status = h;
    const div = $('status');
    div.textContent = '';
    if (!h.ok) {
      div.append(el('p', 'err', 'control endpoint: ' + h.error));
      if (h.last_ok_age_s !== null) div.append(el('p', 'dim', 'last answer ' + fmt(h.last_ok_age_s, 0) + ' s ago'));
      return;
    }
    const st = h.status || {}, s = h.stats || {}, inp = s.input || {};
    const lines = [
      ['state', st.state + ' · up ' + fmt(st.uptime_s, 0) + ' s · pid ' + st.pid],
      ['input', (st.mode || '') + ' ' + (st.input || '') + ' · ' + fmt(inp.rate_fps, 1) + ' frames/s · ' +
        fmt(inp.rate_mbps, 1) + ' MB/s'],
      ['drops', (inp.dropped_total || 0) + ' dropped · ' + (inp.gaps || 0) + ' gaps · ' +
        (inp.malformed || 0) + ' malformed' + (inp.paused ? ' · paused' : '')],
      ['results', (s.results || 0) + ' · ' + fmt(s.results_per_s, 1) + '/s'],
      ['latency', s.latency ? 'p50 ' + fmt(s.latency.p50_us / 1000, 2) + ' ms · p99 ' +
        fmt(s.latency.p99_us / 1000, 2) + ' ms' : '–'],
      ['gpu', st.gpu || '–'],
    ];
    const info = el('table');
    for (const [k, v] of lines) {
      const tr = el('tr');
      tr.append(el('td', 'dim', k), el('td', '', v));
      tr.lastChild.style.textAlign = 'left';
      info.append(tr);
    }
    div.append(info);
    const tab = el('table');
    const hr = el('tr');
    for (const c of ['stage', 'in', 'out', 'queue', 'p50 ms', 'err']) hr.append(el('th', '', c));
    tab.append(hr);
    for (const g of s.stages || []) {
      const tr = el('tr');
      tr.dataset.stage = g.name;
      const q = el('td');
      const bar = el('span', 'qbar');
      bar.style.width = Math.round(40 * (g.queue_cap ? g.queue_depth / g.queue_cap : 0)) + 'px';
      q.append(bar, ' ' + g.queue_depth + '/' + g.queue_cap);
      tr.append(el('td', '', g.name + ' (' + g.kind + ', ' + g.backend + ')'), el('td', '', g.frames_in),
        el('td', '', g.frames_out), q, el('td', '', fmt((g.latency || {}).p50_us / 1000, 2)),
        el('td', g.errors ? 'err' : '', g.errors + g.rejected));
      tab.append(tr);
    }
    div.append(tab);
    /* Rates over time. */
    const R = S.rates, t = h.t_tx_ns / 1e9;
    const prev = S.prevDrops;
    const drops = (inp.dropped_total || 0) + Object.values(s.outputs || {}).reduce((x, o) => x + (o.dropped || 0), 0);
    const dt = S.prevT ? t - S.prevT : 0;
    R.t.push(t); R.fps.push(inp.rate_fps || 0); R.rps.push(s.results_per_s || 0);
    R.drops.push(dt > 0 && prev !== undefined ? Math.max(0, (drops - prev) / dt) : 0);
    S.prevDrops = drops; S.prevT = t;
    if (R.t.length > 300) for (const k of Object.keys(R)) R[k].shift();
    const x = Float32Array.from(R.t, (v) => v - t);
    const c = $('ratesplot');
    c.width = 300; c.height = 120;
    plot(c, [{ x, y: Float32Array.from(R.fps), name: '' }, { x, y: Float32Array.from(R.rps), name: '' },
      { x, y: Float32Array.from(R.drops), name: '' }], { xlabel: 's', ylabel: '' });
  }

  /* One line per series: the viewer resends the newest beamd.series
   * message to a page whose subscription changed, so the same start or end
   * comes more than once; a message is a change of its series' line. */
  function onSeries(h) {
    const d = h.doc || {};
    const start = h.msg_type === 'SERIES_START';
    const info = S.seriesInfo.get(h.series_id) || { id: h.series_id };
    if (start) { info.doc = d; info.shape = h.shape || info.shape; info.dtype = h.dtype; }
    else info.end = { aborted: !!(h.flags & 128), missing: d.missing_frames };
    S.seriesInfo.delete(h.series_id);
    S.seriesInfo.set(h.series_id, info); // newest last
    while (S.seriesInfo.size > 20) S.seriesInfo.delete(S.seriesInfo.keys().next().value);
    S.series = Array.from(S.seriesInfo.values()).reverse().map((q) => {
      const m = q.doc || {};
      return 'series ' + q.id + (q.doc ? ' · started' : '') + (q.end ? ' · ended' : '') +
        (m.detector ? ' · ' + m.detector : '') + (m.nframes ? ' · ' + m.nframes + ' frames' : '') +
        (q.shape ? ' · ' + q.shape.join('×') : '') +
        (q.end && q.end.missing ? ' · ' + q.end.missing + ' missing' : '') + (q.end && q.end.aborted ? ' · aborted' : '');
    });
    const ul = $('series');
    ul.textContent = '';
    for (const s of S.series) ul.append(el('li', '', s));
    /* Images of this series may now have physical axes. */
    for (const q of S.panels.values()) if (q.kind === 'image' && q.last && !q.pending) q.pending = q.last;
  }

  /* ---- connection --------------------------------------------------------------- */
  /* Topics a fit view reads besides its own: the fit stage's outputs
   * (params ± errors for the readout and table) and, for curves, the data
   * points with their errors and lags. */
  function fitNeeds() {
    const need = new Set(), by = new Map();
    for (const p of S.panels.values()) {
      if (!p.fitStage) continue;
      const mine = [p.fitStage + '.'];
      if (p.kind === 'fit') {
        const d = fitDataTopic(p);
        if (d) mine.push(d, d.split('.')[0] + '.lags');
      }
      for (const t of mine) need.add(t);
      by.set(p.name, mine);
    }
    /* Kept for onMessage: which topics to remember by frame, and whom they redraw. */
    S.fitNeed = { all: Array.from(need), by };
    return need;
  }
  function sendSubscribe() {
    const fit = fitNeeds();
    if (!S.ws || S.ws.readyState !== 1) return;
    const want = new Set();
    for (const name of S.panels.keys()) {
      want.add(name);
      want.add(name.split('.')[0] + '.lags'); // x values of lag curves
    }
    for (const n of fit) want.add(n);
    /* Histories need every value, not only while shown. */
    for (const t of S.topics.values()) {
      const k = viewKind(t);
      if (k === 'scalar' || k === 'scalars') want.add(t.topic);
    }
    const msg = JSON.stringify({ subscribe: Array.from(want).sort() });
    if (msg === S.lastSubscribe && S.ws === S.lastSubscribeWs) return;
    S.lastSubscribe = msg; S.lastSubscribeWs = S.ws;
    S.ws.send(msg);
  }

  function onMessage(ev) {
    S.messages++;
    S.bytes += ev.data.byteLength;
    let m;
    try { m = decode(ev.data); } catch (e) { S.errors.push('bad message: ' + e); return; }
    const h = m.h;
    switch (h.type) {
      case 'hello':
        S.hello = h;
        /* Flow control: results are acknowledged once the drawing loop
         * took them, so they wait in the viewer (where newer ones replace
         * them), not in this page's socket queue. */
        S.ws.send(JSON.stringify({ window: WINDOW }));
        S.unacked = 0;
        sendSubscribe();
        return;
      case 'topics': S.topicsAt = nowMs(); onTopics(h); return;
      case 'status': onStatus(h); return;
      default: break;
    }
    const name = h.topic;
    S.received[name] = (S.received[name] || 0) + 1;
    S.unacked++;
    m.fresh = true;
    S.latest.set(name, m);
    S.lastResultAt = nowMs();
    /* Fit views pair data, parameters and curves by frame id, and redraw
     * when one of the topics they read arrives. */
    const fn = S.fitNeed;
    if (fn && fn.all.some((t) => name.startsWith(t))) {
      const r = S.recent.get(name) || [];
      r.push(m);
      if (r.length > RECENT_N) r.shift();
      S.recent.set(name, r);
      for (const [pn, mine] of fn.by) {
        const q = S.panels.get(pn);
        if (q && pn !== name && q.last && !q.pending && mine.some((t) => name.startsWith(t))) q.pending = q.last;
      }
    }
    if (name === 'beamd.series') onSeries(h);
    const p = S.panels.get(name);
    if (p) p.pending = m;
    /* Lag values redraw the curves that use them. */
    if (name.endsWith('.lags')) {
      for (const q of S.panels.values())
        if (q.kind === 'curves' && q.name.split('.')[0] === name.split('.')[0] && q.last && !q.pending) q.pending = q.last;
    }
    /* Histories grow per message (not per drawing), shown or not. */
    const k = viewKind(S.topics.get(name));
    if ((k === 'scalar' || k === 'scalars') && m.a) {
      const hist = S.hist[name] || (S.hist[name] = { t: [], v: [] });
      hist.t.push((h.t_send_ns || h.t_rx_ns) / 1e9);
      hist.v.push(Float32Array.from(m.a));
      if (hist.t.length > HIST_N) { hist.t.shift(); hist.v.shift(); }
    }
  }

  function connect() {
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const url = proto + '//' + location.host + '/ws' + (TOKEN ? '?token=' + encodeURIComponent(TOKEN) : '');
    const ws = new WebSocket(url, 'beamd-view');
    ws.binaryType = 'arraybuffer';
    S.ws = ws;
    ws.onopen = () => {
      S.connected = true;
      $('conn').textContent = 'connected';
      $('conn').className = 'badge ok';
    };
    ws.onmessage = onMessage;
    ws.onclose = () => {
      S.connected = false;
      $('conn').textContent = 'viewer disconnected, retrying';
      $('conn').className = 'badge bad';
      setTimeout(connect, 2000);
    };
  }

  setInterval(() => {
    updateStream();
    $('counters').textContent = S.messages + ' messages · ' + fmt(S.bytes / 1e6, 1) + ' MB';
  }, 500);
  S.topicsAt = nowMs();
  connect();
  requestAnimationFrame(frame);
})();
