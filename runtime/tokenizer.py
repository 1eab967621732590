"""The GLM tokenizer, built from GGUF metadata alone.

Semantics follow llama.cpp (src/llama-vocab.cpp) for ``tokenizer.ggml.model = gpt2`` with
``tokenizer.ggml.pre = glm4`` (llama.cpp's CHATGLM4 pre-tokenizer type):

- byte-level BPE over ``tokenizer.ggml.tokens`` / ``tokenizer.ggml.merges`` (merge rank = list order);
- the text is first split with the GLM-4 regex (`GLM4_SPLIT_REGEX`; it equals the ``Split`` pattern of the
  models' HF ``tokenizer.json``), and ``ignore_merges``: a pre-token that is whole in the vocab is one token;
- ``tokenizer.ggml.token_type`` 3 (control) and 4 (user-defined) tokens are matched whole in the text
  (llama.cpp's ``parse_special = true``); no BOS or other prefix is ever added by `Tokenizer.encode`;
- decoding concatenates token pieces as llama.cpp's ``token_to_piece(special = false)`` does: normal tokens
  are byte-level decoded, user-defined tokens give their text, control (and unknown/unused/byte) tokens give
  nothing.  No clean-up-spaces pass is applied (the pieces a streaming client prints, and the HF decode).

The heavy lifting is done by the HuggingFace ``tokenizers`` library.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from nextn.common.errors import NextnError, shown

#: Pre-tokenizer split of llama.cpp's CHATGLM4 type (``tokenizer.ggml.pre`` = ``glm4`` or ``chatglm-bpe``).
GLM4_SPLIT_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)
SUPPORTED_PRE = ("glm4", "chatglm-bpe")

# GGUF token types (llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4

_K = "tokenizer.ggml."


def _byte_level_chars() -> dict[str, int]:
    """The GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves, the other bytes are
    shifted to code points 256, 257, ... in byte order.  Returns char -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shifted = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def _require(fields: dict, key: str, what: str):
    if key not in fields or fields[key] is None:
        raise NextnError(f"GGUF metadata key '{key}' is missing: expected {what}")
    return fields[key]


def _list_of(fields: dict, key: str, kind: type, what: str) -> list:
    """The list at `key`, every element a `kind` (an element that was not valid UTF-8 is None)."""
    v = _require(fields, key, what)
    bad = next((i for i, x in enumerate(v) if not isinstance(x, kind) or isinstance(x, bool)), None) \
        if isinstance(v, list) else -1
    if bad is not None:
        where = "is not a list" if bad < 0 else f"element {bad} is {shown(v[bad])!r}"
        raise NextnError(f"GGUF metadata key '{key}' {where}: expected {what}")
    return v


def _as_str(value) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def _token_id(fields: dict, key: str, n_vocab: int, required: bool) -> int | None:
    what = f"a token id in [0, {n_vocab})"
    if key not in fields or fields[key] is None:
        if required:
            _require(fields, key, what)
        return None
    try:
        tid = int(fields[key])
    except (TypeError, ValueError):
        raise NextnError(f"GGUF metadata key '{key}' = {shown(fields[key])!r}: expected {what}") from None
    if not 0 <= tid < n_vocab:
        raise NextnError(f"GGUF metadata key '{key}' = {tid}: expected {what}")
    return tid


