"""Fixtures for the end-to-end tests of the beamd daemon.

These start the real beamd binary (and beamd-sim / beamd-sub / beamd-ctl)
from $BEAMD_BUILD (default build/) on loopback ZeroMQ sockets with free
ports, and talk to it with pyzmq plus the Python codec in
tools/python/beamd/proto.py. Every process started here is killed in
teardown; the stdout/stderr files of every process are attached to the
report of a failing test. Every wait has a deadline, so a hung daemon fails
a test instead of hanging the run.

Not for unit-level checks of the codec or the tools (test_proto_py.py and
test_tools.py cover those).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))

from beamd import proto  # noqa: E402

BUILD = os.path.join(REPO, os.environ.get("BEAMD_BUILD", "build"))
START_TIMEOUT = 10.0  # seconds for beamd to answer ping


def binary(name):
    """Path of a built program; fails the test (not skips) when missing,
    because `make check-integration` builds everything first."""
    p = os.path.join(BUILD, name)
    if not os.access(p, os.X_OK):
        pytest.fail("%s is not built (BEAMD_BUILD=%s); run make first" % (p, BUILD))
    return p


# ---- ports -------------------------------------------------------------------

def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (bound at once, so distinct;
    released just before use, a race we accept on a test machine)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_busy(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return False
    except OSError:
        return True
    finally:
        s.close()


# ---- config files --------------------------------------------------------------

_PLAIN = re.compile(r"^[A-Za-z0-9_./:+-]+$")


def _scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    return s if _PLAIN.match(s) and s not in ("true", "false", "null") else json.dumps(s)


def to_yaml(obj, indent=0):
    """Block YAML for nested dicts/lists of scalars (lists of scalars in
    flow style), enough for beamd configs and readable in failure logs."""
    pad = " " * indent
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, dict):
                out.append("%s%s:" % (pad, k))
                out.append(to_yaml(v, indent + 2))
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                out.append("%s%s:" % (pad, k))
                out.append(to_yaml(v, indent + 2))
            elif isinstance(v, list):
                out.append("%s%s: [%s]" % (pad, k, ", ".join(_scalar(x) for x in v)))
            else:
                out.append("%s%s: %s" % (pad, k, _scalar(v)))
    elif isinstance(obj, list):
        for item in obj:
            body = to_yaml(item, indent + 2).split("\n")
            out.append(pad + "- " + body[0].lstrip())
            out.extend(body[1:])
    return "\n".join(x for x in out if x != "")


class Ports:
    def __init__(self):
        self.input, self.publish, self.push, self.control, self.metrics = free_ports(5)

    @property
    def ep_input(self):
        return "tcp://127.0.0.1:%d" % self.input

    @property
    def ep_publish(self):
        return "tcp://127.0.0.1:%d" % self.publish

    @property
    def ep_push(self):
        return "tcp://127.0.0.1:%d" % self.push

    @property
    def ep_control(self):
        return "tcp://127.0.0.1:%d" % self.control


def make_config(ports, stages, mode="pull", push=False, pool_frames=32,
                frame_bytes="4Mi", input_hwm=None, log=None, heartbeat="0.1s",
                out_hwm=None):
    """A config dict with all endpoints on the given free ports. beamd
    connects its input; the test's sender binds."""
    cfg = {
        "input": {"mode": mode, "endpoint": ports.ep_input},
        "output": {"publish": ports.ep_publish},
        "pool": {"frames": pool_frames, "frame_bytes": frame_bytes},
        "control": {"endpoint": ports.ep_control},
        "metrics": {"listen": "127.0.0.1:%d" % ports.metrics},
        "log": log or {"level": "info"},
        "heartbeat": heartbeat,
        "stages": stages,
    }
    if input_hwm is not None:
        cfg["input"]["hwm"] = input_hwm
    if out_hwm is not None:
        cfg["output"]["hwm"] = out_hwm
    if push:
        cfg["output"]["push"] = ports.ep_push
        cfg["output"]["push_hwm"] = 10000
    return cfg


# ---- processes -------------------------------------------------------------------

