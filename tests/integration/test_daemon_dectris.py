"""End to end: a DECTRIS detector stream -> beamd (input.mode dectris) ->
stages -> HDF5 / results.

The detector side is written here in Python from the SIMPLON stream
specification (shared notes, detector-streams.md sections 1-3), not from
beamd's C code: JSON parts with the json module, CBOR with python3-cbor2,
bare LZ4 blocks with python3-lz4, the HDF5 bitshuffle framing with the
Debian bitshuffle module plus the 12-byte big-endian header, bitshuffle +
Zstandard with python3-zstandard over a numpy bit transpose. Frames come
back through the record stage (HDF5, read with h5py) and must be bit-exact;
every fault case must be counted with its own reason while the frames
around it go through.
"""

import hashlib
import json
import struct
import time

import bitshuffle
import cbor2
import h5py
import lz4.block
import numpy as np
import pytest
import zmq
import zstandard

from conftest import Receiver, make_config, proto

H, W = 48, 40  # H != W: a transposed shape cannot pass
SERIES = 6


# ---- the detector's encodings (from the specification) -------------------------------

def bs_header(arr, block_bytes=8192):
    return struct.pack(">QI", arr.nbytes, block_bytes)


def bslz4(arr):
    """bs<N>-lz4< / v2 bslz4: 12-byte header + bitshuffle's LZ4 blocks."""
    return bs_header(arr) + bitshuffle.compress_lz4(np.ascontiguousarray(arr), 0).tobytes()


def bitshuffle_block(block, es):
    """Bit transpose of one block (PROTOCOL.md 5.2): bit k of byte j of
    element i goes to bit i%8 of byte (8j+k)*m/8 + i//8."""
    m = block.size // es
    bits = np.unpackbits(block.reshape(m, es), axis=1, bitorder="little")  # [i][8j+k]
    return np.packbits(bits.T.reshape(-1, 8), axis=1, bitorder="little").tobytes()


