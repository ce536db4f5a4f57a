"""A matplotlib figure that follows beamd results, for notebooks.

    from beamd_client import Subscriber
    from beamd_client.live import LivePlot
    sub = Subscriber("tcp://127.0.0.1:5600", topics=["g2."])
    LivePlot(sub, "g2.g2").run(seconds=60)

The view is chosen from the result's descriptor, as the web viewer does: a
2-D result whose axes name a lag ("tau", "lag", "delay") is drawn as curves
on a log x axis (one per ROI; x from the stage's `lags` result when the
subscription includes it, e.g. topics=["g2."], else the lag index); other 2-D results as
images (complex ones as magnitude and phase); 1-D results as a curve.
Importing this module needs matplotlib (Debian python3-matplotlib); the
rest of beamd_client does not.
"""

import time

import numpy as np

LAG_AXES = ("tau", "lag", "delay")


def choose_view(result):
    a = result.array
    if a is None:
        return "none"
    if a.ndim == 2 and any(ax in LAG_AXES for ax in result.axes):
        return "curves"
    if a.ndim == 2 and min(a.shape) > 1:
        return "complex" if np.iscomplexobj(a) else "image"
    return "line"


def _lag_axis(result):
    for i, ax in enumerate(result.axes):
        if ax in LAG_AXES:
            return i
    return result.array.ndim - 1


class LivePlot:
    def __init__(self, subscriber, topic, figsize=(7, 4), cmap="viridis", vmin=None, vmax=None):
        import matplotlib.pyplot as plt
        self.plt = plt
        self.sub = subscriber
        self.topic = topic
        self.cmap, self.vmin, self.vmax = cmap, vmin, vmax
        self.fig = plt.figure(figsize=figsize)
        self.view = None
        self.updates = 0
        self.last = None
        self._handle = None
        self.x = {}  # stage -> lag values (its `lags` result)
        self.x_units = {}

    def draw(self, r):
        """Redraws the figure for result r (a beamd_client.Result)."""
        self.fig.clear()
        self.view = choose_view(r)
        a = r.array
        title = "%s  series %d frame %d%s" % (r.topic, r.series_id, r.frame_id,
                                              "  FINAL" if r.final else "")
        if self.view == "curves":
            ax = self.fig.add_subplot(111)
            li = _lag_axis(r)
            data = np.moveaxis(a, li, -1)
            x = self.x.get(r.stage)
            if x is None or len(x) != data.shape[-1]:
                x = r.labels(r.axes[li])
            x = np.asarray(x, float) if x is not None and len(x) == data.shape[-1] \
                else np.arange(1, data.shape[-1] + 1, dtype=float)
            ok = x > 0  # lag 0 has no place on a log axis
            x, data = x[ok], data[..., ok]
            names = r.labels("roi")
            for i, row in enumerate(data):
                ax.plot(x, row, ".-", ms=3, label=str(names[i]) if names and i < len(names) else "roi %d" % i)
            ax.set_xscale("log")
            ax.set_xlabel("%s (%s)" % (r.axes[li], self.x_units.get(r.stage, "index")))
            ax.set_ylabel(r.output)
            if data.shape[0] <= 16:
                ax.legend(fontsize="x-small", ncol=2)
        elif self.view in ("image", "complex"):
            panels = [(np.abs(a), "magnitude"), (np.angle(a), "phase")] if self.view == "complex" \
                else [(a, r.units or r.output)]
            for i, (img, name) in enumerate(panels):
                ax = self.fig.add_subplot(1, len(panels), i + 1)
                im = ax.imshow(img, cmap=self.cmap, vmin=self.vmin, vmax=self.vmax,
                               origin="upper", interpolation="nearest")
                ax.set_title(name, fontsize="small")
                self.fig.colorbar(im, ax=ax, shrink=0.8)
        elif self.view == "line":
            ax = self.fig.add_subplot(111)
            ax.plot(np.ravel(a), ".-", ms=3)
            ax.set_ylabel(r.units or r.output)
        self.fig.suptitle(title, fontsize="small")
        self.updates += 1
        self.last = r

    def update(self, timeout=1.0):
        """Takes the newest result of the topic (dropping older ones: latest
        wins) and redraws; False when none arrived within timeout."""
        latest = self.sub.latest(timeout)
        for t, lr in latest.items():
            if t.endswith(".lags") and lr.array is not None:
                self.x[lr.stage] = np.asarray(lr.array, float)
                self.x_units[lr.stage] = lr.units or "frames"
        r = latest.get(self.topic)
        if r is None:
            return False
        self.draw(r)
        return True

    def run(self, seconds=60.0, interval=0.5):
        """Keeps updating for `seconds` (or until a FINAL result), in a
        notebook through IPython.display, elsewhere through plt.pause."""
        try:
            from IPython import get_ipython
            from IPython.display import display
            in_notebook = get_ipython() is not None
        except ImportError:
            in_notebook = False
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.update(timeout=interval):
                if in_notebook:
                    if self._handle is None:
                        self._handle = display(self.fig, display_id=True)
                    else:
                        self._handle.update(self.fig)
                else:
                    self.plt.pause(0.001)
                if self.last is not None and self.last.final:
                    break
        return self.updates
