"""Reload end to end: a broken config on SIGHUP keeps the running graph
(errors logged as file:line:col), a valid one swaps in at the next series
boundary, and `beamd-ctl reload` reports a broken file as ok:false with
every error listed."""

import json
import re
import signal
import time

import numpy as np
import zmq

from conftest import Receiver, Sender, make_config, proto, to_yaml

H, W = 32, 32
ROIS = [{"name": "all", "shape": "rect", "rect": [0, 0, W, H]}]


def stages(vd_name="vd", extra=None):
    vd = {"name": vd_name, "kind": "roi_sum", "input": "corr", "backend": "cpu", "rois": ROIS}
    vd.update(extra or {})
    return [{"name": "corr", "kind": "correct", "backend": "cpu", "publish": False}, vd]


def write(path, cfg):
    text = to_yaml(cfg) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def position(text, needle):
    """1-based line and column of needle in text."""
    for i, line in enumerate(text.split("\n")):
        c = line.find(needle)
        if c >= 0:
            return i + 1, c + 1
    raise AssertionError(needle)


def sums_for(rx, sid, name="vd.sums"):
    return sorted(m[1].frame_id for m in rx.snapshot(name) if m[1].series_id == sid)


def wait_sums(rx, sid, ids, name="vd.sums"):
    rx.wait_for(lambda ms: set(ids) <= {m[1].frame_id for m in ms
                                        if m[0] == name and m[1].series_id == sid},
                timeout=10, what="%s of frames %s" % (name, list(ids)))


def test_sighup_broken_config_keeps_old_graph(ports, zctx, start_beamd, receivers, run_tool):
    good = make_config(ports, stages(), mode="pull")
    b = start_beamd(good)
    path = b.config_path
    rx = Receiver(zctx, ports.ep_publish, topics=(b"vd", b"beamd.series"))
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    frame = np.ones((H, W), np.uint16)

    def send(sid, ids):
        for fid in ids:
            tx.frame(sid, fid, frame)

    tx.start(1, (H, W), np.uint16)
    send(1, range(5))
    wait_sums(rx, 1, range(5))

    # Broken: an unknown key and a bad enum in one stage.
    broken = make_config(ports, stages(extra={"sise": 3, "backend": "gpu"}), mode="pull")
    text = write(path, broken)
    b.signal(signal.SIGHUP)
    b.wait_log(r"reload refused")
    log = b.stderr()
    ln, col = position(text, "sise:")
    assert re.search(r"%s:%d:%d: error: .*sise" % (re.escape(path), ln, col), log), \
        "no file:line:col error for the unknown key at %d:%d" % (ln, col)
    ln, col = position(text, "gpu")
    assert re.search(r"%s:%d:%d: error: .*gpu" % (re.escape(path), ln, col), log), \
        "no file:line:col error for the bad enum at %d:%d" % (ln, col)
    # The old stages keep running.
    send(1, range(5, 10))
    wait_sums(rx, 1, range(10))
    st = b.stats()
    assert st["reload"]["failures"] == 1 and st["reload"]["count"] == 0
    assert st["reload"]["last_error"]
    assert [s["name"] for s in st["stages"]] == ["corr", "vd"]

    # A valid change waits for the series boundary.
    write(path, make_config(ports, stages(vd_name="vd2"), mode="pull"))
    b.signal(signal.SIGHUP)
    st = b.wait_stats(lambda s: s["reload"]["pending"], timeout=5, what="reload pending")
    assert st["reload"]["failures"] == 1
    send(1, range(10, 13))
    wait_sums(rx, 1, range(13))
    tx.end(1)
    rx.wait_series_end(1)
    st = b.wait_stats(lambda s: s["reload"]["count"] == 1, timeout=5, what="reload applied")
    assert not st["reload"]["pending"]
    assert [s["name"] for s in st["stages"]] == ["corr", "vd2"]
    tx.start(2, (H, W), np.uint16)
    send(2, range(3))
    wait_sums(rx, 2, range(3), name="vd2.sums")
    assert sums_for(rx, 1) == list(range(13)), "series 1 stayed on the old graph"
    assert sums_for(rx, 2) == [], "the old stage must not see series 2"
    assert sums_for(rx, 1, "vd2.sums") == []

    # beamd-ctl reload with a broken file: ok:false, every error listed.
    text = write(path, broken)
    ctl = run_tool("beamd-ctl", ["-e", ports.ep_control, "-t", "5", "reload"], wait=10)
    assert ctl.p.returncode == 1, (ctl.p.returncode, ctl.stdout(), ctl.stderr())
    reply = json.loads(ctl.stdout())
    assert reply["ok"] is False
    errs = reply["errors"]
    assert len(errs) >= 2
    assert all(re.match(r"%s:\d+:\d+: error: " % re.escape(path), e) for e in errs), errs
    assert any("sise" in e for e in errs) and any("gpu" in e for e in errs), errs
    st = b.stats()
    assert st["reload"]["failures"] == 2 and st["reload"]["count"] == 1
    # Still processing on the graph that was live.
    send(2, range(3, 6))
    wait_sums(rx, 2, range(6), name="vd2.sums")
    tx.end(2)
    end = rx.wait_series_end(2)
    assert not end[1].flags & proto.FLAG_ABORTED
    assert b.alive()
    tx.close()


