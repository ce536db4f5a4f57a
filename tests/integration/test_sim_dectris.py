"""beamd-sim --protocol dectris1|dectris2 against an independent decoder.

Every stream the simulator sends is PULLed over loopback and decoded with
tests/integration/dectris_ref.py, which was written from the notes
(shared/notes/detector-streams.md), not from tools/beamd-sim/dectris.c.
The counter pattern makes every pixel predictable, so frames are compared
bit-exact with values computed here: pixel i (C order) of frame f is
((f mod 65536) + i) mod 65536, mod 256 for uint8 (docs/tools.md).
Checked: message order and part counts, header keys and their types, the
[x, y] vs (H, W) shapes (64x80 frames, so a transposition shows), md5
hashes, blob framings, the second channel, appendices, the Jungfraujoch
flavour, and that each --fault yields exactly the faulty message described
with the rest of the stream intact. Binaries come from $BEAMD_BUILD
(default build/); ports are picked at run time; every wait has a deadline.
"""
import hashlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time

import bitshuffle
import cbor2
import lz4.block
import numpy as np
import pytest
import zmq

sys.path.insert(0, os.path.dirname(__file__))
import dectris_ref as ref  # noqa: E402
from dectris_ref import DectrisError  # noqa: E402

BUILD = os.environ.get("BEAMD_BUILD", "build")
SIM = os.path.join(BUILD, "beamd-sim")
H, W = 64, 80
NFRAMES = 5
FT = 0.002                 # --frame-time of every run
CT = FT - 1e-7             # count_time: frame time less the 100 ns readout
V1_TPS, V2_TPS = 100_000_000, 50_000_000  # dconfig 10 ns ticks; v2 Rational denominator
ENERGY = 12000.0
CROCKFORD = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
NP = {"uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32}


@pytest.fixture(autouse=True)
def _binary():
    if not os.access(SIM, os.X_OK):
        pytest.fail(f"{SIM} not built (make BUILD={BUILD} {SIM})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counter(f, h=H, w=W, dtype="uint16"):
    mod = 256 if dtype == "uint8" else 65536
    v = (f % 65536 + np.arange(h * w, dtype=np.int64)) % mod
    return v.astype(NP[dtype]).reshape(h, w)


def is_end(m, protocol):
    try:
        if protocol == "dectris1":
            return json.loads(m[0]).get("htype") == "dseries_end-1.0"
        d = cbor2.loads(m[0])
        return isinstance(d, dict) and d.get("type") == "end"
    except Exception:
        return False


def run_sim(protocol, args, nseries=1, timeout=20.0, endpoint=None):
    """Starts beamd-sim bound to a fresh port, PULLs until nseries end
    messages came, and returns (messages as lists of parts, summary dict
    from the JSON line on stderr, stderr)."""
    ep = endpoint or f"tcp://127.0.0.1:{free_port()}"
    cmd = [SIM, "--protocol", protocol, "--pattern", "counter", "--frame-time", str(FT)]
    if endpoint is None:
        cmd += ["--bind", ep]
    p = subprocess.Popen(cmd + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.PULL)
    s.setsockopt(zmq.LINGER, 0)
    msgs, ends = [], 0
    try:
        s.connect(ep)
        deadline = time.monotonic() + timeout
        while ends < nseries:
            assert time.monotonic() < deadline, f"timed out after {len(msgs)} messages"
            if s.poll(100):
                m = s.recv_multipart()
                msgs.append(m)
                ends += is_end(m, protocol)
            elif p.poll() is not None and not s.poll(300):
                break
        # Anything after the last end would be a bug: give it a moment to show.
        while s.poll(100):
            msgs.append(s.recv_multipart())
        out, err = p.communicate(timeout=15)
    finally:
        s.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    lines = [l for l in err.splitlines() if l.startswith('{"protocol"')]
    assert len(lines) == 1, err
    return msgs, json.loads(lines[0]), err


def sim_fails(args):
    r = subprocess.run([SIM, "--pattern", "counter"] + args, capture_output=True, text=True,
                       timeout=10)
    return r.returncode, r.stderr


# ---- stream v1 ------------------------------------------------------------------

V1_CONFIG_REQUIRED = dict(ref.V1_CONFIG_TYPES)
V1_ENCODING = {"raw": "<", "lz4": "lz4<"}


def v1_encoding(enc, dtype):
    return V1_ENCODING.get(enc) or f"bs{8 * np.dtype(dtype).itemsize}-lz4<"


def check_v1_image(r, f, sid, dtype, enc, iapp=None):
    es = np.dtype(dtype).itemsize
    assert r["kind"] == "image" and r["series"] == sid and r["frame"] == f
    assert r["nparts"] == (5 if iapp else 4)
    dd = r["dimage_d"]
    assert dd == {"htype": "dimage_d-1.0", "shape": [W, H], "type": dtype,
                  "encoding": v1_encoding(enc, dtype), "size": len(r["blob"])}
    assert set(r["dimage"]) == {"htype", "series", "frame", "hash"}
    assert r["hash"] == hashlib.md5(r["blob"]).hexdigest()
    assert r["data"].shape == (H, W) and r["data"].dtype == NP[dtype]
    np.testing.assert_array_equal(r["data"], counter(f, dtype=dtype))
    t0 = f * round(FT * V1_TPS)
    ct = round(CT * V1_TPS)
    assert r["dconfig"] == {"htype": "dconfig-1.0", "start_time": t0, "stop_time": t0 + ct,
                            "real_time": ct}
    blob = r["blob"]
    if enc == "raw":
        assert blob == counter(f, dtype=dtype).tobytes()
    elif enc == "lz4":
        # One bare block: no 12-byte framing header in front.
        assert lz4.block.decompress(blob, uncompressed_size=H * W * es) == \
            counter(f, dtype=dtype).tobytes()
    else:
        assert struct.unpack(">QI", blob[:12]) == (H * W * es, 8192)
        mod = ref.decode_bslz4_module(blob, dtype, H * W)
        np.testing.assert_array_equal(mod.reshape(H, W), counter(f, dtype=dtype))
    if iapp:
        assert r["appendix"] == iapp.encode()


def check_v1_header(r, sid, detail, dtype, enc, happ=None, nframes=NFRAMES):
    fixed = {"none": 1, "basic": 2, "all": 8}[detail]
    assert r["kind"] == "start" and r["series"] == sid
    assert r["nparts"] == fixed + (1 if happ else 0)
    assert r["header"] == {"htype": "dheader-1.0", "series": sid, "header_detail": detail}
    assert r["appendix"] == (happ.encode() if happ else None)
    if detail == "none":
        assert r["config"] is None
        return
    c = r["config"]
    assert len(c) >= 45, sorted(c)
    for k, t in V1_CONFIG_REQUIRED.items():
        assert k in c, k
        assert type(c[k]) is t, (k, c[k])  # strict: reals are JSON reals
    es = np.dtype(dtype).itemsize
    assert c["x_pixels_in_detector"] == W and c["y_pixels_in_detector"] == H
    assert c["nimages"] == nframes and c["ntrigger"] == 1 and c["trigger_mode"] == "ints"
    assert c["frame_time"] == FT and c["count_time"] == pytest.approx(CT, abs=1e-15)
    assert c["x_pixel_size"] == 75e-6 and c["y_pixel_size"] == 75e-6
    assert c["photon_energy"] == ENERGY
    assert c["wavelength"] == pytest.approx(12398.419843320026 / ENERGY, rel=1e-15)
    assert c["beam_center_x"] == W / 2 and c["beam_center_y"] == H / 2
    assert c["bit_depth_image"] == 8 * es and c["detector_distance"] > 0
    cutoff = {1: 255, 2: 65535, 4: 0xffffffff}[es]
    assert c["countrate_correction_count_cutoff"] == cutoff - cutoff // 64
    assert not c["countrate_correction_applied"] and not c["pixel_mask_applied"]
    assert c["compression"] == {"raw": "none"}.get(enc, enc)
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$", c["data_collection_date"])
    if detail == "all":
        assert r["arrays"]["flatfield"] == {"htype": "dflatfield-1.0", "shape": [W, H],
                                            "type": "float32"}
        assert r["arrays"]["pixel_mask"] == {"htype": "dpixelmask-1.0", "shape": [W, H],
                                             "type": "uint32"}
        assert r["arrays"]["countrate_table"] == {"htype": "dcountrate_table-1.0",
                                                  "shape": [2, 4000], "type": "float32"}
        check_tables(r["flatfield"], r["pixel_mask"])
        assert c["number_of_excluded_pixels"] == int(np.count_nonzero(r["pixel_mask"]))
        t = r["countrate_table"]
        assert t.shape == (4000, 2)
        m = np.arange(4000) * 1000.0
        np.testing.assert_array_equal(t[:, 0], m.astype(np.float32))
        np.testing.assert_array_equal(t[:, 1], (m / (1.0 - m * 1e-7)).astype(np.float32))
    else:
        assert "flatfield" not in r


def check_tables(ff, mask):
    """docs/tools.md: flatfield 1 + 0.001 (x mod 8) in float32; mask bit 0
    on the middle row (a module gap), bit 1 at (0, 0) (a dead pixel)."""
    assert ff.shape == (H, W) and ff.dtype == np.float32
    x = np.broadcast_to(np.arange(W) % 8, (H, W)).astype(np.float32)
    np.testing.assert_array_equal(ff, np.float32(1) + np.float32(0.001) * x)
    want = np.zeros((H, W), np.uint32)
    want[H // 2, :] |= 1
    want[0, 0] |= 2
    assert mask.shape == (H, W) and mask.dtype == np.uint32
    np.testing.assert_array_equal(mask, want)


@pytest.mark.parametrize("enc", ["raw", "lz4", "bslz4"])
@pytest.mark.parametrize("detail", ["none", "basic", "all"])
def test_v1_stream(detail, enc):
    msgs, summ, _ = run_sim("dectris1", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                         "--header-detail", detail, "--encoding", enc])
    assert len(msgs) == NFRAMES + 2
    st = ref.decode_stream("dectris1", msgs)
    assert st.events == []
    assert [ref.decode_v1(m)["kind"] for m in msgs] == ["start"] + ["image"] * NFRAMES + ["end"]
    check_v1_header(ref.decode_v1(msgs[0]), 1, detail, "uint16", enc)
    for f in range(NFRAMES):
        check_v1_image(ref.decode_v1(msgs[1 + f]), f, 1, "uint16", enc)
    assert ref.decode_v1(msgs[-1]) == {"kind": "end", "series": 1, "nparts": 1,
                                       "footer": {"htype": "dseries_end-1.0", "series": 1}}
    assert summ == {"protocol": "dectris1", "series": 1, "frames_sent": NFRAMES,
                    "messages": NFRAMES + 2, "bytes": sum(len(p) for m in msgs for p in m),
                    "faults": {}}


@pytest.mark.parametrize("dtype,enc", [("uint8", "bslz4"), ("uint32", "bslz4"),
                                       ("uint8", "lz4"), ("uint32", "raw")])
def test_v1_dtypes(dtype, enc):
    msgs, _, _ = run_sim("dectris1", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                      "--dtype", dtype, "--encoding", enc])
    check_v1_header(ref.decode_v1(msgs[0]), 1, "basic", dtype, enc)
    for f in range(NFRAMES):
        check_v1_image(ref.decode_v1(msgs[1 + f]), f, 1, dtype, enc)


@pytest.mark.parametrize("detail", ["none", "basic", "all"])
def test_v1_appendices(detail):
    happ, iapp = '{"acqID": "test_1"}', "image note"
    msgs, _, _ = run_sim("dectris1", ["--shape", f"{H}x{W}", "--frames", "3", "--series", "2",
                                      "--series-id", "6", "--header-detail", detail,
                                      "--header-appendix", happ, "--image-appendix", iapp],
                         nseries=2)
    assert len(msgs) == 2 * (3 + 2)
    for s, sid in enumerate((6, 7)):
        base = s * 5
        h = ref.decode_v1(msgs[base])
        check_v1_header(h, sid, detail, "uint16", "bslz4", happ, nframes=3)
        # The appendix is the last part: part 9 with all, as in the DLS capture.
        assert len(msgs[base]) == {"none": 2, "basic": 3, "all": 9}[detail]
        assert msgs[base][-1] == happ.encode()
        for f in range(3):
            r = ref.decode_v1(msgs[base + 1 + f])
            check_v1_image(r, f, sid, "uint16", "bslz4", iapp)
            assert len(msgs[base + 1 + f]) == 5
        assert ref.decode_v1(msgs[base + 4])["series"] == sid


# ---- stream v2 ------------------------------------------------------------------

V2_ALG = {"raw": "raw", "lz4": "lz4", "bslz4": "bslz4", "bszstd": "bszstd"}
TYPED_TAG = {"uint8": 64, "uint16": 69, "uint32": 70}


def check_v2_start(r, sid, detail, dtype, channels=1, happ="", jfj=False):
    m = r["fields"]
    assert r["kind"] == "start" and next(iter(m)) == "type" and m["type"] == "start"
    for k, t in ref.V2_START_TYPES.items():
        assert k in m, k
        if t is ref.DATETIME:
            assert hasattr(m[k], "tzinfo"), k
        else:
            assert type(m[k]) is t, (k, m[k])
    assert m["series_id"] == sid and CROCKFORD.match(m["series_unique_id"])
    assert m["image_size_x"] == W and m["image_size_y"] == H
    assert m["number_of_images"] == NFRAMES and m["image_dtype"] == dtype
    assert m["channels"] == ["threshold_1", "threshold_2"][:channels]
    assert set(m["threshold_energy"]) == {"threshold_1", "threshold_2"}
    assert all(type(v) is float for v in m["threshold_energy"].values())
    assert set(m["goniometer"]) == {"chi", "kappa", "omega", "phi", "two_theta"}
    for ax in m["goniometer"].values():
        assert set(ax) == {"start", "increment"} and all(type(v) is float for v in ax.values())
    assert len(m["detector_translation"]) == 3
    assert all(type(v) is float for v in m["detector_translation"])
    assert m["frame_time"] == FT and m["count_time"] == pytest.approx(CT, abs=1e-15)
    assert m["incident_energy"] == ENERGY
    assert m["incident_wavelength"] == pytest.approx(12398.419843320026 / ENERGY, rel=1e-15)
    assert m["pixel_size_x"] == 75e-6 and m["pixel_size_y"] == 75e-6
    assert m["beam_center_x"] == W / 2 and m["beam_center_y"] == H / 2
    assert m["user_data"] == happ
    es = np.dtype(dtype).itemsize
    top = {1: 255, 2: 65535, 4: 0xffffffff}[es]
    assert m["saturation_value"] == top - top // 64
    if detail == "all":
        assert set(r["flatfield"]) == set(m["channels"]) == set(r["pixel_mask"])
        for c in m["channels"]:
            check_tables(r["flatfield"][c], r["pixel_mask"][c])
            assert m["flatfield"][c].value[1].tag == 85
            assert m["pixel_mask"][c].value[1].tag == 70
        lut = r["countrate_table"]
        i = np.arange(4096, dtype=np.uint64)
        assert lut.dtype == np.dtype("<u4")
        np.testing.assert_array_equal(lut, (i + i * i // 16384).astype(np.uint32))
    else:  # none == basic for v2: no arrays
        for k in ref.V2_START_ALL:
            assert k not in m
    jkeys = {"detector_distance", "error_value", "magic_number"}
    if jfj:
        assert jkeys <= set(m)
        assert type(m["detector_distance"]) is float and m["detector_distance"] > 0
        assert m["error_value"] == top and type(m["magic_number"]) is int
    else:
        assert not (jkeys & set(m))
    n = 30 + (3 if detail == "all" else 0) + (3 if jfj else 0)
    assert len(m) == n, sorted(m)


def check_v2_image(r, f, sid, uid, dtype, enc, channels=1, iapp=""):
    m = r["fields"]
    assert r["kind"] == "image" and list(m)[0] == "type"
    assert list(m) == ["type", "series_id", "series_unique_id", "image_id", "start_time",
                       "stop_time", "real_time", "series_date", "data", "user_data"]
    assert m["series_id"] == sid and m["series_unique_id"] == uid and m["image_id"] == f
    t0 = f * round(FT * V2_TPS)
    ct = round(CT * V2_TPS)
    assert m["start_time"] == [t0, V2_TPS] and m["stop_time"] == [t0 + ct, V2_TPS]
    assert m["real_time"] == [ct, V2_TPS]
    assert m["user_data"] == iapp
    names = ["threshold_1", "threshold_2"][:channels]
    assert list(r["data"]) == names  # serialized in the order of start's channels
    want = counter(f, dtype=dtype)
    np.testing.assert_array_equal(r["data"]["threshold_1"], want)
    assert r["data"]["threshold_1"].shape == (H, W) and r["data"]["threshold_1"].dtype == NP[dtype]
    if channels == 2:  # docs/tools.md: threshold_2 = floor(threshold_1 / 2)
        np.testing.assert_array_equal(r["data"]["threshold_2"], want >> 1)
    es = np.dtype(dtype).itemsize
    for c in names:
        b = r["blobs"][c]
        assert b["dims"] == [H, W] and b["tag"] == TYPED_TAG[dtype]
        assert b["algorithm"] == V2_ALG[enc]
        raw = want.tobytes() if c == "threshold_1" else (want >> 1).tobytes()
        if enc == "raw":
            assert b["blob"] == raw
            continue
        assert b["modifier"] == (0 if enc == "lz4" else es)
        assert struct.unpack(">QI", b["blob"][:12]) == (H * W * es, 8192)
        if enc == "bslz4":  # own unshuffle (in the decoder) vs Debian's bitshuffle
            mod = ref.decode_bslz4_module(b["blob"], dtype, H * W)
            assert mod.tobytes() == raw


def check_v2_end(msg, sid, uid):
    r = ref.decode_v2(msg)
    assert r["kind"] == "end"
    assert list(r["fields"].items()) == [("type", "end"), ("series_id", sid),
                                         ("series_unique_id", uid)]


@pytest.mark.parametrize("enc", ["raw", "lz4", "bslz4", "bszstd"])
@pytest.mark.parametrize("detail", ["none", "basic", "all"])
def test_v2_stream(detail, enc):
    msgs, summ, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                         "--header-detail", detail, "--encoding", enc])
    assert len(msgs) == NFRAMES + 2 and all(len(m) == 1 for m in msgs)
    assert all(m[0][:3] == b"\xd9\xd9\xf7" for m in msgs)
    st = ref.decode_stream("dectris2", msgs)
    assert st.events == [] and len(st.series) == 1
    start = ref.decode_v2(msgs[0])
    check_v2_start(start, 1, detail, "uint16")
    uid = start["unique_id"]
    for f in range(NFRAMES):
        check_v2_image(ref.decode_v2(msgs[1 + f]), f, 1, uid, "uint16", enc)
    check_v2_end(msgs[-1], 1, uid)
    assert summ["frames_sent"] == NFRAMES and summ["messages"] == NFRAMES + 2
    assert summ["bytes"] == sum(len(m[0]) for m in msgs)


@pytest.mark.parametrize("enc", ["raw", "bslz4", "lz4", "bszstd"])
@pytest.mark.parametrize("dtype", ["uint8", "uint32"])
def test_v2_two_channels(dtype, enc):
    msgs, _, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                      "--dtype", dtype, "--encoding", enc, "--channels", "2",
                                      "--header-detail", "all"])
    start = ref.decode_v2(msgs[0])
    check_v2_start(start, 1, "all", dtype, channels=2)
    for f in range(NFRAMES):
        check_v2_image(ref.decode_v2(msgs[1 + f]), f, 1, start["unique_id"], dtype, enc,
                       channels=2)


