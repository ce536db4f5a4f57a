"""The control socket (ping, status, stats, errors), beamd-ctl's exit codes,
the HTTP /metrics endpoint, and the beamd.stats topic, against a running
beamd that has processed a known number of frames."""

import http.client
import json
import re
import time

import numpy as np
import zmq

from conftest import Receiver, Sender, free_ports, make_config, proto, stage

H, W = 16, 16
STAGES = [{"name": "vd", "kind": "roi_sum", "backend": "cpu",
           "rois": [{"name": "all", "shape": "rect", "rect": [0, 0, W, H]}]}]


def http_req(port, method, path, timeout=3):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type") or "", r.read().decode()
    finally:
        c.close()


def metric(text, name, labels=None):
    """Value of one sample in Prometheus text format."""
    lab = "" if labels is None else r"\{%s\}" % re.escape(labels)
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), lab), text, re.M)
    assert m, "metric %s%s not found" % (name, labels or "")
    return float(m.group(1))


def run_frames(zctx, ports, b, n):
    rx = Receiver(zctx, ports.ep_publish, topics=(b"beamd.series",))
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    tx.start(1, (H, W), np.uint16)
    for fid in range(n):
        tx.frame(1, fid, np.full((H, W), fid, np.uint16))
    tx.end(1)
    rx.wait_series_end(1)
    tx.close()
    return rx


def test_control_commands_and_ctl(ports, zctx, start_beamd, run_tool, receivers):
    b = start_beamd(make_config(ports, STAGES, mode="pull"))
    rx = run_frames(zctx, ports, b, 7)
    receivers.append(rx)
    assert b.ctl("ping") == {"ok": True}
    status = b.ctl("status")
    assert status["state"] == "running" and status["pid"] == b.pid
    assert status["mode"] == "pull" and status["publish"] == ports.ep_publish
    assert status["config"] == b.config_path and status["frames"] == 7
    assert [s["name"] for s in status["stages"]] == ["vd"]
    st = b.ctl("stats")
    assert st["state"] == "running"
    for k in ("messages", "frames", "bytes", "series", "malformed", "gaps", "lost",
              "dropped_busy", "dropped_total", "unknown_series", "paused", "pool_free",
              "pool_slots"):
        assert k in st["input"], k
    assert st["input"]["frames"] == 7 and st["input"]["messages"] == 9
    vd = stage(st, "vd")
    assert vd["frames_in"] == 7 and vd["frames_out"] == 7 and vd["latency"]["count"] == 7
    assert st["results"] == 7 and st["reload"]["failures"] == 0
    # Errors are answered, not fatal.
    bad = b.ctl("frobnicate")
    assert bad["ok"] is False and "unknown command" in bad["error"]
    multi = b.request(["ping", "extra"])
    assert multi["ok"] is False and "one message part" in multi["error"]
    long = b.ctl("x" * 200)
    assert long["ok"] is False
    assert b.ctl("ping\n") == {"ok": True}
    assert b.ctl("ping") == {"ok": True}

    ctl = run_tool("beamd-ctl", ["-e", ports.ep_control, "ping"], wait=10)
    assert ctl.p.returncode == 0 and json.loads(ctl.stdout()) == {"ok": True}
    ctl = run_tool("beamd-ctl", ["-e", ports.ep_control, "stats"], wait=10)
    assert ctl.p.returncode == 0 and json.loads(ctl.stdout())["input"]["frames"] == 7
    ctl = run_tool("beamd-ctl", ["-e", ports.ep_control, "frobnicate"], wait=10)
    assert ctl.p.returncode == 1 and json.loads(ctl.stdout())["ok"] is False
    dead = "tcp://127.0.0.1:%d" % free_ports(1)[0]
    t0 = time.monotonic()
    ctl = run_tool("beamd-ctl", ["-e", dead, "-t", "0.5", "ping"], wait=10)
    assert ctl.p.returncode == 3, ctl.stderr()
    assert time.monotonic() - t0 < 5
    ctl = run_tool("beamd-ctl", [], wait=10)
    assert ctl.p.returncode == 2

    # stop: drains and exits 0.
    ctl = run_tool("beamd-ctl", ["-e", ports.ep_control, "stop"], wait=10)
    assert ctl.p.returncode == 0
    assert b.wait(15) == 0


