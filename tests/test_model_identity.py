"""A model is identified by its header, never by hashing every byte (issue 11 item 2): the cache key and the
runtime's check of an artifact's model hash the header bytes only; a copy is the same model; an edited header is
another model (a cache miss, and an artifact refuses it); new weight bytes under the same header are read as
they are; a whole-file sha256 only with `--verify-model` (tests/test_split_gguf.py)."""
import hashlib
import shutil

import gguf
import numpy as np
import pytest

import badgguf
from conftest import G4

import nextn.common.gguf as cgguf
import nextn.common.hashing as hashing
from nextn.common.errors import NextnError

SRC = G4 / "tiny-glm4moe-Q8_0.gguf"


@pytest.fixture
def cached_copy(compiled, tmp_path, monkeypatch):
    """A copy of the fixture whose cache entry is the session's compiled artifact (no second compile)."""
    from nextn.compiler import entry

    monkeypatch.setenv("NEXTN_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "copy.gguf"
    shutil.copy(SRC, copy)
    dst = entry.cache_path(str(copy))
    assert dst == entry.cache_path(str(SRC))      # a copy is the same model: the same cache entry
    shutil.copytree(compiled("q8", SRC), dst)
    return copy, dst


class _CountingSha256:
    """hashlib.sha256 that records how many bytes each hash object was fed."""

    def __init__(self, log):
        self.log = log

    def __call__(self, data=b""):
        h, entry = hashlib.sha256(data), [len(data)]
        self.log.append(entry)
        log_update = h.update

        class H:
            def update(self, b):
                entry[0] += memoryview(b).nbytes
                log_update(b)

            def digest(self):
                return h.digest()

            def hexdigest(self):
                return h.hexdigest()

        return H()


def test_run_hashes_the_header_only(cached_copy, monkeypatch):
    import types

    import nextn.runtime as rt

    copy, _ = cached_copy
    fed = []
    monkeypatch.setattr(cgguf, "hashlib", types.SimpleNamespace(sha256=_CountingSha256(fed)))
    monkeypatch.setattr(hashing, "sha256_files", lambda *a, **k: pytest.fail("whole-file hash of a model file"))
    m = rt.load(str(copy), spec=False)                       # cache key + the engine's check of the model
    assert m.logits([1, 2, 3]).shape == (3, 8192)
    header = gguf.GGUFReader(copy).data_offset                  # where gguf-py says the tensor data starts
    size = copy.stat().st_size
    assert fed and max(n for (n,) in fed) == 8 + header        # (size, header bytes): not one byte of tensor data
    assert sum(n for (n,) in fed) < 4 * (header + 100) < size / 10


def test_new_weight_bytes_are_read_under_the_same_header(cached_copy):
    import nextn.runtime as rt
    from nextn.compiler import entry

    copy, dst = cached_copy
    before = rt.load(str(copy), spec=False).logits([5, 6, 7])
    t = next(t for t in gguf.GGUFReader(copy).tensors if t.name == "output_norm.weight")   # F32
    assert t.tensor_type.name == "F32"
    with open(copy, "r+b") as f:                                # in place: same header, same size
        f.seek(t.data_offset)
        f.write((np.asarray(t.data, np.float32) * 2).tobytes())
    assert entry.cache_path(str(copy)) == dst             # the compiled artifact still serves it
    after = rt.load(str(copy), spec=False).logits([5, 6, 7])
    # output = W · (norm(h) * g): doubling g doubles every logit exactly (float: x2 is exact)
    assert np.array_equal(after, 2 * before)


def test_an_edited_header_is_another_model(cached_copy, tmp_path):
    from nextn.compiler import entry
    from nextn.runtime.artifact import load_artifact
    from nextn.runtime.weights import ArtifactFiles

    copy, dst = cached_copy
    edited = badgguf.replace_once(copy, tmp_path / "edited.gguf", b"general.size_label", b"general.size_labex")
    assert edited.stat().st_size == copy.stat().st_size
    assert entry.cache_path(str(edited)) != dst              # recompiled, not served a stale artifact
    with pytest.raises(NextnError, match="not the model this artifact was compiled from"):
        ArtifactFiles(load_artifact(dst), model_path=str(edited))
    grown = tmp_path / "grown.gguf"                                # same header, more bytes: another file too
    grown.write_bytes(copy.read_bytes() + b"\0" * 32)
    assert entry.cache_path(str(grown)) != dst