def test_v2_second_channel_any_pattern():
    msgs, _, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--frames", "4", "--channels", "2",
                                      "--pattern", "poisson", "--mean", "40"])
    for m in msgs[1:-1]:
        d = ref.decode_v2(m)["data"]
        assert d["threshold_1"].any()
        np.testing.assert_array_equal(d["threshold_2"], d["threshold_1"] >> 1)


def test_v2_appendices_and_series():
    msgs, _, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                      "--series", "2", "--series-id", "15614",
                                      "--header-appendix", "hdr text",
                                      "--image-appendix", "img text"], nseries=2)
    assert len(msgs) == 2 * (NFRAMES + 2)
    uids = []
    for s, sid in enumerate((15614, 15615)):
        base = s * (NFRAMES + 2)
        start = ref.decode_v2(msgs[base])
        check_v2_start(start, sid, "basic", "uint16", happ="hdr text")
        uids.append(start["unique_id"])
        for f in range(NFRAMES):
            check_v2_image(ref.decode_v2(msgs[base + 1 + f]), f, sid, start["unique_id"],
                           "uint16", "bslz4", iapp="img text")
        check_v2_end(msgs[base + NFRAMES + 1], sid, start["unique_id"])
        # The captured EIGER2 end message of series 15614 is 71 bytes (notes 2.3).
        assert len(msgs[base + NFRAMES + 1][0]) == 71
    assert uids[0] != uids[1]


