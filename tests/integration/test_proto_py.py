"""Tests of tools/python/beamd/proto.py, the Python twin of proto/*.c.

Round trips for every dtype, ndim 1..4 and codec; one case per rejection
reason; compatibility with tests/golden (chunks written by the HDF5 plugins,
messages read by the C unit tests) and with chunks h5py writes right now.
Run with /usr/bin/python3 -m pytest -q tests/integration/test_proto_py.py
"""

import json
import math
import os
import struct
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
GOLDEN = os.path.join(ROOT, "tests", "golden")
PLUGINS = "/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins"

from beamd import proto  # noqa: E402
from beamd.proto import ProtocolError  # noqa: E402

FRAME = proto.FRAME
DTYPES = proto.DTYPES[1:]
SHAPES = [(9,), (3, 7), (2, 3, 5), (2, 1, 3, 11), (1, 100, 97), (4099,)]


def sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt.kind == "c":
        a = rng.normal(0, 5, n) + 1j * rng.normal(0, 5, n)
    elif dt.kind == "f":
        a = rng.normal(0, 100, n)
    else:
        a = rng.poisson(4, n).astype(dt)
        a[::97] = np.iinfo(dt).max
    return a.astype(dt).reshape(shape)


def read_parts(path):
    data = open(path, "rb").read()
    parts, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        parts.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return parts


# ---- round trips -------------------------------------------------------------

