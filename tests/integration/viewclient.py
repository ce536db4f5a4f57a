"""Clients for testing beamd-view: a minimal RFC 6455 WebSocket client over
a plain socket (Debian's python3 has no websocket module by default), the
decoder of beamd-view's message format (docs/viewer.md), and a small
Chrome DevTools Protocol driver for headless Chromium built on the same
client. Used by tests/integration/test_view.py and bench/view.py.
"""
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

import numpy as np


class WSError(Exception):
    pass


class WebSocket:
    """Blocking WebSocket client. status is the HTTP status of the upgrade
    (101 when it worked); on any other status the body is kept in .body and
    the socket closed."""

    def __init__(self, host, port, path="/", headers=(), protocol="beamd-view", timeout=5.0,
                 host_header=None):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        host_header = host_header or "%s:%d" % (host, port)
        lines = ["GET %s HTTP/1.1" % path, "Host: " + host_header, "Upgrade: websocket",
                 "Connection: Upgrade", "Sec-WebSocket-Key: " + key, "Sec-WebSocket-Version: 13"]
        if protocol:
            lines.append("Sec-WebSocket-Protocol: " + protocol)
        lines += list(headers)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            buf += chunk
        head, _, self.buf = buf.partition(b"\r\n\r\n")
        first = head.split(b"\r\n")[0].split(b" ")
        self.status = int(first[1]) if len(first) > 1 and first[1].isdigit() else 0
        self.head = head.decode(errors="replace")
        self.body = b""
        self.closed = False
        if self.status != 101:
            self.body = self.buf
            try:
                while True:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        break
                    self.body += chunk
            except (socket.timeout, OSError):
                pass
            self.sock.close()
            self.closed = True

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise WSError("connection closed by the server")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode, payload):
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            hdr = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            hdr = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            hdr = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        arr = np.frombuffer(payload, np.uint8)
        m = np.frombuffer((mask * (n // 4 + 1))[:n], np.uint8)
        self.sock.sendall(hdr + mask + (arr ^ m).tobytes())

    def send_text(self, s):
        self._send_frame(0x1, s.encode())

    def send_json(self, obj):
        self.send_text(json.dumps(obj))

    def recv(self, timeout=None):
        """One whole message: (opcode, bytes); answers pings."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        parts, op0 = [], None
        while True:
            b0, b1 = self._read(2)
            fin, op, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = (np.frombuffer(data, np.uint8) ^
                        np.frombuffer((mask * (n // 4 + 1))[:n], np.uint8)).tobytes()
            if op == 0x9:
                self._send_frame(0xA, data)
                continue
            if op == 0xA:
                continue
            if op == 0x8:
                self.closed = True
                raise WSError("close frame from the server")
            if op != 0:
                op0 = op
            parts.append(data)
            if fin:
                return op0, b"".join(parts)

    def close(self):
        if not self.closed:
            try:
                self._send_frame(0x8, b"")
            except OSError:
                pass
        try:
            self.sock.close()
        except OSError:
            pass
        self.closed = True


def decode(msg):
    """beamd-view's framing: u32 LE n, n bytes of JSON, pad to 4, payload.
    Returns (header dict, float32 array or None). The arrays of a result
    come back shaped as data.shape, stacked when there are two."""
    n = struct.unpack("<I", msg[:4])[0]
    hdr = json.loads(msg[4:4 + n].decode())
    off = 4 + n + (-(4 + n)) % 4
    payload = msg[off:]
    if not payload:
        return hdr, None
    arr = np.frombuffer(payload, "<f4")
    data = hdr.get("data") or {}
    shape = list(data.get("shape") or [])
    k = len(data.get("arrays") or [1])
    if shape and arr.size == k * int(np.prod(shape)):
        arr = arr.reshape([k] + shape) if k > 1 else arr.reshape(shape)
    return hdr, arr


class ViewClient:
    """A WebSocket session with beamd-view, decoding every message."""

    def __init__(self, port, token=None, host="127.0.0.1", timeout=5.0):
        path = "/ws" + ("?token=" + token if token else "")
        self.ws = WebSocket(host, port, path, timeout=timeout)
        if self.ws.status != 101:
            raise WSError("upgrade refused: HTTP %d" % self.ws.status)

    def next(self, timeout=5.0):
        op, data = self.ws.recv(timeout)
        return decode(data)

    def until(self, pred, timeout=10.0, what="message"):
        """Reads until pred(hdr, arr) is true; returns (hdr, arr, all seen)."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no %s within %.1f s; saw %s" % (
                    what, timeout, sorted({(h["type"], h.get("topic")) for h, _ in seen})))
            try:
                h, a = self.next(timeout=min(left, 1.0))
            except socket.timeout:
                continue
            seen.append((h, a))
            if pred(h, a):
                return h, a, seen

    def close(self):
        self.ws.close()


def http_get(port, path, headers=None, host="127.0.0.1", timeout=5.0):
    """(status, body bytes, headers) of a GET; HTTP errors are returned, not raised."""
    req = urllib.request.Request("http://%s:%d%s" % (host, port, path), headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


# ---- headless Chromium over the DevTools protocol ------------------------------------

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


class Browser:
    """Headless Chromium with one page, driven over CDP."""

    def __init__(self, width=1280, height=900, timeout=20.0, nice=0):
        if not os.access(CHROMIUM, os.X_OK):
            raise FileNotFoundError(CHROMIUM)
        self.profile = tempfile.mkdtemp(prefix="beamd-view-chromium-")
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        self.p = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-dev-shm-usage",
             "--remote-debugging-port=0", "--user-data-dir=" + self.profile,
             "--window-size=%d,%d" % (width, height), "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=(lambda: os.nice(nice)) if nice else None)
        deadline = time.monotonic() + timeout
        port = None
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError("chromium exited with %s" % self.p.returncode)
            try:
                with open(port_file) as f:
                    port = int(f.readline())
                break
            except (OSError, ValueError):
                time.sleep(0.1)
        if not port:
            self.close()
            raise RuntimeError("chromium did not open its DevTools port")
        self.port = port
        targets = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/json" % port, timeout=2) as r:
                    targets = [t for t in json.loads(r.read()) if t.get("type") == "page"]
                if targets:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        if not targets:
            self.close()
            raise RuntimeError("no page target in chromium")
        path = targets[0]["webSocketDebuggerUrl"].split(str(port), 1)[1]
        self.ws = WebSocket("127.0.0.1", port, path, protocol=None, timeout=timeout)
        if self.ws.status != 101:
            raise RuntimeError("DevTools upgrade: HTTP %d" % self.ws.status)
        self.id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method, timeout=20.0, **params):
        self.id += 1
        my = self.id
        self.ws.send_json({"id": my, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("%s: no answer within %.1f s" % (method, timeout))
            op, data = self.ws.recv(timeout=left)
            msg = json.loads(data)
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})

    def goto(self, url):
        self.call("Page.navigate", url=url)

    def eval(self, expr, timeout=20.0):
        r = self.call("Runtime.evaluate", timeout=timeout, expression=expr, returnByValue=True,
                      awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError("page error in %r: %s" % (expr, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait(self, expr, timeout=15.0, what=None):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.eval(expr)
                if last:
                    return last
            except RuntimeError as e:
                last = str(e)
            time.sleep(0.1)
        raise AssertionError("page never satisfied %s within %.1f s (last: %r)" %
                             (what or expr, timeout, last))

    def screenshot(self, path):
        r = self.call("Page.captureScreenshot", format="png")
        with open(path, "wb") as f:
            f.write(base64.b64decode(r["data"]))
        return path

    def close(self):
        try:
            if getattr(self, "ws", None):
                self.ws.close()
        finally:
            if self.p.poll() is None:
                self.p.terminate()
                try:
                    self.p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.p.kill()
                    self.p.wait()
            shutil.rmtree(self.profile, ignore_errors=True)