def bszstd(arr):
    """Jungfraujoch bitshuffle + Zstandard: the bslz4 framing, zstd frames."""
    es = arr.dtype.itemsize
    raw = np.ascontiguousarray(arr).view(np.uint8).ravel()
    n = raw.size // es
    b = max(128, 8192 // es // 8 * 8)
    out = [bs_header(arr, b * es)]
    cctx = zstandard.ZstdCompressor()
    for i in range(0, n, b):
        cnt = min(b, n - i) // 8 * 8
        if not cnt:
            break
        blk = bitshuffle_block(raw[i * es:(i + cnt) * es], es)
        z = cctx.compress(blk)
        out.append(struct.pack(">I", len(z)) + z)
    tail = (n % 8) * es
    out.append(raw[raw.size - tail:].tobytes() if tail else b"")
    return b"".join(out)


def hdf5_lz4(arr):
    """v2 "lz4": HDF5 LZ4 framing; a block LZ4 cannot shrink is stored raw."""
    raw = np.ascontiguousarray(arr).tobytes()
    blk = 8192
    out = [struct.pack(">QI", len(raw), blk)]
    for off in range(0, len(raw), blk):
        chunk = raw[off:off + blk]
        c = lz4.block.compress(chunk, store_size=False)
        if len(c) >= len(chunk):
            c = chunk
        out.append(struct.pack(">I", len(c)) + c)
    return b"".join(out)


V1_ENC = {"raw": "<", "lz4": "lz4<", "bslz4": "bs%d-lz4<"}


def v1_blob(arr, enc):
    if enc == "raw":
        return arr.tobytes()
    if enc == "lz4":
        return lz4.block.compress(arr.tobytes(), store_size=False)
    return bslz4(arr)


def v1_config(n, **kw):
    c = {"x_pixels_in_detector": W, "y_pixels_in_detector": H, "nimages": n, "ntrigger": 1,
         "trigger_mode": "ints", "count_time": 0.0009, "frame_time": 0.001,
         "photon_energy": 12400.0, "wavelength": 0.99987, "x_pixel_size": 7.5e-05,
         "y_pixel_size": 7.5e-05, "beam_center_x": 20.5, "beam_center_y": 24.25,
         "detector_distance": 0.125, "bit_depth_image": 16, "bit_depth_readout": 12,
         "description": "Dectris EIGER 4M (simulated in tests)", "software_version": "1.6.6",
         "flatfield_correction_applied": False, "countrate_correction_count_cutoff": 65000}
    c.update(kw)
    return c


def v1_header(series, detail, n, mask=None, flat=None, appendix=None, **cfg):
    parts = [json.dumps({"htype": "dheader-1.0", "series": series, "header_detail": detail,
                         "acqID": "extra-key-ignored"}).encode()]
    if detail in ("basic", "all"):
        parts.append(json.dumps(v1_config(n, **cfg)).encode())
    if detail == "all":
        flat = np.ones((H, W), np.float32) if flat is None else flat
        mask = np.zeros((H, W), np.uint32) if mask is None else mask
        table = np.stack([np.arange(10, dtype=np.float32)] * 2, axis=1)  # C shape (10, 2)
        for htype, arr, t in (("dflatfield-1.0", flat, "float32"),
                              ("dpixelmask-1.0", mask, "uint32"),
                              ("dcountrate_table-1.0", table, "float32")):
            parts.append(json.dumps({"htype": htype, "shape": list(arr.shape[::-1]),
                                     "type": t}).encode())
            parts.append(arr.tobytes())
    if appendix is not None:
        parts.append(appendix)
    return parts


def v1_image(series, frame, arr, enc="bslz4", dtype=None, size=None, hash_=None,
             appendix=None, encoding=None):
    blob = v1_blob(arr, enc)
    e = encoding or (V1_ENC[enc] % (8 * arr.dtype.itemsize) if enc == "bslz4" else V1_ENC[enc])
    parts = [json.dumps({"htype": "dimage-1.0", "series": series, "frame": frame,
                         "hash": hash_ or hashlib.md5(blob).hexdigest()}).encode(),
             json.dumps({"htype": "dimage_d-1.0", "shape": [arr.shape[1], arr.shape[0]],
                         "type": dtype or str(arr.dtype), "encoding": e,
                         "size": len(blob) if size is None else size}).encode(),
             blob,
             json.dumps({"htype": "dconfig-1.0", "start_time": 200121 * frame,
                         "stop_time": 200121 * frame + 99251, "real_time": 99251}).encode()]
    if appendix is not None:
        parts.append(appendix)
    return parts


def v1_end(series):
    return [json.dumps({"htype": "dseries_end-1.0", "series": series}).encode()]


TYPED = {np.dtype(np.uint8): 64, np.dtype(np.uint16): 69, np.dtype(np.uint32): 70,
         np.dtype(np.int8): 72, np.dtype(np.int16): 77, np.dtype(np.int32): 78,
         np.dtype(np.float32): 85}


def v2_array(arr, enc):
    tag = TYPED[arr.dtype]
    if enc == "raw":
        inner = arr.tobytes()
    else:
        blob = {"bslz4": bslz4, "bszstd": bszstd, "lz4": hdf5_lz4}[enc](arr)
        mod = 0 if enc == "lz4" else arr.dtype.itemsize
        inner = cbor2.CBORTag(56500, [enc, mod, blob])
    return cbor2.CBORTag(40, [[arr.shape[0], arr.shape[1]], cbor2.CBORTag(tag, inner)])


def v2_msg(d):
    return [cbor2.dumps(cbor2.CBORTag(55799, d))]


def v2_start(series, n, channels=("threshold_1",), mask=None, jfj=False, dtype="uint16"):
    d = {"type": "start", "series_id": series, "series_unique_id": "01HBV3JPF9T4ZDPADX6EMK6XMZ",
         "arm_date": cbor2.CBORTag(0, "2026-12-02T06:00:00Z"), "beam_center_x": 20.5,
         "beam_center_y": 24.25, "channels": list(channels), "count_time": 0.004317,
         "countrate_correction_enabled": True, "detector_description": "EIGER2 Si 16M (test)",
         "detector_serial_number": "E-32-0000", "detector_translation": [0.0, 0.0, 0.125],
         "flatfield_enabled": True,
         "goniometer": {"omega": {"increment": 0.1, "start": 0.0}},
         "image_dtype": dtype, "image_size_x": W, "image_size_y": H,
         "incident_energy": 12400.0, "incident_wavelength": 0.99987,
         "number_of_images": n, "pixel_mask_enabled": True, "pixel_size_x": 7.5e-05,
         "pixel_size_y": 7.5e-05, "saturation_value": 65000, "sensor_material": "Si",
         "sensor_thickness": 0.00045, "frame_time": 0.005,
         "threshold_energy": {c: 6200.0 + 1000 * i for i, c in enumerate(channels)},
         "virtual_pixel_interpolation_enabled": False, "user_data": {"scan": "test"},
         "an_unknown_key": [1, 2, 3]}
    if mask is not None:
        d["pixel_mask"] = {c: v2_array(mask, "raw") for c in channels}
    if jfj:
        d.update({"detector_distance": 0.125, "error_value": -1, "magic_number": 9})
    return v2_msg(d)


def v2_image(series, image_id, arrays, enc="bslz4", channels=("threshold_1",)):
    d = {"type": "image", "series_id": series, "series_unique_id": "01HBV3JPF9T4ZDPADX6EMK6XMZ",
         "image_id": image_id, "real_time": [215873, 50000000],
         "series_date": cbor2.CBORTag(0, "2026-12-02T06:00:00Z"),
         "start_time": [250000 * image_id, 50000000],
         "stop_time": [250000 * image_id + 215873, 50000000],
         "data": {c: v2_array(a, enc) for c, a in zip(channels, arrays)},
         "user_data": None}
    return v2_msg(d)


def untag(msg):
    """A v2 message as a dict (cbor2 may or may not strip tag 55799)."""
    d = cbor2.loads(msg)
    return d.value if isinstance(d, cbor2.CBORTag) else d


def v2_end(series):
    return v2_msg({"type": "end", "series_id": series,
                   "series_unique_id": "01HBV3JPF9T4ZDPADX6EMK6XMZ"})


def frames(n, seed=1, dtype=np.uint16, top=4000):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, top, size=(H, W)).astype(dtype) for _ in range(n)]