class Tokenizer:
    """Text <-> token ids for a GLM GGUF.  Build it with `Tokenizer.from_gguf_fields`."""

    n_vocab: int
    eos_id: int
    bos_id: int | None
    eog_ids: frozenset[int]

    def __init__(self, hf: _HFTokenizer, pieces: list[bytes], eos_id: int, bos_id: int | None,
                 eog_ids: frozenset[int]):
        self._hf = hf
        self._pieces = pieces
        self.n_vocab = len(pieces)
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.eog_ids = eog_ids

    @classmethod
    def from_gguf_fields(cls, fields: dict, source: str | None = None) -> "Tokenizer":
        """Build from GGUF metadata: ``{key: value}`` with strings as ``str`` and arrays as lists
        (e.g. ``GGUFFile(path).fields``). Raises NextnError naming `source` (the file) and the key."""
        try:
            return cls._from_fields(fields)
        except NextnError as e:
            if source is None:
                raise
            raise NextnError(f"{source}: {e}") from None

    @classmethod
    def _from_fields(cls, fields: dict) -> "Tokenizer":
        model = _as_str(_require(fields, _K + "model", "the tokenizer model name 'gpt2'"))
        if model != "gpt2":
            raise NextnError(f"GGUF metadata key '{_K}model' = {shown(model)!r}: expected 'gpt2' (byte-level BPE)")
        pre = _as_str(_require(fields, _K + "pre", "the pre-tokenizer name 'glm4'"))
        if pre not in SUPPORTED_PRE:
            raise NextnError(f"GGUF metadata key '{_K}pre' = {shown(pre)!r}: expected one of {', '.join(SUPPORTED_PRE)}")

        tokens = _list_of(fields, _K + "tokens", str, "the list of token strings")
        n_vocab = len(tokens)
        types = _list_of(fields, _K + "token_type", int, "the list of token types, one per token")
        if len(types) != n_vocab:
            raise NextnError(f"GGUF metadata key '{_K}token_type' has {len(types)} entries: expected {n_vocab} "
                             f"(one per entry of '{_K}tokens')")
        vocab = {}
        for i, t in enumerate(tokens):
            if vocab.setdefault(t, i) != i:
                raise NextnError(f"GGUF metadata key '{_K}tokens': token {shown(t)!r} appears at ids {vocab[t]} and {i}; "
                                 "expected unique token strings")
        merges = []
        for i, m in enumerate(_list_of(fields, _K + "merges", str, "the list of BPE merges ('left right')")):
            pair = m.split(" ")
            if len(pair) != 2:
                raise NextnError(f"GGUF metadata key '{_K}merges': entry {i} {shown(m)!r} is not 'left right'")
            if pair[0] not in vocab or pair[1] not in vocab or pair[0] + pair[1] not in vocab:
                raise NextnError(f"GGUF metadata key '{_K}merges': entry {i} {shown(m)!r} merges tokens that are not "
                                 f"in '{_K}tokens' (both parts and their concatenation must be)")
            merges.append((pair[0], pair[1]))

        eos_id = _token_id(fields, _K + "eos_token_id", n_vocab, required=True)
        bos_id = _token_id(fields, _K + "bos_token_id", n_vocab, required=False)
        eog = {eos_id}
        for key in ("eot_token_id", "eom_token_id"):
            tid = _token_id(fields, _K + key, n_vocab, required=False)
            if tid is not None:
                eog.add(tid)

        hf = _HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(GLM4_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                               for i, ty in enumerate(types) if ty == _CONTROL])
        hf.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                       for i, ty in enumerate(types) if ty == _USER_DEFINED])

        chars = _byte_level_chars()
        pieces = []
        for t, ty in zip(tokens, types):
            if ty == _NORMAL:
                pieces.append(bytes(chars[c] for c in t) if all(c in chars for c in t) else t.encode("utf-8"))
            elif ty == _USER_DEFINED:
                pieces.append(t.encode("utf-8"))
            else:  # control, unknown, unused, byte: no text (llama.cpp token_to_piece with special = false)
                pieces.append(b"")
        return cls(hf, pieces, eos_id, bos_id, frozenset(eog))

    def encode(self, text: str) -> list[int]:
        """Raw text -> ids.  Control/user-defined token texts in `text` become their single id; nothing
        (no BOS, no ``[gMASK]<sop>``) is prepended."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def token_to_bytes(self, id: int) -> bytes:
        """The bytes one token contributes to the output (empty for control tokens).  A token may hold part
        of a UTF-8 character: streaming clients should feed these to an incremental UTF-8 decoder."""
        return self._pieces[int(id)]

    def token_to_piece(self, id: int) -> str:
        """Text of one token (invalid/partial UTF-8 shown as U+FFFD); '' for control tokens."""
        return self._pieces[int(id)].decode("utf-8", errors="replace")

    def token_text(self, id: int) -> str:
        """The vocabulary string of a token, control tokens included (e.g. '<|user|>')."""
        return self._hf.id_to_token(int(id)) or ""

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary string is `text`, or None."""
        return self._hf.token_to_id(text)

    def decode(self, ids) -> str:
        """Ids -> text: the concatenated token bytes, decoded as UTF-8 (invalid sequences -> U+FFFD)."""
        return b"".join(self._pieces[int(i)] for i in ids).decode("utf-8", errors="replace")
