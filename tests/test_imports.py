"""The package's import graph, read statically (ast): dependencies point one way.

    common    shared leaves (errors, cache paths, hashing, timing, the manifest format, the GGUF reader, the
              run-time half of each quant format): imports no other nextn package and no TVM compiler module
    compiler  GGUF → IR → TVM → artifact; may use common and schedules, never the runtime
    schedules per-target schedules; may use common, never the compiler or the runtime
    runtime   loads artifacts and generates; may use common, and the compiler only through `nextn.compiler.entry`,
              imported inside a function (so running an artifact imports no compiler module)
No import cycle between modules (imports inside functions count: a lazy cycle is still a cycle).

Print the graph of any checkout (this file needs only the standard library):

    python tests/test_imports.py [--root DIR] [--cross]     # every edge, or only edges between packages
"""
from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass

PACKAGES = ("common", "compiler", "runtime", "schedules")
# TVM modules that need the compiler library (`libtvm_compiler.so`); a runtime-only TVM (the GPU bundle) lacks it.
TVM_COMPILER = ("tvm.tirx", "tvm.te", "tvm.relax", "tvm.s_tir", "tvm.topi", "tvm.script", "tvm.target",
                "tvm.transform", "tvm.ir", "tvm.support", "tvm.contrib", "tvm.driver")
ENTRY = "nextn.compiler.entry"


@dataclass(frozen=True)
class Edge:
    src: str           # importing module (nextn.x.y)
    dst: str           # imported module: a nextn module, or the dotted name of an external one
    line: int
    lazy: bool         # inside a function body


def _modules(root: str) -> dict[str, str]:
    """nextn module name → file path, for every .py under the four packages."""
    out = {}
    for top in PACKAGES:
        base = os.path.join(root, top)
        for d, _dirs, files in os.walk(base):
            for fn in files:
                if not fn.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(d, fn), root)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(["nextn", *rel])] = os.path.join(d, fn)
    return out


def _resolve(name: str, modules: dict) -> str:
    """The longest prefix of `name` that is a module of the package (an attribute import names its module)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        cand = ".".join(parts[:n])
        if cand in modules:
            return cand
    return name


def import_graph(root: str) -> tuple[dict[str, str], list[Edge]]:
    modules = _modules(root)
    edges = []
    for mod, path in sorted(modules.items()):
        is_pkg = path.endswith("__init__.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)

        def visit(node, lazy: bool):
            for child in ast.iter_child_nodes(node):
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.Import):
                    for a in child.names:
                        edges.append(Edge(mod, _resolve(a.name, modules), child.lineno, lazy))
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                        base = base[:len(base) - (child.level - 1)]
                        prefix = ".".join(base + ([child.module] if child.module else []))
                    else:
                        prefix = child.module
                    for a in child.names:   # `from pkg import sub` imports the module pkg.sub when there is one
                        edges.append(Edge(mod, _resolve(f"{prefix}.{a.name}", modules), child.lineno, lazy))
                visit(child, inner)

        visit(tree, False)
    return modules, [e for e in edges if e.dst != e.src]


def package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if parts[0] == "nextn" and len(parts) > 1 else parts[0]


def violations(modules: dict, edges: list[Edge]) -> list[str]:
    """Every edge that breaks the rules of the module docstring, as one line each."""
    out = []
    for e in dict.fromkeys(edges):   # one line per (module, line, target)
        sp, dp = package(e.src), package(e.dst)
        where = f"{e.src}:{e.line} imports {e.dst}"
        if e.dst.startswith("nextn.") and e.dst not in modules:
            out.append(f"{where}: no such module")
        if sp == "common" and dp in ("compiler", "runtime", "schedules"):
            out.append(f"{where}: common imports no other nextn package")
        if sp in ("common", "runtime") and e.dst.startswith(TVM_COMPILER):
            out.append(f"{where}: {sp} runs on a runtime-only TVM (no compiler modules)")
        if sp in ("compiler", "schedules") and dp == "runtime":
            out.append(f"{where}: {sp} -> runtime (the compiler never imports the runtime)")
        if sp == "schedules" and dp == "compiler":
            out.append(f"{where}: schedules -> compiler (the compiler applies schedules, not the reverse)")
        if sp == "runtime" and dp == "schedules":
            out.append(f"{where}: runtime -> schedules (compile-time only)")
        if sp == "runtime" and dp == "compiler":
            if e.dst != ENTRY:
                out.append(f"{where}: runtime -> compiler other than {ENTRY}")
            elif not e.lazy:
                out.append(f"{where}: {ENTRY} imported at module level (import it where it is used)")
    return out + cycles(modules, edges)


def cycles(modules: dict, edges: list[Edge]) -> list[str]:
    """Strongly connected components of more than one module (Tarjan), as 'cycle: a -> b -> ... -> a'."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if e.dst in modules:
            graph[e.src].add(e.dst)
    index, low, stack, on, comps = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    out = []
    for comp in comps:
        members = set(comp)
        path, v = [comp[0]], comp[0]   # walk one cycle inside the component, for the message
        while True:
            v = min(w for w in graph[v] if w in members)
            if v in path:
                path = path[path.index(v):] + [v]
                break
            path.append(v)
        out.append("cycle: " + " -> ".join(path) + f" (component of {len(comp)} modules)")
    return out


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dependencies_point_one_way():
    modules, edges = import_graph(REPO)
    assert len(modules) > 50 and edges
    bad = violations(modules, edges)
    assert not bad, "\n".join(bad)


