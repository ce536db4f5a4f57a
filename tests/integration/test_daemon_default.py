"""The out-of-the-box setup: `beamd` with no -c (built-in config, default
ports) fed by `beamd-sim` with its default pattern and endpoint; results
arrive on tcp://127.0.0.1:5600. Skipped when a default port is taken (a
real beamd may be running on this machine)."""

import json
import signal
import time

import numpy as np
import pytest

from conftest import Receiver, port_busy, proto

DEFAULT_PORTS = (5500, 5600, 5601, 9464)


def test_default_configuration_runs(zctx, start_beamd, run_tool, receivers):
    busy = [p for p in DEFAULT_PORTS if port_busy(p)]
    if busy:
        pytest.skip("default ports in use: %s" % busy)
    b = start_beamd(None)  # ready: answers ping on the default control endpoint
    rx = Receiver(zctx, "tcp://127.0.0.1:5600", topics=(b"vd.sums", b"preview.frame",
                                                         b"beamd.series"))
    receivers.append(rx)
    rx.wait_live()
    # beamd-sub with its default endpoint as a second viewer.
    sub = run_tool("beamd-sub", ["--topic", "vd.sums", "--count", "10", "--timeout", "30",
                                 "--json"])
    time.sleep(0.5)  # PUB/SUB join: let beamd-sub subscribe before frames flow
    # Default pattern, endpoint, shape and dtype; paced and bounded so the
    # run is short (live mode would drop an unpaced stream on 2 cores).
    sim = run_tool("beamd-sim", ["--rate", "100", "--frames", "100", "--quiet"])
    assert sim.wait(30) == 0, sim.stderr()
    rx.wait_series_end(1, timeout=15)
    sums = rx.wait_topic("vd.sums", timeout=5)
    prev = rx.wait_topic("preview.frame", timeout=5)
    _, h, arr, _ = sums[0]
    assert h.type == proto.RESULT and arr.dtype == np.float64 and arr.shape == (2,)
    assert np.all(np.isfinite(arr)) and np.all(arr > 0)  # poisson mean 2 on every pixel
    assert sums[0][3]["labels"] == ["bf", "adf"]
    _, h, arr, _ = prev[0]
    assert arr.dtype == np.float32 and arr.ndim == 2
    assert sub.wait(30) == 0, sub.stderr()
    lines = [json.loads(x) for x in sub.stdout().splitlines() if x.strip()]
    vals = [x for x in lines if x.get("topic") == "vd.sums"]
    assert len(vals) == 10, lines[:3]
    assert all(len(x["values"]) == 2 for x in vals)
    st = b.stats()
    assert st["input"]["frames"] > 0 and st["input"]["malformed"] == 0
    b.signal(signal.SIGTERM)
    assert b.wait(15) == 0
