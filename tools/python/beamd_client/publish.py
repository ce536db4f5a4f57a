"""Sending frames to beamd: a detector stand-in for tests and notebooks."""

import time

import zmq

from beamd import proto


class Publisher:
    """A PUB (live input: beamd's `live` mode subscribes) or PUSH (lossless:
    beamd's `pull` mode) socket. bind=True binds the endpoint (beamd then
    connects, the usual arrangement); every message gets the next sequence
    number so beamd's gap counters stay at zero.

    PUB drops what is sent before beamd's subscription arrives (ZeroMQ's
    slow-joiner): with kind="pub" use wait_subscriber() first, which needs an
    XPUB and is what kind="pub" creates."""

    def __init__(self, endpoint, kind="push", bind=True, context=None, hwm=1000,
                 send_timeout=10.0, curve=None):
        if kind not in ("push", "pub"):
            raise ValueError("kind must be 'push' or 'pub'")
        self._own_ctx = context is None
        self.ctx = context or zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH if kind == "push" else zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.SNDTIMEO, int(send_timeout * 1000))
        self.curve = curve
        if curve:
            curve.apply(self.sock, self.ctx, bind)
        (self.sock.bind if bind else self.sock.connect)(endpoint)
        self.kind = kind
        self.seq = 0

    def close(self):
        self.sock.close()
        if self.curve:
            self.curve.close()
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_subscriber(self, timeout=5.0):
        """XPUB: blocks until a subscriber joined; False on timeout."""
        if self.kind != "pub":
            return True
        if not self.sock.poll(int(timeout * 1000)):
            return False
        self.sock.recv()
        return True

    def _send(self, parts):
        self.sock.send_multipart(parts, copy=False)
        self.seq += 1

    def start(self, series_id, shape, dtype, meta=None):
        self._send(proto.encode_message(proto.SERIES_START, series_id=series_id, seq=self.seq,
                                        shape=tuple(shape), dtype=dtype, meta=meta or {}))

    def frame(self, series_id, frame_id, array, codec="raw", pos=None, flags=0):
        self._send(proto.encode_message(proto.FRAME, array=array, series_id=series_id,
                                        frame_id=frame_id, seq=self.seq, codec=codec,
                                        pos=pos, flags=flags))

    def end(self, series_id, aborted=False):
        self._send(proto.encode_message(proto.SERIES_END, series_id=series_id, seq=self.seq,
                                        flags=proto.FLAG_ABORTED if aborted else 0))

    def series(self, frames, series_id=1, meta=None, codec="raw", positions=None,
               rate=None, first_frame_id=0):
        """Sends SERIES_START, every frame of `frames` (an array of shape
        (n, y, x) or an iterable of 2-D arrays, all the same shape and
        dtype), SERIES_END. positions: per-frame (x, y[, z]) in metres.
        rate: frames per second (None = as fast as the socket takes them).
        Returns the number of frames sent."""
        it = iter(frames)
        try:
            first = next(it)
        except StopIteration:
            raise ValueError("no frames") from None
        self.start(series_id, first.shape, first.dtype, meta)
        n = 0
        t0 = time.monotonic()
        for i, f in enumerate(_chain(first, it)):
            if f.shape != first.shape or f.dtype != first.dtype:
                raise ValueError("frame %d is %s %s, the series is %s %s"
                                 % (i, f.dtype, f.shape, first.dtype, first.shape))
            if rate:
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            self.frame(series_id, first_frame_id + i, f, codec=codec,
                       pos=None if positions is None else positions[i])
            n += 1
        self.end(series_id)
        return n


def _chain(first, rest):
    yield first
    yield from rest