def test_v2_jfj():
    msgs, _, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES), "--jfj",
                                      "--encoding", "bszstd"])
    assert len(msgs) == NFRAMES + 3
    st = ref.decode_stream("dectris2", msgs)
    assert st.events == [] and len(st.others) == 1
    start = ref.decode_v2(msgs[0])
    check_v2_start(start, 1, "basic", "uint16", jfj=True)
    cal = ref.decode_v2(msgs[1])
    assert cal["kind"] == "other" and cal["type"] == "calibration"
    assert cal["fields"]["series_id"] == 1
    assert cal["fields"]["series_unique_id"] == start["unique_id"]
    ped, _ = ref.decode_multidim(cal["fields"]["data"]["pedestal_g0"])
    assert ped.shape == (H, W) and ped.dtype == np.float32 and not ped.any()
    for f in range(NFRAMES):
        check_v2_image(ref.decode_v2(msgs[2 + f]), f, 1, start["unique_id"], "uint16", "bszstd")
    assert st.series[0].frame_ids == list(range(NFRAMES))


def test_v2_lz4_blocks():
    """8192-byte blocks as DECTRIS writes them; a block LZ4 cannot shrink
    is stored raw (stored length == block length). A counter ramp has no
    4-byte repeat for LZ4 to find, so its blocks are all stored raw, the
    short last one too; a flat frame compresses."""
    msgs, _, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--frames", "2", "--encoding", "lz4"])
    r = ref.decode_v2(msgs[2])
    assert ref.lz4_framing_blocks(r["blobs"]["threshold_1"]["blob"]) == (8192, [8192, 2048])
    np.testing.assert_array_equal(r["data"]["threshold_1"], counter(1))
    msgs, _, _ = run_sim("dectris2", ["--shape", "3x5", "--dtype", "uint8", "--frames", "2",
                                      "--encoding", "lz4"])
    r = ref.decode_v2(msgs[2])
    assert ref.lz4_framing_blocks(r["blobs"]["threshold_1"]["blob"]) == (8192, [15])
    np.testing.assert_array_equal(r["data"]["threshold_1"], counter(1, 3, 5, "uint8"))
    msgs, _, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--dtype", "uint32", "--frames", "2",
                                      "--encoding", "lz4", "--pattern", "flat", "--mean", "7"])
    r = ref.decode_v2(msgs[2])
    bsize, lens = ref.lz4_framing_blocks(r["blobs"]["threshold_1"]["blob"])
    assert bsize == 8192 and len(lens) == 3 and all(l < 100 for l in lens)
    a = r["data"]["threshold_1"]
    assert a.shape == (H, W) and a.dtype == np.uint32 and (a == 7).all()


