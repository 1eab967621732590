"""Bad input → one clear line on stderr naming the file/key/tensor, non-zero exit, no traceback."""
import subprocess
import sys

import pytest

import badgguf
from conftest import G4

pytestmark = pytest.mark.e2e   # builds TVM kernels or runs the CLI in a subprocess

SRC = G4 / "tiny-glm4moe-trunk-Q8_0.gguf"


def nextn(*args):
    r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def assert_one_line_error(rc, err, *needles):
    assert rc != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_missing_file(tmp_path):
    rc, _, err = nextn("run", tmp_path / "nope.gguf", "-p", "x")
    assert_one_line_error(rc, err, "nope.gguf", "no such file")


def test_not_a_gguf(tmp_path):
    f = tmp_path / "notes.gguf"
    f.write_text("hello, I am text\n")
    rc, _, err = nextn("compile", f, "-o", tmp_path / "out")
    assert_one_line_error(rc, err, "notes.gguf", "not a GGUF")


@pytest.mark.parametrize("fraction", [0.0005, 0.5])
def test_truncated(tmp_path, fraction):
    f = badgguf.truncate(SRC, tmp_path / "cut.gguf", fraction)
    rc, _, err = nextn("compile", f, "-o", tmp_path / "out")
    assert_one_line_error(rc, err, "cut.gguf", "truncated")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_unsupported_arch(tmp_path):
    f = badgguf.set_arch(SRC, tmp_path / "arch.gguf", b"llama00")
    rc, _, err = nextn("compile", f, "-o", tmp_path / "out")
    assert_one_line_error(rc, err, "arch.gguf", "unsupported architecture 'llama00'", "glm4moe")


def test_missing_tensor(tmp_path):
    f = badgguf.replace_once(SRC, tmp_path / "miss.gguf", b"blk.2.attn_v.weight", b"blk.2.attn_v.wEight")
    rc, _, err = nextn("compile", f, "-o", tmp_path / "out")
    assert_one_line_error(rc, err, "miss.gguf", "'blk.2.attn_v.weight'", "missing")


def test_misshaped_tensor(tmp_path):
    f = badgguf.set_first_dim(SRC, tmp_path / "shape.gguf", b"blk.1.attn_q_norm.weight", 16)
    rc, _, err = nextn("compile", f, "-o", tmp_path / "out")
    assert_one_line_error(rc, err, "shape.gguf", "'blk.1.attn_q_norm.weight'", "[16]", "expected [32]")


def test_prompt_longer_than_context(compiled, tmp_path):
    art = compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")
    rc, _, err = nextn("run", art, "-p", "word " * 40, "-c", "16", "-n", "4")
    assert_one_line_error(rc, err, "context holds 16", "-c")


def test_missing_prompt_file(compiled, tmp_path):
    art = compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")
    rc, _, err = nextn("run", art, "--prompt-file", tmp_path / "none.txt")
    assert_one_line_error(rc, err, "none.txt")