# ---- the daemon side ---------------------------------------------------------------------

def dectris_config(ports, stages, **dx):
    cfg = make_config(ports, stages, mode="dectris", pool_frames=16, frame_bytes="1Mi")
    if dx:
        cfg["input"]["dectris"] = dx
    return cfg


def record_stage(tmp_path, compress="bslz4"):
    return {"name": "rec", "kind": "record", "input": "frames", "dir": str(tmp_path / "rec"),
            "compress": compress, "queue": 64}


class Detector:
    """The detector's PUSH (it binds; beamd connects)."""

    def __init__(self, zctx, endpoint):
        self.s = zctx.socket(zmq.PUSH)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.setsockopt(zmq.SNDTIMEO, 10000)
        self.s.bind(endpoint)

    def send(self, parts):
        self.s.send_multipart(parts)

    def close(self):
        self.s.close()


def dx_stats(b):
    return b.stats()["input"]["dectris"]


def recorded(tmp_path, series=SERIES, partial=False):
    """The record stage's file; a series with frames missing stays .partial."""
    name = "series_%d.h5%s" % (series, ".partial" if partial else "")
    path = tmp_path / "rec" / name
    deadline = time.monotonic() + 10  # the stage closes it after the series' end
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    if partial:
        time.sleep(0.2)  # a .partial file exists from the start: let the end reach it
    with h5py.File(str(path), "r") as f:
        return (f["/entry/data/data"][...], f["/entry/data/frame_id"][...].tolist(),
                dict(f["/series"].attrs), bool(f["/entry"].attrs["complete"]))


def wait_recorded(b, n, what="frames recorded"):
    return b.wait_stats(lambda s: any(st["name"] == "rec" and st["frames_in"] >= n
                                      for st in s["stages"]) and
                        not s["input"]["dectris"]["series_open"], timeout=15, what=what)


# ---- streams that must come through bit-exact --------------------------------------------

