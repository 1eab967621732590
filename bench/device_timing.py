"""The device check's timings: one entry point synchronized per call (device time inside it and wall time), the
entries of a decode round, greedy decode speed per speculation config."""
from __future__ import annotations

import contextlib
import time

import numpy as np

SPEED_CONFIGS = [("off", "none", 1), ("n_max=1", "draft-mtp", 1), ("n_max=2", "draft-mtp", 2),
                 ("n_max=3", "draft-mtp", 3), ("auto", "draft-mtp", "auto")]

def step_bytes(manifest: dict, entry: str) -> int:
    """Weight bytes one row of `entry` must read (`nextn.common.manifest.step_read_bytes`)."""
    from nextn.common.manifest import step_read_bytes

    return int(step_read_bytes(manifest, entry)["total"])


@contextlib.contextmanager
def full_head(model):
    """Draft with the full head inside the block though `model` (a LoadedModel) loaded a reduced one
    (--spec-draft-vocab): the runtime picks the `_vocab` entries by `model.draft_vocab` at each call
    (runtime/sequence.py `mtp_draft`), and the full-head entries and weight are loaded either way."""
    keep = model.draft_vocab
    model.draft_vocab = 0
    try:
        yield
    finally:
        model.draft_vocab = keep


OPTIONAL = ("draft_vocab",)   # rows whose failure is recorded in the row ("error") instead of failing the stage


def draft_steps(seq, tok: int, h_last, pos: int) -> list[tuple[str, object]]:
    """(row name, call) of one draft step with the full head (`draft`) and, where the model loaded a reduced draft
    head, with it (`draft_vocab`: the artifact's entry of that name, the row's seconds and bytes; OPTIONAL, last)."""
    lm = seq.model

    def step():
        return seq.mtp_draft(np.array([tok], np.int32), h_last, pos)

    def full():
        with full_head(lm):
            return step()

    return [("draft", full)] + ([("draft_vocab", step)] if lm.draft_vocab else [])


def timed_entry(seq, name: str, call, reps: int, entry: str | None = None) -> dict:
    """Median and min of `reps` calls of `call()`: device time inside entry `entry` (default `name`; the sequence
    synchronizes the device after each call) and wall time of the whole call (inputs, readback), as row `name`; an
    OPTIONAL row that raises is {"entry": name, "error": ...}."""
    if name not in OPTIONAL:
        return _timed(seq, name, call, reps, entry or name)
    try:   # its first run on a device must not cost the stage the rows already measured
        return _timed(seq, name, call, reps, entry or name)
    except Exception as e:   # noqa: BLE001 (recorded in the row; the callers print it)
        return {"entry": name, "error": f"{type(e).__name__}: {e}"[:400]}


def _timed(seq, name: str, call, reps: int, entry: str) -> dict:
    call()                                       # warm-up: first launch, graph capture
    vm, wall = [], []
    for _ in range(reps):
        v0, t0 = seq.vm_seconds[entry], time.perf_counter()
        call()
        wall.append(time.perf_counter() - t0)
        vm.append(seq.vm_seconds[entry] - v0)
    return {"entry": name, "reps": reps, "median_ms": float(np.median(vm) * 1e3), "min_ms": float(min(vm) * 1e3),
            "wall_median_ms": float(np.median(wall) * 1e3)}


def speed_configs(m, prompt, n: int, reps: int) -> list[dict]:
    """Greedy decode of `n` tokens after `prompt` (text or ids) per SPEED_CONFIGS (spec off first), best of `reps`
    after a warm-up (which also calibrates auto): tok/s, acceptance, mean length, whether the tokens equal off's."""
    rows, plain = [], None
    for label, spec, k in SPEED_CONFIGS:
        if spec != "none" and not m.has_mtp:
            continue
        m.generate(prompt, 8, spec_type=spec, n_max=k, ignore_eos=True)
        best = max((m.generate(prompt, n, spec_type=spec, n_max=k, ignore_eos=True) for _ in range(reps)),
                   key=lambda r: r.tokens_per_s)
        plain = plain or best
        rows.append({"config": label, "tok_s": best.tokens_per_s,
                     "acceptance": best.stats.acceptance if spec != "none" else None,
                     "mean_len": best.stats.mean_len if spec != "none" else None,
                     "same_as_off": best.ids == plain.ids, "vm_s": best.vm_s})
    return rows


def entry_timings(seq, reps: int, prompt: int = 64, k: int = 3) -> list[dict]:
    """Synced per-entry timings: prefill of `prompt` rows (and, with tensor-core prefill, the same rows through its
    GEMV copy `prefill_few`), verify of k+1 rows, decode (one row), NextN rows for the prompt, one draft step (and
    one with the reduced draft head where the model loaded it: `draft_steps`). Token
    ids are in-vocabulary values (timing only); the verify rows are distinct tokens (`runtime.depth.spread_tokens`:
    copies of one token route to the same experts and under-price a verify)."""
    from nextn.runtime.depth import spread_tokens

    V = int(seq.model.hparams["n_vocab"])
    ids = np.arange(7, 7 + prompt, dtype=np.int32) % V
    h, _last, tok = seq.prefill(ids, 0)
    rows_k1 = np.asarray(spread_tokens(k + 1, V), np.int32)
    rows = [timed_entry(seq, "prefill", lambda: seq.prefill(ids, 0), reps) | {"rows": prompt},
            timed_entry(seq, "verify", lambda: seq.verify(rows_k1, prompt), reps) | {"rows": k + 1},
            timed_entry(seq, "decode", lambda: seq.verify(np.array([tok], np.int32), prompt), reps) | {"rows": 1}]
    if "prefill" in seq.model.few_row_entries:   # the same prompt through the GEMV copy: the tensor-core tiles' gain
        keep, seq.model.tensor_core_min_rows = seq.model.tensor_core_min_rows, prompt + 1
        try:
            rows.append(timed_entry(seq, "prefill_few", lambda: seq.prefill(ids, 0), reps, entry="prefill")
                        | {"rows": prompt})
        finally:
            seq.model.tensor_core_min_rows = keep
    if seq.model.has_mtp:
        hp = np.concatenate([np.zeros_like(h[:1]), h[:-1]])
        rows.append(timed_entry(seq, "mtp_rows", lambda: seq.mtp_rows(ids, hp, 0), reps) | {"rows": prompt})
        rows += [timed_entry(seq, name, call, reps) | {"rows": 1}
                 for name, call in draft_steps(seq, tok, h[-1:], prompt)]
    return rows
