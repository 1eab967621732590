"""The real-width GGUFs the benches read, made by one command into a cache folder (as peer_llamacpp.sh builds the peer).

    python bench/realwidth_files.py                  # the speed set (bench/realwidth.py's files); prints name=path
    python bench/realwidth_files.py --set spec       # the predictable files of the speculation benches (~145 GB)
    python bench/realwidth_files.py --set lowbit     # codebook-format experts (issue 35), ~3-5 GB each
    python bench/realwidth_files.py glm45air-1 glm45air-8-a0.1    # just these
    python bench/realwidth_files.py --list           # names and recipes, nothing generated

Files come from `../shared/tools/synth_realwidth.py` (deterministic: same arguments, same bytes) and, for the
requantized variants, the peer's `llama-quantize --allow-requantize` (bench/peer_llamacpp.sh builds it). Environment:
  NEXTN_REALWIDTH    the folder (default ~/.cache/nextn-realwidth); 4-17 GB a file, so point it at a big disk
  NEXTN_HEAVY_LOCK   the lock heavy benches take on a shared machine (default $NEXTN_REALWIDTH/heavy.lock):
                     `flock "$(python bench/realwidth_files.py --lock)" python bench/realwidth.py ...`
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SYNTH = os.path.join(HERE, "..", "..", "shared", "tools", "synth_realwidth.py")

# name -> ("synth", synth_realwidth.py arguments after OUT.gguf's preset) | ("quantize", base name, ggml type)
FILES: dict[str, tuple] = {
    "glm45air-1": ("synth", ["glm45air", "1"]),
    "glm45air-1-IQ4_XS": ("quantize", "glm45air-1", "IQ4_XS"),
    "glm45air-1-Q8_0": ("quantize", "glm45air-1", "Q8_0"),
    "glm45air-3": ("synth", ["glm45air", "3"]),
    "glm52-1": ("synth", ["glm52", "1"]),
}
SPEED = list(FILES)
# The predictable files of the speculation benches (synth_realwidth --mtp-mix): glm45air with 1, 4, 8 MoE layers,
# glm52 with 1, 2 and 3, each at ALPHA 0, 0.1 and 0.2. glm52-3 (~24 GB) does not fit a 24 GB machine's page cache, so
# glm52-2 (~18.5 GB) is the second layer count there that the 78-layer projection needs.
for _preset, _layers in (("glm45air", (1, 4, 8)), ("glm52", (1, 2, 3))):
    for _n in _layers:
        for _alpha in ("0", "0.1", "0.2"):
            FILES[f"{_preset}-{_n}-a{_alpha}"] = ("synth", [_preset, str(_n), "--mtp-mix", _alpha])
SPEC = [n for n in FILES if n not in SPEED]
# The low-bit files of issue 35: glm45air-1 with each codebook format as its routed experts, an unsloth-like mix
# (IQ2_XXS experts, Q4_K elsewhere but the Q6_K head), and glm52-1 with IQ1_S experts. Q4_K is synth_realwidth's
# default --dense-type, so the mix is byte-identical to glm45air-1-IQ2_XXS (same header identity, one compiled
# artifact): a measurement of either is the mix's.
LOWBIT_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
for _t in LOWBIT_TYPES:
    FILES[f"glm45air-1-{_t}"] = ("synth", ["glm45air", "1", "--expert-type", _t])
FILES["glm45air-1-IQ2_XXS-Q4_K"] = ("synth", ["glm45air", "1", "--expert-type", "IQ2_XXS", "--dense-type", "Q4_K"])
FILES["glm52-1-IQ1_S"] = ("synth", ["glm52", "1", "--expert-type", "IQ1_S"])
SETS = {"speed": SPEED, "spec": SPEC, "lowbit": [n for n in FILES if n not in SPEED and n not in SPEC],
        "all": list(FILES)}


def realwidth_dir() -> str:
    return os.environ.get("NEXTN_REALWIDTH") or os.path.join(os.path.expanduser("~"), ".cache", "nextn-realwidth")


def heavy_lock() -> str:
    return os.environ.get("NEXTN_HEAVY_LOCK") or os.path.join(realwidth_dir(), "heavy.lock")


def path_of(name: str) -> str:
    return os.path.join(realwidth_dir(), name if name.endswith(".gguf") else f"{name}.gguf")


def recipe(name: str) -> str:
    r = FILES[name]
    if r[0] == "synth":
        preset, *rest = r[1]
        return f"synth_realwidth.py {preset} {name}.gguf {' '.join(rest)}"
    return f"llama-quantize --allow-requantize {r[1]}.gguf {name}.gguf {r[2]}"


def make(name: str, log=lambda s: print(s, file=sys.stderr, flush=True)) -> str:
    """The path of file `name`, generated first if missing (its base first, for a requantized variant)."""
    if name not in FILES:
        raise SystemExit(f"realwidth_files: unknown file {name!r} (known: {', '.join(FILES)})")
    out = path_of(name)
    if os.path.exists(out):
        return out
    os.makedirs(realwidth_dir(), exist_ok=True)
    r = FILES[name]
    tmp = out + ".part"
    log(f"realwidth_files: {recipe(name)}")
    if r[0] == "synth":
        preset, *rest = r[1]
        subprocess.run([sys.executable, SYNTH, preset, tmp, *rest], check=True)
    else:
        sys.path.insert(0, HERE)
        from peer import peer_tool

        base = make(r[1], log)
        subprocess.run([peer_tool("llama-quantize"), "--allow-requantize", base, tmp, r[2]], check=True,
                       stdout=subprocess.DEVNULL)
    os.replace(tmp, out)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="files to make (default: the --set)")
    ap.add_argument("--set", choices=sorted(SETS), default="speed", help="the files to make when none is named")
    ap.add_argument("--list", action="store_true", help="print names, recipes and whether each exists")
    ap.add_argument("--lock", action="store_true", help="print the heavy-bench lock's path")
    a = ap.parse_args(argv)
    if a.lock:
        print(heavy_lock())
        return
    names = a.names or SETS[a.set]
    for n in names:
        if a.list:
            print(f"{n}\t{'present' if os.path.exists(path_of(n)) else 'missing'}\t{recipe(n)}")
        else:
            print(f"{n}={make(n)}", flush=True)


if __name__ == "__main__":
    main()
