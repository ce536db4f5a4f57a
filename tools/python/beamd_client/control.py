"""beamd's control endpoint (ZeroMQ REQ/REP, one JSON reply per command)."""

import json

import zmq


class ControlError(RuntimeError):
    """beamd answered {"ok": false, ...} or did not answer in time."""


class Control:
    """status(), stats(), reload(), stop(), ping(); command(name) for any.
    A fresh REQ socket per command, so a lost reply never wedges the next
    one (REQ's strict send/recv alternation)."""

    def __init__(self, endpoint="tcp://127.0.0.1:5601", timeout=5.0, context=None, curve=None):
        """curve: a Curve with this client's secret key and beamd's public key
        (control.endpoint written with curve: true)."""
        self.endpoint = endpoint
        self.curve = curve
        self.timeout = timeout
        self._own_ctx = context is None
        self.ctx = context or zmq.Context()

    def close(self):
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def command(self, name, timeout=None, check=True):
        t = int(1000 * (self.timeout if timeout is None else timeout))
        s = self.ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, t)
        s.setsockopt(zmq.SNDTIMEO, t)
        try:
            if self.curve:
                self.curve.client(s)
            s.connect(self.endpoint)
            s.send(name.encode())
            try:
                reply = s.recv()
            except zmq.Again:
                raise ControlError("no reply from %s to %r within %.1f s (is beamd running?)"
                                   % (self.endpoint, name, t / 1000)) from None
        finally:
            s.close()
        try:
            doc = json.loads(reply)
        except ValueError:
            raise ControlError("reply to %r is not JSON: %r" % (name, reply[:200])) from None
        if check and isinstance(doc, dict) and doc.get("ok") is False:
            raise ControlError("beamd refused %r: %s" % (name, doc.get("error", doc)))
        return doc

    def status(self):
        return self.command("status")

    def stats(self):
        return self.command("stats")

    def ping(self):
        return self.command("ping")

    def reload(self):
        return self.command("reload")

    def stop(self):
        return self.command("stop")

    def stage_stats(self, name):
        """The stats entry of one stage (dict), or KeyError."""
        for s in self.stats().get("stages", []):
            if s.get("name") == name:
                return s
        raise KeyError(name)
