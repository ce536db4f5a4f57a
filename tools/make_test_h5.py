#!/usr/bin/python3
"""Writes small HDF5 files for testing beamd-replay and beamd's replay input.

Every file holds a stack of frames (N, H, W) chunked one frame per chunk
unless said otherwise, so the replay server can forward stored chunks. The
frames are deterministic (seeded Poisson counts plus a per-frame ramp), and
every writer returns the numpy array it wrote, so a test compares what it
receives bit for bit. Not a general NeXus writer: only the paths beamd-replay
reads (docs/replay.md) are written.

Kinds of single-dataset files (dataset /entry/data/data):
  raw          chunked (1, H, W), no filter
  contiguous   no chunking
  gzip         deflate level 4
  shuffle_gzip shuffle + deflate
  lz4          HDF5 LZ4 filter 32004 (forwarded as codec lz4)
  bslz4        bitshuffle + LZ4, filter 32008 with compression_opts (0, 2)
  bs           bitshuffle without compression (32008, opts (0, 0))
  lz4_multi    LZ4 with chunks of 4 frames (decoded, sent raw)
Plus an Eiger/NXmx-style master with external links to data files, a file
with garbage chunks, a master with a dangling link, and a 2-D dataset.

Command line: make_test_h5.py OUTDIR [--frames N] [--shape HxW] [--dtype T]
writes one of each into OUTDIR and a manifest.json describing them. The
filters come from Debian's hdf5-filter-plugin and bitshuffle packages.
"""

import argparse
import json
import os
import sys

PLUGIN_DIR = "/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins"
os.environ.setdefault("HDF5_PLUGIN_PATH", PLUGIN_DIR)

import h5py  # noqa: E402
import numpy as np  # noqa: E402

# HDF5 may already be initialised by another import, so the environment
# variable alone would come too late; adding the directory is idempotent.
if os.path.isdir(PLUGIN_DIR):
    try:
        if PLUGIN_DIR.encode() not in [h5py.h5pl.get(i) for i in range(h5py.h5pl.size())]:
            h5py.h5pl.append(PLUGIN_DIR.encode())
    except Exception:  # noqa: BLE001 - old h5py without h5pl: the env var still works
        pass

LZ4_ID = 32004
BSHUF_ID = 32008
KINDS = ("raw", "contiguous", "gzip", "shuffle_gzip", "lz4", "bslz4", "bs", "lz4_multi")

# Metadata written by make_master (SI after the units conversion the server
# does): wavelength 1.0 A -> 12398.42 eV, 250 mm, 75 um pixels, 2 ms frames.
MASTER_META = {"wavelength_A": 1.0, "distance_mm": 250.0, "pixel_um": 75.0,
               "frame_time_s": 0.002, "count_time_s": 0.0019, "detector": "EIGER2 test 1M",
               "beam_center": (10.5, 12.25)}


