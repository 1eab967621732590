"""`nextn compile` artifacts: manifest contents, hash checks, and the CLI contract of `nextn run --json`."""
import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from conftest import G4

from nextn.common.errors import NextnError
from nextn.runtime.artifact import load_artifact


def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def test_manifest(compiled):
    import gguf

    path = G4 / "tiny-glm4moe-Q8_0.gguf"
    art = compiled("q8", path)
    m = json.load(open(f"{art}/manifest.json"))
    assert m["tvm_version"] == "0.27.0.post1" and m["tvm_ffi_version"] == "0.1.14.post1"
    assert m["target"]["name"] == "llvm" and m["arch"] == "glm4moe"
    mfile = m["model_files"][0]
    # identified by its header (no whole-file hash): sha256 over (size, bytes before the tensor data), gguf-py's offset
    import struct

    r = gguf.GGUFReader(path)
    head = path.read_bytes()[:r.data_offset]
    inner = hashlib.sha256(struct.pack("<Q", path.stat().st_size) + head).digest()
    assert mfile["identity"] == hashlib.sha256(b"nextn-gguf-identity-1" + inner).hexdigest()
    assert mfile["size"] == path.stat().st_size and "sha256" not in mfile
    assert mfile["shards"] == [{"file": path.name, "size": path.stat().st_size}]
    # hyper-parameters as the fixture states them: its HF config and the GGUF read with gguf-py
    hf = json.loads((G4 / "hf" / "config.json").read_text())
    assert m["hparams"]["n_layer"] == hf["num_hidden_layers"] == \
        r.fields["glm4moe.block_count"].contents() - r.fields["glm4moe.nextn_predict_layers"].contents()
    assert m["hparams"]["n_expert_used"] == hf["num_experts_per_tok"]
    assert (m["hparams"]["n_embd"], m["hparams"]["n_vocab"]) == (hf["hidden_size"], hf["vocab_size"])
    assert set(m["entry_points"]) == {"prefill", "verify", "mtp_rows", "mtp_draft", "decode", "draft"}
    assert m["entry_points"]["decode"]["static"] == {"T": 1}
    assert m["max_draft"] == 8   # the compiled maximum draft depth that per-request n_max is lowered to
    for lib in m["libraries"]:
        assert sha(f"{art}/{lib['file']}") == lib["sha256"]
    plan = m["buffer_plan"]
    # Q8_0 stays quantized: one buffer of its GGUF blocks (34 bytes per 32 weights, the GGUF's own shape), no
    # float32 copy
    t = next(t for t in r.tensors if t.name == "blk.1.attn_q.weight")
    assert t.tensor_type.name == "Q8_0"
    K, N = (int(x) for x in t.shape)   # ggml ne: {in, out}
    assert (N, K) == (hf["num_attention_heads"] * hf["head_dim"], hf["hidden_size"])
    q = [b for b in plan["weights"] if b["tensor"] == "blk.1.attn_q.weight"]
    assert [(b["dtype"], b["shape"], b["kind"]) for b in q] == [("uint8", [N, K // 32 * 34], "q8_0")]
    # weight buffers vs the GGUF's tensor data: the same bytes
    data = sum(int(t.n_bytes) for t in r.tensors)
    assert abs(plan["weight_bytes"] - data) / data < 0.05


def test_entry_points_take_weights_as_one_argument(compiled):
    """Weights and states are bound once (two tuples), not passed one buffer per argument on every VM call: each
    compiled function's arity is its inputs + n_kv + 2, whatever the number of weight buffers."""
    import re

    import tvm

    art = compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")
    m = json.load(open(f"{art}/manifest.json"))
    text = tvm.runtime.load_module(f"{art}/{m['libraries'][0]['file']}")["as_python"]()
    arity = {name: int(n) for name, n in re.findall(r'function\("(\w+)", num_inputs=(\d+)\)', text)}
    eps = m["entry_points"]
    assert set(arity) >= set(eps)
    for name, ep in eps.items():
        assert len(ep["weights"]) >= 20 and len(ep["states"]) >= 2   # what would be per-call arguments unbundled
        assert arity[name] == len(ep["inputs"]) + 3, name


def test_tampered_library_is_refused(compiled, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf"), art)
    lib = next(art.glob("*.so"))
    data = bytearray(lib.read_bytes())
    data[-1] ^= 0xFF
    lib.write_bytes(bytes(data))
    with pytest.raises(NextnError, match="does not match the manifest"):
        load_artifact(str(art))
    r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "run", str(art), "-p", "x"], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "refusing to load" in r.stderr


def test_host_target_has_only_what_the_cpu_reports():
    """A VM may mask features its CPU model implies (a Zen 4 guest without AVX-512 is still mcpu znver4): the llvm
    target keeps none that /proc/cpuinfo lacks, and the manifest's cpu_flags are all there."""
    from tvm.target import codegen

    from nextn.common.measure import cpu_flags
    from nextn.compiler.target import MASKABLE, make_target, required_cpu_flags

    flags, tgt = cpu_flags(), make_target("llvm")
    assert flags is not None   # Linux, as CI
    for feature, flag in MASKABLE.items():
        assert not codegen.target_has_features(feature, tgt) or flag in flags, feature
    need = required_cpu_flags(tgt)
    assert set(need) <= flags and ("avx2" in need) == ("avx2" in flags)


def test_artifact_for_a_missing_cpu_feature_is_refused(compiled, tmp_path):
    import nextn.runtime as rt

    art = tmp_path / "art"
    shutil.copytree(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf"), art)
    m = json.load(open(art / "manifest.json"))
    assert m["target"]["cpu_flags"]
    m["target"]["cpu_flags"].append("avx1024_imaginary")
    json.dump(m, open(art / "manifest.json", "w"))
    with pytest.raises(NextnError, match="compiled for a CPU with avx1024_imaginary, which this one lacks"):
        rt.load(str(art))


def test_model_file_must_match_manifest(compiled, tmp_path):
    import nextn.runtime as rt

    art = tmp_path / "art"
    shutil.copytree(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf"), art)
    m = json.load(open(art / "manifest.json"))
    m["model_files"][0]["identity"] = "0" * 64
    json.dump(m, open(art / "manifest.json", "w"))
    with pytest.raises(NextnError, match="not the model this artifact was compiled from"):
        rt.load(str(art))


def test_run_json_contract(compiled):
    art = compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")
    r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "run", art, "-p", "import os\nimport sys\n", "-n", "12",
                        "--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"prompt_tokens", "tokens", "text", "stats", "timings"}
    assert set(out["stats"]) >= {"rounds", "drafted", "accepted", "acceptance", "mean_len", "per_pos"}
    assert set(out["timings"]) >= {"prefill_s", "decode_s", "tokens_per_s", "entry_s"}
    entry = out["timings"]["entry_s"]   # seconds inside each compiled entry point, device-synchronized
    assert entry["verify"] > 0 and entry["draft"] > 0 and sum(entry.values()) <= out["timings"]["decode_s"]
    assert len(out["tokens"]) == 12 and len(out["stats"]["per_pos"]) == 2
    assert out["stats"]["mean_len"] == pytest.approx(1 + out["stats"]["accepted"] / out["stats"]["rounds"])
    plain = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "run", art, "-p", "import os\nimport sys\n", "-n", "12",
                            "--spec-type", "none", "--json"], capture_output=True, text=True)
    assert json.loads(plain.stdout)["tokens"] == out["tokens"]


@pytest.mark.slow
def test_run_gguf_compiles_and_caches(tmp_path):
    """`nextn run MODEL.gguf` compiles once into the cache, then reuses it."""
    import os

    env = {**os.environ, "NEXTN_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "nextn.runtime.cli", "run", str(G4 / "tiny-glm4moe-Q8_0.gguf"), "-p", "def", "-n", "3"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert first.returncode == 0 and "compiling" in first.stderr
    second = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert second.returncode == 0 and "compiling" not in second.stderr and second.stdout == first.stdout
