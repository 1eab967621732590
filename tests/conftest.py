"""Shared fixtures: the trained tiny models in ../shared/fixtures and artifacts compiled from them once per session."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures"
G4 = FIXTURES / "tiny-glm4moe"
REPO = Path(__file__).resolve().parents[1]


def reference(model_dir: Path = G4) -> dict:
    return json.loads((model_dir / "reference.json").read_text())


def reference_logits(model_dir: Path = G4):
    return np.load(model_dir / "reference_logits.npz")


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """Max over rows of max|got - want| / max|want| (the fixtures' tolerance measure)."""
    got, want = np.atleast_2d(got), np.atleast_2d(want)
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    os.environ["NEXTN_CACHE"] = str(tmp_path_factory.mktemp("nextn-cache"))


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """compiled(name, model, draft=None) → artifact dir, compiled once per session."""
    from nextn.compiler.compile import compile_model

    done: dict[str, str] = {}

    def get(name: str, model: Path, draft: Path | None = None) -> str:
        if name not in done:
            out = str(tmp_path_factory.mktemp(f"art-{name}"))
            compile_model(str(model), out, draft=str(draft) if draft else None, log=lambda *_: None)
            done[name] = out
        return done[name]

    return get


@pytest.fixture(scope="session")
def bf16_model(compiled):
    import nextn.runtime as rt

    return rt.load(compiled("bf16", G4 / "tiny-glm4moe-BF16.gguf"), ctx_size=4096)


@pytest.fixture(scope="session")
def q8_model(compiled):
    import nextn.runtime as rt

    return rt.load(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf"), ctx_size=4096)


# TVM's native plugins (the CUDA/ROCm build plugins some tests load, meta_schedule's worker pools) can crash in
# their static destructors while the interpreter shuts down, after every test has run and the summary is printed.
# End the process with pytest's own exit status instead of running those destructors; failures still fail.
_EXIT_STATUS = None


def pytest_sessionfinish(session, exitstatus):
    global _EXIT_STATUS
    _EXIT_STATUS = int(exitstatus)


def pytest_unconfigure(config):
    if _EXIT_STATUS is not None and os.environ.get("NEXTN_TEST_NORMAL_EXIT") != "1":
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS)
