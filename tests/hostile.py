"""Hostile GGUFs: seeded mutations of a fixture (tests/test_hostile_gguf.py), and the worker that feeds each one to
nextn's reader and loader in a child process under a 1 GB allocation cap.

The mutations are placed with gguf-py's reader (an independent parser: it gives every field's and tensor info's
byte offset): truncation anywhere; the magic, the version, the tensor and key-value counts; key, string-value and
tensor-name lengths; array element types and counts; value types; tensor types, dimension counts, dimensions and
data offsets; `general.alignment` (zero, not a power of two, other powers of two, huge); metadata numbers set to huge / zero / negative / NaN values; random byte flips
in the header and in the tensor data.

Worker: `python tests/hostile.py SRC SEED N OUT_DIR` writes one JSON line per case:
{"case", "label", "path", "outcome": "ok" | "error" | "crash" | "hang", "message", "seconds"}; "error" is a
NextnError (the user-facing one-line error), "crash" anything else (with its traceback), including MemoryError from
the allocation cap; "hang" a case still running after 10 s (SIGALRM; a hang inside C code that never returns to
Python is caught by the test's timeout on the whole worker instead).
"""
from __future__ import annotations

import json
import os
import random
import struct
import sys
import time
import traceback

U32, U64 = "<I", "<Q"
HUGE64 = [2**31, 2**32 - 1, 2**32 + 7, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
HUGE32 = [2**16, 2**31 - 1, 2**31, 2**32 - 1]


def layout(path: str) -> dict:
    """Byte positions of the header's parts: {"kv": [...], "tensors": [...], "data_offset", "size"} from gguf-py."""
    import gguf

    r = gguf.GGUFReader(path)
    kvs = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        pos, starts = f.offset, []
        for p in f.parts:
            starts.append((pos, int(p.nbytes)))
            pos += int(p.nbytes)
        vtype = int(f.types[0])
        kvs.append({"name": f.name, "parts": starts, "vtype": vtype, "etype": int(f.types[-1]) if vtype == 9 else None,
                    "count": len(f.data) if vtype == 9 else None})
    tensors = []
    for t in r.tensors:
        pos, starts = t.field.offset, []
        for p in t.field.parts:
            starts.append((pos, int(p.nbytes)))
            pos += int(p.nbytes)
        tensors.append({"name": t.name, "parts": starts, "n_dims": len(t.shape), "data_offset": int(t.data_offset),
                        "n_bytes": int(t.n_bytes)})
    return {"kv": kvs, "tensors": tensors, "data_offset": int(r.data_offset), "size": int(r.data.size)}


def _put(buf: bytearray, pos: int, fmt: str, value) -> None:
    struct.pack_into(fmt, buf, pos, value)


def cases(src: str, seed: int, n: int) -> list[tuple[str, list]]:
    """`n` seeded mutations as (label, edits); an edit is ("trunc", size) | ("u32"/"u64"/"i64"/"f32"/"f64", pos,
    value) | ("byte", pos, value)."""
    rng = random.Random(seed)
    lay = layout(src)
    size, head = lay["size"], lay["data_offset"]
    kvs, tens = lay["kv"], lay["tensors"]
    arrays = [k for k in kvs if k["vtype"] == 9]
    strings = [k for k in kvs if k["vtype"] == 8]
    numbers = [k for k in kvs if k["vtype"] in (0, 1, 2, 3, 4, 5, 6, 10, 11, 12)]
    fmt_of = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 10: "<Q", 11: "<q", 12: "<d"}

    def trunc():
        at = rng.choice([rng.randrange(0, head + 64), rng.randrange(0, size)])
        return f"truncate at {at}", [("trunc", at)]

    def magic():
        i = rng.randrange(4)
        return f"magic byte {i}", [("byte", i, rng.randrange(256))]

    def version():
        v = rng.choice([0, 1, 4, 5, 0xFFFF, 2**31, 0x03000000, 2**32 - 1])
        return f"version {v}", [("u32", 4, v)]

    def counts():
        which, pos = rng.choice([("tensor_count", 8), ("kv_count", 16)])
        v = rng.choice([0, 1, len(tens) - 1, len(tens) + 1, len(kvs) - 1, len(kvs) + 1, *HUGE64])
        return f"{which} {v}", [("u64", pos, v)]

    def key_len():
        k = rng.choice(kvs)
        (pos, _), real = k["parts"][0], len(k["name"])
        v = rng.choice([0, 1, real - 1, real + 1, real + 100, *HUGE64])
        return f"key length of {k['name']} = {v}", [("u64", pos, v)]

    def string_len():
        k = rng.choice(strings)
        pos, _ = k["parts"][3]
        v = rng.choice([0, 1, 2**20, size, *HUGE64])
        return f"string length of {k['name']} = {v}", [("u64", pos, v)]

    def element_len():
        k = rng.choice([a for a in arrays if a["etype"] == 8])
        i = rng.randrange(min(k["count"], 50))
        pos, _ = k["parts"][5 + 2 * i]
        v = rng.choice([0, 200, 2**20, *HUGE64])
        return f"element {i} length of {k['name']} = {v}", [("u64", pos, v)]

    def array_count():
        k = rng.choice(arrays)
        pos, _ = k["parts"][4]
        v = rng.choice([0, 1, k["count"] - 1, k["count"] + 1, 2**30, 2**30 + 1, *HUGE64])
        return f"array count of {k['name']} = {v}", [("u64", pos, v)]

    def array_type():
        k = rng.choice(arrays)
        pos, _ = k["parts"][3]
        v = rng.choice([0, 4, 6, 7, 8, 9, 10, 12, 13, 255, 2**31])
        return f"array element type of {k['name']} = {v}", [("u32", pos, v)]

    def value_type():
        k = rng.choice(kvs)
        pos, _ = k["parts"][2]
        v = rng.choice([*range(13), 13, 100, 2**31, 2**32 - 1])
        return f"value type of {k['name']} = {v}", [("u32", pos, v)]

    def number():
        k = rng.choice(numbers)
        pos, _ = k["parts"][3]
        f = fmt_of[k["vtype"]]
        if f in ("<f", "<d"):
            v = rng.choice([0.0, -1.0, 1e30, -1e30, float("nan"), float("inf"), -float("inf"), 1e-30])
        else:
            lo, hi = {"<B": (0, 255), "<b": (-128, 127), "<H": (0, 65535), "<h": (-32768, 32767),
                      "<I": (0, 2**32 - 1), "<i": (-2**31, 2**31 - 1), "<Q": (0, 2**64 - 1),
                      "<q": (-2**63, 2**63 - 1)}[f]
            v = rng.choice([lo, hi, 0, 1, 2, 3, 7, min(hi, 2**31 - 1), max(lo, -1), min(hi, 65536)])
            v = min(max(v, lo), hi)
        return f"{k['name']} = {v}", [(f, pos, v)]

    def tensor_name_len():
        t = rng.choice(tens)
        pos, _ = t["parts"][0]
        v = rng.choice([0, 1, len(t["name"]) - 1, len(t["name"]) + 1, 64, 200, *HUGE64])
        return f"name length of tensor {t['name']} = {v}", [("u64", pos, v)]

    def tensor_dims():
        t = rng.choice(tens)
        pos, _ = t["parts"][2]
        v = rng.choice([0, 1, 2, 3, 4, 5, 8, 2**31, 2**32 - 1])
        return f"n_dims of tensor {t['name']} = {v}", [("u32", pos, v)]

    def tensor_ne():
        t = rng.choice(tens)
        pos, _ = t["parts"][3]
        j = rng.randrange(t["n_dims"])
        v = rng.choice([0, 1, 2, 31, 33, 255, 257, 4096, 2**31, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1])
        return f"ne[{j}] of tensor {t['name']} = {v}", [("u64", pos + 8 * j, v)]

    def tensor_type():
        t = rng.choice(tens)
        pos, _ = t["parts"][4]
        v = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 13, 14, 16, 23, 30, 39, 40, 41, 42, 100, 2**31])
        return f"type of tensor {t['name']} = {v}", [("u32", pos, v)]

    def tensor_offset():
        t = rng.choice(tens)
        pos, _ = t["parts"][5]
        base = t["data_offset"] - head
        v = rng.choice([0, base + 1, base + 32, max(0, base - 32), base + 4096, size, *HUGE64])
        return f"data offset of tensor {t['name']} = {v}", [("u64", pos, v)]

    def alignment():
        k = next((k for k in kvs if k["name"] == "general.alignment"), None)
        if k is None:
            return number()
        v = rng.choice([0, 1, 2, 3, 16, 24, 48, 64, 4096, 2**31, 2**32 - 1])
        return f"general.alignment = {v}", [("u32", k["parts"][3][0], v)]

    def header_flip():
        i = rng.randrange(0, head)
        return f"header byte {i} flipped", [("byte", i, rng.randrange(256))]

    def data_flip():
        i = rng.randrange(head, size)
        return f"data byte {i} flipped", [("byte", i, rng.randrange(256))]

    gens = [(trunc, 90), (magic, 10), (version, 16), (counts, 30), (key_len, 40), (string_len, 25),
            (element_len, 30), (array_count, 40), (array_type, 25), (value_type, 40), (number, 70),
            (tensor_name_len, 30), (tensor_dims, 30), (tensor_ne, 50), (tensor_type, 45), (tensor_offset, 35),
            (alignment, 16), (header_flip, 40), (data_flip, 10)]
    total = sum(w for _, w in gens)
    out = []
    for g, w in gens:
        for _ in range(max(1, round(n * w / total))):
            out.append(g())
    return out


