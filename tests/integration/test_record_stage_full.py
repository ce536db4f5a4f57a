"""The `record` stage on a full disk (a 512 KiB tmpfs; needs root, skipped
otherwise): the write error is logged with the file and the system's
reason, counted as the stage's errors, the daemon and its other stages go
on (every frame's roi_sum result is still published), the frames written
before the disk filled are intact and readable in the .partial file, and
the next series, once there is room again, is recorded whole."""

import os
import subprocess

import h5py
import numpy as np
import pytest
import zmq

from conftest import Receiver, Sender, make_config, stage

H = W = 64
N = 80  # 80 x 8 KiB raw frames: well past 512 KiB with HDF5's own bytes


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): %s" % r.stderr.decode().strip())
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def frames(seed, n):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 60000, size=(n, H, W), dtype=np.uint16)  # incompressible


def test_record_stage_disk_full(small_fs, ports, zctx, start_beamd, receivers):
    stages = [{"name": "rec", "kind": "record", "input": "frames", "dir": str(small_fs),
               "compress": "none", "queue": 8},
              {"name": "vd", "kind": "roi_sum", "backend": "cpu",
               "rois": [{"name": "all", "shape": "rect", "rect": [0, 0, W, H]}]}]
    b = start_beamd(make_config(ports, stages, mode="pull", pool_frames=16))
    rx = Receiver(zctx, ports.ep_publish, topics=(b"vd.", b"beamd.series"))
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    data = frames(1, N)
    tx.start(1, (H, W), np.uint16)
    for k in range(N):
        tx.frame(1, k, data[k])
    tx.end(1)
    rx.wait_series_end(1, timeout=20)
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "vd.sums" and m[1].series_id == 1) >= N,
                timeout=10, what="every vd.sums of series 1")
    b.wait_log(r"record \"rec\": .*series_1\.h5.*No space left on device", timeout=10)
    st = b.stats()
    assert b.alive() and stage(st, "rec")["errors"] >= 1, stage(st, "rec")
    assert stage(st, "vd")["frames_out"] == N
    part = [f for f in os.listdir(small_fs) if f.startswith("series_1")]
    assert part, os.listdir(small_fs)
    with h5py.File(os.path.join(small_fs, part[0]), "r") as f:
        d = f["/entry/data/data"]
        ids = f["/entry/data/frame_id"][...] if "frame_id" in f["/entry/data"] else None
        assert 1 <= d.shape[0] < N, d.shape
        for k in range(d.shape[0]):
            fid = int(ids[k]) if ids is not None and k < len(ids) else k
            np.testing.assert_array_equal(d[k], data[fid], err_msg="frame %d" % k)
    # Room again: the next series is recorded whole.
    for name in os.listdir(small_fs):
        os.unlink(os.path.join(small_fs, name))
    data2 = frames(2, 10)
    tx.start(2, (H, W), np.uint16)
    for k in range(10):
        tx.frame(2, k, data2[k])
    tx.end(2)
    rx.wait_series_end(2, timeout=20)
    path = os.path.join(small_fs, "series_2.h5")
    deadline_ok = b.wait_stats(lambda s: os.path.exists(path), timeout=10,
                               what="series_2.h5 finished")
    assert deadline_ok
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["/entry/data/data"][...], data2)
    tx.close()