@pytest.mark.parametrize("detail", ["none", "basic", "all"])
@pytest.mark.parametrize("enc", ["raw", "lz4", "bslz4"])
def test_v1_stream_bit_exact(tmp_path, ports, zctx, start_beamd, detail, enc):
    n = 7
    data = frames(n)
    b = start_beamd(dectris_config(ports, [record_stage(tmp_path)], format="auto"))
    det = Detector(zctx, ports.ep_input)
    det.send(v1_header(SERIES, detail, n, appendix=b'{"acqID": "test_1"}'))
    for i, a in enumerate(data):
        det.send(v1_image(SERIES, i, a, enc, appendix=b'{"user": 1}' if i == 2 else None))
    det.send(v1_end(SERIES))
    st = wait_recorded(b, n)
    got, ids, attrs, complete = recorded(tmp_path)
    assert got.shape == (n, H, W) and got.dtype == np.uint16
    for i in range(n):
        assert np.array_equal(got[i], data[i]), "frame %d differs" % i
    assert ids == list(range(n)) and complete
    dx = st["input"]["dectris"]
    assert dx["v1_messages"] == n + 2 and dx["images"] == n and dx["starts"] == 1
    assert dx["missing"] == 0 and dx["incomplete"] == 0 and st["input"]["malformed"] == 0
    meta = json.loads(attrs["metadata_json"])
    if detail == "none":
        assert meta["nframes"] == 0 and "energy" not in meta
    else:
        # The detector config mapped to beamd's keys, and kept whole.
        assert meta["nframes"] == n and meta["energy"] == 12400.0
        assert meta["distance"] == 0.125 and meta["pixel_size"] == 7.5e-05
        assert meta["frame_time"] == 0.001 and meta["count_time"] == 0.0009
        assert meta["beam_center"] == [24.25, 20.5]  # [y, x]
        assert meta["dectris"]["config"]["software_version"] == "1.6.6"
    assert meta["dectris"]["header_detail"] == detail and meta["dectris"]["stream"] == 1


@pytest.mark.parametrize("enc", ["raw", "bslz4", "lz4", "bszstd"])
def test_v2_stream_bit_exact(tmp_path, ports, zctx, start_beamd, enc):
    n = 6
    chans = ("threshold_1", "threshold_2")
    one, two = frames(n, seed=1), frames(n, seed=2)
    b = start_beamd(dectris_config(ports, [record_stage(tmp_path)], channel="threshold_2"))
    det = Detector(zctx, ports.ep_input)
    det.send(v2_start(SERIES, n, chans))
    for i in range(n):
        det.send(v2_image(SERIES, i, [one[i], two[i]], enc, chans))
    det.send(v2_end(SERIES))
    st = wait_recorded(b, n)
    got, ids, attrs, complete = recorded(tmp_path)
    for i in range(n):
        assert np.array_equal(got[i], two[i]), "frame %d is not threshold_2's" % i
    assert ids == list(range(n)) and complete
    dx = st["input"]["dectris"]
    assert dx["v2_messages"] == n + 2 and dx["images"] == n and dx["missing"] == 0
    meta = json.loads(attrs["metadata_json"])
    assert meta["energy"] == 12400.0 and meta["nframes"] == n
    # series_date 2026-12-02T06:00:00Z + start_time 250000 * i / 50 MHz
    with h5py.File(str(tmp_path / "rec" / ("series_%d.h5" % SERIES)), "r") as f:
        t_acq = f["/entry/data/t_acq_ns"][...].tolist()
    assert t_acq == [1796191200 * 10**9 + 5000000 * i for i in range(n)], t_acq
    assert meta["dectris"]["channel"] == "threshold_2"
    assert meta["dectris"]["threshold_energy"] == 7200.0
    assert meta["dectris"]["series_unique_id"] == "01HBV3JPF9T4ZDPADX6EMK6XMZ"
    assert meta["dectris"]["config"]["goniometer"]["omega"]["increment"] == 0.1
    assert meta["dectris"]["config"]["user_data"] == {"scan": "test"}


def test_jungfraujoch_signed_pixels(tmp_path, ports, zctx, start_beamd):
    """JUNGFRAU data after pedestal subtraction: int32 with negative values,
    bitshuffle + Zstandard."""
    n = 4
    data = [a.astype(np.int32) - 2000 for a in frames(n)]
    b = start_beamd(dectris_config(ports, [record_stage(tmp_path, compress="none")]))
    det = Detector(zctx, ports.ep_input)
    det.send(v2_start(SERIES, n, jfj=True, dtype="int32"))
    for i in range(n):
        det.send(v2_image(SERIES, i, [data[i]], "bszstd"))
    det.send(v2_end(SERIES))
    wait_recorded(b, n)
    got, ids, _, complete = recorded(tmp_path)
    assert got.dtype == np.int32 and ids == list(range(n)) and complete
    for i in range(n):
        assert np.array_equal(got[i], data[i])


