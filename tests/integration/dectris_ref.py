"""Reference decoder of the DECTRIS SIMPLON detector streams, v1 and v2.

Written from the specification in shared/notes/detector-streams.md
(sections 1, 2.1-2.5 and 3) and the bit-transpose rule of
proto/PROTOCOL.md section 5.2, not from any C code in this repository, so
that tests can hold beamd-sim's emitters (tools/beamd-sim/dectris.c) and
beamd's own decoders (proto/dectris.h) against something independent.
It uses only Debian's python3 modules: json, hashlib, numpy, lz4.block,
cbor2, zstandard and bitshuffle.

Not fast and not lenient: every check the notes name is made, and the
first failure raises DectrisError whose `kind` says which (the kinds match
beamd-sim's --fault names where one exists). It is a test oracle, not a
receiver for real data rates.

API (every function is pure; nothing here opens a socket):

  decode_v1(parts)      one v1 multipart message (list of bytes) -> dict
                        {"kind": "start"|"image"|"end", ...}
  decode_v2(buf)        one v2 message (bytes) -> dict
                        {"kind": "start"|"image"|"end"|"other", ...}
  Stream("dectris1"|"dectris2")
      .feed(msg)        decodes one message (parts list for v1, bytes or a
                        one-part list for v2), tracks series state and
                        returns the decoded dict, or None when it was
                        rejected; rejections and stream anomalies
                        (image-before-header, stale, gap) are appended to
                        .events as {"kind", "index", "detail", ...}.
      .series           list of Series, in arrival order.
  decode_stream(protocol, messages) -> Stream, fed with every message.

  decode_bs_framing(blob, itemsize, inner="lz4"|"zstd") -> bytes
                        the shared 12-byte-header bitshuffle framing (2.4),
                        decoded with bitunshuffle() below.
  decode_bslz4_module(blob, dtype, n) -> numpy array, through Debian's
                        bitshuffle module (the independent cross-check).
  decode_lz4_framing(blob) -> bytes       v2 "lz4" (HDF5 LZ4 32004 framing)
  bitunshuffle(block, m, itemsize) -> bytes  one block's inverse transpose.

Images come back as numpy arrays of shape (H, W) = (y, x) in the dtype
sent: v1's dimage_d shape is [x, y] (fast axis first) and is reversed; v2's
MultiDimArray dims are [rows, cols] = [y, x] and are taken as they are.
"""

import hashlib
import json
import re
import struct
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Optional

import bitshuffle
import cbor2
import lz4.block
import numpy as np
import zstandard


class DectrisError(ValueError):
    """A message the spec says to reject. kind is a short code: v1
    nonjson, truncated, parts, htype, size, encoding, dtype, hash, shape,
    field; v2 nosig, cbor, typenotfirst, type, nesting, dims, short,
    algorithm, tag, rational, date, field; framing (a bad compressed blob
    in either)."""

    def __init__(self, kind, detail):
        super().__init__("%s: %s" % (kind, detail))
        self.kind = kind
        self.detail = detail


DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32}

# ---- blob framings (notes 2.4, PROTOCOL.md 5.2) ------------------------------


def _be64(b, off=0):
    return struct.unpack_from(">Q", b, off)[0]


def _be32(b, off=0):
    return struct.unpack_from(">I", b, off)[0]