def test_metrics_endpoint(ports, zctx, start_beamd, receivers):
    b = start_beamd(make_config(ports, STAGES, mode="pull"))
    rx = run_frames(zctx, ports, b, 5)
    receivers.append(rx)
    time.sleep(0.3)  # the page is rendered at each heartbeat (0.1 s)
    code, ctype, body = http_req(ports.metrics, "GET", "/metrics")
    assert code == 200
    assert ctype.startswith("text/plain"), ctype
    st = b.stats()
    assert metric(body, "beamd_up") == 1
    assert metric(body, "beamd_input_frames_total") == st["input"]["frames"] == 5
    assert metric(body, "beamd_input_messages_total") == st["input"]["messages"] == 7
    assert metric(body, "beamd_input_malformed_total") == st["input"]["malformed"] == 0
    assert metric(body, "beamd_input_lost_total") == st["input"]["lost"] == 0
    assert metric(body, "beamd_results_total") == st["results"] == 5
    assert metric(body, "beamd_stage_frames_in_total",
                  'stage="vd",kind="roi_sum",backend="cpu"') == stage(st, "vd")["frames_in"]
    assert metric(body, "beamd_latency_seconds_count") == st["latency"]["count"] == 5
    for q in ("0.5", "0.9", "0.99"):
        assert metric(body, "beamd_latency_seconds", 'quantile="%s"' % q) >= 0
    assert "# TYPE beamd_input_frames_total counter" in body
    code, _, _ = http_req(ports.metrics, "GET", "/other")
    assert code == 404
    code, _, _ = http_req(ports.metrics, "POST", "/metrics")
    assert code == 405
    assert b.alive() and b.ctl("ping") == {"ok": True}


def test_push_stall_is_reported_and_its_end(ports, zctx, start_beamd, receivers):
    """A lossless PUSH output with no consumer holds the pipeline by design;
    it must say so: a log line with the endpoint and how long, the stall in
    stats, STATUS-style figures in /metrics, and a line when it ends."""
    b = start_beamd(make_config(ports, STAGES, mode="pull", push=True))
    rx = run_frames(zctx, ports, b, 5)
    receivers.append(rx)
    b.wait_log(r"output\.push \(%s\): no consumer has taken a message for \d+ s; \d+ results "
               r"wait and the pipeline is held" % re.escape(ports.ep_push), timeout=10)
    st = b.stats()["outputs"]["push"]
    assert st["stalled_s"] >= 5 and st["backlog"] > 0 and st["blocked_s"] >= st["stalled_s"], st
    time.sleep(0.3)
    _, _, body = http_req(ports.metrics, "GET", "/metrics")
    assert metric(body, "beamd_push_stalled_seconds") >= 5
    assert metric(body, "beamd_push_blocked_seconds_total") >= 5
    assert metric(body, "beamd_push_backlog") == st["backlog"]
    pull = zctx.socket(zmq.PULL)
    pull.connect(ports.ep_push)
    try:
        for _ in range(st["backlog"]):
            assert pull.poll(5000), "the held results did not come"
            pull.recv_multipart()
        b.wait_log(r"output\.push \(%s\): a consumer takes messages again"
                   % re.escape(ports.ep_push), timeout=5)
        st = b.wait_stats(lambda s: s["outputs"]["push"]["backlog"] == 0, what="backlog empty")
        assert st["outputs"]["push"]["stalled_s"] == 0
        time.sleep(0.3)
        _, _, body = http_req(ports.metrics, "GET", "/metrics")
        assert metric(body, "beamd_push_stalled_seconds") == 0
        assert metric(body, "beamd_push_dropped_total") == 0
        assert metric(body, "beamd_latency_seconds_sum") > 0
        assert metric(body, "beamd_stage_process_seconds_sum", 'stage="vd"') > 0
    finally:
        pull.close(0)


def test_stats_topic_decodes(ports, zctx, start_beamd, receivers):
    """beamd.stats must be a valid protocol message (proto/PROTOCOL.md: a
    RESULT carrying the JSON document) that the reference decoder accepts.
    The JSON may be the payload (as PROTOCOL.md says) or the metadata part."""
    b = start_beamd(make_config(ports, STAGES, mode="pull"))
    rx = Receiver(zctx, ports.ep_publish, topics=(b"beamd.stats",))
    receivers.append(rx)
    rx.wait_live()
    time.sleep(0.3)
    assert not rx.errors, "undecodable beamd.stats: %s" % rx.errors[:1]
    msgs = rx.snapshot("beamd.stats")
    assert msgs
    _, h, arr, meta = msgs[-1]
    assert h.type == proto.RESULT
    doc = meta if arr is None else json.loads(arr.tobytes())
    assert doc["state"] == "running" and "input" in doc
    assert b.alive()
