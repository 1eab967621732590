"""Weight bytes a decoded token reads, from a GGUF's tensor sizes (what llama.cpp reads; nextn's own count from its
artifact is `nextn.common.manifest.step_read_bytes`)."""
from __future__ import annotations

def gguf_info(path: str) -> dict:
    """arch, layer counts, expert counts, vocab, and the tensors [(name, ggml type, bytes)] of a GGUF."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    arch = str(r.fields["general.architecture"].contents())

    def key(k, default=None):
        f = r.fields.get(f"{arch}.{k}")
        return f.contents() if f is not None else default

    n_block = int(key("block_count"))
    n_nextn = int(key("nextn_predict_layers", 0))
    embd = next(t for t in r.tensors if t.name == "token_embd.weight")
    return {"arch": arch, "n_layer": n_block - n_nextn, "n_nextn": n_nextn, "n_expert": int(key("expert_count", 1)),
            "n_expert_used": int(key("expert_used_count", 1)), "n_vocab": int(embd.shape[-1]),
            "tensors": [(t.name, t.tensor_type.name, int(t.n_bytes)) for t in r.tensors]}


def decode_bytes_from_gguf(info: dict) -> dict:
    """Bytes per decoded token from the GGUF's tensor sizes (`gguf_info`): NextN blocks (blk.i, i >= n_layer)
    excluded."""
    def trunk(name):
        return not name.startswith("blk.") or int(name.split(".")[1]) < info["n_layer"]
    from nextn.common.manifest import read_bytes_per_row

    tensors = [(n, b) for n, _t, b in info["tensors"] if trunk(n)]
    tied = "output.weight" not in {n for n, _t, _b in info["tensors"]}
    return read_bytes_per_row(tensors, info["n_expert"], info["n_expert_used"], info["n_vocab"], tied)
