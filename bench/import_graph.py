"""nextn's import graph at two commits, side by side: edges between packages, rule violations, import cycles.

    python bench/import_graph.py [BEFORE [AFTER]] [--edges]    # default: 4c80f63 (before issue 17) vs HEAD

Each commit is read from git (`git archive`, nothing checked out or run) with the static walker of
tests/test_imports.py, which also states the rules: common imports no other nextn package, the compiler and the
schedules never import the runtime, the runtime reaches the compiler only through `nextn.compiler.entry` (lazily),
no cycle between modules. `--edges` also lists every module edge between packages that only one side has.
"""
from __future__ import annotations

import argparse
import collections
import io
import os
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
from test_imports import PACKAGES, import_graph, package, violations  # noqa: E402

BEFORE = "4c80f63"   # main just before issue 17's restructuring (c7c7cd8 .gitignore, 186b387 common/ ...)


def graph_at(rev: str):
    """(modules, edges, violations) of the tree at git revision `rev`."""
    top = subprocess.run(["git", "-C", REPO, "ls-tree", "--name-only", rev], capture_output=True, text=True,
                         check=True).stdout.split()
    tar = subprocess.run(["git", "-C", REPO, "archive", rev, "--", *(p for p in PACKAGES if p in top)],
                         capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as d:
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            t.extractall(d, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(d)
        modules, edges = import_graph(d)
    return modules, edges, violations(modules, edges)


def cross(edges) -> set[tuple[str, str]]:
    """Module edges between two different nextn packages."""
    return {(e.src, e.dst) for e in edges
            if e.dst.startswith("nextn.") and package(e.src) != package(e.dst)}


def kind(v: str) -> str:
    return "cycle" if v.startswith("cycle:") else v.split(": ", 1)[1]


def describe(rev: str, modules, edges, bad) -> None:
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    print(f"== {rev} ({sha}): {len(modules)} modules, {len(bad)} violation(s)")
    pairs = collections.Counter((package(s), package(d)) for s, d in cross(edges))
    print("   package edges (module pairs): " + ", ".join(f"{a} -> {b} {n}" for (a, b), n in sorted(pairs.items())))
    for k, n in sorted(collections.Counter(kind(v) for v in bad).items(), key=lambda kv: -kv[1]):
        print(f"   {n:3d} x {k}")
    for v in bad:
        if v.startswith("cycle:"):
            print("   " + v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", nargs="?", default=BEFORE)
    ap.add_argument("after", nargs="?", default="HEAD")
    ap.add_argument("--edges", action="store_true", help="list the module edges between packages only one side has")
    a = ap.parse_args(argv)
    g = {rev: graph_at(rev) for rev in (a.before, a.after)}
    for rev in (a.before, a.after):
        describe(rev, *g[rev])
    if a.edges:
        b, c = cross(g[a.before][1]), cross(g[a.after][1])
        for sign, s in (("-", b - c), ("+", c - b)):
            for src, dst in sorted(s):
                print(f"{sign} {src} -> {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
