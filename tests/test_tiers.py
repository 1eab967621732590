"""The test tiers' tables in conftest.py name real tests: every SLOW_E2E entry is a test file, or a test function
defined in that file; FAST_ARTIFACTS name fixture files; FAST_FORMATS are ggml type names."""
from __future__ import annotations

import re
from pathlib import Path

import gguf

from conftest import FAST_ARTIFACTS, FAST_FORMATS, FAST_PARAMS, FIXTURES, FORMAT_SWEEP_FILES, SLOW_E2E

TESTS = Path(__file__).parent


def test_slow_e2e_entries_name_existing_tests():
    for key in [*SLOW_E2E, *FAST_PARAMS]:
        f, _, test = key.partition("::")
        assert (TESTS / f).is_file(), key
        if test:
            name = test.split("[")[0]
            assert re.search(rf"^def {name}\(", (TESTS / f).read_text(), re.M), key


def test_fast_artifacts_and_formats_exist():
    files = {p.name for p in FIXTURES.rglob("*.gguf")}
    for model, draft, key in FAST_ARTIFACTS:
        assert model in files and (draft is None or draft in files) and key.startswith("llvm-"), (model, key)
    names = {t.name.lower() for t in gguf.GGMLQuantizationType}
    assert set(FAST_FORMATS) <= names
    assert all((TESTS / f).is_file() for f in FORMAT_SWEEP_FILES)
