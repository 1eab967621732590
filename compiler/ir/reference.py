"""The interpreter's side of a comparison with a compiled artifact: a model's IR graphs with its weights dequantized
by gguf-py (float32, numpy's BLAS order), zeroed state buffers, a prefill's inputs. What the tests compare compiled
entry points with (tests/conftest.py) and what bench/exact_tolerance.py measures the summation-order gap against."""
from __future__ import annotations

import numpy as np


def dequantized(mf):
    """Weight getter for the IR interpreter: each tensor of ModelFiles `mf` dequantized by gguf-py, read once."""
    cache: dict[str, np.ndarray] = {}

    def get(name):
        if name not in cache:
            cache[name] = mf.load(name, quantized=False).arrays[0]
        return cache[name]

    return get


def graphs_and_dequantized(model):
    """(the IR graphs with MTP, the weights dequantized by gguf-py) of the GGUF at `model`: the interpreter's side."""
    from ..graphs import build_graphs
    from ..loader.model_files import ModelFiles

    mf = ModelFiles(model, load_mtp=True)
    return build_graphs(mf, with_mtp=True), dequantized(mf)


def zero_states(graphs, n_ctx: int, planes: int = 10) -> dict:
    """Interpreter state buffers (float32 zeros) for every state of `graphs` (a Graph or an iterable of them):
    context `n_ctx` cells, `planes` recurrent planes (ir/graph.py's shape symbols C and P)."""
    from .graph import resolve_shape

    graphs = [graphs] if hasattr(graphs, "states") else list(graphs)
    return {n: np.zeros(resolve_shape(s.shape, {"C": n_ctx, "P": planes}), np.float32)
            for g in graphs for n, s in g.states.items()}


def prefill_inputs(graph, ids) -> dict:
    """The inputs of a `prefill` graph over token ids `ids` (int32) at positions 0..T-1: every row's hidden state,
    the last row's logits; recurrent plane 0 where the graph has one (glm5next)."""
    T = len(ids)
    out = {"tokens": np.asarray(ids, np.int32), "pos": np.arange(T, dtype=np.int32),
           "hidden_ids": np.arange(T, dtype=np.int32), "out_ids": np.array([T - 1], np.int32)}
    if "rs_plane" in graph.inputs:
        out["rs_plane"] = np.array([0], np.int32)
    return out
