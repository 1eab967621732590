"""bench/realwidth.py's summary of a file's rounds (best of the rounds, the ratios) and its Markdown tables."""
from __future__ import annotations

import numpy as np

from machine_probe import GB

VERIFY_ROWS = (1, 2, 3, 4)          # T = k+1 rows for k = 0 (one decode), 1, 2, 3

def summarize(entry: dict) -> dict:
    """Best of the rounds and the ratios of one file's entry (rounds of nextn, llama, bandwidth)."""
    def best(rounds, key, fn=max):
        vals = [r[key] for r in rounds if r.get("status") == "ok" and key in r]
        return fn(vals) if vals else None

    nx = [r["nextn"] for r in entry["rounds"]]
    ll = [r["llama"] for r in entry["rounds"]]
    ok = [r for r in nx if r.get("status") == "ok"]
    bws = [r["bandwidth"]["read_GBps"] for r in entry["rounds"] if "bandwidth" in r]
    bw = max(bws) if bws else None
    s = {"read_GBps": bw, "nextn_tg": best(nx, "decode_tok_s"), "nextn_pp": best(nx, "prefill_tok_s"),
         "llama_tg": best(ll, "tg"), "llama_pp": best(ll, "pp")}
    s["ms"] = ms = {k: min(r["ms"][k] for r in ok) for k in ok[0]["ms"]} if ok else {}
    s["verify_x_decode"] = ({str(T): ms[f"verify_{T}"] / ms["verify_1"] for T in VERIFY_ROWS[1:]}   # JSON keys
                            if "verify_1" in ms else None)
    s["draft_x_decode"] = ms["draft"] / ms["verify_1"] if "draft" in ms else None
    s["verify_experts"] = ok[0].get("verify_experts") if ok else None
    gg = entry["bytes_per_token"]["gguf"]["total"]
    plan = ok[0]["plan_bytes_per_token"]["total"] if ok else None
    s["bytes_per_token_gguf"], s["bytes_per_token_plan"] = gg, plan
    s["nextn_GBps"] = s["nextn_tg"] * plan / GB if s["nextn_tg"] and plan else None
    s["llama_GBps"] = s["llama_tg"] * gg / GB if s["llama_tg"] else None
    div = lambda x, y: x / y if x is not None and y else None   # noqa: E731
    s["tg_ratio"] = div(s["nextn_tg"], s["llama_tg"])
    # the same ratio within each round (both engines timed back to back): on a VM whose memory speed drifts
    # between rounds, the best of each engine may come from different rounds
    s["tg_ratio_rounds"] = [r["nextn"]["decode_tok_s"] / r["llama"]["tg"] for r in entry["rounds"]
                            if r["nextn"].get("status") == "ok" and r["llama"].get("status") == "ok"
                            and r["llama"].get("tg")]
    s["pp_ratio"] = div(s["nextn_pp"], s["llama_pp"])
    s["nextn_bw_fraction"] = div(s["nextn_GBps"], bw)
    s["llama_bw_fraction"] = div(s["llama_GBps"], bw)
    failed = lambda rounds: next((r["status"] for r in rounds if r.get("status") != "ok"), "no rounds")  # noqa: E731
    s["nextn_status"] = "ok" if ok else failed(nx)
    s["llama_status"] = "ok" if s["llama_tg"] is not None else failed(ll)
    if entry.get("skipped"):
        s["nextn_status"] = s["llama_status"] = f"skipped: {entry['skipped']}"
    s.update(summarize_first_token(entry))
    return s


def summarize_first_token(entry: dict) -> dict:
    """The `-n 1` runs of one file: per engine its wall seconds (`{eng}_ft_s`), peak RSS, KV bytes and types, and
    peak RSS ÷ (file bytes + KV bytes) (`{eng}_rss_x_file_kv`, the issue-11 target is ≤ 1.05); `ft_ratio` =
    nextn wall ÷ llama.cpp wall (target ≤ 1.5)."""
    size = entry.get("size")
    s = {"file_bytes": size}
    for eng in ("nextn", "llama"):
        r = (entry.get("first_token") or {}).get(eng) or {}
        ok = r.get("status") == "ok"
        kv = r.get("kv") or {}
        s[f"{eng}_ft_s"] = r["wall_s"] if ok else None
        s[f"{eng}_rss"] = r["peak_rss"] if ok else None
        s[f"{eng}_kv_bytes"] = kv.get("bytes")
        s[f"{eng}_kv_types"] = f"{kv['type_k']}/{kv['type_v']}" if "type_k" in kv else None
        s[f"{eng}_rss_x_file_kv"] = (r["peak_rss"] / (size + kv["bytes"])
                                     if ok and size and kv.get("bytes") is not None else None)
    s["ft_ratio"] = s["nextn_ft_s"] / s["llama_ft_s"] if s["nextn_ft_s"] and s["llama_ft_s"] else None
    return s


def fmt_num(x, fmt="{:.2f}"):
    """A table cell: x formatted, or an en dash for None."""
    return "–" if x is None else fmt.format(x)


def _per_round(ratios) -> str:
    if not ratios:
        return "–"
    return f"{float(np.median(ratios)):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def _experts(e) -> str:
    return "–" if not e else f"{e['distinct']:.1f} / {e['routed']}"


