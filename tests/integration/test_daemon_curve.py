"""CURVE through the real daemon and tools: keys made by beamd-keygen (zcert
names) and by pyzmq (.key names), a listed client that gets results, and an
unlisted key, a plaintext client and a client with a wrong server key that
get nothing and are counted; the allow-list reloaded on SIGHUP; control
commands logged with the key's name; plaintext binds other hosts could reach
refused at start; the metrics bearer token; beamd-ctl, beamd-sub,
beamd-replay and the Python client (beamd_client.Curve) over CURVE.

The clients here are pyzmq sockets configured from the key files with
pyzmq's own zmq.auth.load_certificate, not with beamd's C code."""

import http.client
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import zmq
import zmq.auth

from conftest import Sender, binary, free_ports, make_config, to_yaml

from beamd_client import Control, Curve, Publisher, ReplayServer, Subscriber  # noqa: E402

H, W = 16, 16
STAGES = [{"name": "vd", "kind": "roi_sum", "backend": "cpu",
           "rois": [{"name": "all", "shape": "rect", "rect": [0, 0, W, H]}]}]


class Keys:
    def __init__(self, root):
        self.dir = root / "keys"
        self.allow = root / "allow"
        self.dir.mkdir()
        self.allow.mkdir()

    def pub(self, name):
        return str(self.dir / name)

    def sec(self, name):
        return str(self.dir / (name + "_secret"))

    def z85(self, name):
        return zmq.auth.load_certificate(self.sec(name))


