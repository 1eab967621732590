"""How close the compiled kernels come to the fixture references: the largest relative error per check.

    python bench/reference_error.py [--fixtures ../shared/fixtures]

For the BF16 file of each fixture model (glm4moe, glm-dsa), compiled for this CPU and cached: trunk logits, trunk
hidden and NextN logits of the prompts with full references, and the last-row logits of every prompt, each as
max over rows of max|got - want| / max|want| (nextn.common.compare.rel_err). The tests assert 1e-4
(tests/conftest.py REF_TOL, the fixtures' tolerance); this prints what is actually reached, worst first.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = (("tiny-glm4moe", "tiny-glm4moe-BF16.gguf"), ("tiny-glm-dsa", "tiny-glm-dsa-BF16.gguf"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", default=os.path.join(HERE, "..", "..", "shared", "fixtures"))
    a = ap.parse_args(argv)

    import nextn.runtime as rt
    from nextn.common.compare import rel_err

    for d, name in MODELS:
        m = rt.load(os.path.join(a.fixtures, d, name), ctx_size=4096)
        ref = json.load(open(os.path.join(a.fixtures, d, "reference.json")))
        npz = np.load(os.path.join(a.fixtures, d, "reference_logits.npz"))
        err = {}
        for p in ref["prompts"]:
            k, ids = p["kind"], p["prompt_ids"]
            if f"{k}/trunk_logits" in npz.files:
                err[f"{k} trunk logits"] = rel_err(m.logits(ids), npz[f"{k}/trunk_logits"])
                err[f"{k} trunk hidden"] = rel_err(m.sequence.hidden(ids), npz[f"{k}/trunk_hidden"])
                err[f"{k} NextN logits"] = rel_err(m.mtp_logits(ids), npz[f"{k}/mtp_logits"])
            err[f"{k} last logits"] = rel_err(m.sequence.prefill(np.asarray(ids, np.int32), 0)[1], npz[f"{k}/last_logits"])
        worst = sorted(err.items(), key=lambda kv: -kv[1])
        print(f"{d}: max {worst[0][1]:.2e} ({worst[0][0]}); " + ", ".join(f"{k} {v:.1e}" for k, v in worst[1:4]))


if __name__ == "__main__":
    main()