def test_unshuffle_matches_bitshuffle_module():
    """The decoder's numpy bit-unshuffle (from PROTOCOL.md 5.2) against
    Debian's bitshuffle on data it compressed itself, odd sizes included."""
    rng = np.random.default_rng(7)
    for dt in (np.uint8, np.uint16, np.uint32):
        for n in (1, 7, 8, 9, 2047, 2048, 4100, 20011):
            a = rng.integers(0, 1000, n).astype(dt)
            body = bitshuffle.compress_lz4(a, 0).tobytes()
            bs = max(128, 8192 // a.itemsize // 8 * 8)
            blob = struct.pack(">QI", a.nbytes, bs * a.itemsize) + body
            assert ref.decode_bs_framing(blob, a.itemsize) == a.tobytes(), (dt, n)


# ---- faults ------------------------------------------------------------------------

MID = NFRAMES // 2
V1_COPY = {"nonjson": "nonjson", "truncated": "truncated", "size": "size",
           "encoding": "encoding", "dtype": "dtype", "hash": "hash"}
V2_COPY = {"nosig": "nosig", "typenotfirst": "typenotfirst", "nesting": "nesting",
           "dims": "dims", "short": "short", "algorithm": "algorithm"}


def v1_fault_run(fault, enc="bslz4"):
    msgs, summ, _ = run_sim("dectris1", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                         "--series", "2", "--encoding", enc, "--fault", fault],
                            nseries=2)
    assert summ["faults"] == {fault: 2}
    return msgs, summ


