#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests of the llama-cpp-python 0.3.36 sdist, the source
# bench/peer_llamacpp.sh builds) run against `nextn serve`: its 24 relevant unit/ files with -m "not slow" (the three
# left out test llama-server's MCP client, built-in tools and multi-model router). The suite starts its server
# through $LLAMA_SERVER_BIN_PATH, here bench/llama_server_shim.py, which maps llama-server's flags onto `nextn serve`
# and always serves MODEL. Tests that assert the text of llama.cpp's own test models or a feature nextn does not claim
# are deselected and counted "n/a"; the list, with the reason of each, is in docs/server.md.
#
#   bench/peer_server_tests.sh [MODEL.gguf] [-- extra pytest args, e.g. -k props -x]
#   PEER_FILES="basic metrics" bench/peer_server_tests.sh     # only unit/test_basic.py and unit/test_metrics.py
#
# Default MODEL: the tiny glm4moe fixture (artifacts/tiny-glm4moe-Q8_0.gguf). Prints one line per test file (passed,
# failed, skipped, n/a) and writes out/peer_server_tests/summary.json (counts and the failed test ids) and pytest.log
# (a server writes where the suite sends llama-server's output: a failing test's captured output in pytest.log, or
# the test's own log file). The suite's Python requirements go into a venv under the cache folder ($NEXTN_PEER_DIR,
# default ~/.cache/nextn-peer); the suite writes its scratch files into its own folder there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODEL=artifacts/tiny-glm4moe-Q8_0.gguf
if [[ $# -gt 0 && $1 != -- ]]; then MODEL=$1; shift; fi
[[ ${1:-} == -- ]] && shift
[[ -f $MODEL ]] || { echo "peer_server_tests: no model file $MODEL" >&2; exit 1; }
PY=${PYTHON:-$ROOT/.venv/bin/python}
DIR=${NEXTN_PEER_DIR:-$HOME/.cache/nextn-peer}
OUT=${OUT:-out/peer_server_tests}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/summary.json" "$OUT/summary.jsonl" "$OUT/servers.log"

TREE=$(bench/peer_llamacpp.sh --source | sed -n 's/^source=//p')
TESTS=$TREE/tools/server/tests
VENV=$DIR/server-tests-venv
if [[ ! -x $VENV/bin/pytest || $TESTS/requirements.txt -nt $VENV/.installed ]]; then
    echo "peer_server_tests: installing the suite's requirements into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet -r "$TESTS/requirements.txt" >&2
    touch "$VENV/.installed"
fi

# the shim runs with nextn's interpreter; the suite execs LLAMA_SERVER_BIN_PATH directly
SHIM=$DIR/llama-server-shim
printf '#!/bin/sh\nexec %q %q "$@"\n' "$PY" "$ROOT/bench/llama_server_shim.py" > "$SHIM"
chmod +x "$SHIM"

# one warm process forks every server the suite starts (the imports once, not once per test: llama_server_shim.py)
ZYGOTE=$OUT/zygote.sock
"$PY" bench/llama_server_shim.py --zygote "$ZYGOTE" "$OUT/servers.log" 2> "$OUT/zygote.log" &
ZPID=$!
trap 'kill $ZPID 2>/dev/null' EXIT
for _ in $(seq 1 600); do [[ -S $ZYGOTE ]] && break; sleep 0.2; done
[[ -S $ZYGOTE ]] || { echo "peer_server_tests: the zygote did not start ($OUT/zygote.log)" >&2; exit 1; }

FILES=(${PEER_FILES:-basic chat_completion compat_anthropic compat_gcp compat_oai_responses completion ctx_shift embedding
       ignore_eos infill kv_keep_only_active lora metrics proxy rerank security sleep slot_save speculative stream
       template tokenize tool_call vision_api})
ARGS=()
for f in "${FILES[@]}"; do ARGS+=("unit/test_$f.py"); done

set +e
(cd "$TESTS" && LLAMA_SERVER_BIN_PATH=$SHIM NEXTN_SHIM_MODEL=$ROOT/$MODEL NEXTN_SHIM_PYTHON=$PY NEXTN_SHIM_ZYGOTE=$ZYGOTE \
    NEXTN_PEER_NA=$ROOT/docs/server.md NEXTN_PEER_SUMMARY=$OUT/summary.json \
    PYTHONPATH=$ROOT/bench${PYTHONPATH:+:$PYTHONPATH} \
    "$VENV/bin/python" -m pytest -p peer_server_plugin -m "not slow" -v --tb=short -p no:cacheprovider "${ARGS[@]}" "$@") \
    > "$OUT/pytest.log" 2>&1
rc=$?
set -e
sed -n '/^test file /,/^total /p' "$OUT/pytest.log"
echo "peer_server_tests: log $OUT/pytest.log, summary $OUT/summary.json (pytest exit $rc)"
