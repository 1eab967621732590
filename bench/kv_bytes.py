"""KV cache bytes per token for each cache type (-ctk/-ctv) at a real model's layer count, by the manifest's own
accounting (`nextn.compiler.compile.kv_plan` over the entry points' graphs, as `nextn compile` writes
`kv_cache.bytes_per_token`), without compiling.

    python bench/kv_bytes.py MODEL.gguf [--layers N] [--dense N] [--indexer file|glm52] [--ctx 32768] [--json out]

The real-width GGUFs (bench/realwidth_files.py) hold a few layers only; their widths (heads, head dims, MLA latent, indexer
keys) are the real model's. `--layers` rebuilds the graphs for N trunk layers (GLM-4.5-Air 46, GLM-5.x 78), every
extra layer shaped as the file's last trunk layer. glm-dsa: `--indexer file` extends the file's indexer types
(the synthetic files: all full, GLM-5/5.1's rule below 1M context), `glm52` takes GLM-5.2's built-in pattern
(compiler/models/glm_dsa/config.py `_indexer_types`: full on layers 0-2 and every fourth after).
Reads the GGUF header and tensor infos only.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import types

from nextn.common.kv_types import NAMES
from nextn.compiler.compile import kv_plan
from nextn.compiler.graphs import build_graphs
from nextn.compiler.loader.model_files import ModelFiles


def graphs_at(mf: ModelFiles, n_layer: int, n_dense: int | None, indexer: str, kv: str) -> tuple:
    """(config, graphs of every entry point) for `n_layer` trunk layers with both caches of type `kv`."""
    c = mf.config
    file_layers, nx = c.n_layer, c.n_layer
    over = {"n_layer": n_layer, "n_lead_dense": c.n_lead_dense if n_dense is None else n_dense}
    if hasattr(c, "idx_full"):
        if indexer == "glm52":
            over["idx_full"] = [1 if i < 3 or (i - 3) % 4 == 3 else 0 for i in range(n_layer)]
        else:
            over["idx_full"] = [c.idx_full[min(i, file_layers - 1)] for i in range(n_layer)]
    c2 = dataclasses.replace(c, **over)

    def has_tensor(name: str) -> bool:   # layer il of the rebuilt model -> the file's layer of the same kind
        m = re.match(r"blk\.(\d+)\.(.*)", name)
        if not m:
            return mf.has_tensor(name)
        il = int(m.group(1))
        src = nx if il >= n_layer else (0 if il < over["n_lead_dense"] else max(c.n_lead_dense, file_layers - 1))
        return mf.has_tensor(f"blk.{src}.{m.group(2)}")

    shim = types.SimpleNamespace(spec=mf.spec, config=c2, has_tensor=has_tensor)   # what build_graphs reads
    return c2, build_graphs(shim, mf.has_nextn, {}, (kv, kv))
    return c2, graphs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--layers", type=int, default=None, help="trunk layers (default: the file's)")
    ap.add_argument("--dense", type=int, default=None, help="leading dense layers (default: the file's)")
    ap.add_argument("--indexer", choices=("file", "glm52"), default="file")
    ap.add_argument("--ctx", type=int, default=32768, help="context for the GiB column")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    mf = ModelFiles(args.model, load_mtp=True)
    n_layer = args.layers or mf.config.n_layer
    rows = []
    for kv in NAMES:
        c2, graphs = graphs_at(mf, n_layer, args.dense, args.indexer, kv)
        plan = kv_plan(graphs, c2.n_layer, mf.has_nextn)
        t, n = plan["trunk"]["bytes_per_token"], plan["nextn"]["bytes_per_token"]
        rows.append({"type": kv, "trunk": t, "nextn": n, "total": t + n,
                     "states": len(plan["trunk"]["states"]) + len(plan["nextn"]["states"])})
    full = f", indexer keys on {sum(c2.idx_full)} of {n_layer} layers" if hasattr(c2, "idx_full") else ""
    print(f"\n{args.model}: {c2.arch}, {n_layer} trunk layers + NextN{full}\n")
    print(f"| -ctk/-ctv | trunk B/token | NextN B/token | total B/token | total at -c {args.ctx} (GiB) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['type']} | {r['trunk']:,} | {r['nextn']:,} | {r['total']:,} | {r['total'] * args.ctx / 2**30:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "n_layer": n_layer, "indexer": args.indexer, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