def test_v2_compressed_stays_compressed(tmp_path, ports, zctx, start_beamd):
    """bslz4 blobs reach the record stage as they came (stored without a
    decode), while a pixel stage beside it decodes its own copy."""
    n = 5
    data = frames(n)
    stages = [record_stage(tmp_path),
              {"name": "vd", "kind": "roi_sum", "input": "frames", "backend": "cpu",
               "rois": [{"name": "all", "shape": "rect", "rect": [0, 0, W, H]}]}]
    b = start_beamd(dectris_config(ports, stages))
    rx = Receiver(zctx, ports.ep_publish, topics=(b"vd.",))
    rx.wait_live()
    det = Detector(zctx, ports.ep_input)
    det.send(v2_start(SERIES, n))
    for i in range(n):
        det.send(v2_image(SERIES, i, [data[i]]))
    det.send(v2_end(SERIES))
    st = wait_recorded(b, n)
    rec = [s for s in st["stages"] if s["name"] == "rec"][0]
    assert rec.get("passthrough", 0) == n, rec
    sums = rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "vd.sums") >= n)
    got = sorted((m[1].frame_id, float(m[2].ravel()[0])) for m in sums if m[0] == "vd.sums")
    assert got == [(i, float(data[i].sum())) for i in range(n)]
    rx.close()


# ---- series arrays: the detector's pixel mask used by correct ------------------------------

@pytest.mark.parametrize("version", [1, 2])
def test_series_mask_reaches_correct(tmp_path, ports, zctx, start_beamd, version):
    n = 3
    data = frames(n, top=100)
    data[1][5, 7] = 65535  # a gap pixel as EIGER marks it
    mask = np.zeros((H, W), np.uint32)
    mask[3, 4] = 1   # gap
    mask[10, 11] = 4  # cold
    stages = [{"name": "corr", "kind": "correct", "input": "frames", "backend": "cpu",
               "mask": "series", "gap_value": "auto", "bad_value": -1}]
    b = start_beamd(dectris_config(ports, stages))
    rx = Receiver(zctx, ports.ep_publish, topics=(b"corr.",))
    rx.wait_live()
    det = Detector(zctx, ports.ep_input)
    if version == 1:
        det.send(v1_header(SERIES, "all", n, mask=mask))
        for i in range(n):
            det.send(v1_image(SERIES, i, data[i]))
        det.send(v1_end(SERIES))
    else:
        det.send(v2_start(SERIES, n, mask=mask))
        for i in range(n):
            det.send(v2_image(SERIES, i, [data[i]]))
        det.send(v2_end(SERIES))
    msgs = rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "corr.frame") >= n)
    out = {m[1].frame_id: m[2] for m in msgs if m[0] == "corr.frame"}
    for i in range(n):
        want = data[i].astype(np.float32)
        want[mask != 0] = -1
        want[data[i] == 65535] = -1
        assert np.array_equal(out[i], want), "frame %d" % i
    rx.close()


# ---- bad input: counted with its reason, the frames around it processed ---------------------

def test_v1_faults_counted(tmp_path, ports, zctx, start_beamd):
    n = 12
    data = frames(n)
    b = start_beamd(dectris_config(ports, [record_stage(tmp_path)], verify_hash=True))
    det = Detector(zctx, ports.ep_input)
    det.send(v1_image(SERIES, 0, data[0]))                     # image before any header
    det.send(v1_header(SERIES, "basic", n))
    det.send(v1_image(SERIES - 1, 3, data[0]))                 # stale series (older arm)
    det.send([b"\x00not json", b"", b"", b""])                 # non-JSON where JSON is due
    for i in range(n):
        if i == 4:
            continue                                             # frame-number gap
        if i == 2:
            det.send(v1_image(SERIES, i, data[i])[:2])           # truncated multipart
            continue
        if i == 6:
            det.send(v1_image(SERIES, i, data[i], size=17))      # size != blob
            continue
        if i == 7:
            det.send(v1_image(SERIES, i, data[i], encoding="bs16<"))  # unknown encoding
            continue
        if i == 8:
            det.send(v1_image(SERIES, i, data[i], dtype="float64"))    # unknown dtype
            continue
        if i == 9:
            det.send(v1_image(SERIES, i, data[i], hash_="0" * 32))     # hash mismatch
            continue
        det.send(v1_image(SERIES, i, data[i]))
    det.send(v1_end(SERIES))
    st = wait_recorded(b, 6)
    dx = st["input"]["dectris"]
    assert dx["before_header"] == 1 and dx["stale"] == 1, dx
    assert dx["unsupported"] == 2 and dx["size_mismatch"] == 1 and dx["hash_mismatch"] == 1, dx
    assert st["input"]["malformed"] == 2, st["input"]  # non-JSON, truncated
    # Frames 2, 4, 6, 7, 8 and 9 never came as usable frames.
    assert dx["gaps"] == 3 and dx["missing"] == 6 and dx["incomplete"] == 1, dx
    assert st["input"]["missing"] == 6 and st["input"]["corrupt"] == 0
    got, ids, _, complete = recorded(tmp_path, partial=True)
    assert not complete
    good = [0, 1, 3, 5, 10, 11]
    for i in good:
        assert np.array_equal(got[ids.index(i)], data[i]), "frame %d" % i
    assert b.alive()


