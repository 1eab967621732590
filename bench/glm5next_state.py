"""GLM-5.3-Flash's decode state per sequence at its real widths, read from nextn's own graphs (no weights needed).

    python bench/glm5next_state.py [--ctx 4096 131072] [--n-max 3]

The config is GLM-5.3-Flash's (45 layers: 34 KDA + 11 NoPE MLA with the pooled DSA indexer, hidden 4096, 64 heads,
KDA head dim 128, conv kernel 4, kv_lora 512, indexer 32 x 128, k-pool 4, + the NextN block). Recurrent states
([P, ...]: the KDA state and conv windows, float32) are counted per plane, position-indexed ones (latent cache and
indexer rows in the -ctk type, float32 pooled keys and NextN selection) per cell, by the manifest's accounting.
Planes: 1 without speculation, n_max + 2 with it (LoadedModel.rs_planes).
"""
from __future__ import annotations

import argparse


def flash_config():
    from nextn.compiler.models.glm5next.config import KDA, MLA, Glm5NextConfig

    n_layer = 45
    return Glm5NextConfig(
        arch="glm5-next", n_vocab=154880, n_embd=4096, n_layer=n_layer, n_layer_nextn=1, n_head=64, n_rot=0,
        rope_freq_base=10000.0, rms_eps=1e-5, n_ctx_train=1048576, n_ff=12288, n_ff_exp=2048, n_expert=288,
        n_expert_used=8, n_expert_shared=1, n_lead_dense=3, expert_weights_scale=2.5, expert_weights_norm=True,
        expert_gating_func=2, layer_kinds=[MLA if i % 4 == 3 else KDA for i in range(n_layer)], kda_hd=128, conv_k=4,
        gate_lower_bound=-5.0, q_lora=1536, kv_lora=512, hd_k=256, hd_v=256, kq_scale=1 / 16, idx_heads=32,
        idx_hd=128, idx_top_k=2048, idx_kpool=4, idx_norm_eps=1e-6, idx_full=[1] * n_layer, index_share_mtp=True,
        clamp_exp=[10.0] * (n_layer + 1), clamp_shexp=[10.0] * (n_layer + 1))


def state_bytes(c, kv: str = "f16") -> dict:
    """{"recurrent_per_plane", "per_cell_trunk", "per_cell_nextn", "kda_layers"} in bytes, by the manifest's own
    accounting (`nextn.compiler.compile.kv_plan`) over the trunk and NextN graphs with -ctk / -ctv `kv`."""
    from nextn.compiler.compile import kv_plan
    from nextn.compiler.models.glm5next import graph

    graphs = {"verify": graph.build_trunk(c, lambda n: True, True), "mtp_draft": graph.build_mtp(c, lambda n: True, True)}
    for g, kind in zip(graphs.values(), ("trunk", "mtp")):
        g.kind = kind
        g.set_kv_types(kv, kv)
    plan = kv_plan(graphs, c.n_layer, True)
    return {"recurrent_per_plane": plan["trunk"]["bytes_per_plane"], "per_cell_trunk": plan["trunk"]["bytes_per_token"],
            "per_cell_nextn": plan["nextn"]["bytes_per_token"],
            "kda_layers": sum(n.startswith("ssm.") for n in plan["trunk"]["states"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, nargs="+", default=[4096, 131072])
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--kv", nargs="+", default=["f16", "f32", "q8_0"], help="-ctk / -ctv types of the per-cell rows")
    a = ap.parse_args()
    b = state_bytes(flash_config(), a.kv[0])
    mib = 1 << 20
    print(f"KDA layers: {b['kda_layers']}; recurrent state (ssm + conv) per plane: {b['recurrent_per_plane'] / mib:.1f} MiB "
          f"({b['recurrent_per_plane'] / b['kda_layers'] / mib:.2f} MiB per KDA layer)")
    for label, planes in (("spec off", 1), (f"n_max {a.n_max}", a.n_max + 2), ("n_max 8 (compiled maximum)", 10)):
        print(f"  {label}: {planes} plane(s) = {planes * b['recurrent_per_plane'] / mib:.0f} MiB")
    for kv in a.kv:
        b = state_bytes(flash_config(), kv)
        print(f"position-indexed state per cell, -ctk {kv}: trunk {b['per_cell_trunk'] / 1024:.2f} KiB, "
              f"NextN {b['per_cell_nextn'] / 1024:.2f} KiB; " + ", ".join(
                  f"context {ctx}: {ctx * (b['per_cell_trunk'] + b['per_cell_nextn']) / mib:.0f} MiB" for ctx in a.ctx))


if __name__ == "__main__":
    main()
