"""`make install` and `make uninstall` into a staging tree (DESTDIR), with
PREFIX=/usr, reusing the programs already built in $BEAMD_BUILD (install
builds only the programs, and they are up to date, so nothing compiles).

Checks what lands where (a man page for every program among it, rendered by
groff without a warning where groff is installed), that the unit's paths
follow PREFIX, the
sysusers line, that /etc/beamd/beamd.yaml is the minimal config (no record
stage) and passes --check-config, that an existing config is never
overwritten, and that uninstall leaves nothing but the operator's config."""

import filecmp
import os
import re
import shutil
import subprocess

import pytest

from conftest import BUILD, REPO, binary

TOOLS = sorted(d for d in os.listdir(os.path.join(REPO, "tools"))
               if os.path.isfile(os.path.join(REPO, "tools", d, "main.c")))
# Tools written in Python, installed from $(BUILD) with the version filled in.
SCRIPTS = ["beamd-pca-rebuild"]


def build_vars():
    """The make variables the build was made with: without them make would
    see other flags and rebuild everything."""
    flags = open(os.path.join(BUILD, ".flags")).read()
    v = ["BUILD=" + os.path.relpath(BUILD, REPO)]
    m = re.search(r"CUDA=(\d)\s*$", flags)
    if m:
        v.append("CUDA=" + m.group(1))
    m = re.search(r"-fsanitize=([a-z,]+)", flags)
    if m:
        v.append("SANITIZER=" + m.group(1))
    return v


def make(target, dest, *extra):
    r = subprocess.run(["make", "-j2", target, "DESTDIR=" + str(dest), "PREFIX=/usr"]
                       + build_vars() + list(extra), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, "make %s failed:\n%s\n%s" % (target, r.stdout, r.stderr)
    return r.stdout + r.stderr


def files_under(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


def test_install_and_uninstall(tmp_path):
    binary("beamd")  # fails clearly when nothing is built
    dest = tmp_path / "root"
    out = make("install", dest)
    assert not re.search(r"^cc .* -c ", out, re.M), \
        "install compiled something (was %s out of date? run make first):\n%s" % (BUILD, out)

    for prog in ["beamd"] + TOOLS + SCRIPTS:
        p = dest / "usr/bin" / prog
        assert p.is_file() and os.access(str(p), os.X_OK), prog
    for prog in SCRIPTS:
        assert '\nVERSION = None\n' not in (dest / "usr/bin" / prog).read_text(), prog

    # A man page per program, as in man/man1.
    groff = shutil.which("groff")
    for prog in ["beamd"] + TOOLS + SCRIPTS:
        page = dest / "usr/share/man/man1" / (prog + ".1")
        assert page.is_file(), page
        assert filecmp.cmp(str(page), os.path.join(REPO, "man", "man1", prog + ".1"), shallow=False)
        first = [l for l in page.read_text().splitlines() if not l.startswith('.\\"')][0]
        assert first.startswith(".TH "), (prog, first)
        if groff:
            r = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z", str(page)],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0 and r.stderr == "", (prog, r.stderr)
    assert sorted(os.listdir(dest / "usr/share/man/man1")) == sorted(
        p + ".1" for p in ["beamd"] + TOOLS + SCRIPTS)

    # The unit, generated for PREFIX=/usr.
    unit = (dest / "lib/systemd/system/beamd.service").read_text()
    assert "@" not in re.sub(r"(?m)^#.*$", "", unit), "placeholder left in the unit"
    assert "/usr/local" not in unit
    assert re.search(r"^ExecStart=/usr/bin/beamd -c /etc/beamd/beamd\.yaml$", unit, re.M), unit
    assert re.search(r"^ExecStartPre=/usr/bin/beamd --quiet --check-config /etc/beamd/beamd\.yaml$",
                     unit, re.M), unit
    assert re.search(r"^Documentation=file:///usr/share/doc/beamd/README\.md$", unit, re.M)
    assert re.search(r"^User=beamd$", unit, re.M) and re.search(r"^StateDirectory=beamd$", unit, re.M)
    assert re.search(r"^ProtectSystem=strict$", unit, re.M)

    # The service user, from sysusers.d.
    sysusers = (dest / "usr/lib/sysusers.d/beamd.conf").read_text()
    assert re.search(r"^u beamd - .* /var/lib/beamd$", sysusers, re.M), sysusers
    assert re.search(r"^m beamd video$", sysusers, re.M), sysusers
    su = shutil.which("systemd-sysusers")
    if su:
        r = subprocess.run([su, "--dry-run", "--root", str(dest)], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0 and "Creating user 'beamd'" in r.stdout + r.stderr, r

    # /etc gets the minimal config; the reference goes with the docs.
    cfg = dest / "etc/beamd/beamd.yaml"
    assert filecmp.cmp(str(cfg), os.path.join(REPO, "etc", "beamd-minimal.yaml"), shallow=False)
    assert not re.search(r"^\s*kind:\s*record\b", cfg.read_text(), re.M)
    ref = dest / "usr/share/doc/beamd/beamd.yaml.example"
    assert filecmp.cmp(str(ref), os.path.join(REPO, "etc", "beamd.yaml"), shallow=False)
    assert re.search(r"^\s*kind:\s*record\b", ref.read_text(), re.M)
    assert (dest / "usr/share/doc/beamd/README.md").is_file()
    for f in os.listdir(os.path.join(REPO, "tools", "beamd-view", "www")):
        assert (dest / "usr/share/beamd-view/www" / f).is_file(), f

    # The installed binary accepts the installed config: safe to start.
    r = subprocess.run([str(dest / "usr/bin/beamd"), "--check-config", str(cfg)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert "valid (1 stages)" in r.stderr
    dump = r.stdout
    assert "record" not in dump
    eps = re.findall(r"(?m)^\s*(?:endpoint|publish|push|listen): (\S*:\S*)$", dump)
    assert len(eps) == 4, eps  # input, publish, control, metrics
    for ep in eps:
        assert "127.0.0.1" in ep, "not loopback: " + ep

    # An edited config survives a second install; the new one goes beside it.
    cfg.write_text(cfg.read_text() + "# edited by the operator\n")
    edited = cfg.read_text()
    out = make("install", dest)
    assert cfg.read_text() == edited
    assert (dest / "etc/beamd/beamd.yaml.new").is_file()
    assert "beamd.yaml.new" in out

    # Uninstall: only the operator's config is left.
    out = make("uninstall", dest)
    assert files_under(dest) == ["etc/beamd/beamd.yaml"], files_under(dest)
    assert cfg.read_text() == edited
    assert not (dest / "usr/share/doc/beamd").exists()
    assert not (dest / "usr/share/beamd-view").exists()
    assert not (dest / "usr/share/man").exists()
