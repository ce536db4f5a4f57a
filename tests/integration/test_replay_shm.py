"""beamd-replay's shared-memory payloads (proto/PROTOCOL.md section 13.6)
against a Python REQ client playing beamd's part: it makes a memfd named
like beamd's landing area, offers slots in a request, and reads the frames
the server put there.

Checked: payloads land in the slots offered, in order, bit-exact (raw,
gzip decoded by the server, bslz4 forwarded as stored); corrupt frames
carry their error inline and no payload (what their slot holds is
undefined: the read failed part-way); the server refuses,
saying why, anything but a beamd memfd (a regular file, a memfd of
another name, a path that is not /proc/PID/fd/N), slots too small for the
file's frames, and --no-shm, and then sends the payloads inline;
malformed shm objects are refused like any bad request; a consumer that
restarts with a new area is mapped afresh. The daemon side (landing.c,
src_replay.c) is covered end to end in test_daemon_replay.py (shm on/off).
"""
import json
import mmap
import os

import numpy as np
import pytest

from test_replay_server import serve, proto, mk  # noqa: F401  (the fixture)

SLOT = 1 << 16


class Area:
    """A landing area as beamd makes one (daemon/landing.c)."""

    def __init__(self, nslots, slot_bytes=SLOT, name="beamd-landing"):
        self.fd = os.memfd_create(name)
        self.size = nslots * slot_bytes
        self.slot_bytes = slot_bytes
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        self.path = "/proc/%d/fd/%d" % (os.getpid(), self.fd)

    def offer(self, slots, path=None):
        return {"path": path or self.path, "size": self.size, "slot_bytes": self.slot_bytes,
                "slots": list(slots)}

    def slot(self, i, n):
        return bytes(self.map[i * self.slot_bytes:i * self.slot_bytes + n])

    def close(self):
        if self.fd >= 0:
            self.map.close()
            os.close(self.fd)
            self.fd = -1


@pytest.fixture
def area():
    made = []

    def make(*a, **kw):
        made.append(Area(*a, **kw))
        return made[-1]
    yield make
    for a in made:
        a.close()


def get(srv, next, credit, shm):
    """(status, [(header, array or None, meta, parts)]) with landed payloads
    read from the slots: FRAME number i of the reply is in slots[i]."""
    wire = {k: v for k, v in shm.items() if k != "area"}
    parts = srv.raw([json.dumps({"op": "get", "next": next, "credit": credit,
                                 "shm": wire}).encode()])
    st = json.loads(parts[0])
    out, i, nframe = [], 1, 0
    while i < len(parts):
        h = proto.decode_header(parts[i])
        n = 1 + h.nparts + (1 if h.flags & proto.FLAG_META else 0)
        chunk = list(parts[i:i + n])
        if h.type == proto.FRAME:
            if h.nparts == 1 and len(chunk[1]) == 0:
                assert st.get("shm") is True, st
                chunk[1] = shm["area"].slot(shm["slots"][nframe], h.payload_size)
            nframe += 1
        _, hdr, arr, meta = proto.decode_message(chunk)
        out.append((hdr, arr, meta, chunk))
        i += n
    return st, out


def landed_get(srv, a, next, credit, slots):
    shm = a.offer(slots)
    st, msgs = get(srv, next, credit, dict(shm, area=a))
    return st, msgs


def empty_payloads(parts_list):
    return sum(1 for (h, _, _, c) in parts_list if h.type == proto.FRAME and h.nparts == 1
               and len(c) > 1 and c[1] is not None and len(c[1]) == 0)


def test_payloads_land_in_offered_slots(tmp_path, serve, area):
    """Slots offered out of order: frame i lands in slots[i]; raw, gzip
    (decoded by the server) and bslz4 (the stored chunk) are bit-exact."""
    for kind in ("raw", "gzip", "bslz4"):
        path = tmp_path / ("%s.h5" % kind)
        data = mk.make_dataset_file(path, kind, n=6)
        srv = serve(path, "--stats-json")
        a = area(8)
        slots = [5, 0, 7, 2]
        st, msgs = landed_get(srv, a, 0, 4, slots)
        assert st["ok"] and st["shm"] is True and st["count"] == 4, st
        frames = [m for m in msgs if m[0].type == proto.FRAME]
        assert [h.frame_id for h, *_ in frames] == [0, 1, 2, 3]
        for (h, arr, _, _), fid in zip(frames, range(4)):
            assert np.array_equal(arr, data[fid]), "%s frame %d" % (kind, fid)
        if kind == "bslz4":
            assert all(proto.CODECS[h.codec] == "bslz4" for h, *_ in frames)
        # The slots not offered stay untouched (zero).
        for s in (1, 3, 4, 6):
            assert a.slot(s, SLOT) == bytes(SLOT)
        rc, stats = srv.stop()
        assert rc == 0 and stats["shm_frames"] == 4 and stats["shm_refused"] == 0, stats


def test_slots_bound_the_count(tmp_path, serve, area):
    path = tmp_path / "r.h5"
    data = mk.make_dataset_file(path, "raw", n=10)
    srv = serve(path)
    a = area(4)
    st, msgs = landed_get(srv, a, 0, 8, [3, 1])
    assert st["count"] == 2 and st["next"] == 2, st
    st, msgs = landed_get(srv, a, 2, 8, [0, 1, 2, 3])
    frames = [m for m in msgs if m[0].type == proto.FRAME]
    assert [h.frame_id for h, *_ in frames] == [2, 3, 4, 5]
    assert all(np.array_equal(arr, data[h.frame_id]) for h, arr, *_ in frames)


