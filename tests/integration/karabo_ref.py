"""An independent Karabo bridge client and server, written from the protocol
description (shared notes, detector-streams.md section 5: karabo-bridge-py's
serializer and protocol text, karabo-bridge-cpp's stricter client rules), not
from beamd's C code. Uses only msgpack (Debian python3-msgpack), numpy and
pyzmq.

- serialize_22 / serialize_10: a train {source: {key: value}} (numpy arrays
  among the values) and its metadata, as the bridge server sends it.
- deserialize: the Python client's reading (2.2 pairs, or 1.0 for one part).
- cpp_check: the C++ client's rules; raises ValueError naming the rule.
- Client (REQ `next`, SUB, PULL) and Server (REP answering `next`, PUB, PUSH).
"""

import threading
import time

import msgpack
import numpy as np
import zmq

# numpy names the C++ client maps to C types (kb_client.hpp).
CPP_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float32", "float64"}


def timestamp_meta(source, tid, t=None):
    t = time.time() if t is None else t
    sec = int(t)
    frac = int(round((t - sec) * 1e18))
    return {"source": source, "timestamp": t, "timestamp.sec": str(sec),
            "timestamp.frac": "%018d" % frac, "timestamp.tid": tid, "ignored_keys": []}


def serialize_22(data, metadata):
    """Per source, sorted by name: a msgpack header + map of the non-array
    keys, then a header + raw bytes per array (use_bin_type=True)."""
    parts = []
    for src in sorted(data):
        d = data[src]
        arrays = {k: v for k, v in d.items() if isinstance(v, np.ndarray)}
        rest = {k: v for k, v in d.items() if not isinstance(v, np.ndarray)}
        parts.append(msgpack.packb({"source": src, "content": "msgpack",
                                    "metadata": metadata[src]}, use_bin_type=True))
        parts.append(msgpack.packb(rest, use_bin_type=True))
        for path, a in arrays.items():
            a = np.ascontiguousarray(a)
            parts.append(msgpack.packb({"source": src, "content": "array", "path": path,
                                        "dtype": a.dtype.name, "shape": list(a.shape)},
                                       use_bin_type=True))
            parts.append(a.tobytes())
    return parts


def serialize_10(data, metadata):
    """One part: {source: {key: value, metadata: {...}}}, arrays as
    msgpack-numpy maps (b'nd', b'type', b'kind', b'shape', b'data')."""
    out = {}
    for src, d in data.items():
        m = {}
        for k, v in d.items():
            if isinstance(v, np.ndarray):
                v = {b"nd": True, b"type": v.dtype.str, b"kind": b"", b"shape": list(v.shape),
                     b"data": np.ascontiguousarray(v).tobytes()}
            m[k] = v
        m["metadata"] = metadata[src]
        out[src] = m
    return [msgpack.packb(out, use_bin_type=True)]


def deserialize(parts):
    """(data, metadata) as karabo-bridge-py's client returns them."""
    if len(parts) < 2:
        raw = msgpack.unpackb(parts[0], raw=False)
        meta = {s: d.pop("metadata", {}) for s, d in raw.items()}
        for d in raw.values():
            for k, v in list(d.items()):
                if isinstance(v, dict) and v.get(b"nd", v.get("nd")):
                    g = lambda n: v.get(n.encode(), v.get(n))  # noqa: E731
                    d[k] = np.frombuffer(g("data"), dtype=g("type")).reshape(g("shape"))
        return raw, meta
    data, meta = {}, {}
    for hp, dp in zip(parts[::2], parts[1::2]):
        h = msgpack.unpackb(hp, raw=False)
        src = h["source"]
        d = data.setdefault(src, {})
        if h["content"] == "msgpack":
            meta[src] = h["metadata"]
            d.update(msgpack.unpackb(dp, raw=False))
        elif h["content"] == "array":
            d[h["path"]] = np.frombuffer(dp, dtype=h["dtype"]).reshape(h["shape"])
        else:
            raise ValueError("unknown content %r" % h["content"])
    return data, meta


