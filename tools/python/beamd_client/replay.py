"""A replay server for numpy frames: beamd's `replay` input (REQ) asks it
for frames with credit, as it would ask beamd-replay for a file's frames
(PROTOCOL.md section 13). For tests and for feeding arrays computed in a
notebook through a pipeline losslessly."""

import hashlib
import json
import threading

import numpy as np
import zmq

from beamd import proto


class ReplayServer:
    """Serves `frames` (array (T, y, x)) on a REP socket bound at endpoint,
    in a background thread, as series `series_id` (one pass, no looping).
    meta: the SERIES_START metadata dict. positions: (T, 2|3) metres.
    Counts requests in self.requests and frames sent in self.served."""

    def __init__(self, endpoint, frames, series_id=1, meta=None, codec="raw",
                 positions=None, context=None, curve=None):
        self.frames = np.asarray(frames)
        if self.frames.ndim != 3:
            raise ValueError("frames must be (T, y, x)")
        self.T = self.frames.shape[0]
        self.series_id = series_id
        self.meta = dict(meta or {})
        self.meta.setdefault("nframes", self.T)
        self.codec = codec
        self.positions = positions
        h = hashlib.sha1(self.frames.tobytes()[:1 << 20])
        h.update(repr(self.frames.shape).encode())
        self.file_id = h.hexdigest()[:16]
        self._own_ctx = context is None
        self.ctx = context or zmq.Context()
        self.sock = self.ctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.curve = curve
        if curve:
            curve.server(self.sock, self.ctx)
        self.sock.bind(endpoint)
        self.seq = 0
        self.requests = 0
        self.served = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
        if self.curve:
            self.curve.close()
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _msg(self, type, **kw):
        parts = proto.encode_message(type, series_id=self.series_id, seq=self.seq, **kw)
        self.seq += 1
        return parts

    def _reply(self, req):
        if not isinstance(req, dict) or req.get("op") not in ("get", "info"):
            return [json.dumps({"ok": False, "error": "expected {\"op\": \"get\"|\"info\"}"}).encode()]
        status = {"ok": True, "total": self.T, "loop": False, "series_id": self.series_id,
                  "file": "<numpy>", "file_id": self.file_id, "corrupt": 0}
        if isinstance(req.get("id"), int):
            status["id"] = req["id"]  # section 13.7: consumers with several requests in flight
        if "shm" in req:
            status["shm_error"] = "not supported by beamd_client.ReplayServer"
        if req["op"] == "info":
            status.update(op="info", count=0, next=0, eof=False)
            return [json.dumps(status).encode()]
        k, credit = req.get("next"), req.get("credit")
        if not isinstance(k, int) or not isinstance(credit, int) or not 1 <= credit <= 4096:
            return [json.dumps({"ok": False, "error": "next and credit (1..4096) must be integers"}).encode()]
        if k > self.T:
            return [json.dumps({"ok": False, "error": "next %d is past the end (%d frames)" % (k, self.T)}).encode()]
        shape, dtype = self.frames.shape[1:], self.frames.dtype
        msgs = []
        if k == 0 or (req.get("start") and k < self.T):
            msgs += self._msg(proto.SERIES_START, shape=shape, dtype=dtype, meta=self.meta)
        k2 = min(self.T, k + credit)
        for i in range(k, k2):
            pos = None if self.positions is None else self.positions[i]
            msgs += self._msg(proto.FRAME, array=self.frames[i], frame_id=i, codec=self.codec, pos=pos)
        if k2 == self.T and k < self.T:
            msgs += self._msg(proto.SERIES_END, frame_id=self.T, shape=shape, dtype=dtype)
        self.served += k2 - k
        status.update(next=k2, count=k2 - k, eof=k2 == self.T)
        return [json.dumps(status).encode()] + msgs

    def _run(self):
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            parts = self.sock.recv_multipart()
            self.requests += 1
            try:
                req = json.loads(parts[0]) if len(parts) == 1 else None
            except ValueError:
                req = None
            self.sock.send_multipart(self._reply(req), copy=False)
