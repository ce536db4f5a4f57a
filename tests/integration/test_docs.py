"""README.md and docs/*.md point only at files a clone of the repository has.

Every relative markdown link `[text](target)` (the part before any `#`)
must name a file or directory that exists and lies inside the repository;
a link that climbs out of it (`../shared/...`) or names an absolute path
fails even when the file happens to exist on this machine. Prose that
mentions a path outside the repository (`/work/...`, the developers'
`shared/` or `notes/` trees) fails too: docs state such facts inline.
URLs (`http:`, `mailto:`...) and in-page anchors are not checked here.
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
