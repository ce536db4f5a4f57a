"""tests/run-unit.sh, the C test runner: each test in its own process,
TAP out, and a test that crashes, fails or hangs is named while the rest
still run. Driven with a stand-in binary that speaks the runner.h protocol
(BEAM_TEST_LIST, BEAM_TEST_FILTER), and with a real cmocka binary."""

import os
import re
import subprocess

from conftest import REPO

FAKE = r"""#!/bin/sh
if [ -n "$BEAM_TEST_LIST" ]; then printf 'test_a\ntest_crash\ntest_hang\ntest_fail\ntest_z\n'; exit 0; fi
case "$BEAM_TEST_FILTER" in
  test_a|test_z) echo "[  PASSED  ] 1 test(s)."; exit 0 ;;
  test_crash) echo "about to crash"; kill -SEGV $$ ;;
  test_hang) sleep 30 ;;
  test_fail) echo "assertion at x.c:12"; exit 1 ;;
esac
exit 3
"""


def run(args, **env):
    e = dict(os.environ, **env)
    return subprocess.run([os.path.join(REPO, "tests", "run-unit.sh")] + args,
                          capture_output=True, text=True, env=e, timeout=60)


def test_each_test_in_its_own_process_with_tap(tmp_path):
    fake = tmp_path / "test_fake"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    r = run([str(fake)], BEAM_TEST_TIMEOUT="2")
    out = r.stdout
    assert r.returncode != 0
    assert out.startswith("TAP version 13\n")
    assert re.search(r"^ok 1 - test_fake: test_a$", out, re.M), out
    assert re.search(r"^not ok 2 - test_fake: test_crash # killed by signal 11$", out, re.M), out
    assert re.search(r"^not ok 3 - test_fake: test_hang # timed out after 2s$", out, re.M), out
    assert re.search(r"^not ok 4 - test_fake: test_fail # exit 1$", out, re.M), out
    assert re.search(r"^#   assertion at x.c:12$", out, re.M), out  # the failed test's output
    assert re.search(r"^ok 5 - test_fake: test_z$", out, re.M), out  # runs after the crash
    assert re.search(r"^1\.\.5$", out, re.M), out
    assert "unit: 2 passed, 3 failed (5 tests in 1 binaries" in out


def test_real_binary_lists_and_filters():
    build = os.environ.get("BEAMD_BUILD", "build")
    binary = os.path.join(REPO, build, "tests", "test_proto")
    names = subprocess.run([binary], env=dict(os.environ, BEAM_TEST_LIST="1"),
                           capture_output=True, text=True, timeout=10).stdout.split()
    assert len(names) >= 2 and all(n.startswith("test_") for n in names), names
    one = subprocess.run([binary], env=dict(os.environ, BEAM_TEST_FILTER=names[1]),
                         capture_output=True, text=True, timeout=30)
    assert one.returncode == 0
    assert "Running 1 test(s)" in one.stdout and names[1] in one.stdout, one.stdout
    r = run([binary])
    assert r.returncode == 0, r.stdout
    assert "unit: %d passed, 0 failed" % len(names) in r.stdout
