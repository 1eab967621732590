"""The house benchmark (`nextn bench`): decode speed and acceptance per prompt kind, greedy and sampled, with
speculation off, at fixed depth n_max = 1..3, and at `auto` depth.

Per cell (mode × prompt × config) the fastest of `repeat` runs counts; the configs of one repeat run back to
back so that machine drift hits them alike. Every speculative run is checked against spec off with the same seed
(`same_as_off`: greedy, and sampled with greedy drafts, must give the same tokens). Writes a JSON report, prints
a Markdown table, draws a PNG (per-position acceptance; tokens/s per prompt kind). Speed is measured here,
never asserted in tests.
"""
from __future__ import annotations

import json
import os
from importlib import resources

from nextn.common.compile_options import CompileOptions
from nextn.common.errors import NextnError

CONFIGS = [("off", "none", 1), ("n_max=1", "draft-mtp", 1), ("n_max=2", "draft-mtp", 2),
           ("n_max=3", "draft-mtp", 3), ("auto", "draft-mtp", "auto")]


def house_prompts() -> list[dict]:
    """The prompt set shipped with nextn: 9 kinds (code, docs, repetitive, one token, long context)."""
    return json.loads(resources.files("nextn.runtime").joinpath("data/house_prompts.json").read_text("utf-8"))


def load_prompts(path: str | None) -> list[dict]:
    """A JSON list of {"kind": str, "text": str}; NextnError naming the file otherwise."""
    if path is None:
        return house_prompts()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise NextnError(f"{path}: cannot read the prompt set ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise NextnError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, list) or not data or not all(
            isinstance(p, dict) and isinstance(p.get("kind"), str) and isinstance(p.get("text"), str) and p["text"]
            for p in data):
        raise NextnError(f"{path}: expected a non-empty JSON list of {{\"kind\": str, \"text\": non-empty str}}")
    return data


def _cell(r) -> dict:
    s = r.stats
    return {"tok_s": r.tokens_per_s, "decode_s": r.decode_s, "prefill_s": r.prefill_s, "tokens": len(r.ids),
            "finish_reason": r.finish_reason, "rounds": s.rounds, "plain_rounds": s.plain_rounds,
            "drafted": s.drafted, "accepted": s.accepted, "acceptance": s.acceptance, "mean_len": s.mean_len,
            "per_pos": s.per_pos, "per_pos_rate": s.per_pos_rate, "depth_switches": s.events, "entry_s": r.vm_s}


