"""Weights without copies: the engine hands the kernels views of the memory-mapped GGUF, 16-bit floats stay 16-bit.

A view's address must lie inside the file's map (nothing was copied), every planned buffer of a quantized or BF16
model is such a view, and the engine counts no copied bytes (GGUF aligns tensor data to 32 bytes, what the
kernels are told to assume; test_quant.py / test_x86_kernels.py run the kernels on 32-but-not-64-aligned views).
"""
import gguf
import numpy as np

from conftest import G4


def _mapped_range(engine):
    m = np.frombuffer(engine.files.main.shards[0].buf, np.uint8)     # the map of the whole (one-shard) file
    return m.ctypes.data, m.ctypes.data + m.nbytes


def _address(t) -> int:
    return np.from_dlpack(t).ctypes.data


def _check_views(model):
    eng = model.loaded
    lo, hi = _mapped_range(eng)
    plan = {b["buffer"]: b for b in eng.artifact.manifest["buffer_plan"]["weights"]}
    in_map = [name for name, t in eng._weights.items() if lo <= _address(t) < hi]
    tables = [n for n in eng._weights if plan[n]["kind"] in ("iq2_xxs", "iq1_s") and plan[n]["dtype"] != "uint8"]
    widened = [n for n in eng._weights if plan[n]["kind"] == "f32" and plan[n]["dtype"] == "float32"
               and gguf_type(eng, plan[n]["tensor"]) != "F32"]
    assert sorted(in_map + tables + widened) == sorted(eng._weights)
    assert eng.device.copied_weight_bytes == 0
    return plan


def gguf_type(eng, tensor: str) -> str:
    return eng.files.main.tensor_type(tensor)


def test_quantized_weights_are_views_of_the_file(q8_model):
    plan = _check_views(q8_model)
    assert {b["kind"] for b in plan.values()} == {"q8_0", "f32"}


def test_bf16_weights_stay_16_bit(bf16_model):
    """The BF16 fixture's matrices are uint16 views (bf16 bits; the kernels widen as they read); only its 1-D
    BF16 tensors (norms, biases: read by elementwise ops) are widened to float32, a few KB."""
    plan = _check_views(bf16_model)
    eng = bf16_model.loaded
    r = gguf.GGUFReader(G4 / "tiny-glm4moe-BF16.gguf")
    types = {t.name: t.tensor_type.name for t in r.tensors}
    for b in plan.values():
        if types[b["tensor"]] == "BF16" and len(b["shape"]) >= 2:
            assert b["kind"] == "bf16" and b["dtype"] == "uint16", b
    widened = sum(b["nbytes"] for b in plan.values() if b["kind"] == "f32" and types[b["tensor"]] == "BF16")
    data = sum(int(t.n_bytes) for t in r.tensors if t.name in {b["tensor"] for b in plan.values()})
    assert widened < 0.01 * data
    assert abs(eng.weight_bytes - data - widened / 2) / data < 1e-6    # 16-bit where the file is, f32 copies of norms


def test_the_budget_predicts_the_copies(q8_model, bf16_model, tmp_path):
    """runtime/weights.py copied_bytes (what the memory budget counts, from the headers) = the bytes of the loaded
    weight buffers that lie outside the file's map, on the Q8_0 and BF16 fixtures and on a copy whose
    general.alignment of 16 leaves some tensors 16- but not 32-byte aligned (those are copied)."""
    import badgguf
    import nextn.runtime as rt
    from nextn.runtime.weights import copied_bytes

    def outside(eng):
        lo, hi = _mapped_range(eng)
        plan = {b["buffer"]: b for b in eng._plan}
        return sum(plan[n]["nbytes"] for n, t in eng._weights.items() if not lo <= _address(t) < hi)

    for m in (q8_model, bf16_model):
        assert copied_bytes(m.loaded.files, m.loaded._plan) == outside(m.loaded) == m.loaded.budget.weights
    a16 = badgguf.copy_gguf(G4 / "tiny-glm4moe-Q8_0.gguf", tmp_path / "a16.gguf",
                            {"general.alignment": (16, gguf.GGUFValueType.UINT32)})
    eng = rt.load(str(a16), ctx_size=256).loaded
    assert any(t.data_offset % 32 for t in eng.files.main.tensors.values())
    assert copied_bytes(eng.files, eng._plan) == outside(eng) == eng.device.copied_weight_bytes > 0


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt + resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def test_populate_maps_every_page_of_the_file():
    """GGUFFile.populate (llama.cpp's MAP_POPULATE): afterwards reading one byte of every page of the map takes no
    page fault; "willneed" (a kernel without MADV_POPULATE_READ) only starts read-ahead, so it promises nothing."""
    from nextn.common.gguf import GGUFFile

    f = GGUFFile(G4 / "tiny-glm4moe-Q8_0.gguf")
    done = f.populate()
    assert done in ("populate", "willneed")
    if done == "populate":
        m = np.frombuffer(f.shards[0].buf, np.uint8)
        pages = m[::4096]                      # a strided view: no copy, so no new memory of its own to fault in
        before = _minor_faults()
        total = int(pages.sum(dtype=np.int64))
        faults = _minor_faults() - before
        assert faults < 16, (faults, m.nbytes // 4096, total)


def test_the_cpu_engine_populates_its_mapped_files(q8_model):
    assert q8_model.loaded.wait_populated(timeout=60) in ("populate", "willneed")
