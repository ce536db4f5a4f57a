"""Starting beamd for a benchmark (bench/run.py, bench/dectris.py share it).

launch() writes the config into tmp, starts beamd on it with its output in
tmp/NAME.log, and waits until ping(ctl) answers ok; a daemon that exits or
does not answer in time is stopped, and the error carries its log's tail.
"""
import os
import signal
import subprocess
import time


def stop(p, timeout=10):
    """SIGTERM (beamd drains), then SIGKILL after timeout seconds."""
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def launch(beamd, tmp, cfg_text, name, ping, wait_s):
    """Returns (Popen, log file); ping() -> True once beamd answers."""
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(cfg_text)
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen([beamd, "-c", path, "-l", "warning"], stdout=log,
                         stderr=subprocess.STDOUT)
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if p.poll() is not None:
            break
        try:
            if ping():
                return p, log
        except (RuntimeError, ValueError, subprocess.TimeoutExpired):
            time.sleep(0.1)
    stop(p, 15)
    log.close()
    with open(os.path.join(tmp, name + ".log")) as f:
        raise RuntimeError("beamd did not start: " + f.read()[-2000:])