def frames(n, shape=(32, 48), dtype="uint16", seed=1, first=0):
    """Frames first..first+n-1 of a deterministic stack: Poisson counts
    (mean 3) plus the frame index on every 7th pixel, so frames differ and
    compress like detector data."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    out = np.empty((n,) + tuple(shape), dt)
    h, w = shape
    for i in range(n):
        k = first + i
        base = rng.poisson(3.0, (h, w)).astype(np.float64)
        base.flat[::7] += k % 251
        if dt.kind == "f":
            base = base * 0.5 + 0.25
        elif dt.kind == "i":
            base = base - 2
        out[i] = base.astype(dt)
    return out


def _create(g, name, data, kind):
    n, h, w = data.shape
    kw = {"chunks": (1, h, w)}
    if kind == "raw":
        pass
    elif kind == "contiguous":
        kw = {}
    elif kind == "gzip":
        kw.update(compression="gzip", compression_opts=4)
    elif kind == "shuffle_gzip":
        kw.update(compression="gzip", compression_opts=4, shuffle=True)
    elif kind == "lz4":
        kw.update(compression=LZ4_ID)
    elif kind == "bslz4":
        kw.update(compression=BSHUF_ID, compression_opts=(0, 2))
    elif kind == "bs":
        kw.update(compression=BSHUF_ID, compression_opts=(0, 0))
    elif kind == "lz4_multi":
        kw.update(compression=LZ4_ID, chunks=(min(4, n), h, w))
    else:
        raise ValueError("unknown kind %r (one of %s)" % (kind, ", ".join(KINDS)))
    return g.create_dataset(name, data=data, **kw)


def make_dataset_file(path, kind="raw", n=6, shape=(32, 48), dtype="uint16", seed=1,
                      dataset="/entry/data/data", positions=False):
    """One file with one 3-D dataset; returns the array written. With
    positions, /entry/sample/positions holds (n, 2) x, y in mm (units
    attribute "mm"), and the array of positions in metres is returned too."""
    data = frames(n, shape, dtype, seed)
    with h5py.File(path, "w") as f:
        _create(f, dataset, data, kind)
        if positions:
            pos = _positions(n)
            d = f.create_dataset("/entry/sample/positions", data=pos * 1e3)
            d.attrs["units"] = "mm"
            return data, pos
    return data


def _positions(n):
    """A raster of 100 nm steps, 4 columns, as (n, 2) x, y in metres."""
    k = np.arange(n)
    return np.stack([(k % 4) * 1e-7, (k // 4) * 1e-7], axis=1)


def _scalar(g, name, value, units=None):
    d = g.create_dataset(name, data=value)
    if units:
        d.attrs["units"] = units
    return d


def make_master(dirpath, name="scan", nfiles=3, per_file=4, last_file=None, shape=(32, 48),
                dtype="uint16", kind="bslz4", seed=1, positions=True, dangling=(),
                energy_from="wavelength", missing=(), metadata=True):
    """An Eiger-style master `<name>_master.h5` with /entry/data/data_NNNNNN
    external links to `<name>_data_NNNNNN.h5` (each /entry/data/data).
    last_file: frames in the last data file (default per_file). dangling:
    1-based file numbers whose link points to a file that is not written.
    missing: 1-based file numbers written and then deleted (same effect,
    but the link target name is the usual one). Returns (master path, full
    array, positions in metres or None)."""
    os.makedirs(dirpath, exist_ok=True)
    counts = [per_file] * nfiles
    if last_file is not None:
        counts[-1] = last_file
    total = sum(counts)
    data = frames(total, shape, dtype, seed)
    master = os.path.join(dirpath, "%s_master.h5" % name)
    first = 0
    for i, c in enumerate(counts, 1):
        fname = "%s_data_%06d.h5" % (name, i)
        if i not in dangling:
            with h5py.File(os.path.join(dirpath, fname), "w") as f:
                d = _create(f, "/entry/data/data", data[first:first + c], kind)
                d.attrs["image_nr_low"] = first + 1
                d.attrs["image_nr_high"] = first + c
        first += c
    pos = _positions(total) if positions else None
    m = MASTER_META
    with h5py.File(master, "w") as f:
        entry = f.create_group("entry")
        entry.attrs["NX_class"] = "NXentry"
        dg = entry.create_group("data")
        dg.attrs["NX_class"] = "NXdata"
        for i in range(1, nfiles + 1):
            target = "%s_data_%06d.h5" % (name, i)
            if i in dangling:
                target = "%s_gone_%06d.h5" % (name, i)
            dg["data_%06d" % i] = h5py.ExternalLink(target, "/entry/data/data")
        if metadata:
            det = f.create_group("entry/instrument/detector")
            det.attrs["NX_class"] = "NXdetector"
            det.create_dataset("description", data=m["detector"])
            _scalar(det, "detector_distance", m["distance_mm"], "mm")
            _scalar(det, "x_pixel_size", m["pixel_um"], "um")
            _scalar(det, "y_pixel_size", m["pixel_um"], "um")
            _scalar(det, "frame_time", m["frame_time_s"] * 1e3, "ms")
            _scalar(det, "count_time", m["count_time_s"], "s")
            _scalar(det, "beam_center_x", m["beam_center"][1], "pixel")
            _scalar(det, "beam_center_y", m["beam_center"][0], "pixel")
            mask = np.zeros(shape, np.uint32)
            mask[0, :3] = 1
            det.create_dataset("pixel_mask", data=mask)
            beam = f.create_group("entry/instrument/beam")
            if energy_from == "wavelength":
                _scalar(beam, "incident_wavelength", m["wavelength_A"], "angstrom")
            else:
                _scalar(beam, "incident_energy", 12.39841984 / m["wavelength_A"], "keV")
        if positions:
            d = f.create_dataset("/entry/sample/positions", data=pos * 1e6)
            d.attrs["units"] = "um"
    for i in missing:
        os.unlink(os.path.join(dirpath, "%s_data_%06d.h5" % (name, i)))
    return master, data, pos


def make_corrupt(path, kind="bslz4", n=6, bad=(2,), shape=(32, 48), dtype="uint16", seed=1,
                 garbage=None):
    """A file whose chunks at the frame indices in `bad` are replaced by
    garbage bytes written with write_direct_chunk (filter mask 0, so HDF5
    believes they are compressed). Returns the array of the good data (the
    bad frames hold what was there before)."""
    data = frames(n, shape, dtype, seed)
    junk = garbage if garbage is not None else bytes(range(7, 247)) * 3
    with h5py.File(path, "w") as f:
        d = _create(f, "/entry/data/data", data, kind)
        for k in bad:
            d.id.write_direct_chunk((k, 0, 0), junk, 0)
    return data


def make_2d(path, shape=(32, 48)):
    with h5py.File(path, "w") as f:
        f.create_dataset("/entry/data/data", data=np.zeros(shape, np.uint16))
    return path


def stored_chunk(path, k, dataset="/entry/data/data"):
    """(filter_mask, bytes) of the chunk holding frame k, as stored."""
    with h5py.File(path, "r") as f:
        return f[dataset].id.read_direct_chunk((k, 0, 0))


def make_all(outdir, n=6, shape=(32, 48), dtype="uint16"):
    os.makedirs(outdir, exist_ok=True)
    man = {}
    for kind in KINDS:
        p = os.path.join(outdir, "%s.h5" % kind)
        make_dataset_file(p, kind, n, shape, dtype)
        man[kind] = {"file": p, "dataset": "/entry/data/data", "frames": n}
    master, data, _ = make_master(os.path.join(outdir, "master"), shape=shape, dtype=dtype)
    man["master"] = {"file": master, "frames": int(data.shape[0])}
    p = os.path.join(outdir, "corrupt_bslz4.h5")
    make_corrupt(p, "bslz4", n, (2,), shape, dtype)
    man["corrupt_bslz4"] = {"file": p, "frames": n, "corrupt": [2]}
    p = os.path.join(outdir, "corrupt_gzip.h5")
    make_corrupt(p, "gzip", n, (2,), shape, dtype)
    man["corrupt_gzip"] = {"file": p, "frames": n, "corrupt": [2]}
    master, data, _ = make_master(os.path.join(outdir, "dangling"), name="dang", dangling=(2,),
                                  shape=shape, dtype=dtype)
    man["dangling"] = {"file": master, "frames": int(data.shape[0]), "dangling_file": 2}
    man["2d"] = {"file": make_2d(os.path.join(outdir, "2d.h5"), shape)}
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    return man


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--shape", default="32x48")
    ap.add_argument("--dtype", default="uint16")
    a = ap.parse_args(argv)
    try:
        h, w = (int(x) for x in a.shape.lower().split("x"))
    except ValueError:
        ap.error("--shape: expected HxW, got %r" % a.shape)
    man = make_all(a.outdir, a.frames, (h, w), a.dtype)
    for k, v in man.items():
        print("%-14s %s" % (k, v["file"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