def test_corrupt_frame_inline_no_payload(tmp_path, serve, area):
    path = tmp_path / "c.h5"
    data = mk.make_corrupt(path, "bslz4", n=5, bad=(2,))
    srv = serve(path)
    a = area(5)
    st, msgs = landed_get(srv, a, 0, 5, [0, 1, 2, 3, 4])
    assert st["ok"] and st["corrupt"] == 1 and st["shm"] is True
    frames = [m for m in msgs if m[0].type == proto.FRAME]
    bad = frames[2]
    assert bad[0].flags & proto.FLAG_CORRUPT and "frame 2" in bad[2]["error"], bad[2]
    assert bad[0].nparts == 0 and bad[1] is None
    for h, arr, _, _ in frames[:2] + frames[3:]:
        assert np.array_equal(arr, data[h.frame_id])


def _inline_ok(st, msgs, data, why):
    assert st["ok"] and "shm" not in st and why in st["shm_error"], st
    frames = [m for m in msgs if m[0].type == proto.FRAME]
    assert frames and all(np.array_equal(arr, data[h.frame_id]) for h, arr, *_ in frames)
    assert empty_payloads(msgs) == 0


def test_refuses_what_is_not_a_beamd_memfd(tmp_path, serve, area):
    """The path comes from whoever reaches the REP socket: a regular file
    (here one the client opened, so /proc/PID/fd/N names it) must never be
    written; nor a memfd of another name; nor any other path."""
    path = tmp_path / "r.h5"
    data = mk.make_dataset_file(path, "raw", n=3)
    srv = serve(path)
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"x" * (4 * SLOT))
    fd = os.open(str(victim), os.O_RDWR)
    try:
        a = area(4)
        shm = a.offer([0, 1], path="/proc/%d/fd/%d" % (os.getpid(), fd))
        st, msgs = get(srv, 0, 2, dict(shm, area=a))
        _inline_ok(st, msgs, data, "is not a beamd landing area")
    finally:
        os.close(fd)
    assert victim.read_bytes() == b"x" * (4 * SLOT)
    other = area(4, name="something-else")
    st, msgs = get(srv, 0, 2, dict(other.offer([0, 1]), area=other))
    _inline_ok(st, msgs, data, "is not a beamd landing area")
    assert other.slot(0, SLOT) == bytes(SLOT)
    st, msgs = get(srv, 0, 2, dict(a.offer([0, 1], path=str(victim)), area=a))
    _inline_ok(st, msgs, data, "is not /proc/PID/fd/N")
    st, msgs = get(srv, 0, 2, dict(a.offer([0, 1], path="/proc/%d/fd/999" % os.getpid()), area=a))
    _inline_ok(st, msgs, data, "No such file")
    # And after all that, a good area still works.
    st, msgs = landed_get(srv, a, 0, 2, [1, 0])
    assert st["shm"] is True and st["count"] == 2


def test_refuses_small_slots_and_no_shm(tmp_path, serve, area):
    path = tmp_path / "r.h5"
    data = mk.make_dataset_file(path, "raw", n=3, shape=(128, 128))  # 32 KiB frames
    srv = serve(path)
    small = area(4, slot_bytes=16384)
    st, msgs = get(srv, 0, 2, dict(small.offer([0, 1]), area=small))
    _inline_ok(st, msgs, data, "landing slots hold 16384")
    srv2 = serve(path, "--no-shm", "--stats-json")
    a = area(4)
    st, msgs = get(srv2, 0, 2, dict(a.offer([0, 1]), area=a))
    _inline_ok(st, msgs, data, "--no-shm")
    rc, stats = srv2.stop()
    assert stats["shm_refused"] == 1 and stats["shm_frames"] == 0


@pytest.mark.parametrize("shm,why", [
    ("nope", '"shm" must be an object'),
    ({"size": 65536, "slot_bytes": 65536, "slots": [0]}, '"path"'),
    ({"path": "/x", "slot_bytes": 65536, "slots": [0]}, 'missing "size"'),
    ({"path": "/x", "size": 65536, "slot_bytes": 0, "slots": [0]}, '"slot_bytes" must be'),
    ({"path": "/x", "size": 65536, "slot_bytes": 65536, "slots": []}, "1..4096 slot numbers"),
    ({"path": "/x", "size": 131072, "slot_bytes": 65536, "slots": [0, 2]},
     '"slots"[1] must be a slot number in 0..1'),
    ({"path": "/x", "size": 65536, "slot_bytes": 65536, "slots": ["0"]}, '"slots"[0]'),
])
def test_bad_shm_objects(tmp_path, serve, shm, why):
    path = tmp_path / "r.h5"
    mk.make_dataset_file(path, "raw", n=2)
    srv = serve(path)
    parts = srv.raw([json.dumps({"op": "get", "next": 0, "credit": 1, "shm": shm}).encode()])
    st = json.loads(parts[0])
    assert len(parts) == 1 and st["ok"] is False and why in st["error"], st


def test_new_area_is_mapped_afresh(tmp_path, serve, area):
    """A restarted beamd offers another memfd (maybe at the same
    /proc/PID/fd/N): the server maps the new file, not the old mapping."""
    path = tmp_path / "r.h5"
    data = mk.make_dataset_file(path, "raw", n=4)
    srv = serve(path)
    a = area(2)
    st, _ = landed_get(srv, a, 0, 1, [0])
    assert st["shm"] is True
    path_a = a.path
    a.close()
    b = Area(2)  # likely the same fd number, hence the same path
    try:
        st, msgs = landed_get(srv, b, 1, 1, [1])
        assert st["shm"] is True, st
        h, arr, _, _ = [m for m in msgs if m[0].type == proto.FRAME][0]
        assert h.frame_id == 1 and np.array_equal(arr, data[1])
        print("old area %s, new area %s" % (path_a, b.path))
    finally:
        b.close()
