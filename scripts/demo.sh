#!/usr/bin/env bash
# The README's first command: set up, start tritonserver on the embedded tiny
# checkpoint (or $VOXCPM_CHECKPOINT), synthesize one sentence over gRPC
# streaming and one over HTTP, print time to first audio and RTF, stop.
#
# Writes demo.wav (streamed), demo_http.wav and demo_openai.wav (through the OpenAI
# speech API gateway) in the repository root. The tiny
# checkpoint has random weights: expect noise, shaped like speech timing-wise
# (--min-length 25: at least 4 s of audio, so the RTF means something).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VENV="${VENV:-$REPO/.venv}"
cd "$REPO"

bash scripts/setup.sh
PY="$VENV/bin/python"
# Free loopback ports unless the caller chose some.
read -r HTTP GRPC METRICS OPENAI < <("$PY" - <<'PYEOF'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PYEOF
)
export TRITON_HTTP_PORT="${TRITON_HTTP_PORT:-$HTTP}" TRITON_GRPC_PORT="${TRITON_GRPC_PORT:-$GRPC}"
export TRITON_METRICS_PORT="${TRITON_METRICS_PORT:-$METRICS}" OPENAI_API_PORT="${OPENAI_API_PORT:-$OPENAI}"

LOG="$(mktemp -t voxcpm-demo-server.XXXXXX.log)"
echo "[demo] starting tritonserver (log: $LOG)"
SKIP_SETUP=1 bash scripts/serve.sh >"$LOG" 2>&1 &
SERVER=$!
stop_server() {
    local rc=$?
    if kill -0 "$SERVER" 2>/dev/null; then
        echo "[demo] stopping tritonserver"
        kill -TERM "$SERVER" 2>/dev/null || true
        wait "$SERVER" 2>/dev/null || true
    fi
    if ((rc == 0)); then rm -f "$LOG"; else echo "[demo] the server's log is kept: $LOG" >&2; fi
}
trap stop_server EXIT

t0=$SECONDS
ready() {
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://127.0.0.1:$TRITON_HTTP_PORT/v2/health/ready" >/dev/null 2>&1
}
until ready; do
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "[demo] tritonserver exited during start-up; last lines of its log:" >&2
        tail -n 40 "$LOG" >&2
        exit 1
    fi
    if ((SECONDS - t0 > ${DEMO_START_TIMEOUT:-600})); then
        echo "[demo] tritonserver not ready after $((SECONDS - t0)) s" >&2
        tail -n 40 "$LOG" >&2
        exit 1
    fi
    sleep 1
done
echo "[demo] server ready in $((SECONDS - t0)) s"

export PYTHONPATH="$REPO/client${PYTHONPATH:+:$PYTHONPATH}"
echo "[demo] gRPC streaming (tts_stream):"
"$PY" -m voxcpm_client "Hello! This is VoxCPM2 speaking through Triton, one chunk at a time." \
    --protocol grpc --url "127.0.0.1:$TRITON_GRPC_PORT" --seed 1 --min-length 25 -o demo.wav
echo "[demo] HTTP infer (tts):"
"$PY" -m voxcpm_client "And this whole sentence came back in one HTTP response." \
    --protocol http --url "127.0.0.1:$TRITON_HTTP_PORT" --seed 2 --min-length 25 -o demo_http.wav
if [[ $OPENAI_API_PORT != 0 ]]; then
    echo "[demo] OpenAI speech API (POST /v1/audio/speech on the gateway, wav streamed):"
    "$PY" - "http://127.0.0.1:$OPENAI_API_PORT" <<'PYEOF'
import json, sys, time, urllib.request
url = sys.argv[1]
deadline = time.monotonic() + 60
while True:  # the gateway is healthy once it sees Triton's models ready
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("[demo] the OpenAI gateway did not become healthy")
        time.sleep(0.5)
body = {"model": "voxcpm2", "input": "And this one came through the OpenAI speech API.", "voice": "default",
        "response_format": "wav", "seed": 3, "min_length": 25}
req = urllib.request.Request(url + "/v1/audio/speech", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
t0 = time.perf_counter()
with urllib.request.urlopen(req, timeout=300) as r, open("demo_openai.wav", "wb") as f:
    f.write(r.read(1))
    first = time.perf_counter() - t0
    f.write(r.read())
print(f"[demo] time to first byte {first * 1000:.0f} ms, whole response {time.perf_counter() - t0:.2f} s")
PYEOF
fi
echo "[demo] done: demo.wav, demo_http.wav$([[ $OPENAI_API_PORT == 0 ]] || echo ", demo_openai.wav")"