@pytest.fixture
def keys(tmp_path):
    k = Keys(tmp_path)
    for name in ("beamd", "alice", "mallory", "other"):
        r = subprocess.run([binary("beamd-keygen"), "--dir", str(k.dir), name],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stderr
    assert os.stat(k.sec("alice")).st_mode & 0o777 == 0o600
    # pyzmq's own layout and names for a second client.
    zmq.auth.create_certificates(str(k.dir), "pyclient")
    shutil.copy(k.pub("alice"), str(k.allow / "alice"))
    shutil.copy(str(k.dir / "pyclient.key"), str(k.allow / "pyclient.key"))
    return k


def curve_socket(ctx, kind, endpoint, secret_file, server_file, subscribe=True):
    """A pyzmq client socket with CURVE from the key files (or plaintext when
    secret_file is None)."""
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    if secret_file:
        pub, sec = zmq.auth.load_certificate(secret_file)
        srv, _ = zmq.auth.load_certificate(server_file)
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = pub, sec, srv
    if kind == zmq.SUB and subscribe:
        s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(endpoint)
    return s


def topics_within(sock, seconds):
    """Topics of every message received in the time given."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sock.poll(50):
            got.append(sock.recv_multipart()[0])
    return got


def curve_config(ports, keys, **kw):
    cfg = make_config(ports, STAGES, mode="pull", **kw)
    cfg["output"]["publish"] = {"address": ports.ep_publish, "curve": True}
    cfg["control"]["endpoint"] = {"address": ports.ep_control, "curve": True}
    cfg["curve"] = {"secret_key": keys.sec("beamd"), "allow": str(keys.allow)}
    return cfg


def control(ports, keys, who="alice", timeout=3.0):
    secret = keys.sec(who) if who != "pyclient" else str(keys.dir / "pyclient.key_secret")
    return Control(ports.ep_control, timeout=timeout,
                   curve=Curve(secret_key=secret, server_key=keys.pub("beamd")))


def wait_ready(b, ports, keys, timeout=10.0):
    deadline = time.monotonic() + timeout
    with control(ports, keys, timeout=0.5) as ctl:
        while time.monotonic() < deadline:
            assert b.alive(), b.stderr()
            try:
                if ctl.ping().get("ok"):
                    return
            except Exception:
                time.sleep(0.05)
    pytest.fail("beamd did not answer a CURVE ping:\n" + b.stderr())


def send_series(zctx, ports, n, series_id=1):
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    tx.start(series_id, (H, W), np.uint16)
    for fid in range(n):
        tx.frame(series_id, fid, np.full((H, W), fid, np.uint16))
    tx.end(series_id)
    return tx


def test_listed_keys_get_results_and_the_rest_are_refused(ports, keys, start_beamd, zctx,
                                                           run_tool):
    b = start_beamd(curve_config(ports, keys), ready=False)
    wait_ready(b, ports, keys)
    cctx = zmq.Context()  # clients in a context of their own, as remote ones would be
    try:
        alice = curve_socket(cctx, zmq.SUB, ports.ep_publish, keys.sec("alice"), keys.pub("beamd"))
        mallory = curve_socket(cctx, zmq.SUB, ports.ep_publish, keys.sec("mallory"),
                               keys.pub("beamd"))
        plain = curve_socket(cctx, zmq.SUB, ports.ep_publish, None, None)
        wrong = curve_socket(cctx, zmq.SUB, ports.ep_publish, keys.sec("alice"),
                             keys.pub("other"))
        sub = run_tool("beamd-sub", ["--connect", ports.ep_publish, "--topic", "vd.",
                                     "--count", "5", "--timeout", "20", "--stats",
                                     "--curve-secret", keys.sec("alice"),
                                     "--curve-server", keys.pub("beamd")])
        # Joined: the heartbeat's beamd.stats reaches alice; beamd-sub's
        # handshake is counted (control, alice, beamd-sub).
        assert b"beamd.stats" in topics_within(alice, 1.5)
        with control(ports, keys) as ctl:
            deadline = time.monotonic() + 5
            while ctl.stats()["curve"]["accepted"] < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        tx = send_series(zctx, ports, 5)
        got = topics_within(alice, 2.0)
        assert got.count(b"vd.sums") == 5
        assert sub.wait(20) == 0, sub.stderr()
        assert '"received"' in sub.stdout() or sub.stdout()
        for s in (mallory, plain, wrong):
            assert topics_within(s, 0.3) == []
        with control(ports, keys) as ctl:
            st = ctl.stats()
        cur = st["curve"]
        assert cur["keys"] == 2  # alice (zcert name) and pyclient.key (pyzmq name)
        assert cur["refused_key"] >= 1
        assert cur["refused_handshake"] >= 2  # plaintext and the wrong server key
        m_pub = zmq.auth.load_certificate(keys.pub("mallory"))[0].decode()
        b.wait_log(r"refused client key %s from 127\.0\.0\.1" % re.escape(m_pub))
        # Handshakes that fail before ZAP is asked: the peer read at accept.
        b.wait_log(r"output.publish: refused a client with the wrong server key.* from "
                   r"127\.0\.0\.1:\d+")
        b.wait_log(r"output.publish: refused a client (that broke off|with another mechanism)"
                   r".* from 127\.0\.0\.1:\d+")
        # Plaintext control gets no answer; beamd-ctl with keys does.
        p = run_tool("beamd-ctl", ["-e", ports.ep_control, "-t", "0.5", "ping"], wait=10)
        assert p.p.returncode == 3
        p = run_tool("beamd-ctl", ["-e", ports.ep_control, "--curve-secret", keys.sec("alice"),
                                   "--curve-server", keys.pub("beamd"), "status"], wait=10)
        assert p.p.returncode == 0, p.stderr()
        # Commands that change the daemon are logged with the key's name.
        with control(ports, keys, who="pyclient") as ctl:
            assert ctl.stop()["ok"] is True
        b.wait_log(r"control: stop from key pyclient")
        assert b.wait(20) == 0
        tx.close()
        for s in (alice, mallory, plain, wrong):
            s.close()
    finally:
        cctx.destroy(linger=0)


def test_allow_list_is_read_again_on_sighup(ports, keys, start_beamd):
    b = start_beamd(curve_config(ports, keys), ready=False)
    wait_ready(b, ports, keys)
    cctx = zmq.Context()
    try:
        m = curve_socket(cctx, zmq.SUB, ports.ep_publish, keys.sec("mallory"), keys.pub("beamd"))
        assert b"beamd.stats" not in topics_within(m, 0.5)
        shutil.copy(keys.pub("mallory"), str(keys.allow / "mallory"))
        b.signal(signal.SIGHUP)
        b.wait_log(r"allow-list reloaded: 3 keys")
        # A refused client does not retry (libzmq ends the session on a
        # ZAP refusal): a new connection with the now-listed key gets in.
        assert topics_within(m, 0.3) == []
        m.close()
        m = curve_socket(cctx, zmq.SUB, ports.ep_publish, keys.sec("mallory"), keys.pub("beamd"))
        assert b"beamd.stats" in topics_within(m, 2.0)
        m.close()
        os.remove(str(keys.allow / "mallory"))
        b.signal(signal.SIGHUP)
        b.wait_log(r"allow-list reloaded: 2 keys")
        m = curve_socket(cctx, zmq.SUB, ports.ep_publish, keys.sec("mallory"), keys.pub("beamd"))
        assert topics_within(m, 0.5) == []
        m.close()
    finally:
        cctx.destroy(linger=0)


def check_config(tmp_path, cfg, name="c.yaml"):
    p = tmp_path / name
    p.write_text(to_yaml(cfg) + "\n")
    return p, subprocess.run([binary("beamd"), "--check-config", str(p)], capture_output=True,
                             text=True, timeout=10)


def test_reachable_plaintext_bind_refuses_to_start(ports, tmp_path, start_beamd):
    cfg = make_config(ports, STAGES)
    port, = free_ports(1)
    cfg["output"]["publish"] = "tcp://0.0.0.0:%d" % port
    b = start_beamd(cfg, ready=False)
    assert b.wait(10) != 0
    assert re.search(r":\d+:\d+: error: output.publish: tcp://0.0.0.0:%d can be reached from "
                     r"other hosts without authentication" % port, b.stderr()), b.stderr()
    # Said explicitly, it is accepted (checked without binding: tests stay
    # on loopback).
    cfg["output"]["publish"] = {"address": "tcp://0.0.0.0:%d" % port, "insecure": True}
    _, r = check_config(tmp_path, cfg)
    assert r.returncode == 0, r.stderr
    cfg["metrics"]["listen"] = "0.0.0.0:%d" % port
    p, r = check_config(tmp_path, cfg)
    assert r.returncode == 1 and "metrics.listen" in r.stderr and "token_file" in r.stderr


def test_metrics_bearer_token(ports, tmp_path, start_beamd):
    tok = tmp_path / "token"
    tok.write_text("s3cret-token-0123456789\n")
    cfg = make_config(ports, STAGES)
    cfg["metrics"]["token_file"] = str(tok)
    b = start_beamd(cfg)

    def get(auth):
        c = http.client.HTTPConnection("127.0.0.1", ports.metrics, timeout=3)
        try:
            c.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()
    assert get(None)[0] == 401
    assert get("Bearer wrong-token-0123456789")[0] == 401
    assert get("Basic czNjcmV0")[0] == 401
    status, body = get("Bearer s3cret-token-0123456789")
    assert status == 200 and "beamd_metrics_refused_total" in body
    assert b.stats()["metrics_refused"] == 3


def test_python_client_round_trip_over_curve(ports, keys, start_beamd, zctx):
    """Publisher (CURVE server, beamd connects as a client with the
    publisher's public key) -> beamd -> Subscriber and Control over CURVE."""
    zmq.auth.create_certificates(str(keys.dir), "detector")
    allow_beamd = keys.dir / "allow-beamd"
    allow_beamd.mkdir()
    shutil.copy(keys.pub("beamd"), str(allow_beamd / "beamd"))
    cfg = curve_config(ports, keys)
    cfg["input"]["endpoint"] = {"address": ports.ep_input, "curve": True,
                                "server_key": str(keys.dir / "detector.key")}
    det = Curve(secret_key=str(keys.dir / "detector.key_secret"), allow=str(allow_beamd))
    me = Curve(secret_key=keys.sec("alice"), server_key=keys.pub("beamd"))
    frames = np.random.default_rng(3).integers(0, 1000, (12, H, W), dtype=np.uint16)
    with Publisher(ports.ep_input, kind="push", curve=det) as pub:
        b = start_beamd(cfg, ready=False)
        wait_ready(b, ports, keys)
        with Subscriber(ports.ep_publish, topics=["vd."], curve=me) as sub:
            time.sleep(0.5)  # PUB slow-joiner: the SUB's handshake and subscription
            assert pub.series(frames, series_id=7) == 12
            res = list(sub.results(timeout=10, count=12))
        with Control(ports.ep_control, curve=me) as ctl:
            st = ctl.stats()
    assert sorted(r.frame_id for r in res) == list(range(12))
    for r in res:
        assert r.array[0] == frames[r.frame_id].astype(np.float64).sum()
    assert st["input"]["frames"] == 12


def test_replay_tool_and_daemon_over_curve(ports, keys, start_beamd, run_tool, tmp_path):
    """beamd-replay as a CURVE server letting in beamd's key; beamd's replay
    input as the client; results on a CURVE PUSH read by beamd-sub."""
    import h5py
    h5 = tmp_path / "scan.h5"
    frames = np.arange(20 * H * W, dtype=np.uint16).reshape(20, H, W)
    with h5py.File(str(h5), "w") as f:
        f.create_dataset("/entry/data/data", data=frames)
    allow_beamd = keys.dir / "allow-beamd"
    allow_beamd.mkdir()
    shutil.copy(keys.pub("beamd"), str(allow_beamd / "beamd"))
    srv = run_tool("beamd-replay", [str(h5), "--bind", ports.ep_input,
                                    "--curve-secret", keys.sec("other"),
                                    "--curve-allow", str(allow_beamd)])
    cfg = curve_config(ports, keys, push=True)
    cfg["input"] = {"mode": "replay", "endpoint": {"address": ports.ep_input, "curve": True,
                                                   "server_key": keys.pub("other")}}
    cfg["output"]["push"] = {"address": ports.ep_push, "curve": True}
    b = start_beamd(cfg, ready=False)
    wait_ready(b, ports, keys)
    sub = run_tool("beamd-sub", ["--connect", ports.ep_push, "--socket", "pull",
                                 "--topic", "vd.", "--count", "20", "--timeout", "30",
                                 "--curve-secret", keys.sec("alice"),
                                 "--curve-server", keys.pub("beamd")], wait=40)
    assert sub.p.returncode == 0, sub.stderr()
    assert srv.alive() or srv.p.returncode == 0, srv.stderr()


def test_python_curve_server_lets_in_listed_keys_only(keys):
    """beamd_client.Curve as a server (what Publisher and ReplayServer use):
    the same allow-list rules as beamd, and fail closed."""
    ctx = zmq.Context()
    try:
        srv = Curve(secret_key=keys.sec("beamd"), allow=str(keys.allow))
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        srv.server(push, ctx)
        port, = free_ports(1)
        ep = "tcp://127.0.0.1:%d" % port
        push.bind(ep)
        cctx = zmq.Context()
        ok = curve_socket(cctx, zmq.PULL, ep, keys.sec("alice"), keys.pub("beamd"))
        bad = curve_socket(cctx, zmq.PULL, ep, keys.sec("mallory"), keys.pub("beamd"))
        push.send(b"one", flags=zmq.NOBLOCK) if push.poll(2000, zmq.POLLOUT) else None
        assert ok.poll(2000) and ok.recv() == b"one"
        push.send(b"two")
        assert not bad.poll(300)
        for s in (ok, bad, push):
            s.close()
        srv.close()
        cctx.destroy(linger=0)
    finally:
        ctx.destroy(linger=0)


def test_tools_refuse_reachable_plaintext_binds(keys, run_tool, ports):
    """The tools follow the daemon's rule: a bind other hosts can reach needs
    --curve-allow or --insecure (checked before binding anything)."""
    port, = free_ports(1)
    p = run_tool("beamd-sim", ["--bind", "tcp://0.0.0.0:%d" % port, "--frames", "1"], wait=10)
    assert p.p.returncode != 0
    assert "can be reached from other hosts without authentication" in p.stderr()
    # CURVE server with a missing allow-list: refused, with the reason.
    p = run_tool("beamd-sim", ["--bind", ports.ep_input, "--frames", "1", "--curve-secret",
                               keys.sec("other"), "--curve-allow", "/nonexistent"], wait=10)
    assert p.p.returncode != 0 and "/nonexistent" in p.stderr()
    # A client key file that is only public.
    p = run_tool("beamd-sub", ["--connect", ports.ep_publish, "--timeout", "1",
                               "--curve-secret", keys.pub("alice"),
                               "--curve-server", keys.pub("beamd")], wait=10)
    assert p.p.returncode != 0 and "has no secret-key" in p.stderr()


def test_keygen_never_overwrites_a_key(keys, run_tool):
    p = run_tool("beamd-keygen", ["--dir", str(keys.dir), "alice"], wait=10)
    assert p.p.returncode == 1 and "will not overwrite" in p.stderr()
    before = open(keys.sec("alice")).read()
    p = run_tool("beamd-keygen", ["--dir", str(keys.dir), "--pyzmq", "--print", "carol"], wait=10)
    assert p.p.returncode == 0
    pub, sec = zmq.auth.load_certificate(str(keys.dir / "carol.key_secret"))
    assert p.stdout().strip() == pub.decode() and sec
    assert os.stat(str(keys.dir / "carol.key_secret")).st_mode & 0o777 == 0o600
    assert open(keys.sec("alice")).read() == before
