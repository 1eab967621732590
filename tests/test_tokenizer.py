"""nextn.runtime.tokenizer against the fixture models' references and their HF tokenizer.json."""

import json
from pathlib import Path

import gguf
import pytest
import tokenizers
from tokenizers.pre_tokenizers import ByteLevel

from nextn.common.errors import NextnError
from nextn.runtime.tokenizer import Tokenizer, _byte_level_chars

FIXTURES = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures"
MODELS = {"tiny-glm4moe": "tiny-glm4moe-Q8_0.gguf", "tiny-glm-dsa": "tiny-glm-dsa-Q8_0.gguf"}
PROMPTS = json.loads((FIXTURES / "prompts.json").read_text())


def gguf_fields(path: Path) -> dict:
    reader = gguf.GGUFReader(path)
    return {key: field.contents() for key, field in reader.fields.items()}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    name = request.param
    fields = gguf_fields(FIXTURES / name / MODELS[name])
    reference = json.loads((FIXTURES / name / "reference.json").read_text())
    return {
        "fields": fields,
        "tok": Tokenizer.from_gguf_fields(fields),
        "hf": tokenizers.Tokenizer.from_file(str(FIXTURES / name / "hf" / "tokenizer.json")),
        "ref": {p["kind"]: p for p in reference["prompts"]},
    }


def test_metadata(model):
    tok, fields = model["tok"], model["fields"]
    assert tok.n_vocab == len(fields["tokenizer.ggml.tokens"]) == model["hf"].get_vocab_size()
    assert tok.eos_id == fields["tokenizer.ggml.eos_token_id"] == model["hf"].token_to_id("<|endoftext|>")
    assert tok.bos_id == fields["tokenizer.ggml.bos_token_id"]
    assert tok.eog_ids == {fields["tokenizer.ggml." + k] for k in ("eos_token_id", "eot_token_id", "eom_token_id")}


@pytest.mark.parametrize("kind", [p["kind"] for p in PROMPTS])
def test_encode_matches_reference_and_hf(model, kind):
    text = next(p["text"] for p in PROMPTS if p["kind"] == kind)
    ids = model["tok"].encode(text)
    # reference prompt_ids are the raw text's ids: no [gMASK]/<sop>/BOS prefix.
    assert ids == model["ref"][kind]["prompt_ids"]
    assert ids == model["hf"].encode(text, add_special_tokens=False).ids
    assert model["tok"].decode(ids) == text


@pytest.mark.parametrize("kind", [p["kind"] for p in PROMPTS])
def test_decode_greedy(model, kind):
    ref = model["ref"][kind]
    tok = model["tok"]
    assert tok.decode(ref["greedy_ids"]) == ref["greedy_text"]
    # streaming: the per-token bytes concatenate to the same text
    assert b"".join(tok.token_to_bytes(i) for i in ref["greedy_ids"]).decode("utf-8") == ref["greedy_text"]


def test_special_tokens_in_text(model):
    tok, hf = model["tok"], model["hf"]
    tokens = model["fields"]["tokenizer.ggml.tokens"]
    for text in ("<|endoftext|>", "[gMASK]", "<|user|>"):
        [tid] = tok.encode(text)
        assert tid == hf.token_to_id(text) == tokens.index(text)
    gmask, user, eos = (hf.token_to_id(t) for t in ("[gMASK]", "<|user|>", "<|endoftext|>"))
    text = "[gMASK]<sop><|user|>\nhello world<|endoftext|>"
    ids = tok.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert ids[0] == gmask and ids[2] == user and ids[-1] == eos and len(ids) > 4
    # control tokens give no text on decode (llama.cpp token_to_piece with special = false)
    assert tok.decode(ids) == "\nhello world" == hf.decode(ids, skip_special_tokens=True)
    assert tok.token_to_piece(user) == ""


def test_token_to_piece(model):
    tok, hf = model["tok"], model["hf"]
    for tid in range(tok.n_vocab):
        if tid not in hf.get_added_tokens_decoder():
            assert tok.token_to_piece(tid) == hf.decode([tid])


def test_byte_level_alphabet():
    table = _byte_level_chars()
    assert sorted(table.values()) == list(range(256))
    assert set(table) == set(ByteLevel.alphabet())


def test_user_defined_tokens(model):
    fields = dict(model["fields"])
    tokens = fields["tokenizer.ggml.tokens"] + ["<my_tool>"]
    fields["tokenizer.ggml.tokens"] = tokens
    fields["tokenizer.ggml.token_type"] = fields["tokenizer.ggml.token_type"] + [4]
    tok = Tokenizer.from_gguf_fields(fields)
    ids = tok.encode("a<my_tool>b")
    assert len(tokens) - 1 in ids
    assert tok.decode(ids) == "a<my_tool>b"  # user-defined tokens are kept on decode


def test_ignore_merges(model):
    # every token of the fixture vocab is also reachable by merges, so add one that is not
    fields = dict(model["fields"])
    word = "zqxjkv"
    plain = Tokenizer.from_gguf_fields(fields).encode(word)
    assert len(plain) > 1
    fields["tokenizer.ggml.tokens"] = fields["tokenizer.ggml.tokens"] + [word]
    fields["tokenizer.ggml.token_type"] = fields["tokenizer.ggml.token_type"] + [1]
    tok = Tokenizer.from_gguf_fields(fields)
    new_id = tok.n_vocab - 1
    assert tok.encode(word) == [new_id]  # a pre-token found whole in the vocab is one token
    assert new_id not in tok.encode(" " + word)  # " zqxjkv" is another pre-token, not in the vocab
    assert tok.decode([new_id]) == word


@pytest.mark.parametrize("key", ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                                 "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                                 "tokenizer.ggml.eos_token_id"])
def test_missing_key(model, key):
    fields = {k: v for k, v in model["fields"].items() if k != key}
    with pytest.raises(NextnError, match=f"'{key}' is missing"):
        Tokenizer.from_gguf_fields(fields)


@pytest.mark.parametrize("key,value,expected", [
    ("tokenizer.ggml.model", "llama", "expected 'gpt2'"),
    ("tokenizer.ggml.pre", "qwen2", "expected one of glm4"),
    ("tokenizer.ggml.eos_token_id", 10**6, "expected a token id in"),
])
def test_bad_value(model, key, value, expected):
    fields = dict(model["fields"], **{key: value})
    with pytest.raises(NextnError, match=f"'{key}'.*{expected}"):
        Tokenizer.from_gguf_fields(fields)
