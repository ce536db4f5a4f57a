"""g2 joined with its lag times, from the results of an `xpcs_multitau`
(or `xpcs_twotime`) stage.

    from beamd_client import Subscriber, g2_with_lags
    with Subscriber("tcp://127.0.0.1:5600", topics=["mt."]) as sub:
        c = g2_with_lags(sub.latest(timeout=5), stage="mt")
        for roi, (tau, g2) in c.curves().items():
            ...

The stage publishes `<stage>.g2` (float64 [rows, R], descriptor axes
["lag", "roi"], labels = the ROI label values) and `<stage>.lags` (float64,
units "s" when the series metadata has `frame_time`, else "frames") as two
messages of the same publish (same series and frame id). With
`intensity_rows: pairs` the lags may have more rows than g2; g2's rows are
the first ones (docs/xpcs.md).
"""

import numpy as np


class G2:
    """One publish of g2 with its lags: `lags` [rows] in `lag_units` ("s" or
    "frames"), `g2` [rows, R], `rois` (R labels), and the `stage`,
    `series_id`, `frame_id` and `final` of the publish."""

    __slots__ = ("stage", "series_id", "frame_id", "final", "lags", "lag_units", "g2", "rois")

    def __init__(self, stage, series_id, frame_id, final, lags, lag_units, g2, rois):
        self.stage, self.series_id, self.frame_id, self.final = stage, series_id, frame_id, final
        self.lags, self.lag_units, self.g2, self.rois = lags, lag_units, g2, rois

    def curves(self):
        """{roi label: (lags, g2 of that ROI)}, both [rows]."""
        return {roi: (self.lags, self.g2[:, i]) for i, roi in enumerate(self.rois)}

    def to_xarray(self):
        """An xarray.DataArray (dims lag, roi; coords the lags and the ROI
        labels). Needs xarray (Debian python3-xarray)."""
        from .labelled import _xarray
        return _xarray().DataArray(
            self.g2, dims=("lag", "roi"), coords={"lag": self.lags, "roi": list(self.rois)},
            name="%s.g2" % self.stage,
            attrs={"lag_units": self.lag_units, "series_id": self.series_id,
                   "frame_id": self.frame_id, "final": self.final})

    def __repr__(self):
        return "G2(%s, series %d, frame %d, %d lags in %s, %d ROIs%s)" % (
            self.stage, self.series_id, self.frame_id, len(self.lags), self.lag_units,
            len(self.rois), " FINAL" if self.final else "")


def _by_topic(results):
    if isinstance(results, dict):
        return dict(results)
    out = {}
    for r in results:  # later results of a topic replace earlier ones
        out[r.topic] = r
    return out


def g2_with_lags(results, stage=None, frame_time=None):
    """Joins `<stage>.g2` and `<stage>.lags` into a G2.

    results: {topic: Result} (Subscriber.latest()) or Results in arrival
    order (the newest per topic is used). stage: the stage name; None when
    results hold the g2 of one stage only. frame_time (s): converts lags
    published in frames (a series without `frame_time`) to seconds.
    Raises ValueError when the pair is missing, from different publishes,
    or of shapes that do not fit together."""
    res = _by_topic(results)
    if stage is None:
        stages = sorted({t[:-3] for t in res if t.endswith(".g2")})
        if len(stages) != 1:
            raise ValueError("g2_with_lags: %s; name the stage" % (
                "no <stage>.g2 result" if not stages else "g2 of several stages %s" % stages))
        stage = stages[0]
    g, lg = res.get(stage + ".g2"), res.get(stage + ".lags")
    if g is None or lg is None:
        raise ValueError("g2_with_lags: no %s.%s result (subscribe to topic %r)"
                         % (stage, "g2" if g is None else "lags", stage + "."))
    if (g.series_id, g.frame_id, g.final) != (lg.series_id, lg.frame_id, lg.final):
        raise ValueError("g2_with_lags: %s.g2 (series %d, frame %d) and %s.lags (series %d, "
                         "frame %d) are from different publishes"
                         % (stage, g.series_id, g.frame_id, stage, lg.series_id, lg.frame_id))
    a = np.asarray(g.array, np.float64)
    axes = g.axes
    if a.ndim != 2:
        raise ValueError("g2_with_lags: %s.g2 has shape %s, expected [lags, rois]"
                         % (stage, a.shape))
    if axes[:2] == ["roi", "lag"]:
        a = a.T
    lags = np.asarray(lg.array, np.float64).reshape(-1)
    if lags.size < a.shape[0]:
        raise ValueError("g2_with_lags: %d lags for %d g2 rows" % (lags.size, a.shape[0]))
    lags = lags[:a.shape[0]]
    units = lg.units or "frames"
    if units == "frames" and frame_time is not None:
        lags, units = lags * float(frame_time), "s"
    rois = g.labels("roi")
    if rois is None or len(rois) != a.shape[1]:
        rois = list(range(a.shape[1]))
    return G2(stage, g.series_id, g.frame_id, g.final, lags, units, a, list(rois))