def test_v1_series_end_incomplete_flag(tmp_path, ports, zctx, start_beamd):
    """A series that ends short of nimages: SERIES_END says INCOMPLETE."""
    n = 5
    data = frames(n)
    b = start_beamd(dectris_config(ports, [record_stage(tmp_path)]))
    rx = Receiver(zctx, ports.ep_publish, topics=(b"beamd.series",))
    rx.wait_live()
    det = Detector(zctx, ports.ep_input)
    det.send(v1_header(SERIES, "basic", n))
    for i in range(3):
        det.send(v1_image(SERIES, i, data[i]))
    det.send(v1_end(SERIES))
    end = rx.wait_series_end(SERIES)
    assert end[1].flags & proto.FLAG_INCOMPLETE, end[1].flags
    assert not end[1].flags & proto.FLAG_ABORTED
    assert b.stats()["input"]["missing"] == 2
    rx.close()


def test_v2_faults_counted(tmp_path, ports, zctx, start_beamd):
    n = 10
    data = frames(n)
    b = start_beamd(dectris_config(ports, [record_stage(tmp_path)]))
    det = Detector(zctx, ports.ep_input)
    det.send(v2_start(SERIES, n, jfj=True))
    det.send(v2_msg({"type": "calibration", "series_id": SERIES}))  # Jungfraujoch: skipped
    for i in range(n):
        good = v2_image(SERIES, i, [data[i]])
        if i == 1:
            det.send([good[0][3:]])                                   # no self-describe tag
        elif i == 2:
            d = untag(good[0])
            det.send([cbor2.dumps(cbor2.CBORTag(55799, dict(reversed(list(d.items())))))])
        elif i == 3:
            d = untag(good[0])                            # tag 40 missing
            d["data"]["threshold_1"] = d["data"]["threshold_1"].value[1]
            det.send(v2_msg(d))
        elif i == 4:
            d = untag(good[0])                            # dims x elem != size
            d["data"]["threshold_1"] = cbor2.CBORTag(40, [[H, W],
                                                         cbor2.CBORTag(69, data[i].tobytes()[:-2])])
            det.send(v2_msg(d))
        elif i == 5:
            d = untag(good[0])                            # compressed blob < 12 bytes
            d["data"]["threshold_1"] = cbor2.CBORTag(40, [[H, W], cbor2.CBORTag(
                69, cbor2.CBORTag(56500, ["bslz4", 2, b"\0" * 11]))])
            det.send(v2_msg(d))
        elif i == 6:
            d = untag(good[0])                            # unknown algorithm
            d["data"]["threshold_1"].value[1].value.value[0] = "bsxz"
            det.send(v2_msg(d))
        else:
            det.send(good)
    det.send(v2_end(SERIES))
    st = wait_recorded(b, 4)
    dx = st["input"]["dectris"]
    assert dx["other"] == 1, dx
    assert dx["unsupported"] == 1 and dx["size_mismatch"] == 2, dx
    assert st["input"]["malformed"] == 3, st["input"]  # no tag, type not first, nesting
    assert dx["missing"] == 6 and dx["incomplete"] == 1, dx
    got, ids, attrs, _ = recorded(tmp_path, partial=True)
    assert ids == [0, 7, 8, 9]
    for i in ids:
        assert np.array_equal(got[ids.index(i)], data[i])
    meta = json.loads(attrs["metadata_json"])
    assert meta["distance"] == 0.125 and meta["dectris"]["error_value"] == -1
    assert b.alive()


