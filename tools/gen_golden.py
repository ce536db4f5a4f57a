#!/usr/bin/python3
"""Generates tests/golden/: reference chunks written by the real HDF5 filter
plugins and reference protocol messages written by tools/python/beamd.

Why: a codec that is wrong in the same way on the encode and the decode side
still round-trips. These files pin the bytes to what libhdf5 + the Debian
bitshuffle (32008) and LZ4 (32004) plugins actually write, so the C and
Python decoders are checked against an independent implementation.

Usage (needs Debian python3-h5py, python3-lz4, hdf5-filter-plugin):
    /usr/bin/python3 tools/gen_golden.py [outdir]      (default tests/golden)

Outputs, for each chunk case NAME:
    NAME.raw.bin    the array, C order, little-endian
    NAME.chunk.bin  the chunk bytes as stored in the HDF5 file (read_direct_chunk)
and for each message case NAME: NAME.parts (u32 LE length + bytes, per part).
manifest.json lists dtype, shape, codec and the message header fields.
It also rewrites tests/fuzz/seeds/*.parts (small valid messages, same layout).
"""

import json
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "python"))
os.environ.setdefault("HDF5_PLUGIN_PATH",
                      "/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins")

import h5py  # noqa: E402  (needs HDF5_PLUGIN_PATH set first)
import numpy as np  # noqa: E402

from beamd import proto  # noqa: E402

# name, codec, dtype, shape. Sizes are chosen to hit every framing case:
# several full blocks, a short last block, a last block that rounds down to
# 0 elements, a tail of n % 8 copied elements, a chunk with no block at all,
# and an incompressible LZ4 block stored raw.
CHUNKS = [
    ("bslz4_u16", "bslz4", "uint16", (1, 100, 97)),   # block 4096: 2 + 1504, tail 4
    ("bslz4_u8", "bslz4", "uint8", (1003,)),          # block 8192: 1000, tail 3
    ("bslz4_u32", "bslz4", "uint32", (2150,)),        # block 2048: 1 + 96, tail 6
    ("bslz4_i64", "bslz4", "int64", (1030,)),         # block 1024: 1 + 0, tail 6
    ("bslz4_f32", "bslz4", "float32", (33, 65)),      # block 2048: 1 + 96, tail 1
    ("bslz4_c128", "bslz4", "complex128", (1037,)),   # block 512: 2 + 8, tail 5
    ("bslz4_f64_tiny", "bslz4", "float64", (5,)),     # tail only
    ("lz4_u16", "lz4", "uint16", (1, 64, 65)),
    ("lz4_u8_random", "lz4", "uint8", (3000,)),       # incompressible: raw block
    ("lz4_f32", "lz4", "float32", (1000,)),
]

FILTERS = {"bslz4": dict(compression=32008, compression_opts=(0, 2)),
           "lz4": dict(compression=32004)}


