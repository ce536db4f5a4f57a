"""beamd wire protocol v1 in Python: encode and decode multipart messages.

The normative text is proto/PROTOCOL.md; proto/proto.c is the C twin of this
module and both reject the same inputs with the same reason strings. Used by
tools, tests and simulators; it is not fast and is not meant to be (numpy is
only used to make the bit transpose bearable).

A message is a list of ``bytes`` parts, as sent with
``zmq.Socket.send_multipart``:  [topic]? header payload* metadata?
"""

import dataclasses
import json
import math
import struct
import time

import lz4.block
import numpy as np

PROTO_MAJOR = 1
PROTO_MINOR = 0
HDR_SIZE_V1 = 128
HDR_SIZE_MAX = 4096
MAX_NDIM = 4
TOPIC_MAX = 64
MAX_PAYLOAD_PARTS = 16
MAGIC = b"\x89BMD"

SERIES_START, FRAME, SERIES_END, RESULT = 1, 2, 3, 4
MSG_TYPES = {SERIES_START: "SERIES_START", FRAME: "FRAME",
             SERIES_END: "SERIES_END", RESULT: "RESULT"}

FLAG_BAD = 1 << 0
FLAG_META = 1 << 1
FLAG_POS = 1 << 2
FLAG_PARTIAL = 1 << 3
FLAG_FINAL = 1 << 4
FLAG_CORRUPT = 1 << 5
FLAG_ANOMALY = 1 << 6
FLAG_ABORTED = 1 << 7
FLAG_INCOMPLETE = 1 << 8  # frames of the series never reached the pipeline (SERIES_END, RESULT)

# Wire code -> numpy name, in the order of beam_dtype_t.
DTYPES = ["none", "uint8", "uint16", "uint32", "uint64", "int8", "int16",
          "int32", "int64", "float32", "float64", "complex64", "complex128"]
CODECS = ["raw", "lz4", "bslz4"]

# <  little-endian, fields as in proto/proto.h (offsets in comments there).
_HDR = struct.Struct("<4sBBHHHIQQQQQBBBBI4IQQ3dII")
assert _HDR.size == HDR_SIZE_V1

LZ4_DEFAULT_BLOCK = 1 << 30      # HDF5 LZ4 plugin (filter 32004) default
BSHUF_TARGET_BYTES = 8192        # bitshuffle bshuf_default_block_size()
BSHUF_MIN_BLOCK = 128
_LZ4_MAX_INPUT = 0x7E000000


class ProtocolError(ValueError):
    """A message or payload was rejected; str(e) is the reason."""


@dataclasses.dataclass
class Limits:
    max_raw_bytes: int = 1 << 30
    max_dim: int = 65536
    max_meta_bytes: int = 16 << 20


DEFAULT_LIMITS = Limits()


@dataclasses.dataclass
class Header:
    type: int = FRAME
    flags: int = 0
    series_id: int = 0
    frame_id: int = 0
    seq: int = 0
    t_acq_ns: int = 0
    t_send_ns: int = 0
    dtype: int = 0
    ndim: int = 0
    codec: int = 0
    nparts: int = 0
    stage_id: int = 0
    shape: tuple = (0, 0, 0, 0)
    raw_size: int = 0
    payload_size: int = 0
    pos: tuple = (0.0, 0.0, 0.0)
    meta_size: int = 0
    major: int = PROTO_MAJOR
    minor: int = PROTO_MINOR
    hdr_size: int = HDR_SIZE_V1

    @property
    def dtype_name(self):
        return DTYPES[self.dtype] if self.dtype < len(DTYPES) else "unknown"

    @property
    def codec_name(self):
        return CODECS[self.codec] if self.codec < len(CODECS) else "unknown"

    @property
    def type_name(self):
        return MSG_TYPES.get(self.type, "UNKNOWN")

    @property
    def frame_shape(self):
        return tuple(self.shape[:self.ndim])

    def encode(self):
        """The 128-byte v1 header (major/minor/hdr_size are always v1)."""
        shape = tuple(self.shape) + (0,) * (MAX_NDIM - len(self.shape))
        return _HDR.pack(MAGIC, PROTO_MAJOR, PROTO_MINOR, HDR_SIZE_V1,
                         self.type, 0, self.flags, self.series_id,
                         self.frame_id, self.seq, self.t_acq_ns,
                         self.t_send_ns, self.dtype, self.ndim, self.codec,
                         self.nparts, self.stage_id, *shape[:MAX_NDIM],
                         self.raw_size, self.payload_size, *self.pos,
                         self.meta_size, 0)