def run_bench(model: str, prompts: str | None, out: str, n_predict: int = 64, repeat: int = 3, temp: float = 0.8,
              seed: int = 1, ctx_size: int = 4096, device: str = "cpu", plot: bool = True, log=print,
              threads: int | None = None, draft_vocab_file: str | None = None,
              options: CompileOptions | None = None) -> dict:
    """Run the benchmark on MODEL (GGUF or artifact dir) on `device` (cpu, cuda:N); write `out` (JSON) and `out`
    with .png; return the report. Timings are device-synchronized (per entry point: `entry_s`).
    `options`: the compile options (--target, -ctk / -ctv, --spec-draft-vocab), `draft_vocab_file` the reduced
    draft head's ranking, as `nextn.runtime.load`."""
    from tqdm import tqdm

    from .api import load
    from .threads import runtime_threads

    if n_predict < 1 or repeat < 1:
        raise NextnError(f"-n {n_predict} / --repeat {repeat}: expected >= 1")
    plist = load_prompts(prompts)
    m = load(model, ctx_size=ctx_size, device=device, log=log, threads=threads, draft_vocab_file=draft_vocab_file,
             options=options)
    if not m.has_mtp:
        raise NextnError(f"{model}: the benchmark compares speculation settings and needs a NextN block")
    encoded = []
    for p in plist:
        ids = m.tokenizer.encode(p["text"])
        encoded.append(ids[-(ctx_size - n_predict - 1):])   # keep the tail when a prompt would not fit
    modes = [("greedy", 0.0), ("sampled", temp)]
    for label, spec_type, k in CONFIGS:   # warm-up: first calls, the auto calibration
        m.generate(encoded[0][:8], 4, spec_type=spec_type, n_max=k, ignore_eos=True)

    report = {"model": model, "n_predict": n_predict, "repeat": repeat, "temp": temp, "seed": seed,
              "spec_draft_vocab": m.loaded.draft_vocab,
              "device": device, "cpus": os.cpu_count(), "threads": runtime_threads(), "prompts": prompts or "house",
              "configs": [c[0] for c in CONFIGS], "kv_cache": m.sequence.kv_cache, "modes": {}}
    bar = tqdm(total=len(modes) * len(plist) * repeat * len(CONFIGS), desc="bench", unit="run", leave=False)
    for mode, t in modes:
        rows = []
        for p, ids in zip(plist, encoded):
            best, toks = {}, {}
            for _ in range(repeat):
                for label, spec_type, k in CONFIGS:
                    r = m.generate(ids, n_predict, spec_type=spec_type, n_max=k, temp=t, seed=seed, ignore_eos=True)
                    if label not in best or r.decode_s < best[label].decode_s:
                        best[label] = r
                    toks[label] = r.ids
                    bar.update()
            row = {"kind": p["kind"], "prompt_tokens": len(ids)}
            for label, _s, _k in CONFIGS:
                row[label] = _cell(best[label]) | {"same_as_off": toks[label] == toks["off"]}
            row["off"]["ids"] = toks["off"]
            rows.append(row)
        total = {}
        for label, _s, _k in CONFIGS:
            n = sum(r[label]["tokens"] for r in rows)
            s = sum(r[label]["decode_s"] for r in rows)
            total[label] = {"tok_s": n / s if s > 0 else 0.0, "tokens": n, "decode_s": s}
        report["modes"][mode] = {"temp": t, "rows": rows, "all": total}
    bar.close()

    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    log(format_table(report))
    if plot:
        png = os.path.splitext(out)[0] + ".png"
        draw(report, png)
        report["png"] = png
        log(f"wrote {out} and {png}")
    return report


def format_table(report: dict) -> str:
    """Markdown: tok/s per kind and config (cells: tok/s, acceptance, speed-up over spec off)."""
    lines = []
    for mode, d in report["modes"].items():
        head = ["kind", "T"] + report["configs"]
        lines += [f"\n{mode} (temp {d['temp']}), n_predict {report['n_predict']}, best of {report['repeat']}:",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in d["rows"]:
            off = row["off"]["tok_s"]
            cells = [row["kind"], str(row["prompt_tokens"]), f"{off:.0f}"]
            for label in report["configs"][1:]:
                c = row[label]
                flag = "" if c["same_as_off"] else " DIFFERS"
                cells.append(f"{c['tok_s']:.0f} ({c['acceptance']:.2f}, x{c['tok_s'] / off if off else 0:.2f}){flag}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("| all | | " + " | ".join(f"{d['all'][c]['tok_s']:.0f}" for c in report["configs"]) + " |")
    return "\n".join(lines)


def draw(report: dict, png: str) -> None:
    """Left: per-position acceptance at n_max=3 per kind; right: tokens/s per kind and config. One row per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    modes = list(report["modes"])
    fig, axes = plt.subplots(len(modes), 2, figsize=(14, 4.5 * len(modes)), squeeze=False)
    for (ax_acc, ax_tps), mode in zip(axes, modes):
        rows = report["modes"][mode]["rows"]
        for row in rows:
            rate = row["n_max=3"]["per_pos_rate"][:3]
            ax_acc.plot(range(1, len(rate) + 1), rate, marker="o", label=row["kind"])
        ax_acc.set(title=f"{mode}: acceptance per draft position (n_max=3)", xlabel="draft position",
                   ylabel="accepted / drafted", ylim=(0, 1.05), xticks=[1, 2, 3])
        ax_acc.legend(fontsize=7)
        x = np.arange(len(rows))
        w = 0.8 / len(report["configs"])
        for i, label in enumerate(report["configs"]):
            ax_tps.bar(x + i * w, [r[label]["tok_s"] for r in rows], w, label=label)
        ax_tps.set_xticks(x + 0.4 - w / 2, [r["kind"] for r in rows], rotation=30, fontsize=7)
        ax_tps.set(title=f"{mode}: decode tokens/s per prompt kind", ylabel="tokens/s")
        ax_tps.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
