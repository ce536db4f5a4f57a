"""README.md and docs/*.md point only at files a clone of the repository has.

Every relative markdown link `[text](target)` (the part before any `#`)
must name a file or directory that exists and lies inside the repository;
a link that climbs out of it (`../shared/...`) or names an absolute path
fails even when the file happens to exist on this machine. Prose that
mentions a path outside the repository (`/work/...`, the developers'
`shared/` or `notes/` trees) fails too: docs state such facts inline.
URLs (`http:`, `mailto:`...) and in-page anchors are not checked here.

Every ```yaml block passes `beamd --check-config` (the rule is above
FIXTURES below).
"""

import glob
import os
import re

import pytest

from conftest import REPO

DOCS = ["README.md"] + sorted(os.path.relpath(p, REPO)
                              for p in glob.glob(os.path.join(REPO, "docs", "*.md")))

LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Trees that exist only on the developers' machines, never in a clone.
OUTSIDE = re.compile(r"(?<![\w./-])(?:/work/|\.\./shared/|shared/notes/|notes/[\w-]+\.md)")


def links(text):
    """(line number, target) of every markdown link in text."""
    for m in LINK.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def bad_link(doc, target):
    """Why target (a link in the file doc, relative to REPO) is broken, or None."""
    if SCHEME.match(target) or target.startswith("#"):
        return None
    path = target.split("#", 1)[0]
    if path.startswith("/"):
        return "absolute path"
    full = os.path.normpath(os.path.join(REPO, os.path.dirname(doc), path))
    if os.path.commonpath([full, REPO]) != REPO:
        return "points outside the repository"
    if not os.path.exists(full):
        return "no such file in the repository"
    return None


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve_inside_repo(doc):
    text = open(os.path.join(REPO, doc), encoding="utf-8").read()
    bad = [f"{doc}:{ln}: ({t}): {why}" for ln, t in links(text)
           if (why := bad_link(doc, t))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS)
def test_no_paths_outside_repo(doc):
    bad = []
    for ln, line in enumerate(open(os.path.join(REPO, doc), encoding="utf-8"), 1):
        for m in OUTSIDE.finditer(line):
            bad.append(f"{doc}:{ln}: {m.group(0)!r}")
    assert not bad, "\n".join(bad)


def test_checker_catches_broken_links():
    """The checker itself must be able to fail."""
    assert bad_link("docs/x.md", "../shared/notes/fitting.md")
    assert bad_link("docs/x.md", "../../outside.md")
    assert bad_link("docs/x.md", "nosuch.md#a")
    assert bad_link("README.md", "/work/main/README.md")
    assert bad_link("docs/x.md", "xpcs.md#rois") is None
    assert bad_link("README.md", "etc/beamd.yaml") is None
    assert bad_link("README.md", "https://example.org/") is None
    assert list(links("a [b](c.md) d\n[e](f.md#g \"t\")")) == [(1, "c.md"), (2, "f.md#g")]
    assert OUTSIDE.search("see notes/fitting.md §6")
    assert OUTSIDE.search("(/work/shared/DESIGN.md)")
    assert not OUTSIDE.search("`tools/python/beamd/proto.py`")


# --- YAML config examples ---------------------------------------------------
#
# Rule (also in docs/hacking.md, "Docs"): every ```yaml block in README.md
# and docs/*.md is a beamd configuration or a part of one, and must pass
# `beamd --check-config`, unless its first line is `# not a config`.
# A part is completed with etc/beamd-minimal.yaml: each top-level section
# the block lacks (input, output, control, metrics, pool, stages) is taken
# from there, appended after the block so that an error's line number is
# the block's own. A block may not hold two configurations (write two
# blocks). A block of one stage's keys starts with `# stage: KIND`; it
# becomes the keys of a stage of that kind (name "example", input frames),
# the rest of the config as above. Absolute paths in a block (masks, keys, directories) are moved
# under a temporary directory, where FIXTURES creates them as the key
# needs (keygen for CURVE keys, a directory, a file); a path without a
# fixture fails the test, so a new example cannot slip by unchecked.

NOT_A_CONFIG = "# not a config"
FENCE = re.compile(r"^\s*```\s*(\S*)\s*$")
ABS_PATH = re.compile(r"(?<![\w:/.~-])/(?:etc|data|var|srv|home|opt|tmp)/[\w./-]*[\w/]")
SECTION = re.compile(r"^([A-Za-z_][\w]*)\s*:")


def yaml_blocks():
    """(doc, first line of the block's body, body) of every ```yaml block."""
    out = []
    for doc in DOCS:
        lines = open(os.path.join(REPO, doc), encoding="utf-8").read().split("\n")
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if m:
                j = i + 1
                while j < len(lines) and not FENCE.match(lines[j]):
                    j += 1
                if m.group(1) in ("yaml", "yml"):
                    # An indented fence (in a list item) indents its body.
                    ind = len(lines[i]) - len(lines[i].lstrip())
                    body = [l[ind:] if l[:ind].strip() == "" else l for l in lines[i + 1:j]]
                    out.append((doc, i + 2, "\n".join(body) + "\n"))
                i = j
            i += 1
    return out


def sections(text):
    """Top-level key -> its text (with the comment lines above it)."""
    out, cur, pending = {}, None, []
    for line in text.splitlines(keepends=True):
        m = SECTION.match(line)
        if m:
            cur = m.group(1)
            out[cur] = "".join(pending) + line
            pending = []
        elif cur is None or line.startswith("#") or not line.strip():
            pending.append(line)
        else:
            out[cur] += "".join(pending) + line
            pending = []
    return out


