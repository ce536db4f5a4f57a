"""beamd-replay's payloads read in place (proto/PROTOCOL.md section 13.8)
against a Python REQ client playing beamd's part: it asks with "map": true,
opens the /proc/PID/fd/N paths the reply names and reads each frame's
payload at its offset.

Checked: the bytes at the named offsets are the stored chunks (h5py's
read_direct_chunk) and decode to the frames written, for raw, lz4 and
bslz4 files and for an Eiger-style master, whose frames are named in their
data files; the paths name the server's own descriptors of those files;
gzip files (inflated by the server) and --no-map are refused with a reason
and served as before; a corrupt chunk is still sent CORRUPT (its entry is
null) while its neighbours are read in place, and so is one cut off the
end of the file after the server opened it; a malformed "map" is a bad
request. The daemon side is covered end to end in test_daemon_replay.py
(transport "map") and the mapping itself in tests/unit/test_filemap.c.
"""
import json
import os

import h5py
import numpy as np
import pytest

from test_replay_server import serve, proto, mk  # noqa: F401  (the fixture)


def get_in_place(srv, next, credit):
    """(status, [(header, array or None, meta)]) with payloads read in place
    from the files the reply names."""
    parts = srv.raw([json.dumps({"op": "get", "next": next, "credit": credit,
                                 "map": True}).encode()])
    st = json.loads(parts[0])
    mp = st.get("map")
    fds = [os.open(f["path"], os.O_RDONLY) for f in mp["files"]] if mp else []
    out, i, nframe = [], 1, 0
    try:
        while i < len(parts):
            h = proto.decode_header(parts[i])
            n = 1 + h.nparts + (1 if h.flags & proto.FLAG_META else 0)
            chunk = list(parts[i:i + n])
            if h.type == proto.FRAME:
                at = mp["at"][nframe] if mp else None
                if at is not None:
                    assert h.nparts == 1 and len(chunk[1]) == 0, "in place, yet a payload"
                    chunk[1] = os.pread(fds[at[0]], h.payload_size, at[1])
                else:
                    assert not (h.nparts == 1 and len(chunk[1]) == 0), "empty payload, no file"
                nframe += 1
            _, hdr, arr, meta = proto.decode_message(chunk)
            out.append((hdr, arr, meta, chunk))
            i += n
    finally:
        for fd in fds:
            os.close(fd)
    if mp:
        assert len(mp["at"]) == nframe, (mp, nframe)
    return st, out


def frames_of(msgs):
    return [m for m in msgs if m[0].type == proto.FRAME]


@pytest.mark.parametrize("kind", ["raw", "lz4", "bslz4"])
def test_offsets_name_the_stored_chunks(tmp_path, serve, kind):
    path = tmp_path / ("%s.h5" % kind)
    data = mk.make_dataset_file(path, kind, n=6)
    srv = serve(path, "--stats-json")
    st, msgs = get_in_place(srv, 0, 6)
    assert st["ok"] and st["count"] == 6 and "map_error" not in st, st
    files = st["map"]["files"]
    assert len(files) == 1 and files[0]["name"] == os.path.realpath(path), files
    pid, _ = files[0]["path"][len("/proc/"):].split("/fd/")
    assert int(pid) == srv.p.pid
    assert os.path.realpath(files[0]["path"]) == os.path.realpath(path)
    fr = frames_of(msgs)
    assert [h.frame_id for h, *_ in fr] == list(range(6))
    for k, (h, arr, _, chunk) in enumerate(fr):
        mask, stored = mk.stored_chunk(str(path), k)
        assert mask == 0 and chunk[1] == stored, "frame %d: bytes at the offset" % k
        assert np.array_equal(arr, data[k]), "frame %d decodes wrong" % k
        if kind == "raw":
            assert st["map"]["at"][k][1] % 8 == 0, "raw payload offset not 8-aligned"
    rc, stats = srv.stop()
    assert rc == 0 and stats["map_frames"] == 6 and stats["map_refused"] == 0, stats