def test_the_runtime_reaches_the_compiler_through_entry_only():
    """The rule is not vacuous: the runtime does call the compiler (compile-and-cache, the CLI's compile/tune),
    and only through the entry module."""
    modules, edges = import_graph(REPO)
    assert ENTRY in modules
    calls = {e.src for e in edges if package(e.src) == "runtime" and package(e.dst) == "compiler"}
    assert calls and {e.dst for e in edges if e.src in calls and package(e.dst) == "compiler"} == {ENTRY}


def test_the_checker_catches_each_kind_of_edge():
    """Synthetic graphs: each rule fires on the edge it forbids (and a cycle is reported as one)."""
    mods = {m: m for m in ("nextn.common.a", "nextn.compiler.b", "nextn.compiler.c", "nextn.compiler.entry",
                           "nextn.runtime.d", "nextn.schedules.e")}
    cases = {
        ("nextn.common.a", "nextn.runtime.d", False): "common imports no other nextn package",
        ("nextn.common.a", "tvm.tirx", False): "runtime-only TVM",
        ("nextn.compiler.b", "nextn.runtime.d", True): "the compiler never imports the runtime",
        ("nextn.schedules.e", "nextn.compiler.b", True): "schedules -> compiler",
        ("nextn.runtime.d", "nextn.compiler.b", True): "other than nextn.compiler.entry",
        ("nextn.runtime.d", "nextn.compiler.entry", False): "imported at module level",
        ("nextn.runtime.d", "nextn.schedules.e", True): "runtime -> schedules",
    }
    for (src, dst, lazy), msg in cases.items():
        got = violations(mods, [Edge(src, dst, 1, lazy)])
        assert len(got) == 1 and msg in got[0], (src, dst, got)
    assert violations(mods, [Edge("nextn.runtime.d", "nextn.compiler.entry", 1, True)]) == []
    cyc = violations(mods, [Edge("nextn.compiler.b", "nextn.compiler.c", 1, False),
                            Edge("nextn.compiler.c", "nextn.compiler.b", 9, True)])
    assert cyc == ["cycle: nextn.compiler.b -> nextn.compiler.c -> nextn.compiler.b (component of 2 modules)"]


# Run as a child process: nextn.compiler / nextn.schedules cannot be imported, TVM runs without its compiler library.
_RUNTIME_ONLY = """
import importlib.abc, json, sys
class NoCompiler(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[:2] in (["nextn", "compiler"], ["nextn", "schedules"]):
            raise ImportError("the runtime imported " + name)
sys.meta_path.insert(0, NoCompiler())
import tvm
assert tvm.base._RUNTIME_ONLY
from nextn.runtime.cli import main
main(sys.argv[1:])
"""


def test_running_an_artifact_needs_no_compiler(compiled, q8_model):
    """`nextn run ARTIFACT` with TVM in runtime-only mode (as on a GPU machine with the trimmed wheel) and every
    compiler / schedules import refused: it runs, and generates what the in-process engine generates."""
    import json
    import subprocess

    from conftest import G4

    art = compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")
    r = subprocess.run([sys.executable, "-c", _RUNTIME_ONLY, "run", art, "-p", "def main():", "-n", "12", "--json"],
                       capture_output=True, text=True, env={**os.environ, "TVM_USE_RUNTIME_LIB": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    want = q8_model.generate("def main():", 12, n_max=3)
    assert json.loads(r.stdout)["tokens"] == want.ids


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Print nextn's import graph and the rule violations.")
    ap.add_argument("--root", default=REPO, help="checkout to read (default: this one)")
    ap.add_argument("--cross", action="store_true", help="only edges between packages (and to TVM)")
    a = ap.parse_args(argv)
    modules, edges = import_graph(a.root)
    seen = set()
    for e in sorted(edges, key=lambda e: (e.src, e.dst, e.line)):
        internal = e.dst.startswith("nextn.")
        if not internal and not e.dst.startswith("tvm"):
            continue
        if a.cross and internal and package(e.src) == package(e.dst):
            continue
        key = (e.src, e.dst, e.lazy)
        if key in seen:
            continue
        seen.add(key)
        print(f"{e.src} -> {e.dst}{'  (lazy)' if e.lazy else ''}")
    bad = violations(modules, edges)
    print(f"\n{len(modules)} modules, {len(bad)} violation(s)")
    for b in bad:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