def dtype_size(code):
    return np.dtype(DTYPES[code]).itemsize if 0 < code < len(DTYPES) else 0


def dtype_code(dt):
    """numpy dtype (any byte order) -> wire code; rejects what v1 lacks."""
    name = np.dtype(dt).newbyteorder("=").name
    if name not in DTYPES[1:]:
        raise ProtocolError("dtype %s has no wire code" % name)
    return DTYPES.index(name)


def topic_valid(t):
    if isinstance(t, str):
        t = t.encode("utf-8", "replace")
    if not 1 <= len(t) <= TOPIC_MAX:
        return False
    return all(c in b"abcdefghijklmnopqrstuvwxyz0123456789_.-" for c in t)


# ---- bitshuffle ------------------------------------------------------------

def bshuf_default_block(elem_size):
    b = (BSHUF_TARGET_BYTES // elem_size) // 8 * 8
    return max(b, BSHUF_MIN_BLOCK)


def bitshuffle(data, elem_size):
    """bshuf_trans_bit_elem: bit k of byte j of element i goes to row 8j+k,
    bit i of that row (rows are n/8 bytes, bits little-endian)."""
    a = np.frombuffer(bytes(data), np.uint8).reshape(-1, elem_size)
    if a.shape[0] % 8:
        raise ValueError("bitshuffle needs a multiple of 8 elements")
    bits = np.unpackbits(a, axis=1, bitorder="little")
    return np.packbits(bits.T, axis=1, bitorder="little").tobytes()


def bitunshuffle(data, elem_size):
    rows = np.frombuffer(bytes(data), np.uint8).reshape(8 * elem_size, -1)
    bits = np.unpackbits(rows, axis=1, bitorder="little")
    return np.packbits(bits.T, axis=1, bitorder="little").tobytes()


# ---- codecs (HDF5 filter framing) -------------------------------------------

def codec_bound(codec, raw_bytes, elem_size):
    """Upper bound of the encoded size; 0 when the input cannot be encoded."""
    def lzb(n):
        return n + n // 255 + 16
    if raw_bytes > 1 << 48:
        return 0
    if codec == 0:
        return raw_bytes
    if codec == 1:
        blk = min(raw_bytes, LZ4_DEFAULT_BLOCK)
        nblk = -(-raw_bytes // blk) if blk else 0
        return 12 + nblk * (4 + lzb(blk))
    if codec == 2:
        if elem_size == 0 or raw_bytes % elem_size:
            return 0
        n, b = raw_bytes // elem_size, bshuf_default_block(elem_size)
        last = (n % b) - (n % b) % 8
        bound = 12 + (n // b) * (4 + lzb(b * elem_size))
        if last:
            bound += 4 + lzb(last * elem_size)
        return bound + (n % 8) * elem_size
    return 0


def lz4_encode(raw):
    raw = bytes(raw)
    blk = min(len(raw), LZ4_DEFAULT_BLOCK)
    out = [struct.pack(">QI", len(raw), blk)]
    for off in range(0, len(raw), blk or 1):
        chunk = raw[off:off + blk]
        c = lz4.block.compress(chunk, store_size=False)
        if len(c) >= len(chunk):
            c = chunk  # the plugin stores blocks that do not shrink raw
        out += [struct.pack(">I", len(c)), c]
    return b"".join(out)


def _lz4_block(src, want, prefix):
    try:
        d = lz4.block.decompress(src, uncompressed_size=want)
    except lz4.block.LZ4BlockError:
        raise ProtocolError(prefix + ": corrupt block") from None
    if len(d) != want:
        raise ProtocolError(prefix + ": corrupt block")
    return d


def lz4_decode(buf, raw_bytes):
    buf = memoryview(bytes(buf))
    if len(buf) < 12:
        raise ProtocolError("lz4: truncated framing header")
    total, blk = struct.unpack(">QI", buf[:12])
    if total != raw_bytes:
        raise ProtocolError("lz4: total size does not match raw_size")
    if blk == 0 and raw_bytes:
        raise ProtocolError("lz4: block size 0")
    blk = min(blk, raw_bytes)
    if blk > _LZ4_MAX_INPUT:
        raise ProtocolError("lz4: block size too large")
    out, pos = [], 12
    for off in range(0, raw_bytes, blk or 1):
        want = min(blk, raw_bytes - off)
        if len(buf) - pos < 4:
            raise ProtocolError("lz4: truncated block header")
        (c,) = struct.unpack(">I", buf[pos:pos + 4])
        pos += 4
        if c > len(buf) - pos:
            raise ProtocolError("lz4: block runs past the payload")
        if c == want:
            out.append(bytes(buf[pos:pos + c]))
        elif c > want:
            raise ProtocolError("lz4: compressed block larger than its data")
        else:
            out.append(_lz4_block(buf[pos:pos + c], want, "lz4"))
        pos += c
    if pos != len(buf):
        raise ProtocolError("lz4: trailing bytes after the last block")
    return b"".join(out)


def bslz4_encode(raw, elem_size):
    raw = bytes(raw)
    if elem_size <= 0 or len(raw) % elem_size:
        raise ValueError("raw size is not a multiple of the element size")
    n, b = len(raw) // elem_size, bshuf_default_block(elem_size)
    out = [struct.pack(">QI", len(raw), b * elem_size)]
    for i in range(0, n, b):
        cnt = min(b, n - i)
        cnt -= cnt % 8
        if not cnt:
            break
        sh = bitshuffle(raw[i * elem_size:(i + cnt) * elem_size], elem_size)
        c = lz4.block.compress(sh, store_size=False)
        out += [struct.pack(">I", len(c)), c]
    tail = (n % 8) * elem_size
    out.append(raw[len(raw) - tail:])
    return b"".join(out)


def bslz4_decode(buf, raw_bytes, elem_size):
    buf = memoryview(bytes(buf))
    if elem_size <= 0 or raw_bytes % elem_size:
        raise ProtocolError("bslz4: raw_size not a multiple of the element size")
    if len(buf) < 12:
        raise ProtocolError("bslz4: truncated framing header")
    total, bbytes = struct.unpack(">QI", buf[:12])
    if total != raw_bytes:
        raise ProtocolError("bslz4: total size does not match raw_size")
    if bbytes % elem_size:
        raise ProtocolError(
            "bslz4: block size not a multiple of the element size")
    b, n = bbytes // elem_size, raw_bytes // elem_size
    if b == 0 or b % 8:
        raise ProtocolError(
            "bslz4: block size not a positive multiple of 8 elements")
    if bbytes > _LZ4_MAX_INPUT:
        raise ProtocolError("bslz4: block size too large")
    out, pos = [], 12
    for i in range(0, n, b):
        cnt = min(b, n - i)
        cnt -= cnt % 8
        if not cnt:
            break
        if len(buf) - pos < 4:
            raise ProtocolError("bslz4: truncated block header")
        (c,) = struct.unpack(">I", buf[pos:pos + 4])
        pos += 4
        if c > len(buf) - pos:
            raise ProtocolError("bslz4: block runs past the payload")
        d = _lz4_block(buf[pos:pos + c], cnt * elem_size, "bslz4")
        out.append(bitunshuffle(d, elem_size))
        pos += c
    tail = (n % 8) * elem_size
    if len(buf) - pos < tail:
        raise ProtocolError("bslz4: truncated trailing elements")
    out.append(bytes(buf[pos:pos + tail]))
    pos += tail
    if pos != len(buf):
        raise ProtocolError("bslz4: trailing bytes after the last block")
    return b"".join(out)


def codec_encode(codec, raw, elem_size):
    codec = _codec_code(codec)
    if codec == 0:
        return bytes(raw)
    if codec == 1:
        return lz4_encode(raw)
    return bslz4_encode(raw, elem_size)


def codec_decode(codec, buf, raw_bytes, elem_size):
    codec = _codec_code(codec)
    if codec == 0:
        if len(buf) != raw_bytes:
            raise ProtocolError("raw: payload size != raw_size")
        return bytes(buf)
    if codec == 1:
        return lz4_decode(buf, raw_bytes)
    return bslz4_decode(buf, raw_bytes, elem_size)


def _codec_code(codec):
    if isinstance(codec, str):
        if codec not in CODECS:
            raise ValueError("unknown codec %r (raw, lz4, bslz4)" % codec)
        return CODECS.index(codec)
    if codec not in (0, 1, 2):
        raise ValueError("unknown codec %r" % codec)
    return codec


# ---- header validation (mirrors beam_hdr_decode) ----------------------------

def _geometry(h, lim):
    if h.dtype >= len(DTYPES):
        raise ProtocolError("unknown dtype")
    if h.ndim > MAX_NDIM:
        raise ProtocolError("ndim > 4")
    for i in range(h.ndim, MAX_NDIM):
        if h.shape[i]:
            raise ProtocolError("shape[%d] set beyond ndim" % i)
    if h.ndim == 0:
        if h.raw_size:
            raise ProtocolError("raw_size set but ndim is 0")
        return
    if h.dtype == 0:
        raise ProtocolError("dtype none with ndim > 0")
    for i in range(h.ndim):
        if h.shape[i] == 0:
            raise ProtocolError("shape[%d] = 0" % i)
        if h.shape[i] > lim.max_dim:
            raise ProtocolError("shape[%d] > max_dim limit" % i)
    nbytes = dtype_size(h.dtype)
    for i in range(h.ndim):
        if nbytes > lim.max_raw_bytes // h.shape[i]:
            raise ProtocolError("frame too large (limit max_raw_bytes)")
        nbytes *= h.shape[i]
    series = h.type in (SERIES_START, SERIES_END)
    if h.raw_size != nbytes and not (series and h.raw_size == 0):
        raise ProtocolError("raw_size does not match shape x dtype")


def _payload(h):
    if h.codec >= len(CODECS):
        raise ProtocolError("unknown codec")
    if h.nparts > MAX_PAYLOAD_PARTS:
        raise ProtocolError("nparts > 16 payload parts")
    if h.nparts == 0:
        may_be_empty = h.type in (SERIES_START, SERIES_END) or (
            h.type == FRAME and h.flags & FLAG_CORRUPT)
        if not may_be_empty:
            raise ProtocolError("message type requires a payload")
        if h.payload_size:
            raise ProtocolError("payload_size set but nparts is 0")
        return
    if h.raw_size == 0:
        raise ProtocolError("payload parts without an array")
    if h.codec == 0:
        if h.payload_size != h.raw_size:
            raise ProtocolError("raw codec: payload_size != raw_size")
        return
    if h.nparts != 1:
        raise ProtocolError("compressed payload must be one part")
    bound = codec_bound(h.codec, h.raw_size, dtype_size(h.dtype))
    if h.payload_size < 12:
        raise ProtocolError("compressed payload_size < 12")
    if bound == 0 or h.payload_size > bound:
        raise ProtocolError("compressed payload_size exceeds the codec bound")


def decode_header(buf, limits=None):
    lim = limits or DEFAULT_LIMITS
    buf = bytes(buf)
    if len(buf) < 8:
        raise ProtocolError("header part too short")
    if buf[:4] != MAGIC:
        raise ProtocolError("bad magic")
    if buf[4] != PROTO_MAJOR:
        raise ProtocolError("unsupported major version %d" % buf[4]
                            if buf[4] <= 5 else
                            "unsupported major version (> 5)")
    (hsz,) = struct.unpack_from("<H", buf, 6)
    if hsz < HDR_SIZE_V1:
        raise ProtocolError("hdr_size < 128")
    if hsz > HDR_SIZE_MAX:
        raise ProtocolError("hdr_size > 4096")
    if len(buf) != hsz:
        raise ProtocolError("header part length != hdr_size")
    f = _HDR.unpack_from(buf)
    h = Header(major=f[1], minor=f[2], hdr_size=f[3], type=f[4], flags=f[6],
               series_id=f[7], frame_id=f[8], seq=f[9], t_acq_ns=f[10],
               t_send_ns=f[11], dtype=f[12], ndim=f[13], codec=f[14],
               nparts=f[15], stage_id=f[16], shape=tuple(f[17:21]),
               raw_size=f[21], payload_size=f[22], pos=tuple(f[23:26]),
               meta_size=f[26])
    if h.type not in MSG_TYPES:
        raise ProtocolError("unknown message type")
    _geometry(h, lim)
    _payload(h)
    if h.flags & FLAG_META:
        if h.meta_size == 0:
            raise ProtocolError("metadata flag set but meta_size is 0")
        if h.meta_size > lim.max_meta_bytes:
            raise ProtocolError("metadata too large (limit max_meta_bytes)")
    elif h.meta_size:
        raise ProtocolError("meta_size set without metadata flag")
    if h.flags & FLAG_POS and not all(math.isfinite(p) for p in h.pos):
        raise ProtocolError("scan position is not finite")
    return h


# ---- messages ----------------------------------------------------------------

def _type_code(t):
    if isinstance(t, str):
        for k, v in MSG_TYPES.items():
            if v == t.upper():
                return k
        raise ValueError("unknown message type %r" % t)
    return int(t)


def encode_message(type, array=None, series_id=0, frame_id=0, seq=0, flags=0,
                   codec="raw", topic=None, meta=None, pos=None, stage_id=0,
                   t_acq_ns=0, t_send_ns=None, shape=None, dtype=None,
                   split=1):
    """Builds the parts of one message.

    array: numpy array sent as the payload (any byte order; sent as LE).
    shape/dtype: geometry without a payload (SERIES_START/END, corrupt
    frames). meta: dict (JSON-encoded) or bytes. pos: 3 scan coordinates in
    metres (sets FLAG_POS). split: raw payload split over that many parts.
    """
    h = Header(type=_type_code(type), flags=flags, series_id=series_id,
               frame_id=frame_id, seq=seq, stage_id=stage_id,
               t_acq_ns=t_acq_ns,
               t_send_ns=time.time_ns() if t_send_ns is None else t_send_ns,
               codec=_codec_code(codec))
    payload = []
    if array is not None:
        a = np.ascontiguousarray(array)
        shape, dtype = a.shape, a.dtype
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    if shape is not None:
        if not 1 <= len(shape) <= MAX_NDIM:
            raise ValueError("ndim must be 1..4")
        h.ndim = len(shape)
        h.shape = tuple(int(s) for s in shape) + (0,) * (MAX_NDIM - len(shape))
        h.dtype = dtype_code(dtype)
        h.raw_size = dtype_size(h.dtype) * int(np.prod(shape))
    if array is not None:
        if h.codec == 0:
            step = -(-len(raw) // max(1, split))
            payload = [raw[i:i + step] for i in range(0, len(raw), step)]
        else:
            payload = [codec_encode(h.codec, raw, dtype_size(h.dtype))]
        h.nparts = len(payload)
        h.payload_size = sum(len(p) for p in payload)
    if pos is not None:
        h.flags |= FLAG_POS
        h.pos = tuple(float(p) for p in pos) + (0.0,) * (3 - len(pos))
    parts = []
    if topic is not None:
        t = topic.encode() if isinstance(topic, str) else bytes(topic)
        if not topic_valid(t):
            raise ValueError("invalid topic %r" % topic)
        parts.append(t)
    mpart = None
    if meta is not None:
        mpart = meta if isinstance(meta, (bytes, bytearray)) else \
            json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
        h.flags |= FLAG_META
        h.meta_size = len(mpart)
    parts.append(h.encode())
    parts += payload
    if mpart is not None:
        parts.append(bytes(mpart))
    return parts


def parse_message(parts, limits=None):
    """Validates the part structure (beam_msg_parse): returns
    (topic bytes or None, Header, payload parts, metadata bytes or None)."""
    parts = [bytes(p) for p in parts]
    if not parts:
        raise ProtocolError("empty message")
    if len(parts[0]) == 0:
        raise ProtocolError("empty first part")
    topic, at = None, 0
    if parts[0][0] != MAGIC[0]:
        if len(parts[0]) > TOPIC_MAX:
            raise ProtocolError("topic longer than 64 bytes")
        if not topic_valid(parts[0]):
            raise ProtocolError("topic contains invalid characters")
        topic, at = parts[0], 1
        if len(parts) < 2:
            raise ProtocolError("topic without a header part")
    h = decode_header(parts[at], limits)
    at += 1
    if h.type == RESULT and topic is None:
        raise ProtocolError("RESULT message without a topic")
    has_meta = bool(h.flags & FLAG_META)
    have, want = len(parts) - at, h.nparts + int(has_meta)
    if have != want:
        if has_meta and have == h.nparts:
            raise ProtocolError("metadata flag set but no metadata part")
        raise ProtocolError("fewer parts than the header declares"
                            if have < want else
                            "more parts than the header declares")
    payload = parts[at:at + h.nparts]
    if sum(len(p) for p in payload) != h.payload_size:
        raise ProtocolError("payload size mismatch")
    meta = None
    if has_meta:
        meta = parts[at + h.nparts]
        if len(meta) != h.meta_size:
            raise ProtocolError("metadata part size != meta_size")
    return topic, h, payload, meta


def decode_message(parts, limits=None):
    """-> (topic str or None, Header, ndarray or None, dict or None)."""
    topic, h, payload, meta = parse_message(parts, limits)
    arr = None
    if payload:
        es = dtype_size(h.dtype)
        raw = b"".join(payload) if h.codec == 0 else \
            codec_decode(h.codec, payload[0], h.raw_size, es)
        arr = np.frombuffer(raw, np.dtype(DTYPES[h.dtype]).newbyteorder("<"))
        arr = arr.reshape(h.frame_shape)
    md = None
    if meta is not None:
        try:
            md = json.loads(meta)
        except ValueError:
            raise ProtocolError("metadata is not valid JSON") from None
    return (topic.decode() if topic is not None else None), h, arr, md
