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


def test_format_sweeps_keep_one_format_per_path_fast():
    """A sweep file's test whose first parameter is a weight format outside FAST_FORMATS is slow; a fast format, or
    a first parameter that is no format, stays in the fast tier (test_cuda_int8: the integer route's Q8_0 and Q4_K
    fast, Q5_K / Q6_K slow)."""
    from types import SimpleNamespace

    from conftest import _slow_format

    def slow(f, node):
        return _slow_format(SimpleNamespace(path=TESTS / f, nodeid=f"tests/{f}::{node}"))

    f = "test_cuda_int8.py"
    assert f in FORMAT_SWEEP_FILES
    assert not slow(f, "test_int8_mul_mat_against_float64[Q8_0-1]")
    assert not slow(f, "test_int8_grouped_mul_mat_id_against_float64[Q4_K-False-9]")
    assert slow(f, "test_int8_mul_mat_id_against_float64[Q5_K-4]")
    assert slow(f, "test_int8_kernels_build_for_sm90_with_dp4a[Q6_K]")
    assert not slow(f, "test_quantizer_gives_the_cpu_rows[1-32-352]")
    assert not slow("test_budget.py", "test_x[Q5_K]")   # not a sweep file