STAGE_FRAGMENT = re.compile(r"^# stage: ([a-z0-9_]+)\s*$")


def as_config(body):
    """(config text, lines before the block's first line in it): a
    `# stage: KIND` block goes into a stage of that kind."""
    first = body.split("\n", 1)[0]
    m = STAGE_FRAGMENT.match(first)
    if not m:
        return body, 0
    keys = "".join("    " + l + "\n" if l.strip() else "\n" for l in body.split("\n")[1:])
    head = "stages:\n  - name: example\n    kind: %s\n    input: frames\n" % m.group(1)
    # The block's line 1 (the comment) is replaced by the 4 head lines.
    return head + keys.rstrip("\n") + "\n", 3


def complete(body):
    """The block plus the minimal config's sections it lacks."""
    have = sections(body)
    dup = [k for k in have if len(re.findall(r"(?m)^%s\s*:" % re.escape(k), body)) > 1]
    assert not dup, "top-level %s twice: two configurations in one block?" % dup
    base = sections(open(os.path.join(REPO, "etc", "beamd-minimal.yaml")).read())
    return body + "".join("\n" + t for k, t in base.items() if k not in have)


def _keypair(tmp, path, public):
    import subprocess
    from conftest import binary
    d, name = os.path.split(path)
    os.makedirs(d, exist_ok=True)
    if not os.path.exists(os.path.join(d, name if public else name[:-len("_secret")])):
        subprocess.run([binary("beamd-keygen"), "--dir", d,
                        name if public else name[:-len("_secret")]],
                       check=True, capture_output=True, timeout=30)
    if public:
        os.unlink(path + "_secret")


def _dir_with_client_key(tmp, path):
    _keypair(tmp, os.path.join(path, "viewer"), public=True)


def _file(tmp, path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def _h5(tmp, path):
    h5py = pytest.importorskip("h5py")
    import numpy as np
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w") as f:
        f["data"] = np.zeros((4, 4), np.float32)


FIXTURES = {
    "/data/dark.h5": _h5,
    "/etc/beamd/curve/beamd_secret": lambda t, p: _keypair(t, p, public=False),
    "/etc/beamd/curve/upstream": lambda t, p: _keypair(t, p, public=True),
    "/etc/beamd/curve/clients": _dir_with_client_key,
    "/etc/beamd/metrics.token": lambda t, p: _file(t, p, "0123456789abcdef0123456789abcdef\n"),
    "/var/lib/beamd/record": lambda t, p: os.makedirs(p, exist_ok=True),
}

BLOCKS = yaml_blocks()


def test_there_are_yaml_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("doc,line,body", BLOCKS,
                         ids=["%s:%d" % (d, ln) for d, ln, _ in BLOCKS])
def test_yaml_example_passes_check_config(doc, line, body, tmp_path):
    import subprocess
    from conftest import binary
    if body.lstrip().startswith(NOT_A_CONFIG):
        return
    missing = sorted({p for p in ABS_PATH.findall(body) if p not in FIXTURES})
    assert not missing, "%s:%d: add a fixture for %s to FIXTURES" % (doc, line, missing)
    root = str(tmp_path / "root")
    for p in sorted(set(ABS_PATH.findall(body))):
        FIXTURES[p](root, root + p)
    cfg_text, shift = as_config(body)
    text = ABS_PATH.sub(lambda m: root + m.group(0), complete(cfg_text))
    cfg = tmp_path / "example.yaml"
    cfg.write_text(text)
    r = subprocess.run([binary("beamd"), "--check-config", str(cfg)],
                       capture_output=True, text=True, timeout=30)
    # Map the temp file's line numbers back to the doc's.
    err = re.sub(re.escape(str(cfg)) + r":(\d+):",
                 lambda m: "%s:%d:" % (doc, line - 1 - shift + int(m.group(1))),
                 r.stdout + r.stderr)
    assert r.returncode == 0, "%s:%d: example fails --check-config:\n%s" % (doc, line, err)


def test_yaml_check_can_fail(tmp_path):
    """A broken example must be caught: an unknown key, a missing section
    filled from the minimal config still failing, and two configs in one
    block."""
    import subprocess
    from conftest import binary
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(complete("input: {mode: live, endpoint: tcp://127.0.0.1:5500, nosuchkey: 1}\n"))
    r = subprocess.run([binary("beamd"), "--check-config", str(cfg)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "bad.yaml:1:" in r.stdout + r.stderr
    assert "stages:" in complete("input: {mode: live}\n")
    text, shift = as_config("# stage: roi_sum\nrois: [{name: a, shape: nosuch}]\n")
    cfg.write_text(complete(text))
    r = subprocess.run([binary("beamd"), "--check-config", str(cfg)],
                       capture_output=True, text=True, timeout=30)
    # the bad value is on the block's line 2
    assert r.returncode == 1 and "bad.yaml:%d:" % (2 + shift) in r.stdout + r.stderr, r.stderr
    with pytest.raises(AssertionError):
        complete("input: {mode: pull}\nstages: []\n# B\ninput: {mode: live}\n")
    assert ABS_PATH.findall('dark: /data/dark.h5, ep: "ipc:///tmp/x", u: tcp://h:1') \
        == ["/data/dark.h5"]
