"""pytest plugin that runs llama.cpp's server test suite against `nextn serve` (loaded by bench/peer_server_tests.sh
with `-p peer_server_plugin`).

- Not applicable tests are read from docs/server.md (the section "llama.cpp's server tests"): each table row names a
  test file (`unit/test_x.py`) or a test (`unit/test_x.py::test_name`, every parametrization of it) and the reason.
  `unit/test_x.py::test_name[params]` names one parametrization. They are deselected and counted as "n/a".
- The suite's session fixture starts every preset server once to download llama.cpp's test models; the shim serves
  the fixture whatever the preset names, so that warm-up is skipped (`ServerPreset.load_all`).
- At the end a table per test file: passed, failed, skipped (by the suite itself), not applicable; and, with
  NEXTN_PEER_SUMMARY=path, the same as JSON with the failed test ids, and as the run goes one JSON line per test
  (outcome, the failure's last line) in path + "l".
"""
from __future__ import annotations

import collections
import json
import os
import re

ROW = re.compile(r"^\|\s*`(unit/test_[\w]+\.py(?:::[\w]+(?:\[[^`]*\])?)?)`\s*\|\s*(.+?)\s*\|\s*$")


def read_not_applicable(md_path: str) -> dict[str, str]:
    """{file or file::test: reason} from the docs table (rows `| \\`unit/...\\` | reason |`)."""
    out = {}
    with open(md_path, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line.strip())
            if m:
                out[m.group(1)] = m.group(2)
    return out


def not_applicable(nodeid: str, table: dict[str, str]) -> str | None:
    """The reason `nodeid` (unit/test_x.py::test_name[params]) is not applicable, or None."""
    path, _, name = nodeid.partition("::")
    return table.get(path) or table.get(nodeid) or table.get(f"{path}::{name.split('[')[0]}")


class _State:
    def __init__(self):
        self.table = {}
        self.counts = collections.defaultdict(collections.Counter)
        self.failed = []


S = _State()


def pytest_configure(config):
    S.table = read_not_applicable(os.environ["NEXTN_PEER_NA"])


def pytest_collection_modifyitems(session, config, items):
    import sys

    utils = sys.modules.get("utils")
    if utils is not None:
        utils.ServerPreset.load_all = staticmethod(lambda: None)
    keep, drop = [], []
    for it in items:
        if not_applicable(it.nodeid, S.table):
            drop.append(it)
            S.counts[it.nodeid.split("::")[0]]["n/a"] += 1
        else:
            keep.append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_logreport(report):
    f = report.nodeid.split("::")[0]
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        S.counts[f][outcome] += 1
        if outcome == "failed":
            S.failed.append(report.nodeid)
        out = os.environ.get("NEXTN_PEER_SUMMARY")
        if out:      # as the run goes: a run stopped early keeps its results (one JSON line per test)
            why = report.longreprtext.strip().splitlines()[-1][:300] if outcome == "failed" else ""
            with open(out + "l", "a") as fh:
                fh.write(json.dumps({"test": report.nodeid, "outcome": outcome, "why": why}) + "\n")


def pytest_terminal_summary(terminalreporter):
    w = terminalreporter.write_line
    w("")
    w(f"{'test file':<36}{'passed':>8}{'failed':>8}{'skipped':>8}{'n/a':>6}")
    tot = collections.Counter()
    for f in sorted(S.counts):
        c = S.counts[f]
        tot.update(c)
        w(f"{f:<36}{c['passed']:>8}{c['failed']:>8}{c['skipped']:>8}{c['n/a']:>6}")
    w(f"{'total':<36}{tot['passed']:>8}{tot['failed']:>8}{tot['skipped']:>8}{tot['n/a']:>6}")
    out = os.environ.get("NEXTN_PEER_SUMMARY")
    if out:
        with open(out, "w") as fh:
            json.dump({"files": {f: dict(c) for f, c in S.counts.items()}, "total": dict(tot), "failed": S.failed},
                      fh, indent=1)
