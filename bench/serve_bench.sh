#!/usr/bin/env bash
# nextn serve and llama-server side by side on the same GGUF: bench/mtp_bench.py against each, one after the other
# (never both at once, so neither measures the other's load), one slot each, the same chat template (nextn's
# GLM-4.5-style one, since the fixtures carry none), llama-server with --spec-type draft-mtp.
#
#   bench/serve_bench.sh [MODEL.gguf] [OUT_DIR]      # default: the embedded tiny model, out/serve_bench
#
# llama-server comes from the peer build (bench/peer_llamacpp.sh, or $NEXTN_PEER_DIR/bin); extra mtp_bench options go
# in MTP_BENCH_ARGS (e.g. "--max-tokens 256"). Prints both tables and writes OUT_DIR/{nextn,llama}.json.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-artifacts/tiny-glm4moe-Q8_0.gguf}
OUT=${2:-out/serve_bench}
PY=${PYTHON:-.venv/bin/python}
TEMPLATE=runtime/server/templates/glm4.jinja
mkdir -p "$OUT"
if [[ -x bench/peer_llamacpp.sh ]]; then
    LLAMA_SERVER=$(bench/peer_llamacpp.sh | sed -n 's/^llama-server=//p')
else
    LLAMA_SERVER=${NEXTN_PEER_DIR:-$HOME/.cache/nextn-peer}/bin/llama-server
fi
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ready() {   # url pid
    for _ in $(seq 1 600); do
        curl -sf "$1/health" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || { echo "serve_bench: the server exited" >&2; return 1; }
        sleep 0.5
    done
    echo "serve_bench: $1 not ready" >&2; return 1
}
bench_one() {    # name port pid
    local url=http://127.0.0.1:$2
    wait_ready "$url" "$3"
    echo "== $1 ($url)"
    "$PY" bench/mtp_bench.py --url "$url" -o "$OUT/$1.json" ${MTP_BENCH_ARGS:-}
    kill "$3"; wait "$3" 2>/dev/null || true
}

P=$(free_port)
"$PY" -m nextn.runtime.cli serve "$MODEL" --port "$P" -c 4096 -np 1 --spec-type draft-mtp --spec-draft-n-max 3 \
    --chat-template-file "$TEMPLATE" 2>"$OUT/nextn.log" &
bench_one nextn "$P" $!

P=$(free_port)
"$LLAMA_SERVER" -m "$MODEL" --port "$P" -c 4096 -np 1 --spec-type draft-mtp --spec-draft-n-max 3 \
    --jinja --chat-template-file "$TEMPLATE" >"$OUT/llama.log" 2>&1 &
bench_one llama "$P" $!