def split_series(msgs, n):
    per = len(msgs) // n
    assert per * n == len(msgs)
    return [msgs[i * per:(i + 1) * per] for i in range(n)]


def check_intact(st, nseries, ids=range(NFRAMES), enc="bslz4"):
    assert [s.series for s in st.series] == list(range(1, nseries + 1))
    for s in st.series:
        assert s.frame_ids == list(ids) and s.end is not None
        for f, a in zip(s.frame_ids, s.frames):
            a = a["threshold_1"] if isinstance(a, dict) else a
            np.testing.assert_array_equal(a, counter(f))


@pytest.mark.parametrize("fault", sorted(V1_COPY))
def test_v1_fault_copies(fault):
    """A corrupted copy of the middle frame just before the good one."""
    msgs, summ = v1_fault_run(fault)
    assert summ["frames_sent"] == 2 * NFRAMES
    for sid, ser in enumerate(split_series(msgs, 2), 1):
        assert len(ser) == NFRAMES + 3
        bad, good = ser[1 + MID], ser[2 + MID]
        with pytest.raises(DectrisError) as e:
            ref.decode_v1(bad)
        assert e.value.kind == V1_COPY[fault]
        g = ref.decode_v1(good)
        check_v1_image(g, MID, sid, "uint16", "bslz4")
        # Everything but the fault equals the good message.
        if fault == "truncated":
            assert bad == good[:2]
        else:
            assert len(bad) == 4 and bad[2] == good[2] and bad[3] == good[3]
            j1, j2 = json.loads(bad[0]), None if fault == "nonjson" else json.loads(bad[1])
            if fault == "hash":
                assert j1["hash"] != g["hash"] and re.fullmatch("[0-9a-f]{32}", j1["hash"])
                assert {**j1, "hash": g["hash"]} == g["dimage"] and bad[1] == good[1]
            else:
                assert j1 == g["dimage"]
            if fault == "nonjson":
                with pytest.raises(ValueError):
                    json.loads(bad[1])
            elif fault == "size":
                assert j2 == {**g["dimage_d"], "size": len(good[2]) + 1}
            elif fault == "encoding":
                assert j2["encoding"] == "lzma<" and {**j2, "encoding": "bs16-lz4<"} == g["dimage_d"]
            elif fault == "dtype":
                assert j2["type"] == "uint24" and {**j2, "type": "uint16"} == g["dimage_d"]
    st = ref.decode_stream("dectris1", msgs)
    assert [(e["kind"], e["index"]) for e in st.events] == \
        [(V1_COPY[fault], 1 + MID), (V1_COPY[fault], NFRAMES + 3 + 1 + MID)]
    check_intact(st, 2)