def apply(data: bytes, edits: list) -> bytes:
    buf = bytearray(data)
    for e in edits:
        if e[0] == "trunc":
            del buf[e[1]:]
        elif e[0] == "byte":
            buf[e[1]] = e[2]
        else:
            fmt = {"u32": U32, "u64": U64}.get(e[0], e[0])
            _put(buf, e[1], fmt, e[2])
    return bytes(buf)


def check(path: str) -> None:
    """What `nextn compile` / `nextn run` do with a GGUF before building anything: open and validate it
    (with the NextN block), read every tensor the kernels would get, build the tokenizer and the IR graphs."""
    from nextn.compiler.graphs import build_graphs
    from nextn.compiler.loader.model_files import ModelFiles
    from nextn.runtime.tokenizer import Tokenizer

    mf = ModelFiles(path, load_mtp=False)
    if mf.has_nextn:
        mf.validate_nextn()
    build_graphs(mf, mf.has_nextn)
    for name in mf.main.tensors:
        mf.load(name)
    Tokenizer.from_gguf_fields(mf.main.fields, source=mf.main.path)


class Hang(Exception):
    """A case ran past HANG_S (raised by SIGALRM in the worker)."""


HANG_S = 10


def worker(src: str, seed: int, n: int, out_dir: str) -> None:
    import resource
    import signal

    def on_alarm(*_):
        raise Hang(f"still running after {HANG_S} s")

    signal.signal(signal.SIGALRM, on_alarm)

    import nextn.compiler.graphs  # noqa: F401  (imports first: the cap is on what a case allocates)
    import nextn.compiler.loader.model_files  # noqa: F401
    import nextn.runtime.tokenizer  # noqa: F401

    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = vm + (1 << 30)     # 1 GB above what the process holds now
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:                     # the cap holds: 1.5 GB more cannot be had
        bytearray(3 << 29)
        capped = False
    except MemoryError:
        capped = True
    print(json.dumps({"cap_bytes": cap, "held_bytes": vm, "capped": capped}), flush=True)
    data = open(src, "rb").read()
    for i, (label, edits) in enumerate(cases(src, seed, n)):
        path = os.path.join(out_dir, f"case{i:04d}.gguf")
        with open(path, "wb") as f:
            f.write(apply(data, edits))
        t0 = time.perf_counter()
        signal.alarm(HANG_S)
        try:
            check(path)
            outcome, msg = "ok", ""
        except Hang as e:
            outcome, msg = "hang", str(e)
        except Exception as e:   # the point of the worker: report what escaped, the test judges it
            from nextn.common.errors import NextnError

            outcome, msg = ("error", str(e)) if isinstance(e, NextnError) else ("crash", traceback.format_exc())
        finally:
            signal.alarm(0)
        dt = time.perf_counter() - t0
        if outcome != "ok":
            os.unlink(path)
        print(json.dumps({"case": i, "label": label, "path": path, "outcome": outcome, "message": msg,
                          "seconds": dt}), flush=True)


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
