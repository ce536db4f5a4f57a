"""beamd_client: use beamd from Python and notebooks.

    from beamd_client import Subscriber, Control
    with Subscriber("tcp://127.0.0.1:5600", topics=["g2."]) as sub:
        for r in sub.results(timeout=10):
            print(r.topic, r.array.shape, r.descriptor.get("axes"))

- Subscriber: results (and optionally series events) as numpy arrays with
  their header fields and result descriptors (names, units, axes, labels).
- Control: status / stats / reload / stop / ping on the control endpoint.
- Publisher: send series of numpy frames (PUB or PUSH), for tests and
  simulations.
- ReplayServer: serve numpy frames to a daemon whose input mode is
  `replay`, speaking the credit protocol of PROTOCOL.md section 13.
- Curve: CURVE keys for any of these (beamd endpoints with curve: true).
- g2_with_lags: an xpcs stage's g2 joined with its lag times, per ROI.
- to_xarray: a Result as an xarray.DataArray (axes, labels, units); needs
  python3-xarray, imported only when called.
- live: LivePlot, a matplotlib figure that follows a topic (notebooks).

numpy and pyzmq come from Debian (python3-numpy, python3-zmq); the wire
format is the `beamd` package next to this one.
"""

from .control import Control, ControlError  # noqa: F401
from .curve import Curve  # noqa: F401
from .g2 import G2, g2_with_lags  # noqa: F401
from .labelled import to_xarray  # noqa: F401
from .publish import Publisher  # noqa: F401
from .replay import ReplayServer  # noqa: F401
from .subscribe import Result, SeriesEvent, Subscriber  # noqa: F401

__all__ = ["Control", "ControlError", "Curve", "G2", "Publisher", "ReplayServer", "Result",
           "SeriesEvent", "Subscriber", "g2_with_lags", "to_xarray"]
