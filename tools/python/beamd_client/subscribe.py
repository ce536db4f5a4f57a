"""Subscribing to beamd's result stream."""

import json
import time

import numpy as np
import zmq

from beamd import proto


class Result:
    """One RESULT message: topic "<stage>.<output>", the array (numpy, as
    the daemon sent it: dtype and shape from the header), the header, and
    the descriptor last announced for the topic (dict, {} until one was
    seen: descriptors ride on the first result of a topic per series and
    then at most once per second)."""

    __slots__ = ("topic", "header", "array", "descriptor", "received")

    def __init__(self, topic, header, array, descriptor, received):
        self.topic = topic
        self.header = header
        self.array = array
        self.descriptor = descriptor
        self.received = received

    @property
    def stage(self):
        return self.topic.split(".", 1)[0]

    @property
    def output(self):
        return self.topic.split(".", 1)[1] if "." in self.topic else ""

    @property
    def series_id(self):
        return self.header.series_id

    @property
    def frame_id(self):
        return self.header.frame_id

    @property
    def flags(self):
        return self.header.flags

    @property
    def partial(self):
        return bool(self.header.flags & proto.FLAG_PARTIAL)

    @property
    def final(self):
        return bool(self.header.flags & proto.FLAG_FINAL)

    @property
    def anomaly(self):
        return bool(self.header.flags & proto.FLAG_ANOMALY)

    @property
    def units(self):
        return self.descriptor.get("units", "")

    @property
    def axes(self):
        return list(self.descriptor.get("axes", []))

    def labels(self, axis):
        """Coordinates or names of an axis (by name or index) from the
        descriptor, or None. A descriptor's `labels` is either a dict per
        axis name or one list, which names the ROIs (the axis called "roi",
        or the only axis of a 1-D result)."""
        lab = self.descriptor.get("labels")
        axes = self.axes
        name = axis
        if isinstance(axis, int):
            name = axes[axis] if axis < len(axes) else None
        if isinstance(lab, dict):
            return lab.get(name)
        if isinstance(lab, list):
            if name == "roi" or (len(axes) <= 1 and axis in (0, name)):
                return lab
        return None

    def json(self):
        """The payload as JSON (the `beamd.stats` topic carries a JSON
        document as uint8 bytes)."""
        return json.loads(self.array.tobytes())

    def __repr__(self):
        return "Result(%s, series %d, frame %d, %s %s%s)" % (
            self.topic, self.series_id, self.frame_id,
            None if self.array is None else self.array.dtype,
            None if self.array is None else self.array.shape,
            " PARTIAL" if self.partial else " FINAL" if self.final else "")


class SeriesEvent:
    """SERIES_START or SERIES_END as republished on topic `beamd.series`."""

    __slots__ = ("kind", "header", "meta")

    def __init__(self, kind, header, meta):
        self.kind = kind  # "start" or "end"
        self.header = header
        self.meta = meta or {}

    @property
    def series_id(self):
        return self.header.series_id

    @property
    def aborted(self):
        return bool(self.header.flags & proto.FLAG_ABORTED)

    def __repr__(self):
        return "SeriesEvent(%s, series %d)" % (self.kind, self.series_id)


class Subscriber:
    """SUB (default, lossy: a slow reader never slows beamd) or PULL
    (lossless) on one or more endpoints. topics are prefixes ("" = all);
    `beamd.series` is added when series events are wanted.

    Malformed messages are counted in `self.malformed` (with the last
    reason in `self.last_error`) and skipped, never raised."""

    def __init__(self, endpoints, topics=("",), pull=False, series=False,
                 context=None, hwm=1000, limits=None, curve=None):
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        self._own_ctx = context is None
        self.ctx = context or zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL if pull else zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        if not pull:
            topics = list(topics)
            if series and not any("beamd.series".startswith(t) for t in topics):
                topics.append("beamd.series")
            for t in topics:
                self.sock.setsockopt(zmq.SUBSCRIBE, t.encode())
        if curve:
            curve.client(self.sock)
        for ep in endpoints:
            self.sock.connect(ep)
        self.series = series
        self.limits = limits
        self.descriptors = {}
        self.malformed = 0
        self.last_error = None
        self.received = 0

    def close(self):
        self.sock.close(linger=0)
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def recv(self, timeout=None):
        """The next Result (or SeriesEvent when series=True), or None when
        nothing arrives within timeout seconds (None = wait forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.sock.poll(None if left is None else int(left * 1000)):
                return None
            parts = self.sock.recv_multipart(copy=True)
            item = self._decode(parts)
            if item is not None:
                return item
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _decode(self, parts):
        try:
            topic, h, arr, meta = proto.decode_message(parts, self.limits)
        except proto.ProtocolError as e:
            self.malformed += 1
            self.last_error = str(e)
            return None
        self.received += 1
        now = time.time()
        if h.type == proto.RESULT:
            if isinstance(meta, dict) and meta:
                self.descriptors[topic] = meta
            return Result(topic, h, arr, self.descriptors.get(topic, {}), now)
        if self.series and h.type in (proto.SERIES_START, proto.SERIES_END):
            return SeriesEvent("start" if h.type == proto.SERIES_START else "end", h, meta)
        return None

    def results(self, timeout=None, count=None, until_final=None):
        """Iterates over results (and series events when series=True).
        Stops after `count` items, after `timeout` seconds without one, or
        once a FINAL result of topic `until_final` has been yielded."""
        n = 0
        while count is None or n < count:
            r = self.recv(timeout)
            if r is None:
                return
            n += 1
            yield r
            if until_final and isinstance(r, Result) and r.final and r.topic == until_final:
                return

    __iter__ = results

    def latest(self, timeout=1.0):
        """Drains what is queued and returns the newest result per topic
        (dict topic -> Result); waits up to timeout for the first one."""
        out = {}
        r = self.recv(timeout)
        while r is not None:
            if isinstance(r, Result):
                out[r.topic] = r
            r = self.recv(0)
        return out


def as_display(array):
    """2-D view of a result for plotting: complex -> (magnitude, phase)."""
    a = np.asarray(array)
    if np.iscomplexobj(a):
        return np.abs(a), np.angle(a)
    return a, None