def test_v1_fault_gap():
    msgs, summ = v1_fault_run("gap")
    assert summ["frames_sent"] == 2 * (NFRAMES - 1)
    ids = [i for i in range(NFRAMES) if i != MID]
    for sid, ser in enumerate(split_series(msgs, 2), 1):
        assert [ref.decode_v1(m).get("frame") for m in ser[1:-1]] == ids
    st = ref.decode_stream("dectris1", msgs)
    assert [(e["kind"], e["frame"], e["expected"]) for e in st.events] == \
        [("gap", MID + 1, MID)] * 2
    check_intact(st, 2, ids)


def test_v1_fault_stale():
    msgs, _ = v1_fault_run("stale")
    for sid, ser in enumerate(split_series(msgs, 2), 1):
        assert len(ser) == NFRAMES + 3
        r = ref.decode_v1(ser[1 + MID])  # well formed, of the series before
        assert r["series"] == sid - 1 and r["frame"] == MID
        np.testing.assert_array_equal(r["data"], counter(MID))
        assert ser[1 + MID][1:] == ser[2 + MID][1:]
    st = ref.decode_stream("dectris1", msgs)
    assert [(e["kind"], e["series"]) for e in st.events] == [("stale", 0), ("stale", 1)]
    check_intact(st, 2)