def make_array(name, dtype, shape):
    rng = np.random.default_rng(sum(name.encode()))  # stable across runs
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if name.endswith("random"):
        a = rng.integers(0, 256, n)
    elif dt.kind == "c":
        a = rng.normal(0, 3, n).round(2) + 1j * rng.normal(0, 3, n).round(2)
    elif dt.kind == "f":
        a = np.sin(np.arange(n) / 7.0) * 100 + rng.normal(0, 1, n).round(1)
    else:  # detector-like counts: mostly small, a few hot pixels
        a = rng.poisson(3, n)
        a[rng.integers(0, n, max(1, n // 200))] = np.iinfo(dt).max // 3
        if dt.kind == "i":
            a = a - 2
    return np.ascontiguousarray(a.astype(dt).reshape(shape))


def h5_chunk(arr, codec, path):
    """The chunk the plugin writes for arr, after checking that the plugin
    also reads back a chunk encoded by beamd.proto (LZ4 output is not
    unique: the bitshuffle plugin bundles its own LZ4, so the bytes may
    differ from ours while both decode to the same array)."""
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=arr, chunks=arr.shape, **FILTERS[codec])
        mask, chunk = d.id.read_direct_chunk((0,) * arr.ndim)
        if mask != 0:
            raise SystemExit("filter was skipped for %s (mask %d)" % (path, mask))
        back = d[...]
        mine = proto.codec_encode(codec, arr.tobytes(), arr.dtype.itemsize)
        e = f.create_dataset("ours", shape=arr.shape, dtype=arr.dtype,
                             chunks=arr.shape, **FILTERS[codec])
        e.id.write_direct_chunk((0,) * arr.ndim, mine)
        ours = e[...]
    if not np.array_equal(back, arr):
        raise SystemExit("HDF5 round trip failed for " + path)
    if not np.array_equal(ours, arr):
        raise SystemExit("the HDF5 plugin misreads beamd.proto's %s chunk "
                         "for %s" % (codec, path))
    return chunk, mine == chunk


def write_parts(path, parts):
    with open(path, "wb") as f:
        for p in parts:
            f.write(struct.pack("<I", len(p)))
            f.write(p)


def write_fuzz_seeds(seeds):
    """Small valid messages, one per shape of message, for tests/fuzz."""
    os.makedirs(seeds, exist_ok=True)
    rng = np.random.default_rng(5)
    small = rng.poisson(2, (3, 13)).astype("uint16")
    common = dict(series_id=1, t_send_ns=0)
    cases = {
        "frame_raw": dict(type="FRAME", array=small, split=2),
        "frame_lz4": dict(type="FRAME", array=small.astype("float32"),
                          codec="lz4"),
        "frame_bslz4": dict(type="FRAME", array=small, codec="bslz4",
                            pos=(1e-6, 2e-6, 0.0)),
        "frame_bslz4_c128": dict(type="FRAME",
                                 array=small.astype("complex128")[:, :9],
                                 codec="bslz4"),
        "series_start": dict(type="SERIES_START", shape=(3, 13),
                             dtype="uint16", meta={"nframes": 2}),
        "series_end": dict(type="SERIES_END", flags=proto.FLAG_ABORTED),
        "result": dict(type="RESULT", array=np.arange(4.0), topic="g2.g2",
                       meta={"stage": "g2", "output": "g2"}),
        "corrupt": dict(type="FRAME", shape=(3, 13), dtype="uint16",
                        flags=proto.FLAG_CORRUPT),
    }
    for name, kw in cases.items():
        write_parts(os.path.join(seeds, name + ".parts"),
                    proto.encode_message(**dict(common, **kw)))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        HERE, "..", "tests", "golden")
    os.makedirs(out, exist_ok=True)
    manifest = {"chunks": {}, "messages": {}}
    arrays = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, codec, dtype, shape in CHUNKS:
            a = make_array(name, dtype, shape)
            arrays[name] = a
            chunk, same = h5_chunk(a, codec, os.path.join(tmp, name + ".h5"))
            with open(os.path.join(out, name + ".raw.bin"), "wb") as f:
                f.write(a.astype(a.dtype.newbyteorder("<")).tobytes())
            with open(os.path.join(out, name + ".chunk.bin"), "wb") as f:
                f.write(chunk)
            manifest["chunks"][name] = dict(codec=codec, dtype=dtype,
                                            shape=list(shape),
                                            same_bytes_as_beamd=same)

    u16 = arrays["bslz4_u16"]
    f32 = arrays["lz4_f32"]
    meta_series = {"detector": "sim-eiger", "frame_time": 0.001,
                   "energy": 12400.0, "distance": 5.0, "pixel_size": 7.5e-5,
                   "nframes": 3, "operator_note": "golden"}
    descr = {"stage": "g2", "output": "g2", "dtype": "float32",
             "shape": [1000], "units": "", "axes": ["tau"],
             "labels": ["roi0"]}
    common = dict(series_id=7, t_acq_ns=1700000000000000000,
                  t_send_ns=1700000000000500000)
    msgs = [
        ("msg_series_start", dict(type="SERIES_START", seq=10, frame_id=0,
                                  shape=u16.shape, dtype=u16.dtype,
                                  meta=meta_series), None),
        ("msg_frame_raw_u16", dict(type="FRAME", seq=11, frame_id=0,
                                   array=u16, codec="raw", split=2),
         "bslz4_u16"),
        ("msg_frame_bslz4_u16", dict(type="FRAME", seq=12, frame_id=1,
                                     array=u16, codec="bslz4",
                                     pos=(1.5e-6, -2.0e-6, 0.0)),
         "bslz4_u16"),
        ("msg_frame_corrupt", dict(type="FRAME", seq=13, frame_id=2,
                                   shape=u16.shape, dtype=u16.dtype,
                                   flags=proto.FLAG_CORRUPT), None),
        ("msg_result_lz4_f32", dict(type="RESULT", seq=14, frame_id=2,
                                    array=f32, codec="lz4", topic="g2.g2",
                                    stage_id=3, meta=descr,
                                    flags=proto.FLAG_FINAL), "lz4_f32"),
        ("msg_series_end", dict(type="SERIES_END", seq=15, frame_id=3),
         None),
    ]
    for name, kw, arr_name in msgs:
        kw = dict(common, **kw)
        parts = proto.encode_message(**kw)
        write_parts(os.path.join(out, name + ".parts"), parts)
        _, h, _, _ = proto.decode_message(parts)
        manifest["messages"][name] = dict(
            array=arr_name, topic=kw.get("topic"), type=h.type, flags=h.flags,
            series_id=h.series_id, frame_id=h.frame_id, seq=h.seq,
            dtype=h.dtype_name, shape=list(h.frame_shape), codec=h.codec_name,
            nparts=h.nparts, meta=kw.get("meta"),
            pos=list(h.pos) if kw.get("pos") else None)
    write_fuzz_seeds(os.path.join(HERE, "..", "tests", "fuzz", "seeds"))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote %d chunk cases and %d messages to %s"
          % (len(CHUNKS), len(msgs), os.path.normpath(out)))


if __name__ == "__main__":
    main()
