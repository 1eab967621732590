"""bench/peer_server_tests.sh's pieces that run without llama.cpp's suite: the llama-server flag shim and the
not-applicable table the plugin reads from docs/server.md."""
from __future__ import annotations

import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_shim_maps_llama_server_flags_and_drops_the_rest():
    shim = _load("llama_server_shim")
    argv = ["--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "--hf-repo", "ggml-org/x",
            "--batch-size", "32", "--no-slots", "--alias", "tinyllama-2", "--ctx-size", "512", "--parallel", "2",
            "--n-predict", "64", "--no-jinja", "--reasoning", "off", "--api-key", "k", "--metrics", "--verbose"]
    args, dropped = shim.translate(argv, "m.gguf")
    assert args == ["m.gguf", "--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "-b", "32",
                    "--no-slots", "--alias", "tinyllama-2", "-c", "512", "-np", "2", "-n", "64",
                    "--reasoning-budget", "0", "--api-key", "k", "--metrics", "--verbose"]
    assert dropped == ["--hf-repo", "ggml-org/x", "--no-jinja"]
    args, dropped = shim.translate(["--chat-template", "{{ messages[0].content }}", "--chat-template", "llama3",
                                    "--kv-unified", "--sleep-idle-seconds", "1", "--cache-ram", "0", "--ubatch-size",
                                    "8"], "m")
    assert args == ["m", "--chat-template", "{{ messages[0].content }}", "--chat-template", "llama3",
                    "--kv-unified", "--sleep-idle-seconds", "1", "--cache-ram", "0"]
    assert dropped == ["--ubatch-size", "8"]


def test_the_not_applicable_table_names_suite_files_with_reasons():
    plugin = _load("peer_server_plugin")
    table = plugin.read_not_applicable(os.path.join(ROOT, "docs", "server.md"))
    script = open(os.path.join(ROOT, "bench", "peer_server_tests.sh")).read()
    files = set(re.search(r"FILES=\(\$\{PEER_FILES:-([^}]*)\}\)", script).group(1).split())
    assert len(files) == 24
    assert table and all(k.split("::")[0][len("unit/test_"):-len(".py")] in files for k in table)
    assert all(len(reason) > 10 for reason in table.values())
    assert plugin.not_applicable("unit/test_embedding.py::test_embedding_single", table) == \
        table["unit/test_embedding.py"]
    one = next(k for k in table if "::" in k)
    assert plugin.not_applicable(f"{one}[param-1]", table) == table[one]
    assert plugin.not_applicable(f"{one}_other", table) is None