def test_v1_fault_image_before_header():
    msgs, _ = v1_fault_run("image-before-header")
    for sid, ser in enumerate(split_series(msgs, 2), 1):
        r = ref.decode_v1(ser[0])
        assert r["kind"] == "image" and r["series"] == sid and r["frame"] == 0
        np.testing.assert_array_equal(r["data"], counter(0))
        assert ref.decode_v1(ser[1])["kind"] == "start"
    st = ref.decode_stream("dectris1", msgs)
    assert [(e["kind"], e["series"], e["index"]) for e in st.events] == \
        [("image-before-header", 1, 0), ("image-before-header", 2, NFRAMES + 3)]
    check_intact(st, 2)


def test_v1_all_faults_at_once():
    faults = sorted(V1_COPY) + ["gap", "stale", "image-before-header"]
    msgs, summ, _ = run_sim("dectris1", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                         "--series", "2", "--series-id", "5", "--encoding", "raw",
                                         "--header-detail", "all", "--fault", ",".join(faults)],
                            nseries=2)
    assert summ["faults"] == {f: 2 for f in faults}
    assert summ["frames_sent"] == 2 * (NFRAMES - 1)
    st = ref.decode_stream("dectris1", msgs)
    kinds = sorted(e["kind"] for e in st.events)
    assert kinds == sorted(2 * (list(V1_COPY.values()) + ["gap", "stale", "image-before-header"]))
    assert [s.series for s in st.series] == [5, 6]
    for s in st.series:
        assert s.frame_ids == [i for i in range(NFRAMES) if i != MID]
        for f, a in zip(s.frame_ids, s.frames):
            np.testing.assert_array_equal(a, counter(f))


def v2_fault_run(fault, enc, channels=1):
    msgs, summ, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                         "--series", "2", "--encoding", enc, "--fault", fault,
                                         "--channels", str(channels)], nseries=2)
    assert summ["faults"] == {fault: 2}
    return msgs, summ


@pytest.mark.parametrize("enc", ["raw", "bslz4"])
@pytest.mark.parametrize("fault", sorted(V2_COPY))
def test_v2_fault_copies(fault, enc):
    msgs, summ = v2_fault_run(fault, enc, channels=2)
    assert summ["frames_sent"] == 2 * NFRAMES
    for sid, ser in enumerate(split_series(msgs, 2), 1):
        assert len(ser) == NFRAMES + 3
        bad, good = ser[1 + MID][0], ser[2 + MID][0]
        with pytest.raises(DectrisError) as e:
            ref.decode_v2(bad)
        assert e.value.kind == V2_COPY[fault]
        g = ref.decode_v2(good)
        uid = ref.decode_v2(ser[0])["unique_id"]
        check_v2_image(g, MID, sid, uid, "uint16", enc, channels=2)
        b = cbor2.loads(bad)  # cbor2 itself does not insist on the signature
        gf = g["fields"]
        # Only threshold_1 carries the fault; threshold_2 decodes as sent.
        assert b["data"]["threshold_2"] == gf["data"]["threshold_2"]
        rest = {k: v for k, v in b.items() if k != "data"}
        assert rest == {k: v for k, v in gf.items() if k != "data"}
        t1, g1 = b["data"]["threshold_1"], gf["data"]["threshold_1"]
        if fault == "nosig":
            assert bad[:3] != b"\xd9\xd9\xf7" and b"\xd9\xd9\xf7" + bad == good
        elif fault == "typenotfirst":
            assert list(b)[:2] == ["series_id", "type"] and t1 == g1
        elif fault == "nesting":
            assert isinstance(t1, list) and t1 == g1.value
        elif fault == "dims":
            assert t1.value[0] == [H + 1, W] and t1.value[1] == g1.value[1]
        elif fault == "short":
            inner = t1.value[1].value
            assert inner.tag == 56500 and inner.value[0] == "bslz4"
            assert inner.value[2] == struct.pack(">Q", H * W * 2)
        elif fault == "algorithm":
            inner = t1.value[1].value
            assert inner.tag == 56500 and inner.value[0] == "lzma"
            want = g1.value[1].value
            assert inner.value[2] == (want if enc == "raw" else want.value[2])
    st = ref.decode_stream("dectris2", msgs)
    assert [e["kind"] for e in st.events] == [V2_COPY[fault]] * 2
    check_intact(st, 2)