@pytest.mark.parametrize("codec", proto.CODECS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_dtype_shape_codec(dtype, codec):
    for i, shape in enumerate(SHAPES):
        a = sample(dtype, shape, i)
        parts = proto.encode_message("FRAME", a, series_id=3, frame_id=i,
                                     seq=100 + i, codec=codec, t_send_ns=5)
        topic, h, b, meta = proto.decode_message(parts)
        assert topic is None and meta is None
        assert h.type == proto.FRAME and h.codec_name == codec
        assert h.series_id == 3 and h.frame_id == i and h.seq == 100 + i
        assert h.frame_shape == shape and h.dtype_name == dtype
        assert h.raw_size == a.nbytes
        assert b.dtype == a.dtype and b.shape == a.shape
        assert np.array_equal(a, b, equal_nan=False)


def test_big_endian_input_is_sent_little_endian():
    a = np.arange(20, dtype=">u4")
    _, h, b, _ = proto.decode_message(proto.encode_message(FRAME, a))
    assert h.dtype_name == "uint32" and np.array_equal(a, b)


def test_split_raw_parts_topic_meta_pos():
    a = sample("uint16", (2, 3, 5))
    parts = proto.encode_message("RESULT", a, topic="g2.g2", split=3,
                                 meta={"stage": "g2", "units": "s"},
                                 pos=(1e-6, -2e-6, 3e-6), stage_id=4,
                                 flags=proto.FLAG_PARTIAL)
    assert parts[0] == b"g2.g2" and len(parts) == 1 + 1 + 3 + 1
    topic, h, b, meta = proto.decode_message(parts)
    assert topic == "g2.g2" and meta == {"stage": "g2", "units": "s"}
    assert h.flags == proto.FLAG_PARTIAL | proto.FLAG_META | proto.FLAG_POS
    assert h.pos == (1e-6, -2e-6, 3e-6) and h.stage_id == 4
    assert np.array_equal(a, b)


def test_series_messages_without_payload():
    parts = proto.encode_message("SERIES_START", shape=(512, 512),
                                 dtype="uint32", meta={"nframes": 10})
    _, h, arr, meta = proto.decode_message(parts)
    assert arr is None and h.nparts == 0 and h.raw_size == 512 * 512 * 4
    assert meta == {"nframes": 10}
    h0 = proto.Header(type=proto.SERIES_START, ndim=2, dtype=3,
                      shape=(512, 512, 0, 0), raw_size=0)
    assert proto.decode_header(h0.encode()).raw_size == 0
    _, h, arr, _ = proto.decode_message(proto.encode_message("SERIES_END"))
    assert arr is None and h.ndim == 0 and h.type_name == "SERIES_END"
    parts = proto.encode_message("FRAME", shape=(4, 4), dtype="uint16",
                                 flags=proto.FLAG_CORRUPT)
    _, h, arr, _ = proto.decode_message(parts)
    assert arr is None and h.nparts == 0


def test_header_layout_offsets():
    h = proto.Header(type=FRAME, flags=0x11223344, series_id=5, frame_id=6,
                     seq=7, t_acq_ns=8, t_send_ns=9, dtype=2, ndim=2,
                     codec=0, nparts=1, stage_id=10, shape=(3, 4, 0, 0),
                     raw_size=24, payload_size=24, pos=(1.5, 0.0, 0.0))
    b = h.encode()
    assert len(b) == 128 and b[:4] == b"\x89BMD" and b[4:6] == b"\x01\x00"
    assert struct.unpack_from("<HHHI", b, 6) == (128, FRAME, 0, 0x11223344)
    assert struct.unpack_from("<5Q", b, 16) == (5, 6, 7, 8, 9)
    assert tuple(b[56:60]) == (2, 2, 0, 1)
    assert struct.unpack_from("<I4IQQ3dII", b, 60) == (
        10, 3, 4, 0, 0, 24, 24, 1.5, 0.0, 0.0, 0, 0)


def test_longer_header_from_newer_minor():
    b = bytearray(proto.encode_message(FRAME, np.zeros(4, "u1"))[0])
    b[5] = 7
    b[6:8] = struct.pack("<H", 160)
    b += b"\xAA" * 32
    h = proto.decode_header(bytes(b))
    assert h.minor == 7 and h.hdr_size == 160 and h.raw_size == 4


# ---- rejections (same reason strings as proto/proto.c) -----------------------

def good_header(**kw):
    base = dict(type=FRAME, dtype=2, ndim=2, shape=(4, 6, 0, 0), codec=0,
                nparts=1, raw_size=48, payload_size=48)
    base.update(kw)
    return proto.Header(**base)


@pytest.mark.parametrize("kw,reason", [
    (dict(type=0), "unknown message type"),
    (dict(type=9), "unknown message type"),
    (dict(dtype=13), "unknown dtype"),
    (dict(ndim=5), "ndim > 4"),
    (dict(shape=(4, 6, 1, 0)), "shape[2] set beyond ndim"),
    (dict(dtype=0), "dtype none with ndim > 0"),
    (dict(shape=(0, 6, 0, 0)), "shape[0] = 0"),
    (dict(shape=(4, 0, 0, 0)), "shape[1] = 0"),
    (dict(shape=(4, 65537, 0, 0)), "shape[1] > max_dim limit"),
    (dict(raw_size=47, payload_size=47),
     "raw_size does not match shape x dtype"),
    (dict(type=3, ndim=0, shape=(0, 0, 0, 0), raw_size=8, nparts=0,
          payload_size=0), "raw_size set but ndim is 0"),
    (dict(ndim=4, dtype=12, shape=(65536,) * 4, raw_size=16,
          payload_size=16), "frame too large (limit max_raw_bytes)"),
    (dict(codec=3), "unknown codec"),
    (dict(nparts=17), "nparts > 16 payload parts"),
    (dict(nparts=0, payload_size=0), "message type requires a payload"),
    (dict(nparts=0, flags=proto.FLAG_CORRUPT),
     "payload_size set but nparts is 0"),
    (dict(type=1, raw_size=0), "payload parts without an array"),
    (dict(payload_size=40), "raw codec: payload_size != raw_size"),
    (dict(codec=1, nparts=2, payload_size=30),
     "compressed payload must be one part"),
    (dict(codec=2, payload_size=11), "compressed payload_size < 12"),
    (dict(codec=2, payload_size=1000),
     "compressed payload_size exceeds the codec bound"),
    (dict(flags=proto.FLAG_META), "metadata flag set but meta_size is 0"),
    (dict(flags=proto.FLAG_META, meta_size=(16 << 20) + 1),
     "metadata too large (limit max_meta_bytes)"),
    (dict(meta_size=3), "meta_size set without metadata flag"),
    (dict(flags=proto.FLAG_POS, pos=(0.0, math.nan, 0.0)),
     "scan position is not finite"),
])
def test_header_rejections(kw, reason):
    with pytest.raises(ProtocolError) as e:
        proto.decode_header(good_header(**kw).encode())
    assert str(e.value) == reason


def test_header_byte_rejections():
    b = good_header().encode()
    cases = [
        (b[:7], "header part too short"),
        (b"\x89BMX" + b[4:], "bad magic"),
        (b[:4] + b"\x02" + b[5:], "unsupported major version 2"),
        (b[:4] + b"\x09" + b[5:], "unsupported major version (> 5)"),
        (b[:6] + struct.pack("<H", 100) + b[8:], "hdr_size < 128"),
        (b[:6] + struct.pack("<H", 5000) + b[8:], "hdr_size > 4096"),
        (b + b"\0", "header part length != hdr_size"),
    ]
    for buf, reason in cases:
        with pytest.raises(ProtocolError) as e:
            proto.decode_header(buf)
        assert str(e.value) == reason


def test_limits_are_configurable():
    h = good_header().encode()
    with pytest.raises(ProtocolError, match="frame too large"):
        proto.decode_header(h, proto.Limits(max_raw_bytes=47))
    with pytest.raises(ProtocolError, match=r"shape\[1\] > max_dim"):
        proto.decode_header(h, proto.Limits(max_dim=5))


def test_message_rejections():
    a = np.arange(24, dtype="u2").reshape(4, 6)
    ok = proto.encode_message(FRAME, a, meta={"x": 1}, split=2)
    meta_less = proto.encode_message(FRAME, a)
    result = proto.encode_message("RESULT", a, topic="s.o")
    cases = [
        ([], "empty message"),
        ([b""] + ok, "empty first part"),
        ([b"Bad"] + ok, "topic contains invalid characters"),
        ([b"a" * 65] + ok, "topic longer than 64 bytes"),
        ([b"topic"], "topic without a header part"),
        (ok[:-1], "metadata flag set but no metadata part"),
        (ok[:-2], "fewer parts than the header declares"),
        (meta_less + [b"x"], "more parts than the header declares"),
        (ok[:1] + [ok[1][:-1], ok[2] + b"\0"] + ok[3:], None),
        (ok[:1] + [ok[1] + b"\0", ok[2]] + ok[3:], "payload size mismatch"),
        (ok[:3] + [b'{"x":2} '], "metadata part size != meta_size"),
        (result[1:], "RESULT message without a topic"),
        (ok[:3] + [b"{nope"[:len(ok[3])].ljust(len(ok[3]), b" ")],
         "metadata is not valid JSON"),
    ]
    for parts, reason in cases:
        if reason is None:  # moving a byte between raw parts is fine
            proto.decode_message(parts)
            continue
        with pytest.raises(ProtocolError) as e:
            proto.decode_message(parts)
        assert str(e.value) == reason, parts[:1]


def test_codec_rejections():
    a = sample("uint16", (1, 100, 97))
    bs = proto.codec_encode("bslz4", a.tobytes(), 2)
    lz = proto.codec_encode("lz4", a.tobytes(), 2)
    n = a.nbytes
    cases = [
        (lambda: proto.lz4_decode(lz[:11], n), "lz4: truncated framing header"),
        (lambda: proto.lz4_decode(lz, n - 2),
         "lz4: total size does not match raw_size"),
        (lambda: proto.lz4_decode(lz[:8] + b"\0\0\0\0" + lz[12:], n),
         "lz4: block size 0"),
        (lambda: proto.lz4_decode(lz[:14], n), "lz4: truncated block header"),
        (lambda: proto.lz4_decode(lz[:-1], n),
         "lz4: block runs past the payload"),
        (lambda: proto.lz4_decode(lz + b"\0", n),
         "lz4: trailing bytes after the last block"),
        (lambda: proto.lz4_decode(lz[:16] + b"\xff" * (len(lz) - 16), n),
         "lz4: corrupt block"),
        (lambda: proto.lz4_decode(lz[:12] + struct.pack(">I", n + 1)
                                  + b"\0" * (n + 1), n),
         "lz4: compressed block larger than its data"),
        (lambda: proto.bslz4_decode(bs[:11], n, 2),
         "bslz4: truncated framing header"),
        (lambda: proto.bslz4_decode(bs, n - 2, 2),
         "bslz4: total size does not match raw_size"),
        (lambda: proto.bslz4_decode(bs, n - 1, 2),
         "bslz4: raw_size not a multiple of the element size"),
        (lambda: proto.bslz4_decode(bs[:8] + struct.pack(">I", 8191)
                                    + bs[12:], n, 2),
         "bslz4: block size not a multiple of the element size"),
        (lambda: proto.bslz4_decode(bs[:8] + struct.pack(">I", 8)
                                    + bs[12:], n, 2),
         "bslz4: block size not a positive multiple of 8 elements"),
        (lambda: proto.bslz4_decode(bs[:14], n, 2),
         "bslz4: truncated block header"),
        (lambda: proto.bslz4_decode(bs[:100], n, 2),
         "bslz4: block runs past the payload"),
        (lambda: proto.bslz4_decode(bs[:-1], n, 2),
         "bslz4: truncated trailing elements"),
        (lambda: proto.bslz4_decode(bs + b"\0", n, 2),
         "bslz4: trailing bytes after the last block"),
        (lambda: proto.bslz4_decode(bs[:16] + b"\xff" * (len(bs) - 16), n, 2),
         "bslz4: corrupt block"),
        (lambda: proto.codec_decode("raw", b"abc", 4, 1),
         "raw: payload size != raw_size"),
    ]
    for fn, reason in cases:
        with pytest.raises(ProtocolError) as e:
            fn()
        assert str(e.value) == reason


def test_every_truncation_rejected():
    a = sample("float32", (33, 65))
    for codec in ("lz4", "bslz4"):
        enc = proto.codec_encode(codec, a.tobytes(), 4)
        for cut in range(0, len(enc), 7):
            with pytest.raises(ProtocolError):
                proto.codec_decode(codec, enc[:cut], a.nbytes, 4)


# ---- bitshuffle layout ---------------------------------------------------------

def oracle_bitshuffle(raw, es):
    a = np.frombuffer(raw, np.uint8).reshape(-1, es)
    n = a.shape[0]
    out = np.zeros(n * es, np.uint8)
    for i in range(n):
        for j in range(es):
            for k in range(8):
                if a[i, j] >> k & 1:
                    r = 8 * j + k
                    out[r * (n // 8) + i // 8] |= 1 << (i % 8)
    return out.tobytes()


@pytest.mark.parametrize("es", [1, 2, 4, 8, 16])
def test_bitshuffle_matches_definition(es):
    raw = np.random.default_rng(es).integers(0, 256, 24 * es, np.uint8)
    raw = raw.tobytes()
    sh = proto.bitshuffle(raw, es)
    assert sh == oracle_bitshuffle(raw, es)
    assert proto.bitunshuffle(sh, es) == raw


def test_default_block_size():
    assert [proto.bshuf_default_block(e) for e in (1, 2, 4, 8, 16, 3, 128)] \
        == [8192, 4096, 2048, 1024, 512, 2728, 128]


# ---- golden files and live HDF5 ------------------------------------------------

def manifest():
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        return json.load(f)


def test_golden_chunks_decode():
    chunks = manifest()["chunks"]
    assert len(chunks) >= 10
    for name, c in chunks.items():
        raw = open(os.path.join(GOLDEN, name + ".raw.bin"), "rb").read()
        chunk = open(os.path.join(GOLDEN, name + ".chunk.bin"), "rb").read()
        es = np.dtype(c["dtype"]).itemsize
        assert proto.codec_decode(c["codec"], chunk, len(raw), es) == raw, name
        assert len(raw) == es * int(np.prod(c["shape"]))


def test_golden_messages_decode():
    msgs = manifest()["messages"]
    for name, m in msgs.items():
        topic, h, arr, meta = proto.decode_message(
            read_parts(os.path.join(GOLDEN, name + ".parts")))
        assert topic == m["topic"] and h.type == m["type"], name
        assert (h.series_id, h.frame_id, h.seq) == (7, m["frame_id"], m["seq"])
        assert h.flags == m["flags"] and h.codec_name == m["codec"]
        assert list(h.frame_shape) == m["shape"] and meta == m["meta"]
        if m["array"]:
            c = manifest()["chunks"][m["array"]]
            raw = open(os.path.join(GOLDEN, m["array"] + ".raw.bin"),
                       "rb").read()
            ref = np.frombuffer(raw, np.dtype(c["dtype"]).newbyteorder("<"))
            assert np.array_equal(arr.ravel(), ref), name
        else:
            assert arr is None


def test_golden_messages_reencode_identically():
    """The encoder is deterministic: re-encoding the decoded message gives
    the golden bytes (this is what keeps the C test vectors stable)."""
    for name, m in manifest()["messages"].items():
        parts = read_parts(os.path.join(GOLDEN, name + ".parts"))
        topic, h, arr, meta = proto.decode_message(parts)
        kw = dict(series_id=h.series_id, frame_id=h.frame_id, seq=h.seq,
                  flags=h.flags & ~(proto.FLAG_META | proto.FLAG_POS),
                  codec=h.codec_name, topic=topic, meta=meta,
                  stage_id=h.stage_id, t_acq_ns=h.t_acq_ns,
                  t_send_ns=h.t_send_ns,
                  pos=h.pos if h.flags & proto.FLAG_POS else None,
                  split=max(1, h.nparts))
        if arr is None and h.ndim:
            kw.update(shape=h.frame_shape, dtype=h.dtype_name)
        assert proto.encode_message(h.type, arr, **kw) == parts, name


@pytest.fixture
def h5file(tmp_path):
    if not os.path.isdir(PLUGINS):
        pytest.skip("HDF5 filter plugins not installed (hdf5-filter-plugin)")
    os.environ.setdefault("HDF5_PLUGIN_PATH", PLUGINS)
    h5py = pytest.importorskip("h5py")
    # HDF5 may have read the environment before this test ran.
    h5py.h5pl.append(PLUGINS.encode())
    return h5py, str(tmp_path / "chunks.h5")


@pytest.mark.parametrize("dtype,shape", [
    ("uint16", (1, 257, 129)), ("int32", (3001,)), ("float64", (17, 61)),
    ("uint8", (5,)), ("complex64", (1, 1031)), ("complex128", (2, 515))])
def test_live_h5py_chunks(h5file, dtype, shape):
    """Chunks that h5py + the plugins write now decode here, and chunks we
    encode are read back by HDF5 through the plugin."""
    h5py, path = h5file
    a = sample(dtype, shape, 3)
    with h5py.File(path, "w") as f:
        for codec, kw in (("bslz4", dict(compression=32008,
                                         compression_opts=(0, 2))),
                          ("lz4", dict(compression=32004))):
            d = f.create_dataset(codec, data=a, chunks=a.shape, **kw)
            _, chunk = d.id.read_direct_chunk((0,) * a.ndim)
            got = proto.codec_decode(codec, chunk, a.nbytes, a.itemsize)
            assert got == a.tobytes()
            e = f.create_dataset(codec + "_ours", shape=a.shape, dtype=a.dtype,
                                 chunks=a.shape, **kw)
            e.id.write_direct_chunk(
                (0,) * a.ndim, proto.codec_encode(codec, a.tobytes(),
                                                  a.itemsize))
            assert np.array_equal(e[...], a)