def test_unknown_channel_counted(tmp_path, ports, zctx, start_beamd):
    b = start_beamd(dectris_config(ports, [record_stage(tmp_path)], channel="threshold_9"))
    det = Detector(zctx, ports.ep_input)
    det.send(v2_start(SERIES, 2))
    for i, a in enumerate(frames(2)):
        det.send(v2_image(SERIES, i, [a]))
    det.send(v2_end(SERIES))
    st = b.wait_stats(lambda s: s["input"]["dectris"]["ends"] == 1, what="end of series")
    assert st["input"]["dectris"]["no_channel"] == 3  # the start and both images
    assert st["input"]["frames"] == 0
    assert "threshold_9" in b.stderr()


def test_garbage_survived(tmp_path, ports, zctx, start_beamd):
    """Neither JSON nor CBOR, and CBOR of two parts: counted, then a good
    series still goes through."""
    b = start_beamd(dectris_config(ports, [record_stage(tmp_path)]))
    det = Detector(zctx, ports.ep_input)
    det.send([b"\x01\x02garbage"])
    det.send(v2_end(SERIES) + [b"x"])
    data = frames(2)
    det.send(v2_start(SERIES, 2))
    for i in range(2):
        det.send(v2_image(SERIES, i, [data[i]]))
    det.send(v2_end(SERIES))
    st = wait_recorded(b, 2)
    assert st["input"]["malformed"] == 2
    got, ids, _, _ = recorded(tmp_path)
    assert ids == [0, 1] and np.array_equal(got[1], data[1])


# ---- beamd-sim's faithful streams, end to end ------------------------------------------

SIM_FAULTS = {
    "dectris1": "nonjson,truncated,image-before-header,size,encoding,dtype,hash,stale,gap",
    "dectris2": "nosig,typenotfirst,nesting,dims,short,algorithm,stale,gap",
}


def counter_frame(f, h, w):
    """beamd-sim's counter pattern: pixel i (C order) of image f is (f + i) mod 2^16."""
    return ((f % 65536 + np.arange(h * w, dtype=np.int64)) % 65536).astype(np.uint16).reshape(h, w)


@pytest.mark.parametrize("protocol,encoding,detail", [
    ("dectris1", "bslz4", "all"), ("dectris1", "lz4", "basic"), ("dectris1", "raw", "none"),
    ("dectris2", "bslz4", "all"), ("dectris2", "lz4", "basic"), ("dectris2", "bszstd", "basic"),
    ("dectris2", "raw", "basic")])
def test_sim_stream_through_daemon(tmp_path, ports, start_beamd, run_tool, protocol, encoding,
                                   detail):
    """beamd-sim's stream with every fault of its protocol, twice (two
    series): each fault counted once per series under its own reason, every
    other frame recorded bit-exact, the gap reported as missing."""
    h, w, n, nser = 24, 20, 8, 2
    stages = [dict(record_stage(tmp_path), input="frames")]
    b = start_beamd(dectris_config(ports, stages, verify_hash=True))
    sim = run_tool("beamd-sim", ["--protocol", protocol, "--bind", ports.ep_input,
                                 "--shape", "%dx%d" % (h, w), "--frames", str(n),
                                 "--series", str(nser), "--series-id", "3", "--pattern", "counter",
                                 "--encoding", encoding, "--header-detail", detail,
                                 "--fault", SIM_FAULTS[protocol]] +
                   (["--channels", "2"] if protocol == "dectris2" else []))
    assert sim.wait(30) == 0, sim.stderr()
    summary = json.loads([ln for ln in sim.stderr().splitlines() if ln.startswith("{")][-1])
    st = b.wait_stats(lambda s: s["input"]["dectris"]["ends"] == nser and
                      not s["input"]["dectris"]["series_open"], timeout=15, what="both series")
    dx, inp = st["input"]["dectris"], st["input"]
    m = n // 2
    faults = summary["faults"]
    assert all(faults[k] == nser for k in SIM_FAULTS[protocol].split(",")), summary
    if protocol == "dectris1":
        assert dx["before_header"] == nser and dx["size_mismatch"] == nser, dx
        assert dx["unsupported"] == 2 * nser and dx["hash_mismatch"] == nser, dx
        assert inp["malformed"] == 2 * nser, inp  # nonjson, truncated
    else:
        # nosig, typenotfirst, nesting: malformed; dims, short: sizes; algorithm: unsupported
        assert inp["malformed"] == 3 * nser and dx["size_mismatch"] == 2 * nser, (inp, dx)
        assert dx["unsupported"] == nser, dx
    assert dx["stale"] == nser and dx["missing"] == nser and dx["incomplete"] == nser, dx
    assert inp["frames"] == nser * (n - 1) and inp["missing"] == nser
    for sid in (3, 4):
        got, ids, attrs, complete = recorded(tmp_path, sid, partial=True)
        assert ids == [i for i in range(n) if i != m] and not complete
        for k, i in enumerate(ids):
            assert np.array_equal(got[k], counter_frame(i, h, w)), "series %d frame %d" % (sid, i)
        meta = json.loads(attrs["metadata_json"])
        if detail != "none" or protocol == "dectris2":
            assert meta["energy"] == 12000.0 and meta["distance"] == 0.2
            assert meta["nframes"] == n and meta["pixel_size"] == 75e-6
        assert meta["dectris"]["stream"] == int(protocol[-1])
    assert b.alive()