class Proc:
    """A child process with stdout/stderr in files under the test's tmp dir."""

    def __init__(self, name, argv, tmp_path, registry, env=None):
        self.name = name
        self.argv = argv
        n = sum(1 for p in registry if p.name == name)
        tag = "%s%s" % (name, "-%d" % n if n else "")
        self.out_path = str(tmp_path / (tag + ".stdout"))
        self.err_path = str(tmp_path / (tag + ".stderr"))
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.p = subprocess.Popen(argv, stdout=self._out, stderr=self._err,
                                  stdin=subprocess.DEVNULL, cwd=REPO,
                                  env=env)
        registry.append(self)

    @property
    def pid(self):
        return self.p.pid

    def stdout(self):
        with open(self.out_path, "r", errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.err_path, "r", errors="replace") as f:
            return f.read()

    def alive(self):
        return self.p.poll() is None

    def wait(self, timeout):
        """Exit code; fails the test when it does not exit in time."""
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("%s (pid %d) did not exit within %.1f s" %
                        (self.name, self.p.pid, timeout))

    def signal(self, sig):
        if self.alive():
            self.p.send_signal(sig)

    def kill(self):
        if self.alive():
            self.p.kill()
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._out.close()
        self._err.close()


class Beamd(Proc):
    """A running beamd with a control-socket client."""

    def __init__(self, tmp_path, registry, zctx, config=None, args=(), name="beamd"):
        self.zctx = zctx
        self.config_path = None
        self.cfg = None
        self.control = None
        argv = [binary("beamd")]
        if config is None:
            self.control = "tcp://127.0.0.1:5601"  # the built-in default
        else:
            if isinstance(config, dict):
                self.cfg = config
                self.control = config.get("control", {}).get("endpoint")
                text = to_yaml(config) + "\n"
                self.config_path = str(tmp_path / ("%s.yaml" % name))
                with open(self.config_path, "w") as f:
                    f.write(text)
            else:
                self.config_path = str(config)
            argv += ["-c", self.config_path]
        argv += list(args)
        super().__init__(name, argv, tmp_path, registry)

    def request(self, parts, timeout=3.0):
        """One request on the control REP; a fresh REQ each time so a lost
        reply cannot wedge the next request."""
        s = self.zctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        s.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        try:
            s.connect(self.control)
            if isinstance(parts, (bytes, str)):
                parts = [parts]
            s.send_multipart([p.encode() if isinstance(p, str) else p for p in parts])
            return json.loads(s.recv())
        finally:
            s.close()

    def ctl(self, cmd, timeout=3.0):
        return self.request(cmd, timeout)

    def stats(self):
        return self.ctl("stats")

    def wait_ready(self, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                pytest.fail("beamd exited with %s during start-up:\n%s" %
                            (self.p.returncode, self.stderr()))
            try:
                if self.request("ping", timeout=0.5).get("ok") is True:
                    return self
            except zmq.ZMQError:
                pass
        pytest.fail("beamd did not answer ping within %.1f s" % timeout)

    def wait_stats(self, pred, timeout=10.0, what="condition"):
        """Polls stats until pred(stats) is true; returns the stats."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.stats()
            if pred(st):
                return st
            time.sleep(0.05)
        pytest.fail("beamd stats never met %s within %.1f s; last stats: %s" %
                    (what, timeout, json.dumps(st)))

    def wait_log(self, pattern, timeout=5.0):
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern, re.M)
        while time.monotonic() < deadline:
            m = rx.search(self.stderr())
            if m:
                return m
            time.sleep(0.05)
        pytest.fail("beamd stderr never matched %r within %.1f s" % (pattern, timeout))


def stage(stats, name):
    for s in stats["stages"]:
        if s["name"] == name:
            return s
    raise KeyError(name)


# ---- ZeroMQ helpers -----------------------------------------------------------------

class Receiver:
    """A SUB (or PULL) on one of beamd's outputs, collecting decoded messages
    on a background thread: (topic, Header, ndarray or None, meta or None).
    Undecodable messages are kept in .errors (a test can assert there are
    none)."""

    def __init__(self, zctx, endpoint, kind=zmq.SUB, topics=(b"",)):
        self.sock = zctx.socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        if kind == zmq.SUB:
            # beamd.stats always: wait_live() uses it to see the join done.
            for t in set(topics) | {b"beamd.stats"}:
                self.sock.setsockopt(zmq.SUBSCRIBE, t)
        self.sock.connect(endpoint)
        self.msgs = []
        self.errors = []
        self.raw_topics = {}  # first part -> count, decodable or not
        self.cv = threading.Condition()
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop:
            if not poller.poll(50):
                continue
            while True:
                try:
                    parts = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                first = bytes(parts[0][:proto.TOPIC_MAX])
                try:
                    m = proto.decode_message(parts)
                except proto.ProtocolError as e:
                    with self.cv:
                        self.raw_topics[first] = self.raw_topics.get(first, 0) + 1
                        self.errors.append((str(e), first))
                        self.cv.notify_all()
                    continue
                with self.cv:
                    self.raw_topics[first] = self.raw_topics.get(first, 0) + 1
                    self.msgs.append(m)
                    self.cv.notify_all()

    def close(self):
        self._stop = True
        self._t.join(timeout=2)
        self.sock.close()

    def snapshot(self, topic=None):
        with self.cv:
            return [m for m in self.msgs if topic is None or m[0] == topic]

    def wait_for(self, pred, timeout=10.0, what="message"):
        """Waits until pred(list of messages) is true; returns that list."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                if pred(self.msgs):
                    return list(self.msgs)
                left = deadline - time.monotonic()
                if left <= 0:
                    topics = {}
                    for m in self.msgs:
                        topics[m[0]] = topics.get(m[0], 0) + 1
                    pytest.fail("timed out after %.1f s waiting for %s; received per topic: %s" %
                                (timeout, what, topics))
                self.cv.wait(min(left, 0.1))

    def wait_topic(self, topic, timeout=10.0):
        msgs = self.wait_for(lambda ms: any(m[0] == topic for m in ms), timeout,
                             "a message on %s" % topic)
        return [m for m in msgs if m[0] == topic]

    def wait_series_end(self, series_id, timeout=10.0):
        def have(ms):
            return any(m[0] == "beamd.series" and m[1].type == proto.SERIES_END and
                       m[1].series_id == series_id for m in ms)
        msgs = self.wait_for(have, timeout, "SERIES_END of series %d" % series_id)
        return [m for m in msgs if m[0] == "beamd.series" and m[1].type == proto.SERIES_END
                and m[1].series_id == series_id][0]

    def wait_live(self, timeout=5.0):
        """Returns once a beamd.stats message arrived (decodable or not, which
        test_daemon_control checks): the subscription is then known to be in
        place (PUB/SUB joins asynchronously)."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while not self.raw_topics.get(b"beamd.stats"):
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail("no beamd.stats message within %.1f s (subscription not live)"
                                % timeout)
                self.cv.wait(min(left, 0.1))

    def decode_errors(self, ignore_topics=()):
        """Undecodable messages (optionally ignoring some topics)."""
        with self.cv:
            return [e for e in self.errors if e[1] not in ignore_topics]


class Sender:
    """The test's detector: a PUSH or (X)PUB bound on beamd's input endpoint,
    numbering every message it sends (seq from 0, contiguous)."""

    def __init__(self, zctx, endpoint, kind=zmq.PUSH, sndhwm=None, send_timeout=10.0):
        self.sock = zctx.socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        if sndhwm is not None:
            self.sock.setsockopt(zmq.SNDHWM, sndhwm)
        self.sock.setsockopt(zmq.SNDTIMEO, int(send_timeout * 1000))
        self.sock.bind(endpoint)
        self.kind = kind
        self.seq = 0
        self.sent = 0

    def send_parts(self, parts, numbered=True):
        """Sends raw parts; numbered=True consumes a sequence number (the
        caller encoded self.seq into the header)."""
        self.sock.send_multipart(parts, copy=False)
        self.sent += 1
        if numbered:
            self.seq += 1

    def start(self, series_id, shape, dtype, meta=None):
        parts = proto.encode_message(proto.SERIES_START, series_id=series_id, seq=self.seq,
                                     shape=shape, dtype=dtype, meta=meta or {"test": True})
        self.send_parts(parts)

    def frame(self, series_id, frame_id, array, **kw):
        parts = proto.encode_message(proto.FRAME, array=array, series_id=series_id,
                                     frame_id=frame_id, seq=self.seq, **kw)
        self.send_parts(parts)

    def end(self, series_id, flags=0):
        parts = proto.encode_message(proto.SERIES_END, series_id=series_id, seq=self.seq,
                                     flags=flags)
        self.send_parts(parts)

    def wait_subscriber(self, timeout=5.0):
        """XPUB only: waits for beamd's subscription, so nothing sent after
        this is lost to the PUB/SUB join race."""
        assert self.kind == zmq.XPUB
        self.sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        try:
            msg = self.sock.recv()
        except zmq.Again:
            pytest.fail("beamd's SUB did not subscribe within %.1f s" % timeout)
        assert msg[:1] == b"\x01", msg

    def close(self):
        self.sock.close()


class FastFrames:
    """Pre-encoded frames: the payload is encoded once and only the
    128-byte header is rebuilt per frame, so a Python sender can outrun
    beamd (payload parts are sent zero-copy)."""

    def __init__(self, array):
        parts = proto.encode_message(proto.FRAME, array=array, series_id=0, frame_id=0)
        self.h = proto.decode_header(parts[0])
        self.payload = [zmq.Frame(p) for p in parts[1:]]

    def parts(self, series_id, frame_id, seq):
        self.h.series_id, self.h.frame_id, self.h.seq = series_id, frame_id, seq
        return [self.h.encode()] + self.payload


# ---- fixtures ---------------------------------------------------------------------

@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def procs(request):
    """Registry of every process the test started; killed in teardown."""
    reg = []
    request.node._beamd_procs = reg
    yield reg
    for p in reg:
        p.kill()
    # A sanitizer build (make SANITIZER=... check-integration, check-tsan)
    # reports on stderr; any report fails the test that started the process.
    for p in reg:
        m = SANITIZER_REPORT.search(p.stderr())
        if m:
            err = p.stderr()
            pytest.fail("%s: sanitizer report:\n%s" % (p.name, err[m.start():m.start() + 4000]))


SANITIZER_REPORT = re.compile(r"WARNING: ThreadSanitizer|ERROR: AddressSanitizer|"
                              r"ERROR: LeakSanitizer|: runtime error: ")


@pytest.fixture
def ports():
    return Ports()


@pytest.fixture
def start_beamd(tmp_path, procs, zctx):
    """start_beamd(config_dict_or_path=None, args=(), ready=True) -> Beamd."""
    def start(config=None, args=(), ready=True, name="beamd"):
        b = Beamd(tmp_path, procs, zctx, config, args, name)
        if ready:
            b.wait_ready()
        return b
    return start


@pytest.fixture
def run_tool(tmp_path, procs):
    """run_tool(name, args, wait=timeout or None) -> Proc (waited when
    wait is a number)."""
    def run(name, args, wait=None):
        p = Proc(name, [binary(name)] + list(args), tmp_path, procs)
        if wait is not None:
            p.wait(wait)
        return p
    return run


@pytest.fixture
def receivers():
    made = []
    yield made
    for r in made:
        r.close()


TEST_TIMEOUT = 90  # seconds; a safety net, every wait has its own deadline


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Bounds every test even if a wait without a deadline slipped in
    (pytest-timeout is not a dependency): SIGALRM raises in the main thread."""
    def on_alarm(signum, frame):
        raise TimeoutError("test ran longer than %d s" % TEST_TIMEOUT)
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when in ("call", "teardown", "setup"):
        for p in getattr(item, "_beamd_procs", []):
            for label, path in (("stderr", p.err_path), ("stdout", p.out_path)):
                try:
                    with open(path, "r", errors="replace") as f:
                        text = f.read()
                except OSError:
                    continue
                if text:
                    if len(text) > 20000:
                        text = "...\n" + text[-20000:]
                    rep.sections.append(("%s (pid %d) %s" % (p.name, p.pid, label), text))


# ---- numpy references --------------------------------------------------------------

def roi_masks(rois, h, w):
    """Boolean masks with beamd's roi_sum geometry: pixel centres at
    integer (x, y); centre default ((w-1)/2, (h-1)/2); disk d2 < r^2;
    annulus r_in^2 <= d2 < r_out^2; rect [x0, y0, x1, y1] half-open."""
    y, x = np.mgrid[0:h, 0:w]
    out = []
    for r in rois:
        if r["shape"] == "rect":
            x0, y0, x1, y1 = r["rect"]
            out.append((x >= x0) & (x < x1) & (y >= y0) & (y < y1))
            continue
        cx, cy = r.get("center", ((w - 1) / 2.0, (h - 1) / 2.0))
        d2 = (x - cx) ** 2 + (y - cy) ** 2
        if r["shape"] == "disk":
            out.append(d2 < r["radius"] ** 2)
        else:
            ri, ro = r["radii"]
            out.append((d2 >= ri * ri) & (d2 < ro * ro))
    return out


def correct_ref(raw, dark=None, flat=None, mask=None, bad_value=0.0):
    """beamd's correct stage in numpy float32: (float32(raw) - dark) / flat,
    bad (masked, flat <= 0) pixels -> bad_value."""
    v = raw.astype(np.float32)
    if dark is not None:
        v = v - dark.astype(np.float32)
    if flat is not None:
        v = v / flat.astype(np.float32)
    bad = np.zeros(raw.shape, bool)
    if mask is not None:
        bad |= mask != 0
    if flat is not None:
        bad |= ~(flat > 0)
    v = np.where(bad, np.float32(bad_value), v).astype(np.float32)
    return v