def bitunshuffle(block, m, itemsize):
    """Inverse of bitshuffle's bit transpose of one block of m elements
    (m a multiple of 8). PROTOCOL.md 5.2: bit k (LSB = 0) of byte j of
    element i is stored at bit (i mod 8) of byte (8j + k) * m/8 + i // 8."""
    if m % 8:
        raise DectrisError("framing", "bit-transposed block of %d elements" % m)
    a = np.frombuffer(block, np.uint8)
    if a.size != m * itemsize:
        raise DectrisError("framing", "block of %d bytes, expected %d" % (a.size, m * itemsize))
    rows = a.reshape(8 * itemsize, m // 8)                 # row r = 8j + k
    bits = np.unpackbits(rows, axis=1, bitorder="little")  # [r, i] = that bit of element i
    out = np.packbits(np.ascontiguousarray(bits.T), axis=1, bitorder="little")  # [i, j]
    return out.tobytes()


def decode_bs_framing(blob, itemsize, inner="lz4"):
    """Bitshuffle framing: u64 BE orig_size, u32 BE block size in bytes,
    blocks of (u32 BE length, compressed bit-transposed block), then the
    last orig/itemsize mod 8 elements raw. Returns the orig_size bytes."""
    blob = bytes(blob)
    if len(blob) < 12:
        raise DectrisError("short", "compressed blob of %d bytes (< 12)" % len(blob))
    orig, bsize = _be64(blob), _be32(blob, 8)
    if orig % itemsize:
        raise DectrisError("framing", "orig_size %d not a multiple of %d" % (orig, itemsize))
    if bsize == 0 or bsize % (8 * itemsize):
        raise DectrisError("framing", "block size %d not a multiple of 8 elements" % bsize)
    n, b = orig // itemsize, bsize // itemsize
    out, pos, i = [], 12, 0
    zd = zstandard.ZstdDecompressor() if inner == "zstd" else None
    while i < n:
        cnt = min(b, n - i)
        cnt -= cnt % 8
        if cnt == 0:
            break
        if pos + 4 > len(blob):
            raise DectrisError("framing", "truncated block header at %d" % pos)
        clen = _be32(blob, pos)
        pos += 4
        if pos + clen > len(blob):
            raise DectrisError("framing", "block of %d bytes runs past the blob" % clen)
        chunk = blob[pos:pos + clen]
        pos += clen
        try:
            if zd is not None:
                raw = zd.decompress(chunk, max_output_size=cnt * itemsize)
            else:
                raw = lz4.block.decompress(chunk, uncompressed_size=cnt * itemsize)
        except Exception as e:  # lz4 / zstd errors have no common base
            raise DectrisError("framing", "corrupt block: %s" % e)
        if len(raw) != cnt * itemsize:
            raise DectrisError("framing", "block decodes to %d bytes" % len(raw))
        out.append(bitunshuffle(raw, cnt, itemsize))
        i += cnt
    tail = (n - i) * itemsize
    if pos + tail != len(blob):
        raise DectrisError("framing", "%d bytes after the blocks, expected %d raw"
                           % (len(blob) - pos, tail))
    out.append(blob[pos:])
    return b"".join(out)


def decode_bslz4_module(blob, dtype, n):
    """The same bslz4 blob through Debian's bitshuffle module: skip the 12
    header bytes and hand it the block size in elements."""
    dt = np.dtype(dtype)
    if len(blob) < 12:
        raise DectrisError("short", "compressed blob of %d bytes (< 12)" % len(blob))
    if _be64(blob) != n * dt.itemsize:
        raise DectrisError("dims", "orig_size %d != %d elements x %d"
                           % (_be64(blob), n, dt.itemsize))
    bs = _be32(blob, 8) // dt.itemsize
    return bitshuffle.decompress_lz4(np.frombuffer(blob[12:], np.uint8), (n,), dt, bs)


def decode_lz4_framing(blob):
    """v2 "lz4" (HDF5 LZ4 filter 32004): u64 BE orig_size, u32 BE block
    size, blocks of (u32 BE length, data); a block whose stored length
    equals its own length is raw, otherwise one LZ4 block."""
    blob = bytes(blob)
    if len(blob) < 12:
        raise DectrisError("short", "compressed blob of %d bytes (< 12)" % len(blob))
    orig, bsize = _be64(blob), _be32(blob, 8)
    if bsize == 0 and orig:
        raise DectrisError("framing", "block size 0")
    out, pos, off = [], 12, 0
    while off < orig:
        want = min(bsize, orig - off)
        if pos + 4 > len(blob):
            raise DectrisError("framing", "truncated block header")
        clen = _be32(blob, pos)
        pos += 4
        if pos + clen > len(blob) or clen > want:
            raise DectrisError("framing", "bad block length %d" % clen)
        chunk = blob[pos:pos + clen]
        pos += clen
        if clen == want:
            out.append(chunk)
        else:
            try:
                out.append(lz4.block.decompress(chunk, uncompressed_size=want))
            except Exception as e:
                raise DectrisError("framing", "corrupt lz4 block: %s" % e)
        off += want
    if pos != len(blob):
        raise DectrisError("framing", "trailing bytes after the last block")
    return b"".join(out)


def lz4_framing_blocks(blob):
    """(block size, [stored length of each block]) of a 32004 blob, so a
    test can see raw-stored blocks."""
    orig, bsize = _be64(blob), _be32(blob, 8)
    pos, off, lens = 12, 0, []
    while off < orig:
        lens.append(_be32(blob, pos))
        pos += 4 + lens[-1]
        off += min(bsize, orig - off)
    return bsize, lens


# ---- stream v1 (notes section 1) ----------------------------------------------

# Config keys beamd-sim promises (the notes' table plus what LiberTEM reads)
# and their JSON types. bool before int: bool is an int in Python.
V1_CONFIG_TYPES = {
    "x_pixels_in_detector": int, "y_pixels_in_detector": int, "nimages": int,
    "ntrigger": int, "trigger_mode": str, "count_time": float, "frame_time": float,
    "photon_energy": float, "threshold_energy": float, "wavelength": float,
    "x_pixel_size": float, "y_pixel_size": float, "beam_center_x": float,
    "beam_center_y": float, "detector_distance": float, "bit_depth_image": int,
    "bit_depth_readout": int, "description": str, "detector_number": str,
    "software_version": str, "data_collection_date": str, "nframes_sum": int,
    "countrate_correction_applied": bool, "flatfield_correction_applied": bool,
    "pixel_mask_applied": bool, "virtual_pixel_correction_applied": bool,
    "efficiency_correction_applied": bool, "countrate_correction_count_cutoff": int,
    "omega_start": float, "omega_increment": float, "phi_start": float,
    "phi_increment": float, "chi_start": float, "chi_increment": float,
    "kappa_start": float, "kappa_increment": float, "two_theta_start": float,
    "two_theta_increment": float, "sensor_material": str, "sensor_thickness": float,
}

_V1_ENCODING = re.compile(r"^(?:bs(8|16|32)-)?(lz4)?([<>])$")


def _json_part(parts, i, what):
    try:
        v = json.loads(bytes(parts[i]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise DectrisError("nonjson", "part %d (%s) is not JSON: %s" % (i + 1, what, e))
    if not isinstance(v, dict):
        raise DectrisError("nonjson", "part %d (%s) is not a JSON object" % (i + 1, what))
    return v


def _typed(d, k, t, kind="field", lenient=False):
    """d[k] has type t: int means a non-negative integer (the specs' uint),
    float a real; lenient lets a JSON integer stand for a real (v1 JSON
    makes no difference between 1 and 1.0; CBOR does, and v2 is strict)."""
    v = d.get(k)
    if t is bool:
        ok = type(v) is bool
    elif t is int:
        ok = type(v) is int and v >= 0
    elif t is float:
        ok = type(v) is float or (lenient and type(v) is int)
    else:
        ok = isinstance(v, t)
    if not ok:
        raise DectrisError(kind, "%s: %r is not %s" % (k, v, t.__name__))
    return v


def _shape_xy(d, what):
    s = d.get("shape")
    if not (isinstance(s, list) and len(s) == 2 and all(type(v) is int and v > 0 for v in s)):
        raise DectrisError("shape", "%s shape %r is not [x, y]" % (what, s))
    return s


def _v1_array(parts, i, htype, want_type):
    """One header array: a JSON part with htype/shape/type, then the raw
    little-endian array, returned as (y, x)."""
    j = _json_part(parts, i, htype)
    if j.get("htype") != htype:
        raise DectrisError("htype", "part %d: htype %r, expected %r" % (i + 1, j.get("htype"), htype))
    x, y = _shape_xy(j, htype)
    t = j.get("type")
    if t != want_type:
        raise DectrisError("dtype", "%s type %r, expected %r" % (htype, t, want_type))
    dt = np.dtype(t).newbyteorder("<")
    blob = bytes(parts[i + 1])
    if len(blob) != x * y * dt.itemsize:
        raise DectrisError("size", "%s blob of %d bytes for shape [%d, %d]" % (htype, len(blob), x, y))
    return j, np.frombuffer(blob, dt).reshape(y, x)


def _v1_pixels(blob, enc, dtname, x, y):
    m = _V1_ENCODING.match(enc) if isinstance(enc, str) else None
    if dtname not in DTYPES:
        raise DectrisError("dtype", "unknown type %r" % (dtname,))
    dt = np.dtype(DTYPES[dtname])
    if not m:
        raise DectrisError("encoding", "unknown encoding %r" % (enc,))
    bits, lz, order = m.groups()
    dt = dt.newbyteorder(order)
    n = x * y
    if bits and not lz:
        raise DectrisError("encoding", "bitshuffle without lz4 (%r) is not a detector encoding" % enc)
    if bits and int(bits) != 8 * dt.itemsize:
        raise DectrisError("encoding", "%r for %s pixels" % (enc, dtname))
    if bits:
        if order != "<":
            raise DectrisError("encoding", "big-endian bitshuffle %r" % enc)
        raw = decode_bs_framing(blob, dt.itemsize, "lz4")
        if len(raw) != n * dt.itemsize:
            raise DectrisError("size", "bitshuffle orig_size %d for shape [%d, %d]" % (len(raw), x, y))
    elif lz:
        try:  # one bare LZ4 block of exactly x * y * bytes
            raw = lz4.block.decompress(blob, uncompressed_size=n * dt.itemsize)
        except Exception as e:
            raise DectrisError("framing", "lz4< block: %s" % e)
    else:
        raw = blob
    if len(raw) != n * dt.itemsize:
        raise DectrisError("size", "%d pixel bytes for shape [%d, %d] %s" % (len(raw), x, y, dtname))
    return np.frombuffer(raw, dt).astype(dt.newbyteorder("=")).reshape(y, x)


def decode_v1(parts):
    """Decodes one v1 message (a list of the multipart's parts).

    start: {"kind": "start", "series", "header_detail", "header" (dheader
      dict), "config" (dict or None), "flatfield"/"pixel_mask"/
      "countrate_table" (arrays, header_detail all; (y, x), the table as
      sent [2, 4000] -> (4000, 2)), "arrays" (their JSON parts), "appendix"
      (bytes or None), "nparts"}
    image: {"kind": "image", "series", "frame", "hash", "dimage",
      "dimage_d", "dconfig" (dicts), "blob" (bytes), "data" ((y, x)
      array), "appendix", "nparts"}
    end: {"kind": "end", "series", "footer", "nparts"}
    """
    parts = [bytes(p) for p in parts]
    if not parts:
        raise DectrisError("truncated", "empty message")
    h = _json_part(parts, 0, "first part")
    ht = h.get("htype")
    if ht == "dheader-1.0":
        sid = _typed(h, "series", int)
        detail = h.get("header_detail")
        fixed = {"none": 1, "basic": 2, "all": 8}.get(detail)
        if fixed is None:
            raise DectrisError("field", "header_detail %r" % (detail,))
        if len(parts) < fixed:
            raise DectrisError("truncated", "%s header of %d parts (< %d)" % (detail, len(parts), fixed))
        if len(parts) > fixed + 1:
            raise DectrisError("parts", "%s header of %d parts (> %d)" % (detail, len(parts), fixed + 1))
        r = {"kind": "start", "series": sid, "header_detail": detail, "header": h,
             "config": None, "arrays": {}, "appendix": parts[fixed] if len(parts) > fixed else None,
             "nparts": len(parts)}
        if fixed >= 2:
            cfg = _json_part(parts, 1, "config")
            for k, t in V1_CONFIG_TYPES.items():
                if k in cfg:
                    _typed(cfg, k, t, lenient=True)
            r["config"] = cfg
        if fixed == 8:
            for i, (name, htype, t) in enumerate((("flatfield", "dflatfield-1.0", "float32"),
                                                  ("pixel_mask", "dpixelmask-1.0", "uint32"),
                                                  ("countrate_table", "dcountrate_table-1.0", "float32"))):
                j, a = _v1_array(parts, 2 + 2 * i, htype, t)
                r["arrays"][name] = j
                r[name] = a
        return r
    if ht == "dimage-1.0":
        sid = _typed(h, "series", int)
        frame = _typed(h, "frame", int)
        hsh = h.get("hash")
        if not (isinstance(hsh, str) and re.fullmatch(r"[0-9a-f]{32}", hsh)):
            raise DectrisError("field", "hash %r is not 32 hex digits" % (hsh,))
        if len(parts) < 4:
            raise DectrisError("truncated", "image of %d parts (< 4)" % len(parts))
        if len(parts) > 5:
            raise DectrisError("parts", "image of %d parts (> 5)" % len(parts))
        dd = _json_part(parts, 1, "dimage_d")
        if dd.get("htype") != "dimage_d-1.0":
            raise DectrisError("htype", "part 2 htype %r" % (dd.get("htype"),))
        x, y = _shape_xy(dd, "dimage_d")
        blob = parts[2]
        size = dd.get("size")
        if type(size) is not int or size != len(blob):
            raise DectrisError("size", "dimage_d size %r, blob of %d bytes" % (size, len(blob)))
        if hashlib.md5(blob).hexdigest() != hsh:
            raise DectrisError("hash", "md5 of the blob is %s, dimage says %s"
                               % (hashlib.md5(blob).hexdigest(), hsh))
        data = _v1_pixels(blob, dd.get("encoding"), dd.get("type"), x, y)
        dc = _json_part(parts, 3, "dconfig")
        if dc.get("htype") != "dconfig-1.0":
            raise DectrisError("htype", "part 4 htype %r" % (dc.get("htype"),))
        for k in ("start_time", "stop_time", "real_time"):
            _typed(dc, k, int)
        return {"kind": "image", "series": sid, "frame": frame, "hash": hsh, "dimage": h,
                "dimage_d": dd, "dconfig": dc, "blob": blob, "data": data,
                "appendix": parts[4] if len(parts) == 5 else None, "nparts": len(parts)}
    if isinstance(ht, str) and ht.startswith("dseries_end"):
        if ht != "dseries_end-1.0":
            raise DectrisError("htype", "end htype %r" % ht)
        if len(parts) != 1:
            raise DectrisError("parts", "dseries_end of %d parts" % len(parts))
        return {"kind": "end", "series": _typed(h, "series", int), "footer": h, "nparts": 1}
    raise DectrisError("htype", "unknown htype %r" % (ht,))


# ---- stream v2 (notes sections 2 and 3) -----------------------------------------

SIGNATURE = b"\xd9\xd9\xf7"
DATETIME = object()  # marker: tag 0 text, decoded by cbor2 to a datetime

# The start table of notes 2.2 (Jungfraujoch's extras from section 3).
V2_START_TYPES = {
    "type": str, "series_unique_id": str, "detector_description": str,
    "detector_serial_number": str, "sensor_material": str, "image_dtype": str,
    "series_id": int, "image_size_x": int, "image_size_y": int, "number_of_images": int,
    "saturation_value": int, "beam_center_x": float, "beam_center_y": float,
    "count_time": float, "frame_time": float, "incident_energy": float,
    "incident_wavelength": float, "pixel_size_x": float, "pixel_size_y": float,
    "sensor_thickness": float, "countrate_correction_enabled": bool,
    "flatfield_enabled": bool, "pixel_mask_enabled": bool,
    "virtual_pixel_interpolation_enabled": bool, "arm_date": DATETIME,
    "channels": list, "detector_translation": list, "goniometer": dict,
    "threshold_energy": dict,
}
V2_START_ALL = ("flatfield", "pixel_mask", "countrate_correction_lookup_table")
JFJ_START_TYPES = {"detector_distance": float, "magic_number": int}  # error_value: int64
ALGORITHMS = {"bslz4", "lz4", "bszstd"}  # bszstd: the Jungfraujoch extension


def _elem_size(tag):
    """RFC 8746 typed arrays 64..87: 1 << (f + ll) with tag = 0b010_f_s_e_ll."""
    return 1 << (((tag >> 4) & 1) + (tag & 3))


_TYPED = {64: np.dtype("u1"), 65: np.dtype(">u2"), 66: np.dtype(">u4"), 67: np.dtype(">u8"),
          69: np.dtype("<u2"), 70: np.dtype("<u4"), 71: np.dtype("<u8"),
          72: np.dtype("i1"), 77: np.dtype("<i2"), 78: np.dtype("<i4"), 79: np.dtype("<i8"),
          81: np.dtype(">f4"), 82: np.dtype(">f8"), 85: np.dtype("<f4"), 86: np.dtype("<f8")}


def _check_tag0(buf, key):
    """cbor2 turns tag 0 and tag 1 alike into datetimes; the spec says tag
    0 text, so look at the bytes: the key as a text string, then c0 6x/7x."""
    k = key.encode()
    enc = bytes([0x60 + len(k)]) + k if len(k) < 24 else bytes([0x78, len(k)]) + k
    i = buf.find(enc)
    if i < 0:
        raise DectrisError("date", "%s not found in the message" % key)
    j = i + len(enc)
    if buf[j:j + 1] != b"\xc0" or not (0x60 <= buf[j + 1] <= 0x7b):
        raise DectrisError("date", "%s is not tag 0 + text" % key)


def _v2_typed(t, want=None):
    """A TypedArray tag around bytes (or around a 56500 compression tag):
    returns (numpy dtype, ("raw", bytes) | (algorithm, modifier, bytes))."""
    if not (isinstance(t, cbor2.CBORTag) and 64 <= t.tag <= 87):
        raise DectrisError("nesting", "expected a typed-array tag, got %r" % (type(t).__name__,))
    if t.tag not in _TYPED:
        raise DectrisError("tag", "typed-array tag %d not supported" % t.tag)
    dt = _TYPED[t.tag]
    if dt.itemsize != _elem_size(t.tag):
        raise DectrisError("tag", "internal: tag %d element size" % t.tag)
    v = t.value
    if isinstance(v, (bytes, bytearray)):
        return dt, ("raw", bytes(v))
    if isinstance(v, cbor2.CBORTag) and v.tag == 56500:
        c = v.value
        if not (isinstance(c, list) and len(c) == 3):
            raise DectrisError("nesting", "56500 content is not a 3-array")
        alg, mod, data = c
        if not isinstance(alg, str) or type(mod) is not int or not isinstance(data, bytes):
            raise DectrisError("nesting", "56500 array is not [tstr, uint, bstr]")
        if alg not in ALGORITHMS:
            raise DectrisError("algorithm", "unknown algorithm %r" % alg)
        if len(data) < 12:
            raise DectrisError("short", "compressed blob of %d bytes (< 12)" % len(data))
        return dt, (alg, mod, data)
    raise DectrisError("nesting", "typed array holds %r" % (type(v).__name__,))


def decode_multidim(v):
    """MultiDimArray 40([[dim0, dim1], TypedArray]) -> (y, x) array and a
    description {"dims", "tag", "algorithm", "modifier", "blob"}."""
    if not (isinstance(v, cbor2.CBORTag) and v.tag == 40):
        raise DectrisError("nesting", "channel value is not tag 40 (%r)" % (type(v).__name__,))
    a = v.value
    if not (isinstance(a, list) and len(a) == 2 and isinstance(a[0], list)):
        raise DectrisError("nesting", "tag 40 content is not [[dims], array]")
    dims = a[0]
    if not (len(dims) == 2 and all(type(d) is int and d >= 0 for d in dims)):
        raise DectrisError("dims", "dims %r is not two uints" % (dims,))
    dt, payload = _v2_typed(a[1])
    n = dims[0] * dims[1]
    desc = {"dims": dims, "tag": a[1].tag, "algorithm": payload[0], "modifier": None,
            "blob": payload[-1]}
    if payload[0] == "raw":
        raw = payload[1]
        if len(raw) % dt.itemsize:
            raise DectrisError("dims", "typed array of %d bytes, element size %d" % (len(raw), dt.itemsize))
        if len(raw) != n * dt.itemsize:
            raise DectrisError("dims", "dims %r x %d != %d bytes" % (dims, dt.itemsize, len(raw)))
    else:
        alg, mod, data = payload
        desc["modifier"] = mod
        orig = _be64(data)
        if orig != n * dt.itemsize:
            raise DectrisError("dims", "dims %r x %d != orig_size %d" % (dims, dt.itemsize, orig))
        if alg == "lz4":
            if mod != 0:
                raise DectrisError("algorithm", "lz4 modifier %d" % mod)
            raw = decode_lz4_framing(data)
        else:
            if mod != dt.itemsize:
                raise DectrisError("algorithm", "%s modifier %d for %d-byte elements" % (alg, mod, dt.itemsize))
            raw = decode_bs_framing(data, dt.itemsize, "zstd" if alg == "bszstd" else "lz4")
    arr = np.frombuffer(raw, dt).astype(dt.newbyteorder("=")).reshape(dims[0], dims[1])
    return arr, desc


def _rational(d, k):
    v = d.get(k)
    if not (isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= 0 for x in v)
            and v[1] > 0):
        raise DectrisError("rational", "%s %r is not [num, den]" % (k, v))
    return v


def _check_types(d, table, kind="field"):
    for k, t in table.items():
        if k not in d:
            continue
        if t is DATETIME:
            if not isinstance(d[k], datetime):
                raise DectrisError("date", "%s is not a DateTime" % k)
        else:
            _typed(d, k, t, kind)


def decode_v2(buf):
    """Decodes one v2 message.

    start: {"kind": "start", "series", "unique_id", "fields" (the whole map,
      cbor2 values), "channels", "flatfield"/"pixel_mask" ({channel: (y, x)
      array}, header_detail all), "countrate_table" (1-D array or None)}
    image: {"kind": "image", "series", "unique_id", "image_id", "fields",
      "data" ({channel: (y, x) array}, in the order sent), "blobs"
      ({channel: description, see decode_multidim})}
    end: {"kind": "end", "series", "unique_id", "fields"}
    other: {"kind": "other", "type", "fields"} (Jungfraujoch calibration,
      metadata: to be skipped by a DECTRIS client)
    """
    if isinstance(buf, (list, tuple)):
        if len(buf) != 1:
            raise DectrisError("parts", "v2 message of %d parts" % len(buf))
        buf = buf[0]
    buf = bytes(buf)
    if buf[:3] != SIGNATURE:
        raise DectrisError("nosig", "message starts %s, not d9d9f7" % buf[:3].hex())
    try:
        m = cbor2.loads(buf)
    except Exception as e:
        raise DectrisError("cbor", "not CBOR: %s" % e)
    if not isinstance(m, dict) or not m:
        raise DectrisError("cbor", "top level is not a non-empty map")
    if next(iter(m)) != "type":
        raise DectrisError("typenotfirst", "first key is %r" % (next(iter(m)),))
    t = m["type"]
    if t in ("start", "image", "end"):
        _typed(m, "series_id", int)
        _typed(m, "series_unique_id", str)
    r = {"kind": t, "fields": m, "series": m.get("series_id"), "unique_id": m.get("series_unique_id")}
    if t == "start":
        _check_types(m, V2_START_TYPES)
        _check_types(m, JFJ_START_TYPES)
        if "error_value" in m and type(m["error_value"]) is not int:
            raise DectrisError("field", "error_value is not an integer")
        if "arm_date" in m:
            _check_tag0(buf, "arm_date")
        ch = m.get("channels", [])
        if not all(isinstance(c, str) for c in ch):
            raise DectrisError("field", "channels %r" % (ch,))
        r["channels"] = ch
        for k in ("flatfield", "pixel_mask"):
            if k in m:
                if not isinstance(m[k], dict):
                    raise DectrisError("field", "%s is not a map" % k)
                r[k] = {c: decode_multidim(v)[0] for c, v in m[k].items()}
        r["countrate_table"] = None
        if "countrate_correction_lookup_table" in m:
            dt, p = _v2_typed(m["countrate_correction_lookup_table"])
            raw = p[1] if p[0] == "raw" else (decode_lz4_framing(p[2]) if p[0] == "lz4"
                                              else decode_bs_framing(p[2], dt.itemsize))
            r["countrate_table"] = np.frombuffer(raw, dt)
        return r
    if t == "image":
        r["image_id"] = _typed(m, "image_id", int)
        for k in ("start_time", "stop_time", "real_time"):
            _rational(m, k)
        if "series_date" in m:
            if not isinstance(m["series_date"], datetime):
                raise DectrisError("date", "series_date is not a DateTime")
            _check_tag0(buf, "series_date")
        data = m.get("data")
        if not isinstance(data, dict):
            raise DectrisError("field", "data is not a map")
        r["data"], r["blobs"] = {}, {}
        for c, v in data.items():
            r["data"][c], r["blobs"][c] = decode_multidim(v)
        return r
    if t == "end":
        return r
    if isinstance(t, str):
        return {"kind": "other", "type": t, "fields": m}
    raise DectrisError("type", "type %r" % (t,))


# ---- stream state ----------------------------------------------------------------


@dataclass
class Series:
    """One series as received: the start message, the images in arrival
    order and the end message (None until it came)."""
    series: int
    start: Dict[str, Any]
    frames: List[Any] = field(default_factory=list)     # v1: arrays; v2: {channel: array}
    frame_ids: List[int] = field(default_factory=list)
    images: List[Dict[str, Any]] = field(default_factory=list)
    end: Optional[Dict[str, Any]] = None


class Stream:
    """Series state over a stream: what LiberTEM and stream2.c's callers do
    (notes section 1 "What clients check"): images need a header of their
    series; images of another series are stale; frame numbers count up
    from 0 by one. Messages decode_v1/decode_v2 reject are recorded and
    skipped; so are stale images and images before any header. A gap is
    recorded and the image kept."""

    def __init__(self, protocol):
        if protocol not in ("dectris1", "dectris2"):
            raise ValueError(protocol)
        self.v2 = protocol == "dectris2"
        self.series: List[Series] = []
        self.events: List[Dict[str, Any]] = []
        self.others: List[Dict[str, Any]] = []
        self.cur: Optional[Series] = None
        self.next_frame = 0
        self.index = -1

    def _event(self, kind, detail, **kw):
        e = {"kind": kind, "index": self.index, "detail": detail}
        e.update(kw)
        self.events.append(e)

    def feed(self, msg):
        self.index += 1
        try:
            r = decode_v2(msg) if self.v2 else decode_v1(msg)
        except DectrisError as e:
            self._event(e.kind, e.detail, rejected=True)
            return None
        k = r["kind"]
        if k == "other":
            self.others.append(r)
            return r
        if k == "start":
            self.cur = Series(series=r["series"], start=r)
            self.series.append(self.cur)
            self.next_frame = 0
            return r
        if k == "image":
            fid = r["image_id"] if self.v2 else r["frame"]
            cur = self.cur
            if cur is None or r["series"] != cur.series or cur.end is not None:
                # An older series (or this one after its end) is stale; any
                # other series has not sent its header yet.
                old = cur is not None and r["series"] <= cur.series
                self._event("stale" if old else "image-before-header",
                            "image %d of series %d, current series %s"
                            % (fid, r["series"], cur.series if cur else None),
                            series=r["series"], frame=fid)
                return None
            if self.v2 and r["unique_id"] != self.cur.start["unique_id"]:
                self._event("stale", "series_unique_id %s during %s"
                            % (r["unique_id"], self.cur.start["unique_id"]), frame=fid)
                return None
            if fid != self.next_frame:
                self._event("gap", "frame %d, expected %d" % (fid, self.next_frame),
                            frame=fid, expected=self.next_frame)
            self.next_frame = fid + 1
            self.cur.frames.append(r["data"])
            self.cur.frame_ids.append(fid)
            self.cur.images.append(r)
            return r
        if k == "end":
            if self.cur is None or r["series"] != self.cur.series:
                self._event("stale", "end of series %r" % (r["series"],))
                return None
            self.cur.end = r
            return r
        return r


def decode_stream(protocol, messages):
    s = Stream(protocol)
    for m in messages:
        s.feed(m)
    return s
