"""Malformed input end to end: every kind of bad message is counted under
its own counter, logged (rate-limited), and dropped; the valid frames
around it are all processed with correct results, and beamd stays up.

Pull mode, so nothing is lost and the counts are exact. Messages that parse
carry contiguous sequence numbers (so lost and gaps stay 0); messages that
do not parse never reach the sequence tracker."""

import re
import time

import numpy as np
import zmq

from conftest import Receiver, Sender, make_config, proto, roi_masks

H, W = 32, 32
ROIS = [{"name": "bf", "shape": "disk", "radius": 6},
        {"name": "box", "shape": "rect", "rect": [2, 3, 20, 9]}]


def hdr(**kw):
    """A FRAME header for H x W uint16, raw, with fields overridden."""
    h = proto.Header(type=proto.FRAME, series_id=1, dtype=proto.DTYPES.index("uint16"), ndim=2,
                     shape=(H, W, 0, 0), raw_size=H * W * 2, payload_size=H * W * 2, nparts=1)
    for k, v in kw.items():
        setattr(h, k, v)
    return h


def test_malformed_messages_counted_and_survived(ports, zctx, start_beamd, receivers):
    stages = [{"name": "vd", "kind": "roi_sum", "backend": "cpu", "rois": ROIS}]
    cfg = make_config(ports, stages, mode="pull", frame_bytes="64Ki",
                      log={"level": "info", "rate_limit": 2})
    b = start_beamd(cfg)
    rx = Receiver(zctx, ports.ep_publish, topics=(b"vd.sums", b"beamd.series"))
    receivers.append(rx)
    rx.wait_live()
    tx = Sender(zctx, ports.ep_input, zmq.PUSH)
    rng = np.random.default_rng(5)
    valid = {}
    expect = dict(malformed=0, unknown_series=0, shape_mismatch=0, too_large=0, unexpected=0)

    def good(fid):
        a = rng.integers(0, 1000, size=(H, W)).astype(np.uint16)
        valid[fid] = a
        tx.frame(1, fid, a)

    def garbage(parts, counter="malformed"):
        tx.send_parts(parts, numbered=False)
        expect[counter] += 1

    payload = np.zeros((H, W), np.uint16).tobytes()
    tx.start(1, (H, W), np.uint16)
    good(0)
    garbage([hdr(seq=tx.seq).encode()[:60], payload])                  # truncated header
    good(1)
    garbage([b"\x89XYZ" + hdr(seq=tx.seq).encode()[4:], payload])      # bad magic
    good(2)
    garbage([hdr(seq=tx.seq).encode(), payload[:-48]])                 # payload shorter than declared
    garbage([hdr(seq=tx.seq, type=9).encode(), payload])               # unknown message type
    good(3)
    garbage([hdr(seq=tx.seq).encode()] + [payload[:64]] * 24)          # too many parts
    garbage([hdr(seq=tx.seq, dtype=proto.DTYPES.index("uint32"), shape=(60000, 60000, 0, 0),
                 raw_size=60000 * 60000 * 4, payload_size=16).encode(), b"\0" * 16])  # huge shape
    good(4)
    # These parse, so they are numbered; each has its own counter.
    tx.frame(999, 0, valid[0])                                          # series never started
    expect["unknown_series"] += 1
    tx.frame(1, 100, valid[0].astype(np.uint32))                        # dtype differs
    tx.frame(1, 101, valid[0][:, :16].copy())                           # shape differs
    expect["shape_mismatch"] += 2
    tx.send_parts(proto.encode_message(proto.RESULT, array=valid[0], series_id=1, frame_id=102,
                                       seq=tx.seq, topic="x.sums"))     # a RESULT on the input
    expect["unexpected"] += 1
    good(5)
    good(6)
    tx.end(1)
    # A series whose frames exceed pool.frame_bytes (64 KiB): too_large.
    big = np.zeros((256, 256), np.uint16)
    tx.start(2, big.shape, np.uint16)
    tx.frame(2, 0, big)
    tx.frame(2, 1, big)
    expect["too_large"] += 2
    tx.end(2)
    # After the rate-limit window a new warning brings the summary line.
    time.sleep(1.2)
    garbage([hdr(seq=tx.seq).encode()[:60], payload])
    tx.start(3, (H, W), np.uint16)
    for fid in range(7, 10):
        a = rng.integers(0, 1000, size=(H, W)).astype(np.uint16)
        valid[fid] = a
        tx.frame(3, fid, a)
    tx.end(3)

    rx.wait_series_end(3, timeout=10)
    st = b.wait_stats(lambda s: s["input"]["messages"] == tx.sent, timeout=5,
                      what="all %d messages counted" % tx.sent)
    inp = st["input"]
    for k, v in expect.items():
        assert inp[k] == v, "input.%s = %d, expected %d (stats %s)" % (k, inp[k], v, inp)
    assert inp["lost"] == 0 and inp["gaps"] == 0 and inp["dropped_busy"] == 0, inp
    assert inp["frames"] == len(valid), inp
    assert inp["series"] == 3

    # Every valid frame has its result, with the right sums.
    masks = roi_masks(ROIS, H, W)
    rx.wait_for(lambda ms: sum(1 for m in ms if m[0] == "vd.sums") >= len(valid), timeout=5,
                what="a result per valid frame")
    got = {}
    for _, h, arr, _ in rx.snapshot("vd.sums"):
        assert (h.series_id, h.frame_id) not in got
        got[(h.series_id, h.frame_id)] = arr
    assert sorted(fid for _, fid in got) == sorted(valid)
    for (sid, fid), arr in got.items():
        ref = np.array([valid[fid].astype(np.float64)[m].sum() for m in masks])
        assert np.array_equal(arr, ref), (sid, fid, arr, ref)

    assert b.alive() and b.ctl("ping") == {"ok": True}
    log = b.stderr()
    warn = re.findall(r"warning: input: ", log)
    assert warn, "no warning logged for bad input"
    bad_total = sum(expect.values())
    # rate_limit 2/s: the burst can straddle at most two windows.
    assert len(warn) <= 4 < bad_total, "%d warnings for %d bad messages" % (len(warn), bad_total)
    assert re.search(r"suppressed \d+ similar messages", log), "no suppression summary"
    # The first bad message (a truncated header) is logged with its reason.
    assert "input: malformed message: header part length != hdr_size" in log
    tx.close()
