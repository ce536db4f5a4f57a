"""Start-up failures: each gives a clear message on stderr, exit code 1,
within a few seconds, and leaves nothing running (its ports are free
again). Also --check-config on the reference config."""

import os
import re
import socket
import subprocess
import time

import pytest

from conftest import REPO, binary, make_config, port_busy, to_yaml

STAGES = [{"name": "corr", "kind": "correct", "backend": "cpu"},
          {"name": "vd", "kind": "roi_sum", "input": "corr", "backend": "cpu",
           "rois": [{"name": "bf", "shape": "disk", "radius": 4}]}]


def expect_exit1(b, ports, timeout=5.0):
    t0 = time.monotonic()
    rc = b.wait(timeout)
    assert rc == 1, "exit code %s, stderr:\n%s" % (rc, b.stderr())
    assert time.monotonic() - t0 < timeout
    # Nothing left behind: the ports it bound before failing are free.
    time.sleep(0.05)
    assert not port_busy(ports.control), "control port still bound"
    return b.stderr()


@pytest.mark.parametrize("which", ["publish", "control", "metrics"])
def test_port_in_use(ports, start_beamd, which):
    port = {"publish": ports.publish, "control": ports.control, "metrics": ports.metrics}[which]
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", port))
    blocker.listen(1)
    try:
        b = start_beamd(make_config(ports, STAGES), ready=False)
        t0 = time.monotonic()
        rc = b.wait(5)
        err = b.stderr()
        assert rc == 1, "exit code %s, stderr:\n%s" % (rc, err)
        assert time.monotonic() - t0 < 5
        assert "127.0.0.1:%d" % port in err, "the message must name the endpoint"
        assert re.search(r"in use", err, re.I), err
    finally:
        blocker.close()
    if which != "control":
        assert not port_busy(ports.control)


def test_missing_dark_file(tmp_path, ports, start_beamd):
    missing = str(tmp_path / "no-such-dark.npy")
    stages = [dict(STAGES[0], dark=missing), STAGES[1]]
    b = start_beamd(make_config(ports, stages), ready=False)
    err = expect_exit1(b, ports)
    assert missing in err, "the message must name the missing file"


def test_missing_mask_file_in_roi_sum(tmp_path, ports, start_beamd):
    missing = str(tmp_path / "no-such-masks.h5")
    stages = [STAGES[0], {"name": "vd", "kind": "roi_sum", "input": "corr", "backend": "cpu",
                          "masks": {"file": missing}}]
    b = start_beamd(make_config(ports, stages), ready=False)
    err = expect_exit1(b, ports)
    assert missing in err


def test_backend_cuda_without_gpu(ports, start_beamd):
    v = subprocess.run([binary("beamd"), "-V"], capture_output=True, text=True, timeout=10)
    if "gpu: none" not in v.stdout:
        pytest.skip("a GPU is usable here (%s)" % v.stdout.strip())
    stages = [dict(STAGES[0], backend="cuda"), STAGES[1]]
    b = start_beamd(make_config(ports, stages), ready=False)
    err = expect_exit1(b, ports)
    assert re.search(r'stage "corr".*backend cuda.*no GPU', err), err


def test_bad_config_file_line_col(tmp_path, ports, start_beamd):
    cfg = make_config(ports, STAGES)
    cfg["pool"]["framez"] = 3
    cfg["log"]["level"] = "loud"
    path = tmp_path / "bad.yaml"
    text = to_yaml(cfg) + "\n"
    path.write_text(text)
    b = start_beamd(str(path), ready=False)
    err = expect_exit1(b, ports)
    lines = text.split("\n")
    for needle in ("framez", "loud"):
        ln = next(i for i, l in enumerate(lines) if needle in l) + 1
        col = lines[ln - 1].index(needle) + 1
        assert re.search(r"^%s:%d:%d: error: .*%s" % (re.escape(str(path)), ln, col, needle),
                         err, re.M), "no %s:%d:%d error for %s" % (path, ln, col, needle)
    assert "not starting" in err


def test_check_config():
    ref = os.path.join(REPO, "etc", "beamd.yaml")
    r = subprocess.run([binary("beamd"), "--check-config", ref], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stderr


def test_check_config_rejects(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("input:\n  mode: sideways\n")
    r = subprocess.run([binary("beamd"), "--check-config", str(p)], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 1
    assert re.search(r"^%s:2:9: error: .*sideways" % re.escape(str(p)), r.stderr, re.M), r.stderr


def test_check_config_missing_input_file(tmp_path):
    """--check-config (the unit's ExecStartPre) checks that every file a
    stage reads exists: exit 1, each at its value's file:line:col."""
    missing = str(tmp_path / "no-such-mask.h5")
    p = tmp_path / "cfg.yaml"
    p.write_text("stages:\n  - name: corr\n    kind: correct\n    mask: %s\n"
                 "    flat: series\n  - name: vd\n    kind: roi_sum\n    input: corr\n"
                 "    masks: {file: %s/labels.h5}\n" % (missing, tmp_path))
    r = subprocess.run([binary("beamd"), "--check-config", str(p)], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 1, r.stderr
    assert re.search(r'^%s:4:11: error: stage "corr"\.mask: %s: No such file or directory$'
                     % (re.escape(str(p)), re.escape(missing)), r.stderr, re.M), r.stderr
    assert re.search(r'^%s:9:19: error: stage "vd"\.masks\.file: %s/labels\.h5: No such file'
                     % (re.escape(str(p)), re.escape(str(tmp_path))), r.stderr, re.M), r.stderr
    assert "2 errors" in r.stderr
    # Once the files exist (contents are the stage's business), it passes.
    open(missing, "wb").close()
    open(str(tmp_path / "labels.h5"), "wb").close()
    r = subprocess.run([binary("beamd"), "--check-config", str(p)], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0, r.stderr


def test_check_config_quiet_prints_only_errors(tmp_path):
    ref = os.path.join(REPO, "etc", "beamd.yaml")
    r = subprocess.run([binary("beamd"), "--quiet", "--check-config", ref], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    p = tmp_path / "bad.yaml"
    p.write_text("input:\n  mode: sideways\n")
    r = subprocess.run([binary("beamd"), "--check-config", str(p), "-q"], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 1 and r.stdout == "" and "sideways" in r.stderr
