"""nextn runtime: load a compiled artifact (or a GGUF), generate with NextN/MTP speculation.

    import nextn.runtime as rt
    m = rt.load("artifacts/tiny-glm4moe-Q8_0.gguf")          # compiles for llvm and caches
    r = m.generate("def main():", n_predict=32, spec_type="draft-mtp", n_max=3)
    r.text, r.stats.acceptance, m.logits(ids), m.mtp_logits(ids)
"""
from nextn.common.errors import NextnError


def load(*args, **kwargs):
    from .api import load as _load

    return _load(*args, **kwargs)


load.__doc__ = "See nextn.runtime.api.load."

__all__ = ["NextnError", "load"]