# ---- Jungfraujoch: one image stream split over several PUSH sockets ----------------------

def split_config(ports, stages, extra_eps, **dx):
    cfg = dectris_config(ports, stages, endpoints=extra_eps, **dx)
    return cfg


def test_split_stream_merged_in_order(tmp_path, ports, zctx, start_beamd):
    """Images 0-3 and 8-11 on one socket, 4-7 on another (file by file),
    the second socket's sent first: beamd holds them back and lets every
    image in by id, none missing; start and end come on both sockets."""
    from conftest import free_ports
    n = 12
    data = frames(n)
    ep2 = "tcp://127.0.0.1:%d" % free_ports(1)[0]
    b = start_beamd(split_config(ports, [record_stage(tmp_path)], [ep2], merge_wait="5s"))
    a, c = Detector(zctx, ports.ep_input), Detector(zctx, ep2)
    for det in (a, c):
        det.send(v2_start(SERIES, n, jfj=True))
    for i in range(4, 8):
        c.send(v2_image(SERIES, i, [data[i]], "bszstd"))
    c.send(v2_end(SERIES))
    time.sleep(0.3)  # beamd holds image 4 and reads no further from that socket
    assert b.stats()["input"]["frames"] == 0
    for i in list(range(0, 4)) + list(range(8, 12)):
        a.send(v2_image(SERIES, i, [data[i]], "bszstd"))
    a.send(v2_end(SERIES))
    st = wait_recorded(b, n)
    got, ids, _, complete = recorded(tmp_path)
    assert ids == list(range(n)) and complete
    for i in range(n):
        assert np.array_equal(got[i], data[i]), "frame %d" % i
    dx = st["input"]["dectris"]
    assert dx["sockets"] == 2 and dx["missing"] == 0 and dx["merge_held"] >= 1, dx
    assert dx["starts"] == 1 and dx["ends"] == 2 and dx["merge_timeouts"] == 0, dx


def test_split_stream_lost_image_times_out(tmp_path, ports, zctx, start_beamd):
    """An image that never comes (a Jungfraujoch writer dropped it): after
    merge_wait the next one is taken, the lost one counted as missing."""
    from conftest import free_ports
    n = 6
    data = frames(n)
    ep2 = "tcp://127.0.0.1:%d" % free_ports(1)[0]
    b = start_beamd(split_config(ports, [record_stage(tmp_path)], [ep2], merge_wait="100ms"))
    a, c = Detector(zctx, ports.ep_input), Detector(zctx, ep2)
    for det in (a, c):
        det.send(v2_start(SERIES, n))
    for i in (0, 1, 2):
        a.send(v2_image(SERIES, i, [data[i]]))
    for i in (4, 5):  # image 3 is lost
        c.send(v2_image(SERIES, i, [data[i]]))
    st = b.wait_stats(lambda s: s["input"]["frames"] == 5, timeout=10, what="5 frames")
    for det in (a, c):
        det.send(v2_end(SERIES))
    st = wait_recorded(b, 5)
    dx = st["input"]["dectris"]
    assert dx["missing"] == 1 and dx["merge_timeouts"] >= 1 and dx["incomplete"] == 1, dx
    got, ids, _, _ = recorded(tmp_path, partial=True)
    assert ids == [0, 1, 2, 4, 5]