def format_table(report: dict) -> str:
    """Markdown: the speed table (one row per file, ratios last), the memory / first-token table (ratios last),
    a line on the machine and the settings, then any failures."""
    head = ["file", "MB/token GGUF / plan", "read GB/s", "nextn tg", "llama tg", "nextn pp",
            f"llama pp{report['n_prompt']}",
            "nextn GB/s", "llama GB/s", "verify 2/3/4 rows ÷ decode",
            f"experts of verify {max(VERIFY_ROWS)}: distinct / routed", "draft ÷ decode",
            "tg nextn/llama per round: median (min–max)", "tg nextn/llama", "pp nextn/llama", "nextn/read BW",
            "llama/read BW"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for e in report["files"]:
        s = e["summary"]
        vx = s.get("verify_x_decode")
        plan_mb = s["bytes_per_token_plan"] and s["bytes_per_token_plan"] / 1e6
        cells = [e["name"], f"{s['bytes_per_token_gguf'] / 1e6:.0f} / {fmt_num(plan_mb, '{:.0f}')}",
                 fmt_num(s["read_GBps"], "{:.1f}"), fmt_num(s["nextn_tg"]), fmt_num(s["llama_tg"]),
                 fmt_num(s["nextn_pp"], "{:.1f}"), fmt_num(s["llama_pp"], "{:.1f}"), fmt_num(s["nextn_GBps"], "{:.1f}"),
                 fmt_num(s["llama_GBps"], "{:.1f}"),
                 " / ".join(fmt_num(vx[str(T)]) for T in VERIFY_ROWS[1:]) if vx else "–",
                 _experts(s.get("verify_experts")), fmt_num(s.get("draft_x_decode")),
                 _per_round(s.get("tg_ratio_rounds")), fmt_num(s["tg_ratio"]), fmt_num(s["pp_ratio"]),
                 fmt_num(s["nextn_bw_fraction"]), fmt_num(s["llama_bw_fraction"])]
        lines.append("| " + " | ".join(cells) + " |")
        if e.get("skipped"):
            notes.append(f"- {e['name']}: skipped: {e['skipped']}")
            continue
        for eng in ("nextn", "llama"):
            if s[f"{eng}_status"] != "ok" and not s[f"{eng}_status"].startswith("not run"):
                notes.append(f"- {e['name']}: {eng}: {s[f'{eng}_status']}")
    if any(e.get("first_token") for e in report["files"]):
        lines += ["", f"| file | file GB | KV GB nextn / llama | KV types nextn / llama | nextn peak RSS GB | "
                  f"llama peak RSS GB | nextn run -n 1 s | llama-completion -n 1 s | nextn tg | llama tg{report['n_gen']} | "
                  "RSS ÷ (file+KV) nextn / llama | wall nextn/llama | tg nextn/llama |", "|" + "---|" * 13]
        for e in report["files"]:
            s = e["summary"]
            kv = " / ".join(fmt_num(s[f"{x}_kv_bytes"] and s[f"{x}_kv_bytes"] / GB) for x in ("nextn", "llama"))
            types = " / ".join(s[f"{x}_kv_types"] or "–" for x in ("nextn", "llama"))
            cells = [e["name"], fmt_num(e.get("size") and e["size"] / GB), kv, types,
                     fmt_num(s["nextn_rss"] and s["nextn_rss"] / GB), fmt_num(s["llama_rss"] and s["llama_rss"] / GB),
                     fmt_num(s["nextn_ft_s"], "{:.1f}"), fmt_num(s["llama_ft_s"], "{:.1f}"), fmt_num(s["nextn_tg"]),
                     fmt_num(s["llama_tg"]), f"{fmt_num(s['nextn_rss_x_file_kv'])} / {fmt_num(s['llama_rss_x_file_kv'])}",
                     fmt_num(s["ft_ratio"]), fmt_num(s["tg_ratio"])]
            lines.append("| " + " | ".join(cells) + " |")
            for eng, r in (e.get("first_token") or {}).items():
                if r.get("status") != "ok" and not r["status"].startswith("not run"):
                    notes.append(f"- {e['name']}: first token, {eng}: {r['status']}")
    m = report["machine"]
    kv = f", KV -ctk {report['cache_type_k']} -ctv {report['cache_type_v']}" if "cache_type_k" in report else ""
    lines += ["", f"{m['cpu']} ({' '.join(m.get('cpu_flags', []))}), {m['physical_cores']} cores, "
              f"{report['threads']} thread(s) both engines{kv}, -c {report.get('ctx', '?')}, best of "
              f"{report['repeat']} interleaved rounds, tg = {report['n_gen']} decoded tokens; nextn "
              f"{m.get('nextn_commit') or '?'}, llama.cpp {(report.get('llama_build') or '?').split()[0]}; loadavg at start "
              f"{m['loadavg'][0]:.2f} (others' load; ours adds up to {report['threads']})"
              + (" (machine loaded: read the ratios, not the absolute numbers)" if report["loaded"] else "")]
    return "\n".join(lines + ([""] + notes if notes else []))