def test_v2_fault_gap_and_stale():
    msgs, summ, _ = run_sim("dectris2", ["--shape", f"{H}x{W}", "--frames", str(NFRAMES),
                                         "--series", "2", "--fault", "gap,stale"], nseries=2)
    assert summ["faults"] == {"gap": 2, "stale": 2}
    assert summ["frames_sent"] == 2 * (NFRAMES - 1)
    sers = split_series(msgs, 2)
    uids = [ref.decode_v2(s[0])["unique_id"] for s in sers]
    for i, ser in enumerate(sers):
        sid = i + 1
        r = ref.decode_v2(ser[1 + MID])
        assert r["series"] == sid - 1 and r["image_id"] == MID
        if i == 1:  # the stale image carries the previous series' unique id
            assert r["unique_id"] == uids[0]
        else:
            assert CROCKFORD.match(r["unique_id"]) and r["unique_id"] != uids[0]
        np.testing.assert_array_equal(r["data"]["threshold_1"], counter(MID))
        good = ser[1:1 + MID] + ser[2 + MID:-1]
        assert [ref.decode_v2(m)["image_id"] for m in good] == \
            [f for f in range(NFRAMES) if f != MID]
    st = ref.decode_stream("dectris2", msgs)
    assert [e["kind"] for e in st.events] == ["stale", "gap"] * 2
    check_intact(st, 2, [f for f in range(NFRAMES) if f != MID])


def test_rate_and_stats_json():
    """--rate paces the images (a lower bound only: a loaded machine may be
    slower, never faster); --stats-json still reports on stdout."""
    port = free_port()
    ep = f"tcp://127.0.0.1:{port}"
    p = subprocess.Popen([SIM, "--protocol", "dectris2", "--bind", ep, "--shape", "8x6",
                          "--frames", "11", "--rate", "200", "--fault", "nosig", "--stats-json",
                          "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.PULL)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(ep)
    n = 0
    try:
        deadline = time.monotonic() + 20
        while n < 14 and time.monotonic() < deadline:
            if s.poll(100):
                s.recv_multipart()
                n += 1
        out, err = p.communicate(timeout=15)
    finally:
        s.close()
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and n == 14, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["frames_sent"] == 11 and stats["malformed_sent"] == 1 and stats["series"] == 1
    assert stats["seconds"] >= 0.95 * 10 / 200
    assert json.loads(err.strip().splitlines()[-1])["faults"] == {"nosig": 1}


# ---- command line ------------------------------------------------------------------

@pytest.mark.parametrize("args,why", [
    (["--protocol", "dectris1", "--dtype", "float32"], "uint8, uint16 or uint32"),
    (["--protocol", "dectris2", "--dtype", "float32"], "uint8, uint16 or uint32"),
    (["--protocol", "dectris1", "--encoding", "bszstd"], "bszstd"),
    (["--protocol", "dectris1", "--channels", "2"], "--channels"),
    (["--protocol", "dectris1", "--jfj"], "--jfj"),
    (["--protocol", "dectris2", "--jfj", "--encoding", "lz4"], "LZ4"),
    (["--protocol", "dectris2", "--channels", "3"], "channels"),
    (["--protocol", "dectris1", "--fault", "nosig"], "nosig"),
    (["--protocol", "dectris2", "--fault", "hash"], "hash"),
    (["--protocol", "dectris2", "--fault", "gap,bogus"], "fault"),
    (["--protocol", "dectris1", "--fault", "stale", "--series-id", "0"], "stale"),
    (["--protocol", "dectris1", "--connect", "tcp://127.0.0.1:1"], "--connect"),
    (["--protocol", "dectris2", "--socket", "pub"], "--socket"),
    (["--protocol", "dectris1", "--codec", "lz4"], "--codec"),
    (["--protocol", "dectris1", "--frames", "0"], "--frames"),
    (["--protocol", "dectris1", "--malformed", "2"], "--malformed"),
    (["--protocol", "dectris3"], "protocol"),
    (["--header-detail", "all"], "--header-detail"),
    (["--encoding", "bslz4"], "--encoding"),
    (["--protocol", "dectris1", "--encoding", "zlib"], "encoding"),
])
def test_refused(args, why):
    rc, err = sim_fails(args)
    assert rc == 2 and why in err, err


@pytest.mark.parametrize("protocol,port", [("dectris1", 9999), ("dectris2", 31001)])
def test_default_endpoint(protocol, port):
    with socket.socket() as s:
        # SO_REUSEADDR as ZeroMQ sets it: a TIME_WAIT left by an earlier run
        # does not stop the simulator's bind, so it must not skip the test.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            pytest.skip(f"port {port} is in use here")
    msgs, summ, err = run_sim(protocol, ["--shape", "4x6", "--frames", "1"],
                              endpoint=f"tcp://127.0.0.1:{port}")
    assert f"tcp://127.0.0.1:{port}" in err and summ["frames_sent"] == 1
    assert len(msgs) == 3
