"""The token ids of the reduced-vocabulary draft head (`--spec-draft-vocab N`, FR-Spec: Zhao et al. 2025,
"FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling"; SGLang's
`--speculative-token-map`): the draft's head multiplies only the rows of the N highest-ranked tokens, the verify
keeps the full head, so the output is unchanged and only the acceptance can move.

Ranks come from
- a file (`--spec-draft-vocab-file F`): token ids, most frequent first, either one id per line (blank lines and
  lines starting with `#` ignored) or one JSON list of ints (SGLang's token map is a list of ids too). The first N
  distinct ids are taken; an id repeated later is skipped.
- else the tokenizer (`tokenizer_ranks`): the control tokens first (end-of-generation must stay draftable), then
  the tokens no merge makes (the byte alphabet, added tokens) in id order, then every merge's result in merge order.
  Byte-level BPE learns its merges most-frequent pair first, so merge order is a frequency rank on the tokenizer's
  training text; it is the only frequency the GGUF carries. (For GLM's tokenizers it is also id order, apart from the
  specials at the end of the vocabulary, which this order puts first.)

A frequency file is what FR-Spec and SGLang's token map use: token counts of text the model produces (or of the
user's own traffic). `frequency_ranks` makes one from token ids and `write_ranks` writes it in the format above;
`text_ranks` counts the tokens of text files with the model's tokenizer (`nextn draft-vocab MODEL.gguf --from
TEXT... -o FILE`).
"""
from __future__ import annotations

import json

import numpy as np

from nextn.common.errors import NextnError

CONTROL = 3   # llama.cpp LLAMA_TOKEN_TYPE_CONTROL in tokenizer.ggml.token_type


def tokenizer_ranks(fields: dict) -> np.ndarray:
    """Every token id of the GGUF's vocabulary in the default draft order (module doc), int32 [n_vocab].
    `fields`: the GGUF's metadata (tokenizer.ggml.tokens, .merges, .token_type; the last two optional)."""
    tokens = list(fields["tokenizer.ggml.tokens"])
    n = len(tokens)
    types = fields.get("tokenizer.ggml.token_type")
    control = [i for i in range(n) if types is not None and int(types[i]) == CONTROL]
    index = {t: i for i, t in enumerate(tokens)}
    merged = []
    for m in fields.get("tokenizer.ggml.merges") or ():
        i = index.get(m.replace(" ", "", 1))   # "a b" makes token "ab"
        if i is not None:
            merged.append(i)
    made = set(merged)
    order = control + [i for i in range(n) if i not in made] + merged
    return _first_distinct(order, n)


def read_ranks(path: str, n_vocab: int) -> np.ndarray:
    """The token ids of file `path` (module doc), int32, distinct, in file order. NextnError (one line, naming the
    file) for an unreadable file, a token that is not an integer, or an id outside [0, n_vocab)."""
    text = _read_text(path, "the draft vocabulary file", "")
    if text.lstrip().startswith("["):
        try:
            ids = json.loads(text)
        except ValueError as e:
            raise NextnError(f"{path}: not a JSON list of token ids ({e})") from None
        where = lambda k: f"item {k}"   # noqa: E731
    else:
        lines = [(k, s.strip()) for k, s in enumerate(text.splitlines(), 1)]
        lines = [(k, s) for k, s in lines if s and not s.startswith("#")]
        ids, at = [s for _k, s in lines], [k for k, _s in lines]
        where = lambda k: f"line {at[k]}"   # noqa: E731
    out = []
    for k, v in enumerate(ids):
        try:
            t = int(v) if not isinstance(v, (bool, float)) else None
        except (TypeError, ValueError):
            t = None
        if t is None or not 0 <= t < n_vocab:
            raise NextnError(f"{path}: {where(k)}: {v!r} is not a token id (expected an integer in 0..{n_vocab - 1})")
        out.append(t)
    return _first_distinct(out, n_vocab)


def draft_ids(n: int, n_vocab: int, fields: dict, path: str | None = None) -> np.ndarray:
    """The N token ids of the reduced draft head, int32 [N] in rank order: from `path` if given, else from the
    tokenizer's `fields`. NextnError when N is out of range or the file ranks fewer than N tokens."""
    if not 0 < n < n_vocab:
        raise NextnError(f"--spec-draft-vocab {n}: expected 0 < N < {n_vocab} (the model's vocabulary)")
    ranks = read_ranks(path, n_vocab) if path else tokenizer_ranks(fields)
    if len(ranks) < n:
        raise NextnError(f"{path}: ranks {len(ranks)} distinct token ids, --spec-draft-vocab {n} needs {n}")
    return ranks[:n]


def frequency_ranks(tokens, n_vocab: int, fallback=()) -> np.ndarray:
    """Token ids ranked by how often they occur in `tokens` (most frequent first, ties by first occurrence), then
    the ids of `fallback` (e.g. `tokenizer_ranks`) that did not occur; int32, distinct. FR-Spec (Zhao et al. 2025)
    section 3: ranks from token frequencies of a corpus. Raises ValueError for an id outside [0, n_vocab)."""
    t = np.asarray(tokens, np.int64).reshape(-1)
    if len(t) and not (0 <= t.min() and t.max() < n_vocab):
        raise ValueError(f"frequency_ranks: token ids {t.min()}..{t.max()} outside 0..{n_vocab - 1}")
    ids, first, counts = np.unique(t, return_index=True, return_counts=True)
    seen = ids[np.lexsort((first, -counts))]   # by count descending, then by first occurrence
    return _first_distinct(seen.tolist() + [int(x) for x in fallback], n_vocab)


def text_ranks(model: str, texts, fill: bool = True) -> tuple[np.ndarray, int, int]:
    """(ranks, tokens counted, distinct ids counted) of the text files `texts` (UTF-8, each tokenized on its own
    with the GGUF `model`'s tokenizer, runtime/tokenizer.py, no prefix added): `frequency_ranks` of all their
    tokens, then with `fill` every other id in the tokenizer's order (`tokenizer_ranks`), so any N below the
    vocabulary can be drafted from the file. NextnError (one line, naming the file) for a model that is not a
    GGUF with a GLM tokenizer or a text file that cannot be read as UTF-8."""
    from nextn.common.gguf import GGUFFile

    from .tokenizer import Tokenizer

    fields = GGUFFile.open(model).fields
    tok = Tokenizer.from_gguf_fields(fields, source=model)
    tokens = []
    for path in texts:
        tokens += tok.encode(_read_text(path, "the text file", "; expected UTF-8 text"))
    counted = len(set(tokens))
    return frequency_ranks(tokens, tok.n_vocab, tokenizer_ranks(fields) if fill else ()), len(tokens), counted


def write_ranks(path: str, ids, comment: str = "") -> None:
    """Write token ids (rank order) as a `--spec-draft-vocab-file`: one id per line, `comment` lines first (`#`)."""
    with open(path, "w", encoding="utf-8") as f:
        for line in comment.splitlines():
            f.write(f"# {line}\n")
        f.write("".join(f"{int(i)}\n" for i in ids))


def _read_text(path: str, what: str, expected: str) -> str:
    """The UTF-8 text of file `path`; NextnError "PATH: cannot read WHAT (why`expected`)" otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise NextnError(f"{path}: cannot read {what} ({why}{expected})") from None


def _first_distinct(ids, n_vocab: int) -> np.ndarray:
    seen = np.zeros(n_vocab, bool)
    out = []
    for t in ids:
        if not seen[t]:
            seen[t] = True
            out.append(t)
    return np.asarray(out, np.int32)
