"""beamd-sim -> beamd-sub over loopback, no daemon.

Checks the two tools against each other and against values computed here:
the counter pattern makes every pixel predictable, so arrival, order,
decoding (raw, lz4, bitshuffle+lz4), pacing, malformed-message counting and
the .npy / HDF5 output can be checked exactly. The simulator's output is
also decoded by the Python twin of proto/ (tools/python/beamd/proto.py), and
beamd-sub is fed RESULT messages and garbage built with it. Binaries come
from $BEAMD_BUILD (default build/). Every test is bounded in time.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "python"))
from beamd import proto  # noqa: E402  (the Python twin of proto/, an independent decoder)

BUILD = os.environ.get("BEAMD_BUILD", "build")
SIM = os.path.join(BUILD, "beamd-sim")
SUB = os.path.join(BUILD, "beamd-sub")
NP_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
             "float32": np.float32}


@pytest.fixture(autouse=True)
def _binaries():
    for b in (SIM, SUB):
        if not os.access(b, os.X_OK):
            pytest.fail(f"{b} not built (make BUILD={BUILD} {b})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counter_frame(frame_id, shape, dtype):
    n = shape[0] * shape[1]
    v = (frame_id + np.arange(n, dtype=np.int64)) % 65536
    return v.astype(NP_DTYPES[dtype]).reshape(shape)


def run_pair(sim_args, sub_args, sock="pub", sub_timeout=15.0):
    """Starts beamd-sub, then beamd-sim; returns (sim stats, sub lines, sub rc)."""
    port = free_port()
    ep = f"tcp://127.0.0.1:{port}"
    sub_sock = "sub" if sock == "pub" else "pull"
    sub = subprocess.Popen([SUB, "--connect", ep, "--socket", sub_sock,
                            "--timeout", str(sub_timeout)] + sub_args,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sim = subprocess.run([SIM, "--bind", ep, "--socket", sock, "--quiet", "--stats-json",
                              "--wait-subscribers", "1.0"] + sim_args,
                             capture_output=True, text=True, timeout=20)
        out, err = sub.communicate(timeout=sub_timeout + 5)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sim.returncode == 0, sim.stderr
    stats = json.loads(sim.stdout.strip().splitlines()[-1])
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    return stats, lines, sub.returncode, err


def by_type(lines, t):
    return [l for l in lines if l["type"] == t]


CASES = [("pub", "uint16", "raw"), ("pub", "uint8", "lz4"), ("push", "uint32", "bslz4"),
         ("push", "float32", "lz4"), ("pub", "float32", "bslz4"), ("push", "uint8", "raw"),
         ("pub", "uint16", "bslz4")]


@pytest.mark.parametrize("sock,dtype,codec", CASES)
def test_counter_frames_exact(sock, dtype, codec):
    shape = (16, 20)  # 320 pixels: uint8 values wrap at 256
    nframes, nseries = 15, 2
    stats, lines, rc, err = run_pair(
        ["--shape", "16x20", "--dtype", dtype, "--codec", codec, "--pattern", "counter",
         "--frames", str(nframes), "--series", str(nseries), "--series-id", "7",
         "--meta", "energy=12.4", "--meta", "sample=lysozyme"],
        ["--json", "--all-types", "--stats", "--ends", str(nseries), "--hwm", "0"], sock)
    assert rc == 0, err
    assert stats["frames_sent"] == nframes * nseries and stats["series"] == nseries
    summary = lines[-1]
    assert summary["type"] == "SUMMARY"
    assert summary["gaps"] == 0 and summary["malformed"] == 0 and summary["orphans"] == 0
    msgs = lines[:-1]
    # One sequence per socket: every message numbered, none missing.
    assert [m["seq"] for m in msgs] == list(range(len(msgs)))
    starts = by_type(msgs, "SERIES_START")
    assert [s["series"] for s in starts] == [7, 8]
    meta = starts[0]["meta"]
    assert meta["detector"] == "beamd-sim" and meta["pattern"] == "counter"
    assert meta["nframes"] == nframes and meta["energy"] == 12.4
    assert meta["sample"] == "lysozyme" and meta["frame_time"] > 0
    assert starts[0]["shape"] == list(shape) and starts[0]["dtype"] == dtype
    ends = by_type(msgs, "SERIES_END")
    assert [e["series"] for e in ends] == [7, 8]
    frames = by_type(msgs, "FRAME")
    got = [(f["series"], f["frame"]) for f in frames]
    assert got == [(s, i) for s in (7, 8) for i in range(nframes)]
    for f in frames:
        exp = counter_frame(f["frame"], shape, dtype)
        assert f["codec"] == codec and f["dtype"] == dtype and f["shape"] == list(shape)
        assert f["flags"] == 0 and f["t_acq_ns"] > 0
        vals = np.array(f["values"], dtype=NP_DTYPES[dtype]).reshape(shape)
        np.testing.assert_array_equal(vals, exp)
        assert f["sum"] == exp.astype(np.float64).sum()
        assert f["min"] == exp.min() and f["max"] == exp.max()


def test_large_frames_summarised():
    # 100x70 = 7000 elements > 4096: no values, but sum/min/max stay exact.
    stats, lines, rc, err = run_pair(
        ["--shape", "100x70", "--dtype", "uint16", "--codec", "lz4", "--pattern", "counter",
         "--frames", "5"],
        ["--json", "--all-types", "--ends", "1"], "push")
    assert rc == 0, err
    frames = by_type(lines, "FRAME")
    assert len(frames) == 5
    for f in frames:
        exp = counter_frame(f["frame"], (100, 70), "uint16")
        assert "values" not in f and f["nelems"] == 7000
        assert f["sum"] == int(exp.astype(np.int64).sum())
        assert f["min"] == exp.min() and f["max"] == exp.max()


def test_rate_pacing_200hz():
    n = 400  # 2 s at 200 Hz
    t0 = time.monotonic()
    stats, lines, rc, err = run_pair(
        ["--shape", "4x4", "--rate", "200", "--frames", str(n), "--pattern", "flat"],
        ["--json", "--all-types", "--ends", "1", "--hwm", "0"], "push")
    assert rc == 0, err
    assert 180 <= stats["rate"] <= 220, stats
    frames = by_type(lines, "FRAME")
    assert len(frames) == n
    # Independent of the sender's own report: acquisition stamps in the headers.
    span = (frames[-1]["t_acq_ns"] - frames[0]["t_acq_ns"]) / 1e9
    assert 180 <= (n - 1) / span <= 220, span
    assert time.monotonic() - t0 < 15
    # Flat pattern: every pixel equals --mean (2.0 rounded for integers).
    assert all(f["values"] == [2] * 16 for f in frames)


@pytest.mark.parametrize("sock", ["pub", "push"])
def test_malformed_counted_without_gaps(sock):
    n, bad = 60, 12  # kinds cycle over 6: 2 of the 12 are orphan frames
    stats, lines, rc, err = run_pair(
        ["--shape", "8x8", "--pattern", "counter", "--frames", str(n), "--malformed", str(bad)],
        ["--json", "--all-types", "--stats", "--ends", "1", "--hwm", "0"], sock)
    assert rc == 0, err
    assert stats["malformed_sent"] == bad and stats["frames_sent"] == n
    summary = lines[-1]
    assert summary["malformed"] == 10 and summary["orphans"] == 2
    # Rejected messages do not consume sequence numbers; orphan frames are
    # well-formed and numbered like any other message.
    assert summary["gaps"] == 0 and summary["seq_resets"] == 0
    assert len(by_type(lines, "MALFORMED")) == 10
    frames = [f for f in by_type(lines, "FRAME") if not f.get("orphan")]
    assert [f["frame"] for f in frames] == list(range(n))
    assert summary["reported"] == n
    valid = [l for l in lines[:-1] if l["type"] != "MALFORMED"]
    assert [m["seq"] for m in valid] == list(range(n + 2 + 2))
    whys = {l["why"] for l in by_type(lines, "MALFORMED")}
    assert len(whys) == 5, whys  # five distinct rejection reasons


def test_save_npy_and_h5(tmp_path):
    save = tmp_path / "npy"
    h5 = tmp_path / "out.h5"
    stats, lines, rc, err = run_pair(
        ["--shape", "6x5", "--dtype", "float32", "--codec", "bslz4", "--pattern", "counter",
         "--frames", "4", "--series", "2"],
        ["--all-types", "--ends", "2", "--save", str(save), "--save-h5", str(h5)], "push")
    assert rc == 0, err
    files = sorted(os.listdir(save / "frame"))
    assert files == sorted(f"{s}_{i}.npy" for s in (1, 2) for i in range(4))
    for s in (1, 2):
        for i in range(4):
            a = np.load(save / "frame" / f"{s}_{i}.npy")
            assert a.dtype == np.float32 and a.shape == (6, 5)
            np.testing.assert_array_equal(a, counter_frame(i, (6, 5), "float32"))
    with h5py.File(h5, "r") as f:
        d = f["frame"]
        ids = f["frame:ids"][()]
        assert d.shape == (8, 6, 5) and d.dtype == np.float32
        assert d.chunks == (1, 6, 5) and d.maxshape[0] is None
        assert ids.tolist() == [[s, i] for s in (1, 2) for i in range(4)]
        for row, (s, i) in enumerate(ids):
            np.testing.assert_array_equal(d[row], counter_frame(int(i), (6, 5), "float32"))


def test_poisson_and_stem_patterns(tmp_path):
    stats, lines, rc, err = run_pair(
        ["--shape", "32x32", "--pattern", "stem", "--frames", "16", "--mean", "1.0"],
        ["--json", "--all-types", "--ends", "1", "--save", str(tmp_path)], "push")
    assert rc == 0, err
    start = by_type(lines, "SERIES_START")[0]
    assert start["meta"]["scan_shape"] == [4, 4]
    frames = by_type(lines, "FRAME")
    assert len(frames) == 16
    inner, outer, peaks, xs = [], [], [], set()
    for f in frames:
        a = np.load(tmp_path / "frame" / f"1_{f['frame']}.npy")
        np.testing.assert_array_equal(a.ravel(), np.array(f["values"], dtype=np.uint16))
        assert f["flags"] & 4  # BEAM_FLAG_POS: scan position in the header
        xs.add(f["pos"][0])
        inner.append(a[14:18, 14:18].mean())
        outer.append(np.concatenate([a[:4].ravel(), a[-4:].ravel()]).mean())
        peaks.append(a[14:18, 14:18].mean())
    assert min(inner) > 5 * max(outer)  # bright disk over a dim background
    assert max(peaks) - min(peaks) > 5  # disk intensity varies with position
    assert len(xs) == 4
    assert 0.3 < np.mean(outer) < 2.0  # Poisson background of mean 1

    stats, lines, rc, err = run_pair(
        ["--shape", "64x64", "--pattern", "poisson", "--mean", "3", "--frames", "20"],
        ["--json", "--all-types", "--ends", "1"], "push")
    assert rc == 0, err
    frames = by_type(lines, "FRAME")
    means = [f["mean"] for f in frames]
    assert abs(np.mean(means) - 3.0) < 0.1
    assert len({f["sum"] for f in frames}) > 10  # frames differ from each other


def test_bad_options_and_bind_failure():
    def rc_of(cmd):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    for args in (["--shape", "0x5"], ["--shape", "12"], ["--dtype", "int7"],
                 ["--codec", "zstd"], ["--rate", "-1"], ["--frames", "x"],
                 ["--socket", "req"], ["--bogus"], ["--frames", "0", "--series", "2"],
                 ["--meta", "novalue"], ["--bind", "tcp://a:1", "--connect", "tcp://b:1"]):
        r = rc_of([SIM] + args)
        assert r.returncode == 2, (args, r.stderr)
        assert "beamd-sim:" in r.stderr
    for args in (["--socket", "rep"], ["--count", "0"], ["--timeout", "abc"],
                 ["--print", "--json"], ["--nope"]):
        r = rc_of([SUB] + args)
        assert r.returncode == 2, (args, r.stderr)
    r = rc_of([SIM, "--bind", "tcp://256.1.1.1:5", "--quiet"])
    assert r.returncode == 1 and "tcp://256.1.1.1:5" in r.stderr
    assert rc_of([SIM, "--help"]).returncode == 0
    assert rc_of([SUB, "--help"]).returncode == 0


def test_sub_timeout_exit_codes():
    ep = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    r = subprocess.run([SUB, "--connect", ep, "--count", "3", "--timeout", "0.5", "--stats"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 3
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["timed_out"] is True and summary["messages"] == 0
    r = subprocess.run([SUB, "--connect", ep, "--timeout", "0.5"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0
    assert time.monotonic() - t0 < 5


def test_sim_output_decoded_by_python_twin():
    """beamd-sim checked by the independent Python decoder, not by beamd-sub."""
    port = free_port()
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(f"tcp://127.0.0.1:{port}")
    try:
        sim = subprocess.Popen([SIM, "--bind", f"tcp://127.0.0.1:{port}", "--socket", "push",
                                "--shape", "9x7", "--dtype", "uint16", "--codec", "bslz4",
                                "--pattern", "counter", "--frames", "30", "--malformed", "6",
                                "--quiet"], stderr=subprocess.PIPE, text=True)
        msgs, rejected = [], []
        pull.setsockopt(zmq.RCVTIMEO, 10000)
        while not msgs or msgs[-1][1].type != proto.SERIES_END:
            parts = pull.recv_multipart()
            try:
                msgs.append(proto.decode_message(parts))
            except proto.ProtocolError as e:
                rejected.append(str(e))
        assert sim.wait(timeout=15) == 0, sim.stderr.read()
    finally:
        pull.close(0)
        ctx.term()
    assert len(rejected) == 5 and len(set(rejected)) == 5
    assert [h.seq for _, h, _, _ in msgs] == list(range(len(msgs)))
    start = msgs[0]
    assert start[1].type == proto.SERIES_START and start[3]["detector"] == "beamd-sim"
    frames = [(h, a) for _, h, a, _ in msgs if h.type == proto.FRAME and h.series_id == 1]
    assert [h.frame_id for h, _ in frames] == list(range(30))
    for h, a in frames:
        assert proto.CODECS[h.codec] == "bslz4"
        np.testing.assert_array_equal(a, counter_frame(h.frame_id, (9, 7), "uint16"))


def send_results(sock, msgs):
    for m in msgs:
        sock.send_multipart(m)


def result_messages():
    g2 = np.arange(640, dtype=np.float32).reshape(10, 64) / 7
    scores = np.array([1 + 2j, -3.5 + 0.25j, 0], dtype=np.complex64)
    desc = {"stage": "g2", "output": "g2", "dtype": "float32", "shape": [10, 64],
            "units": "", "axes": ["roi", "tau"]}
    stats = json.dumps({"frames": 5, "gaps": 0}).encode()
    seq = iter(range(100))
    msgs = [
        proto.encode_message("SERIES_START", topic="beamd.series", series_id=3,
                             shape=(8, 8), dtype="uint16", seq=next(seq),
                             meta={"detector": "x", "frame_time": 0.01, "nframes": 2}),
        proto.encode_message("RESULT", g2, topic="g2.g2", series_id=3, frame_id=0,
                             seq=next(seq), meta=desc, split=3, flags=proto.FLAG_PARTIAL),
        [b"g2.g2", b"\x89BMD-not-a-header"],
        proto.encode_message("RESULT", scores, topic="pca.scores", series_id=3, frame_id=0,
                             seq=next(seq), codec="lz4"),
        proto.encode_message("RESULT", g2 * 2, topic="g2.g2", series_id=3, frame_id=1,
                             seq=next(seq), codec="bslz4", flags=proto.FLAG_FINAL),
        proto.encode_message("RESULT", np.frombuffer(stats, np.uint8), topic="beamd.stats",
                             seq=next(seq)),
        proto.encode_message("SERIES_END", topic="beamd.series", series_id=3, seq=next(seq)),
    ]
    return msgs, g2, scores


def test_sub_results_save_and_h5(tmp_path):
    msgs, g2, scores = result_messages()
    port = free_port()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDTIMEO, 10000)
    push.bind(f"tcp://127.0.0.1:{port}")
    h5 = tmp_path / "r.h5"
    try:
        sub = subprocess.Popen([SUB, "--connect", f"tcp://127.0.0.1:{port}", "--socket", "pull",
                                "--json", "--stats", "--count", "4", "--timeout", "10",
                                "--save", str(tmp_path), "--save-h5", str(h5)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        send_results(push, msgs[:-1])  # stop before SERIES_END: --count 4 ends the run
        out, err = sub.communicate(timeout=15)
    finally:
        push.close(0)
        ctx.term()
    assert sub.returncode == 0, err
    lines = [json.loads(l) for l in out.splitlines()]
    res = by_type(lines, "RESULT")
    assert [r["topic"] for r in res] == ["g2.g2", "pca.scores", "g2.g2", "beamd.stats"]
    assert res[0]["meta"]["axes"] == ["roi", "tau"] and res[0]["shape"] == [10, 64]
    np.testing.assert_array_equal(np.array(res[0]["values"], np.float32).reshape(10, 64), g2)
    assert res[1]["values"] == [[1.0, 2.0], [-3.5, 0.25], [0.0, 0.0]]
    assert res[3]["doc"] == {"frames": 5, "gaps": 0} and "values" not in res[3]
    assert by_type(lines, "SERIES_START")[0]["topic"] == "beamd.series"
    summary = lines[-1]
    assert summary["malformed"] == 1 and summary["gaps"] == 0
    assert summary["by_topic"] == {"beamd.series": 1, "g2.g2": 2, "pca.scores": 1,
                                   "beamd.stats": 1}
    np.testing.assert_array_equal(np.load(tmp_path / "g2.g2" / "3_0.npy"), g2)
    np.testing.assert_array_equal(np.load(tmp_path / "g2.g2" / "3_1.npy"), g2 * 2)
    c = np.load(tmp_path / "pca.scores" / "3_0.npy")
    assert c.dtype == np.complex64
    np.testing.assert_array_equal(c, scores)
    assert not (tmp_path / "beamd.stats").exists()
    with h5py.File(h5, "r") as f:
        np.testing.assert_array_equal(f["g2.g2"][()], np.stack([g2, g2 * 2]))
        assert json.loads(f["g2.g2"].attrs["descriptor"])["stage"] == "g2"
        assert f["g2.g2:ids"][()].tolist() == [[3, 0], [3, 1]]
        np.testing.assert_array_equal(f["pca.scores"][0], scores)


def test_sub_topic_filter_pub():
    msgs, g2, _ = result_messages()
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    try:
        sub = subprocess.Popen([SUB, "--connect", f"tcp://127.0.0.1:{port}", "--topic", "g2.",
                                "--print", "--stats", "--count", "2", "--timeout", "10"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # let the subscription reach the PUB
        send_results(pub, msgs)
        out, err = sub.communicate(timeout=15)
    finally:
        pub.close(0)
        ctx.term()
    assert sub.returncode == 0, err
    lines = out.splitlines()
    summary = json.loads(lines[-1])
    assert summary["by_topic"] == {"g2.g2": 2} and summary["gaps"] is None
    printed = [l for l in lines[:-1] if l.startswith("RESULT")]
    assert len(printed) == 2 and all(" g2.g2 " in l for l in printed)
    assert "float32[10x64] raw" in printed[0] and "min=0 " in printed[0]


def test_sub_survives_garbage():
    rng = np.random.default_rng(5)
    good = proto.encode_message("RESULT", np.arange(100, dtype=np.uint16), topic="a.b",
                                codec="bslz4")
    bad_total = list(good)
    bad_total[2] = b"\x00" * 7 + b"\x07" + bad_total[2][8:]  # framing total != raw_size
    bad_block = list(good)
    bad_block[2] = bad_block[2][:12] + b"\x7f\xff\xff\xff" + bad_block[2][16:]  # block too long
    junk = [[bytes(rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8))
             for _ in range(int(rng.integers(1, 4)))] for _ in range(40)]
    junk += [[b"\x89"], [b"a.b", good[1][:127]], bad_total, bad_block, [b"a.b"] * 25,
             good[:2] + [good[2] + b"x"]]
    port = free_port()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDTIMEO, 10000)
    push.bind(f"tcp://127.0.0.1:{port}")
    try:
        sub = subprocess.Popen([SUB, "--connect", f"tcp://127.0.0.1:{port}", "--socket", "pull",
                                "--print", "--stats", "--count", "1", "--timeout", "10"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        send_results(push, junk + [good])
        out, err = sub.communicate(timeout=15)
    finally:
        push.close(0)
        ctx.term()
    assert sub.returncode == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["malformed"] == len(junk) and summary["by_type"] == {"RESULT": 1}
    assert out.count("MALFORMED") == len(junk)


# ---- every tool: --version, --help, man page ----------------------------------
# The long options a tool accepts are read from its getopt tables here, not
# from the tool, so an option added without a line in --help or the man page
# fails. Option macros (TOOL_CURVE_LONGOPTS) expand to the options their
# definition in tools/common lists.

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = sorted(d for d in os.listdir(os.path.join(REPO, "tools"))
               if os.path.isfile(os.path.join(REPO, "tools", d, "main.c")))
LONGOPT = re.compile(r'\{\s*"([a-z0-9-]+)",\s*(?:no|required|optional)_argument')
# Tools written in Python (argparse), installed from $(BUILD) like the others.
SCRIPTS = ["beamd-pca-rebuild"]
ARGPARSE_OPT = re.compile(r'add_argument\((?:"-\w",\s*)?"--([a-z0-9-]+)"')


def _read(*parts):
    with open(os.path.join(REPO, *parts)) as f:
        return f.read()


def _option_macros():
    macros = {}
    for h in os.listdir(os.path.join(REPO, "tools", "common")):
        if h.endswith(".h"):
            for m in re.finditer(r"#define (\w+)((?:.*\\\n)*.*)", _read("tools", "common", h)):
                names = LONGOPT.findall(m.group(2))
                if names:
                    macros[m.group(1)] = names
    return macros


def long_options(src):
    names = set(LONGOPT.findall(src))
    for macro, opts in _option_macros().items():
        if re.search(r"\b%s\b" % macro, src):
            names.update(opts)
    return names


def tool_options(tool):
    if tool in SCRIPTS:  # argparse adds --help itself
        return set(ARGPARSE_OPT.findall(_read("tools", tool))) | {"help"}
    d = os.path.join("tools", tool)
    src = "".join(_read(d, f) for f in sorted(os.listdir(os.path.join(REPO, d))) if f.endswith(".c"))
    return long_options(src)


def test_tool_list_is_complete():
    # Guards the parametrisation below against a tool moved or renamed.
    assert {"beamd-ctl", "beamd-fit", "beamd-keygen", "beamd-ptycho", "beamd-record",
            "beamd-replay", "beamd-sim", "beamd-sub", "beamd-view"} <= set(TOOLS)
    for t in TOOLS + SCRIPTS:
        assert {"help", "version"} <= tool_options(t), t


@pytest.mark.parametrize("tool", TOOLS + SCRIPTS)
def test_tool_version_and_help(tool):
    exe = os.path.join(BUILD, tool)
    v = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
    assert v.returncode == 0, v.stderr
    beamd_v = subprocess.run([os.path.join(BUILD, "beamd"), "--version"], capture_output=True,
                             text=True, timeout=20)
    version = re.match(r"beamd (\S+)", beamd_v.stdout).group(1)
    assert v.stdout == "%s %s\n" % (tool, version), v.stdout

    h = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=20)
    assert h.returncode == 0, h.stderr
    assert tool in h.stdout and h.stderr == ""
    missing = [o for o in sorted(tool_options(tool))
               if not re.search(r"--%s\b(?!-)" % re.escape(o), h.stdout)]
    assert not missing, "%s --help lacks %s" % (tool, missing)

    # Unknown options still fail as a bad command line.
    bad = subprocess.run([exe, "--no-such-option"], capture_output=True, text=True, timeout=20)
    assert bad.returncode == 2, (bad.returncode, bad.stderr)


def test_script_version_from_source_tree():
    """Run from the source tree (VERSION = None), a Python tool reads
    daemon/version.h, so the version is bumped in one place only."""
    want = re.search(r'#define BEAMD_VERSION "([^"]+)"', _read("daemon", "version.h")).group(1)
    for tool in SCRIPTS:
        assert re.search(r"(?m)^VERSION = None$", _read("tools", tool)), tool
        v = subprocess.run([os.path.join(REPO, "tools", tool), "--version"], capture_output=True,
                           text=True, timeout=20)
        assert v.returncode == 0 and v.stdout == "%s %s\n" % (tool, want), (v.stdout, v.stderr)


@pytest.mark.parametrize("prog", ["beamd"] + TOOLS + SCRIPTS)
def test_man_page_lists_every_option(prog):
    page = _read("man", "man1", prog + ".1")
    assert page.startswith(".\\\"") or page.startswith(".TH"), prog
    assert re.search(r"^\.TH %s 1 " % re.escape(prog.upper().replace("-", "\\-")), page, re.M)
    for sec in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "SEE ALSO"):
        assert re.search(r"^\.SH %s$" % sec, page, re.M), (prog, sec)
    src = _read("daemon", "main.c") if prog == "beamd" else None
    opts = long_options(src) if src else tool_options(prog)
    missing = [o for o in sorted(opts)
               if not re.search(r"\\-\\-%s(?!\\-)\b" % re.escape(o.replace("-", "\\-")), page)]
    assert not missing, "man/man1/%s.1 lacks %s" % (prog, missing)


# ---- beamd --list-stages / --describe-stage ------------------------------------
# The expected keys come from the C schema tables (pipeline/kern/*.c and
# daemon/stage_record.c), nested maps as map.key and lists of maps as
# list[].key, so the listing is checked against the source, not itself.

def _param_tables():
    tables = {}
    srcs = [os.path.join("pipeline", "kern", f) for f in os.listdir(os.path.join(REPO, "pipeline", "kern"))
            if f.endswith(".c")] + [os.path.join("daemon", "stage_record.c")]
    for s in srcs:
        for m in re.finditer(r"beam_param_t (\w+)\[\] = \{(.*?)\};", _read(s), re.S):
            tables[m.group(1)] = m.group(2)
    common = re.search(r"#define BEAM_STAGE_COMMON_PARAMS((?:.*\\\n)*.*)", _read("pipeline", "stage.h"))
    tables["BEAM_STAGE_COMMON_PARAMS"] = common.group(1)
    return tables


def _keys(tables, body, prefix=""):
    out = []
    if "BEAM_STAGE_COMMON_PARAMS" in body:
        out += _keys(tables, tables["BEAM_STAGE_COMMON_PARAMS"])
    entries = list(re.finditer(r'\{"(\w+)",\s*BEAM_P_(\w+)', body))
    for i, e in enumerate(entries):
        key = prefix + e.group(1)
        out.append(key)
        if e.group(2) in ("MAP", "MAP_LIST"):
            text = body[e.end():entries[i + 1].start() if i + 1 < len(entries) else len(body)]
            sub = [w for w in re.findall(r"\b(\w+)\b", text) if w in tables]
            assert sub, key
            out += _keys(tables, tables[sub[0]], key + ("[]." if e.group(2) == "MAP_LIST" else "."))
    return out


def expected_kinds():
    """{kind: [keys in table order]} for every kind beamd registers."""
    tables = _param_tables()
    kinds = {}
    for s in (_read("pipeline", "registry.c"), _read("daemon", "stage_record.c")):
        for m in re.finditer(r'beam_stage_kind_t \w+ = \{\s*"(\w+)",.*?\b(\w+_params)\b', s, re.S):
            kinds[m.group(1)] = _keys(tables, tables[m.group(2)])
    return kinds


def printed_keys(text):
    return re.findall(r"^ +(\S+) \((?:[a-z ]+)[,)]", text, re.M)


def beamd_run(*args):
    return subprocess.run([os.path.join(BUILD, "beamd")] + list(args), capture_output=True,
                          text=True, timeout=20)


def test_list_stages_every_kind_and_key():
    kinds = expected_kinds()
    assert {"roi_sum", "correct", "record"} <= set(kinds), kinds.keys()
    r = beamd_run("--list-stages")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    blocks = re.split(r"\n\n", r.stdout.strip())
    common = printed_keys(blocks[0])
    assert common == ["name", "kind", "input", "backend", "publish", "queue", "thread"], common
    listed = {}
    for b in blocks[1:]:
        m = re.match(r"([a-z0-9_]+): \S", b)
        assert m, b[:200]
        assert re.search(r"^  backends: cpu", b, re.M), b[:200]
        listed[m.group(1)] = common + printed_keys(b)
    assert listed == kinds


def test_describe_stage_roi_sum():
    r = beamd_run("--describe-stage", "roi_sum")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("roi_sum: per frame, the sum of the pixels")
    assert printed_keys(r.stdout) == expected_kinds()["roi_sum"]
    # Type, default, range, enum values and doc of one key each.
    assert "  queue (int, default 32, range 1..65536): input queue depth" in r.stdout
    assert "  image_every (int, default 256, range 1..1000000000): publish the scan image" in r.stdout
    assert "    rois[].shape (enum, required, one of disk|annulus|rect): ROI geometry" in r.stdout
    assert "    masks.file (file, required): " in r.stdout


def test_describe_stage_record_is_registered():
    r = beamd_run("--describe-stage", "record")
    assert r.returncode == 0, r.stderr
    assert printed_keys(r.stdout) == expected_kinds()["record"]
    assert "  backends: cpu\n" in r.stdout


def test_describe_stage_unknown_kind():
    r = beamd_run("--describe-stage", "nope")
    assert r.returncode == 1 and r.stdout == ""
    assert 'unknown stage kind "nope"' in r.stderr
    for k in expected_kinds():
        assert re.search(r"\b%s\b" % k, r.stderr), (k, r.stderr)


# ---- beamd-ctl endpoints --------------------------------------------------------
# A bare HOST:PORT is tcp://HOST:PORT; a malformed endpoint is refused before
# any socket is made, saying what was expected, with the daemon's own reason.

CTL = os.path.join(BUILD, "beamd-ctl")


def _ctl(*args, env=None):
    return subprocess.run([CTL] + list(args), capture_output=True, text=True, timeout=20,
                          env=env)


@pytest.mark.parametrize("ep", ["tcp://127.0.0.1:%d", "127.0.0.1:%d", "localhost:%d"])
def test_ctl_bare_host_port_is_tcp(ep):
    port = free_port()
    ctx = zmq.Context.instance()
    rep = ctx.socket(zmq.REP)
    rep.setsockopt(zmq.LINGER, 0)
    rep.bind("tcp://127.0.0.1:%d" % port)
    try:
        p = subprocess.Popen([CTL, "-e", ep % port, "-t", "10", "ping"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        assert rep.poll(10000), "beamd-ctl never sent its command"
        assert rep.recv() == b"ping"
        rep.send(b'{"ok": true, "pong": 1}')
        out, err = p.communicate(timeout=10)
    finally:
        rep.close()
    assert p.returncode == 0, err
    assert json.loads(out) == {"ok": True, "pong": 1}


@pytest.mark.parametrize("ep,why", [
    ("foo", 'missing ":port" after the host'),
    ("tcp://foo", 'missing ":port" after the host'),
    ("127.0.0.1:0", "the port must be 1..65535"),
    ("127.0.0.1:http", "the port must be 1..65535"),
    ("udp://127.0.0.1:5601", "unsupported transport"),
    ("ipc://", "ipc:// needs a path"),
    ("inproc://ctl", "inproc:// only reaches the same process"),
    ("", "empty"),
    ("tcp://127.0.0.1:5601 ", "contains whitespace"),
])
def test_ctl_bad_endpoint_says_what_it_expected(ep, why):
    r = _ctl("-e", ep, "-t", "0.2", "ping")
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    assert r.stderr.startswith('beamd-ctl: bad endpoint "%s": expected tcp://HOST:PORT, '
                               'HOST:PORT or ipc://PATH (' % ep), r.stderr
    assert why in r.stderr, r.stderr
    # $BEAMD_CONTROL goes through the same check.
    e = _ctl("-t", "0.2", "ping", env=dict(os.environ, BEAMD_CONTROL=ep))
    assert e.returncode == 2 and ('bad endpoint "%s"' % ep) in e.stderr, e.stderr
