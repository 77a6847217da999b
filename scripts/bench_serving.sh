#!/usr/bin/env bash
# Serving figures: `radixserve bench online` against a real `radixserve serve`
# at several request rates, once with each server configuration given, all in one command, so the
# configurations meet the same requests on the same machine. Random weights of a model's shapes
# (`--load-format dummy`) with a real tokenizer: no checkpoint needed.
#
#   bash scripts/bench_serving.sh TOKENIZER_DIR PRESET|MODEL_DIR [CONFIG ...] -- [BENCH ARGS ...]
#
# TOKENIZER_DIR: a directory holding a tokenizer (tokenizer.json, tokenizer_config.json, ...);
# the second argument: a `--model-preset` name (qwen3-0.6b, ...) or a model directory whose
# config.json is used. Each CONFIG is one quoted string of extra serve flags ("" for the
# defaults); the default list is: "" "--disable-mixed-chunk". BENCH ARGS go to `bench online`
# (default: --request-rate 4 16 64 inf --num-prompts 200 --input-len 512 8192 --output-len 64 512).
# Example (the H200, mixed batches off and on under long prompts):
#
#   bash scripts/bench_serving.sh bench-smollm2 qwen3-0.6b "" "--disable-mixed-chunk"
#
# Logs and the bench output go to $OUT when set, else to the work folder it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,18p "$0"; exit 2; }
TOKENIZER=$1 MODEL=$2
shift 2
CONFIGS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do CONFIGS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
BENCH=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=("" "--disable-mixed-chunk")
[ ${#BENCH[@]} -gt 0 ] || BENCH=(--request-rate 4 16 64 inf --num-prompts 200 --input-len 512 8192 --output-len 64 512)
PY=$(command -v "${PYTHON:-python3}")
WORK=$(mktemp -d /tmp/radixserve-bench-serving.XXXXXX)
LOGS=${OUT:-$WORK}
echo "bench_serving: logs in $LOGS"

# the model: the preset's (or directory's) config.json beside the tokenizer's files
"$PY" - "$TOKENIZER" "$MODEL" "$WORK/model" <<'EOF'
import shutil, sys
from pathlib import Path

tok, model, dest = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
if not (tok / "tokenizer_config.json").is_file():
    sys.exit(f"bench_serving: {tok} has no tokenizer_config.json")
dest.mkdir(parents=True)
for f in tok.iterdir():
    if f.is_file() and f.name != "config.json" and not f.name.endswith(".safetensors"):
        shutil.copy(f, dest / f.name)
if Path(model).is_dir():
    shutil.copy(Path(model) / "config.json", dest / "config.json")
else:
    from radixserve.bench.presets import preset_dir
    shutil.copy(preset_dir(model) / "config.json", dest / "config.json")
(dest / "generation_config.json").unlink(missing_ok=True)  # the tokenizer's model's EOS ids
EOF

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
SERVER=
stop_server() {
    if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then
        kill -TERM "$SERVER"
        wait "$SERVER" || true
    fi
    SERVER=
}
trap stop_server EXIT

status=0
for i in "${!CONFIGS[@]}"; do
    cfg=${CONFIGS[$i]}
    label=${cfg:-defaults}
    log="$LOGS/server-$i.log"
    # shellcheck disable=SC2086  # a config is a list of flags
    "$PY" -m radixserve serve --model "$WORK/model" --load-format dummy --port "$PORT" $cfg >"$log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1800); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
        kill -0 "$SERVER" 2>/dev/null || { echo "bench_serving: server [$label] exited; see $log"; tail -5 "$log"; exit 1; }
        sleep 1
    done
    echo "=== server: $label"
    "$PY" -m radixserve bench online --base-url "http://127.0.0.1:$PORT" "${BENCH[@]}" \
        2>&1 | tee "$LOGS/bench-$i.txt" || status=1
    stop_server
done
exit $status