def test_reload_changing_sockets_is_refused(ports, zctx, start_beamd, run_tool):
    cfg = make_config(ports, stages(), mode="pull")
    b = start_beamd(cfg)
    other = dict(cfg)
    other["output"] = dict(cfg["output"], hwm=7)
    write(b.config_path, other)
    reply = b.ctl("reload")
    assert reply["ok"] is False
    assert any("output" in e and "restart" in e for e in reply["errors"]), reply
    assert b.stats()["reload"]["failures"] == 1
    time.sleep(0.1)
    assert b.ctl("ping") == {"ok": True}


def test_reload_logs_every_error(ports, start_beamd):
    """A file with 12 errors: all 12 are logged (one line each, at their
    file:line:col) and all 12 come back in the control reply."""
    b = start_beamd(make_config(ports, stages(), mode="pull"))
    path = b.config_path
    keys = ["bad_key_%02d" % i for i in range(12)]
    text = write(path, make_config(ports, stages(extra={k: 1 for k in keys}), mode="pull"))
    b.signal(signal.SIGHUP)
    b.wait_log(r"reload refused")
    log = b.stderr()
    for k in keys:
        ln, col = position(text, k + ":")
        assert re.search(r"^.*%s:%d:%d: error: .*unknown key \"%s\"" % (re.escape(path), ln, col, k),
                         log, re.M), "no logged error for %s at %d:%d:\n%s" % (k, ln, col, log)
    assert re.search(r"reload refused.*12 errors", log), log
    reply = b.ctl("reload")
    assert reply["ok"] is False
    assert len(reply["errors"]) == 12, reply
    assert sorted(re.search(r'"(bad_key_\d+)"', e).group(1) for e in reply["errors"]) == keys
    st = b.stats()
    assert st["reload"]["failures"] == 2 and st["reload"]["count"] == 0
    assert [s["name"] for s in st["stages"]] == ["corr", "vd"]


def test_reload_with_missing_mask_is_refused(tmp_path, ports, zctx, start_beamd, receivers):
    """An input file that does not exist refuses the reload at load time,
    with the key's file:line:col, and the running graph keeps going."""
    b = start_beamd(make_config(ports, stages(), mode="pull"))
    path = b.config_path
    rx = Receiver(zctx, ports.ep_publish, topics=(b"vd",))
    receivers.append(rx)
    rx.wait_live()
    missing = str(tmp_path / "no-such-mask.h5")
    bad = stages()
    bad[0]["mask"] = missing
    text = write(path, make_config(ports, bad, mode="pull"))
    b.signal(signal.SIGHUP)
    b.wait_log(r"reload refused")
    ln, col = position(text, missing)
    assert re.search(r'%s:%d:%d: error: stage "corr"\.mask: %s: No such file or directory'
                     % (re.escape(path), ln, col, re.escape(missing)), b.stderr()), b.stderr()
    st = b.stats()
    assert st["reload"]["failures"] == 1 and st["reload"]["count"] == 0
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    tx.start(1, (H, W), np.uint16)
    for fid in range(3):
        tx.frame(1, fid, np.ones((H, W), np.uint16))
    wait_sums(rx, 1, range(3))
    tx.close()