def test_master_names_its_data_files(tmp_path, serve):
    master, data, _ = mk.make_master(str(tmp_path / "eiger"), nfiles=3, per_file=4)
    srv = serve(master)
    st, msgs = get_in_place(srv, 2, 8)  # frames 2..9: all three data files
    names = [os.path.basename(f["name"]) for f in st["map"]["files"]]
    assert names == ["scan_data_%06d.h5" % i for i in (1, 2, 3)], names
    for f in st["map"]["files"]:
        assert os.path.realpath(f["path"]) == os.path.realpath(f["name"])
    fr = frames_of(msgs)
    assert [h.frame_id for h, *_ in fr] == list(range(2, 10))
    for (h, arr, _, chunk), at in zip(fr, st["map"]["at"]):
        g = h.frame_id
        assert at[0] == g // 4, (g, at)  # files are listed in the order first named
        _, stored = mk.stored_chunk(st["map"]["files"][at[0]]["name"], g % 4)
        assert chunk[1] == stored and np.array_equal(arr, data[g]), "frame %d" % g


def test_refused_for_gzip_and_no_map(tmp_path, serve):
    path = tmp_path / "g.h5"
    data = mk.make_dataset_file(path, "gzip", n=4)
    srv = serve(path, "--stats-json")
    st, msgs = get_in_place(srv, 0, 4)
    assert "map" not in st and "decodes every frame" in st["map_error"], st
    assert all(np.array_equal(a, data[h.frame_id]) for h, a, *_ in frames_of(msgs))
    rc, stats = srv.stop()
    assert stats["map_refused"] == 1 and stats["map_frames"] == 0, stats

    path = tmp_path / "r.h5"
    data = mk.make_dataset_file(path, "raw", n=4)
    srv = serve(path, "--no-map", "--stats-json")
    st, msgs = get_in_place(srv, 0, 4)
    assert "map" not in st and "--no-map" in st["map_error"], st
    assert all(np.array_equal(a, data[h.frame_id]) for h, a, *_ in frames_of(msgs))
    rc, stats = srv.stop()
    assert stats["map_refused"] == 1 and stats["map_frames"] == 0, stats


def test_corrupt_chunk_still_reported(tmp_path, serve):
    path = tmp_path / "c.h5"
    data = mk.make_corrupt(str(path), "bslz4", n=6, bad=(2, 4))
    srv = serve(path)
    st, msgs = get_in_place(srv, 0, 6)
    assert st["corrupt"] == 2, st
    at = st["map"]["at"]
    assert [a is None for a in at] == [False, False, True, False, True, False], at
    for (h, arr, meta, _) in frames_of(msgs):
        if h.frame_id in (2, 4):
            assert h.flags & proto.FLAG_CORRUPT and "frame %d" % h.frame_id in meta["error"]
        else:
            assert np.array_equal(arr, data[h.frame_id])


def test_malformed_map_is_a_bad_request(tmp_path, serve):
    path = tmp_path / "r.h5"
    mk.make_dataset_file(path, "raw", n=2)
    srv = serve(path)
    st, _ = srv.req({"op": "get", "next": 0, "credit": 1, "map": 1})
    assert st["ok"] is False and "map" in st["error"], st
    st, msgs = srv.get(0, 2, map=False)  # false: as without the key
    assert st["ok"] and "map" not in st and "map_error" not in st, st


@pytest.mark.parametrize("in_place", [True, False])
def test_file_cut_short_after_open(tmp_path, serve, in_place):
    """A file cut short while the server has it open: frames whose chunks
    now lie past the end are sent CORRUPT naming the cut (HDF5's own driver
    would read them as zeros), whether they would be read in place or by
    the server; the frames before the cut are intact."""
    n = 12
    path = tmp_path / "cut.h5"
    data = mk.make_dataset_file(path, "raw", n=n)
    with h5py.File(str(path), "r") as f:
        d = f["/entry/data/data"]
        ends = [d.id.get_chunk_info(k).byte_offset + d.id.get_chunk_info(k).size
                for k in range(n)]
    srv = serve(path)
    assert srv.req({"op": "info"})[0]["ok"]  # the file is open
    cut = ends[5] + 10  # inside frame 6's chunk
    os.truncate(str(path), cut)
    if in_place:
        st, msgs = get_in_place(srv, 0, n)
        assert [a is None for a in st["map"]["at"]] == [k > 5 for k in range(n)], st["map"]
    else:
        st, msgs = srv.get(0, n)
    assert st["corrupt"] == n - 6, st
    for h, arr, meta, _ in frames_of(msgs):
        if h.frame_id > 5:
            assert h.flags & proto.FLAG_CORRUPT and "cut short" in meta["error"], meta
        else:
            assert np.array_equal(arr, data[h.frame_id])
