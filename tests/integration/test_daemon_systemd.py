"""beamd under systemd's notify protocol, with a fake NOTIFY_SOCKET: READY=1
only once the sockets answer, STATUS= with rates, WATCHDOG=1 from the loop
timer, RELOADING=1 then READY=1 around a reload, STOPPING=1 on SIGTERM, no
READY=1 from a start-up that fails, and journald priority prefixes on
stderr."""

import os
import re
import signal
import socket
import time

import zmq

from conftest import Proc, binary, make_config, to_yaml


def notify_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(0.05)
    return s, path


def drain(sock, seconds, until=None):
    """Datagrams received within `seconds` (stops early once `until` is seen)."""
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            continue
        out.append(msg)
        if until and until in msg:
            break
    return out


def ping(zctx, endpoint):
    s = zctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 1000)
    try:
        s.connect(endpoint)
        s.send(b"ping")
        return s.recv() == b'{"ok":true}'
    except zmq.ZMQError:
        return False
    finally:
        s.close()


def start(tmp_path, procs, cfg, path, watchdog_usec=None, name="beamd"):
    cfg_path = tmp_path / (name + ".yaml")
    cfg_path.write_text(to_yaml(cfg) + "\n")
    env = dict(os.environ)
    env["NOTIFY_SOCKET"] = path
    env.pop("JOURNAL_STREAM", None)
    env.pop("WATCHDOG_PID", None)
    if watchdog_usec:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    return Proc(name, [binary("beamd"), "-c", str(cfg_path)], tmp_path, procs, env=env), cfg_path


STAGES = [{"name": "vd", "kind": "roi_sum", "rois": [{"name": "all", "shape": "rect", "rect": [0, 0, 8, 8]}]}]


def test_notify_lifecycle(tmp_path, procs, ports, zctx):
    sock, path = notify_socket(tmp_path)
    cfg = make_config(ports, STAGES, heartbeat="0.1s")
    d, cfg_path = start(tmp_path, procs, cfg, path, watchdog_usec=200000)
    msgs = drain(sock, 10, until="READY=1")
    assert any("READY=1" in m for m in msgs), msgs
    # READY means ready: the control socket answers at once.
    assert ping(zctx, ports.ep_control)
    later = drain(sock, 1.0)
    assert sum("WATCHDOG=1" in m for m in later) >= 5, later  # every 100 ms
    status = [m for m in later if m.startswith("STATUS=")]
    assert status and re.search(r"frames/s", status[-1]), status

    # A reload: RELOADING=1 (with MONOTONIC_USEC), then READY=1.
    d.signal(signal.SIGHUP)
    msgs = drain(sock, 5, until="READY=1")
    reloading = [m for m in msgs if "RELOADING=1" in m]
    assert reloading and "MONOTONIC_USEC=" in reloading[0], msgs
    assert msgs.index(reloading[0]) < max(i for i, m in enumerate(msgs) if "READY=1" in m)

    d.signal(signal.SIGTERM)
    msgs = drain(sock, 5, until="STOPPING=1")
    assert any("STOPPING=1" in m for m in msgs), msgs
    assert d.wait(10) == 0
    # Under systemd, stderr lines carry journald priorities, no timestamps.
    lines = [l for l in d.stderr().splitlines() if l]
    assert lines and all(re.match(r"^<[0-7]>", l) for l in lines), lines[:5]
    assert any(l.startswith("<5>") and "ready" in l for l in lines)


def test_no_ready_when_startup_fails(tmp_path, procs, ports, zctx):
    sock, path = notify_socket(tmp_path)
    blocker = zctx.socket(zmq.PUB)
    blocker.setsockopt(zmq.LINGER, 0)
    blocker.bind(ports.ep_publish)  # the daemon's publish port is taken
    try:
        cfg = make_config(ports, STAGES)
        d, _ = start(tmp_path, procs, cfg, path)
        assert d.wait(10) == 1
        msgs = drain(sock, 0.5)
        assert not any("READY=1" in m for m in msgs), msgs
        assert "cannot bind" in d.stderr()
    finally:
        blocker.close()