def cpp_check(parts):
    """karabo-bridge-cpp's rules; returns the list of decoded headers."""
    if len(parts) % 2:
        raise ValueError("odd number of parts")
    headers = []
    for hp, dp in zip(parts[::2], parts[1::2]):
        h = msgpack.unpackb(hp, raw=False)
        if not isinstance(h, dict) or "content" not in h:
            raise ValueError("header without content")
        if h["content"] == "msgpack":
            if not isinstance(h.get("metadata"), dict):
                raise ValueError("msgpack header without metadata")
            if not isinstance(msgpack.unpackb(dp, raw=False), dict):
                raise ValueError("msgpack data is not a map")
        elif h["content"] in ("array", "ImageData"):
            for k in ("shape", "dtype", "path"):
                if k not in h:
                    raise ValueError("array header without %s" % k)
            if h["dtype"] not in CPP_DTYPES:
                raise ValueError("dtype %r is not one the C++ client maps" % h["dtype"])
            n = int(np.prod(h["shape"])) * np.dtype(h["dtype"]).itemsize
            if n != len(dp):
                raise ValueError("shape x itemsize %d != %d data bytes" % (n, len(dp)))
        else:
            raise ValueError("unknown content %r" % h["content"])
        headers.append(h)
    return headers


def agipd_train(tid, modules=4, ss=16, fs=8, pulses=6, layout="online", dtype=np.uint16,
                seed=None):
    """AGIPD-like image.data: online (modules, ss, fs, pulses) or file
    (pulses, modules, ss, fs) layout, with cellId/pulseId/trainId."""
    rng = np.random.default_rng(tid if seed is None else seed)
    a = rng.integers(0, 4000, size=(pulses, modules, ss, fs)).astype(dtype)
    img = np.ascontiguousarray(np.moveaxis(a, 0, -1)) if layout == "online" else a
    return a, {"image.data": img,
               "image.cellId": np.arange(pulses, dtype=np.uint16),
               "image.pulseId": np.arange(pulses, dtype=np.uint64),
               "image.trainId": np.full(pulses, tid, dtype=np.uint64),
               "detector.name": "AGIPD-like"}


class Client:
    """karabo-bridge-py's Client: REQ sends b'next' (HWM 1, LINGER 0,
    RCVTIMEO = timeout), or SUB to "" / PULL."""

    def __init__(self, zctx, endpoint, sock="REQ", timeout=5.0):
        self.kind = sock
        self.s = zctx.socket(getattr(zmq, sock))
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.setsockopt(zmq.RCVHWM, 1 if sock == "REQ" else 1000)
        self.s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        if sock == "SUB":
            self.s.setsockopt(zmq.SUBSCRIBE, b"")
        self.s.connect(endpoint)

    def raw(self, request=b"next"):
        if self.kind == "REQ":
            self.s.send(request)
        return self.s.recv_multipart(copy=True)

    def next(self):
        return deserialize(self.raw())

    def close(self):
        self.s.close(linger=0)


class Server:
    """A bridge server: REP answers b'next' with the next queued message
    (waiting for one when none is queued), anything else with
    b'Error: bad request ...'; PUB / PUSH send each queued message."""

    def __init__(self, zctx, endpoint, sock="REP"):
        self.kind = sock
        self.s = zctx.socket(getattr(zmq, sock))
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.setsockopt(zmq.SNDHWM, 1000)
        self.s.bind(endpoint)
        self.queue = []
        self.cv = threading.Condition()
        self.served = 0
        self.requests = 0
        self.stop = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def put(self, parts):
        with self.cv:
            self.queue.append(parts)
            self.cv.notify_all()

    def _take(self):
        with self.cv:
            while not self.queue and not self.stop:
                self.cv.wait(0.05)
            return self.queue.pop(0) if self.queue else None

    def _run(self):
        poller = zmq.Poller()
        poller.register(self.s, zmq.POLLIN)
        while not self.stop:
            if self.kind == "REP":
                if not poller.poll(50):
                    continue
                req = self.s.recv()
                self.requests += 1
                if req != b"next":
                    self.s.send(b"Error: bad request " + req)
                    continue
                parts = self._take()
                if parts is None:
                    return
                self.s.send_multipart(parts)
            else:
                parts = self._take()
                if parts is None:
                    return
                self.s.send_multipart(parts)
            self.served += 1

    def idle(self, timeout=10.0):
        """Waits until everything queued went out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.cv:
                if not self.queue:
                    return True
            time.sleep(0.02)
        return False

    def close(self):
        self.stop = True
        self.t.join(timeout=2)
        self.s.close(linger=0)
