# %% [markdown]
# # Following beamd results live from a notebook
#
# Run beamd with an XPCS stage (for example the quick start's `make demo`, or
# `beamd -c etc/beamd.yaml` fed by `beamd-sim --pattern xpcs`), then run these
# cells in Jupyter (`# %%` cells also run in VS Code, or as a plain script).

# %%
import matplotlib
from beamd_client import Control, Subscriber
from beamd_client.live import LivePlot

PUBLISH = "tcp://127.0.0.1:5600"   # output.publish of the daemon
CONTROL = "tcp://127.0.0.1:5601"   # control.endpoint

# %% What is the daemon doing?
with Control(CONTROL) as ctl:
    for s in ctl.stats()["stages"]:
        print(s["name"], s.get("kind"), s.get("frames_in"), "frames in")

# %% Which topics are flowing?
sub = Subscriber(PUBLISH)
print(sorted(sub.latest(timeout=3.0)))

# %% Follow g2 per q-ring (curves on a log tau axis) until the series ends
plot = LivePlot(Subscriber(PUBLISH, topics=["g2."]), "g2.g2")  # g2.lags gives tau
plot.run(seconds=120)

# %% Or any image-like result: the latest corrected frame, PCA components, a
# ptychographic object (complex: magnitude and phase)
LivePlot(Subscriber(PUBLISH, topics=["preview."]), "preview.frame", cmap="gray").run(seconds=30)
print("matplotlib backend:", matplotlib.get_backend())
