#!/usr/bin/env bash
# The served benchmark on the GPU machine (the device tool runs it from the repo root):
# tritonserver from the bundle gpu_box/make_device_bundle.sh built (carry .cache/device_bundle),
# this model repository on the full-size random checkpoint, then benchmarks/bench_served.py.
#   LEVELS (1,8,32,64)  REQUESTS (2 per worker)  CKPT (/tmp/full, made if missing)
#   ARRIVALS (burst; "burst,poisson" runs both, poisson into served_poisson.json)  MEAN_GAP (2 s)
#   CLIENT_PROCESSES (1; bench_served's --client-processes, e.g. 1,4: each level in one client process, then in 4)
#   PREFIX=1: benchmarks/bench_prefix_cache.py instead (TTFA of a 10 s voice cold vs cached, 32
#   streams of that voice vs its audio inline), voices in a fresh directory: $OUT/prefix_cache.json.
#   GATEWAY=1: benchmarks/bench_gateway.py instead: the OpenAI gateway (gateway/voxcpm_gateway, its
#   dependencies from .cache/gateway_wheels, made by gpu_box/make_gateway_wheels.sh: carry it too)
#   beside the server; time to first byte through it vs the direct gRPC stream (GW_REQUESTS, 30),
#   aggregate at GW_STREAMS (32) streams both ways: $OUT/gateway.json, $OUT/gateway.log.
#   GW_SOURCES="dir,dir,...": gateway source folders measured one after the other against the same
#   server (default gateway/), e.g. another commit's `git archive REV gateway` and this one's, in
#   alternation: $OUT/gateway_<i>.json and gateway_<i>.log for the i-th (0-based) when more than one.
#   TRITON_ARGS: more tritonserver arguments (split on spaces), e.g. --backend-config=python,...
#   SERVER_ENV="NAME=value ...": environment for the server alone (its stubs inherit it), not the clients
#   (each variable as it was is back once the server runs; NAME in capitals, once each), e.g.
#   VOXCPM_PYTHON_BACKEND=<other code>, which SET's check then reads too
#   SET="model.key=value ...": those model parameters changed, in a copy of MODEL_REPOSITORY (the
#   checkout's model_repository unless given), checked first (scripts/repository_copy.py; e.g.
#   SET=decoder.decode_audio=true). AUDIO=1: benchmarks/served_audio.py records 4 fixed-seed streams
#   first, together ($OUT/audio.npz) and one at a time ($OUT/audio_seq.npz), to compare two
#   configurations' audio (--compare).
#   DRAIN=N: the server runs under scripts/supervise.py (as scripts/serve.sh runs it); after the
#   benchmarks, benchmarks/shutdown_drain.py starts N streams of DRAIN_LENGTH (3000) patches and sends
#   the supervisor SIGTERM: how they end and how the server goes, $OUT/drain.json.
#   PERF_ANALYZER=1: benchmarks/bench_perf_analyzer.py instead: Triton's perf_analyzer 2.51 (from
#   .cache/perf_analyzer_bundle, made by gpu_box/make_perf_analyzer_bundle.sh: carry it too) on
#   tts_stream over gRPC streaming, PA_LENGTH (100)-step requests, at PA_LEVELS (1,8,32,64), windows of
#   PA_INTERVAL_MS (6000; a level takes about 25 s): $OUT/perf_analyzer.{csv,log,json}.
# Writes $OUT/served.json (each level with its minor page faults, the server's and each model's stubs'),
# $OUT/metrics.txt (the voxcpm_ metrics at the end) and
# $OUT/tritonserver.log (benchmarks/out without $OUT).
set -uo pipefail
# SERVER_ENV first: a mistake there costs nothing yet
read -ra server_env <<<"${SERVER_ENV:-}"
declare -A env_seen=()
for kv in "${server_env[@]}"; do
    name="${kv%%=*}"
    [[ $kv =~ ^[A-Z_][A-Z0-9_]*= ]] || { echo "[run_served_gpu] SERVER_ENV: '$kv' is not NAME=value, NAME in capitals"; exit 1; }
    [[ -z ${env_seen[$name]:-} ]] || { echo "[run_served_gpu] SERVER_ENV: $name given twice"; exit 1; }
    [[ $(declare -p "$name" 2>/dev/null | cut -d' ' -f2) != *r* ]] || { echo "[run_served_gpu] SERVER_ENV: $name is read-only"; exit 1; }
    env_seen[$name]=1
done
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CKPT="${CKPT:-/tmp/full}"
[[ -f $CKPT/config.json ]] || python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json \
    --out "$CKPT" --device cuda 2>&1 | tail -1
if [[ ${PERF_ANALYZER:-0} == 1 ]]; then  # before the server: a missing bundle costs no start-up
    pa_tar=.cache/perf_analyzer_bundle/perf_analyzer.tar.xz
    pa_dir="$(mktemp -d)"
    if ! (cd "$(dirname "$pa_tar")" && sha256sum --quiet -c perf_analyzer.tar.xz.sha256) \
        || ! tar -C "$pa_dir" -xJf "$pa_tar"; then
        echo "[run_served_gpu] no usable $pa_tar: build it with gpu_box/make_perf_analyzer_bundle.sh, carry .cache/perf_analyzer_bundle"
        rm -rf "$pa_dir"
        exit 1
    fi
    PA_BIN="$pa_dir/perf_analyzer/bin/perf_analyzer"
    "$PA_BIN" --version 2>&1 | grep "Perf Analyzer Version" || { echo "[run_served_gpu] $PA_BIN does not run"; exit 1; }
fi
DEVICE_ENV_QUIET=1 source gpu_box/device_serve_env.sh
if [[ ${PREFIX:-0} == 1 ]]; then
    VOXCPM_VOICES_DIR="$(mktemp -d)/voices"
    export VOXCPM_VOICES_DIR
fi
repo_arg=()
if [[ -n ${SET:-} ]]; then  # checked against the server's VOXCPM_PYTHON_BACKEND's parameter table before it starts
    repo_copy="$(mktemp -d)/model_repository"
    read -ra sets <<<"$SET"
    env "${server_env[@]}" python3 scripts/repository_copy.py "${MODEL_REPOSITORY:-model_repository}" "$repo_copy" "${sets[@]}" \
        || { rm -rf "$(dirname "$repo_copy")"; exit 1; }
    repo_arg=("$repo_copy")
fi
t0=$SECONDS
saved_env=()  # each variable's declaration before (declare -p: its value and whether exported), or "" if unset
for kv in "${server_env[@]}"; do
    name="${kv%%=*}"
    if [[ -v $name ]]; then saved_env+=("$(declare -p "$name")"); else saved_env+=(""); fi
    export "${kv?}"
done
# Killed (a timeout, ^C): take the server down too; it runs in its own session, out of the signal's reach.
trap 'echo "[run_served_gpu] interrupted: stopping the server"; [[ -n ${sup_pid:-} ]] && kill -TERM "$sup_pid" \
    && wait "$sup_pid"; device_triton_stop; exit 143' TERM INT
if [[ -n ${DRAIN:-} ]]; then  # under scripts/supervise.py, as scripts/serve.sh runs it (no liveness probe)
    device_env_ok || { echo "[run_served_gpu] environment incomplete"; exit 1; }
    _dse_ports_free || exit 1
    VOXCPM_PROBE_INTERVAL=0 VOXCPM_CHECKPOINT="$CKPT" setsid python3 scripts/supervise.py -- "$TRITONSERVER_BIN" \
        --model-repository="${repo_arg[0]:-$MODEL_REPOSITORY}" --backend-directory="$TRITON_BACKEND_DIR" \
        --http-address=127.0.0.1 --http-port="$TRITON_HTTP_PORT" --grpc-address=127.0.0.1 \
        --grpc-port="$TRITON_GRPC_PORT" --metrics-address=127.0.0.1 --metrics-port="$TRITON_METRICS_PORT" \
        --allow-metrics=true --exit-timeout-secs="${TRITON_EXIT_TIMEOUT:-30}" ${TRITON_ARGS:-} \
        >"$OUT/tritonserver.log" 2>&1 </dev/null &
    sup_pid=$!
    if ! _dse_wait_ready "$sup_pid" "$TRITON_HTTP_PORT" "${DEVICE_TRITON_READY_TIMEOUT:-900}"; then
        tail -n 60 "$OUT/tritonserver.log"; kill -TERM "$sup_pid"; wait "$sup_pid"
        echo "[run_served_gpu] tritonserver did not start"; exit 1
    fi
elif ! VOXCPM_CHECKPOINT="$CKPT" DEVICE_TRITON_LOG="$OUT/tritonserver.log" \
    device_triton_start "${repo_arg[0]:-${MODEL_REPOSITORY:-}}" ${TRITON_ARGS:-}; then
    echo "[run_served_gpu] tritonserver did not start"; exit 1
fi
for i in "${!server_env[@]}"; do
    unset "${server_env[i]%%=*}"
    [[ -z ${saved_env[i]} ]] || eval "${saved_env[i]}"
done
echo "[run_served_gpu] server ready after $((SECONDS - t0)) s (load, compile, capture)${SERVER_ENV:+ with $SERVER_ENV}"
grep -E "captured|compiled|start-up|GiB" "$OUT/tritonserver.log" | tail -5
rc=0
IFS=, read -ra modes <<<"${ARRIVALS:-burst}"
[[ ${PREFIX:-0} == 1 || ${GATEWAY:-0} == 1 || ${PERF_ANALYZER:-0} == 1 ]] && [[ -z ${ARRIVALS:-} ]] \
    && modes=()  # those alone, unless asked
if [[ ${PREFIX:-0} == 1 ]]; then
    python3 benchmarks/bench_prefix_cache.py --url "127.0.0.1:$TRITON_GRPC_PORT" \
        --metrics-url "http://127.0.0.1:$TRITON_METRICS_PORT/metrics" --json-out "$OUT/prefix_cache.json" || rc=$?
fi
if [[ ${GATEWAY:-0} == 1 ]]; then
    gw_py="$(mktemp -d)"
    for w in .cache/gateway_wheels/*.whl; do python3 -m zipfile -e "$w" "$gw_py"; done
    IFS=, read -ra gw_sources <<<"${GW_SOURCES:-$PWD/gateway}"
    for i in "${!gw_sources[@]}"; do
        gw_src="$(cd "${gw_sources[i]}" && pwd)" || { echo "[run_served_gpu] no gateway source ${gw_sources[i]}"; rc=1; continue; }
        gw_name=gateway; (( ${#gw_sources[@]} > 1 )) && gw_name="gateway_$i"
        echo "[run_served_gpu] $gw_name: the gateway from $gw_src"
        PYTHONPATH="$gw_src:$gw_py:$PYTHONPATH" setsid python3 -m voxcpm_gateway --port "${OPENAI_API_PORT:-9000}" \
            --triton-url "127.0.0.1:$TRITON_GRPC_PORT" --log-level warning >"$OUT/$gw_name.log" 2>&1 </dev/null &
        gw_pid=$!
        for _ in $(seq 120); do
            python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
                "http://127.0.0.1:${OPENAI_API_PORT:-9000}/health" 2>/dev/null && break
            kill -0 "$gw_pid" 2>/dev/null || break
            sleep 0.5
        done
        python3 benchmarks/bench_gateway.py --grpc-url "127.0.0.1:$TRITON_GRPC_PORT" \
            --gateway-url "http://127.0.0.1:${OPENAI_API_PORT:-9000}" --requests "${GW_REQUESTS:-30}" \
            --concurrency "${GW_STREAMS:-32}" --requests-per-stream 2 --min-length 100 --max-length 100 \
            --json-out "$OUT/$gw_name.json" || rc=$?
        kill -TERM "$gw_pid" 2>/dev/null; wait "$gw_pid" 2>/dev/null
        tail -5 "$OUT/$gw_name.log"
    done
fi
if [[ ${PERF_ANALYZER:-0} == 1 ]]; then
    python3 benchmarks/bench_perf_analyzer.py --perf-analyzer "$PA_BIN" --url "127.0.0.1:$TRITON_GRPC_PORT" \
        --levels "${PA_LEVELS:-1,8,32,64}" --min-length "${PA_LENGTH:-100}" --max-length "${PA_LENGTH:-100}" \
        --interval-ms "${PA_INTERVAL_MS:-6000}" --out-dir "$OUT" || rc=$?
    rm -rf "$pa_dir"
fi
if [[ ${AUDIO:-0} == 1 ]]; then
    python3 benchmarks/served_audio.py --url "127.0.0.1:$TRITON_GRPC_PORT" --out "$OUT/audio.npz" || rc=$?
    python3 benchmarks/served_audio.py --url "127.0.0.1:$TRITON_GRPC_PORT" --out "$OUT/audio_seq.npz" \
        --sequential || rc=$?
fi
for mode in "${modes[@]}"; do
    name=served; [[ $mode == burst ]] || name="served_$mode"
    python3 benchmarks/bench_served.py --url "127.0.0.1:$TRITON_GRPC_PORT" --concurrency "${LEVELS:-1,8,32,64}" \
        --requests-per-worker "${REQUESTS:-2}" --min-length 100 --max-length 100 --warmup 2 \
        --arrivals "$mode" --mean-gap "${MEAN_GAP:-2}" --client-processes "${CLIENT_PROCESSES:-1}" \
        --json-out "$OUT/$name.json" \
        --metrics-url "http://127.0.0.1:$TRITON_METRICS_PORT/metrics" --server-pid "${sup_pid:-$DEVICE_TRITON_PID}" \
        || rc=$?
done
# the server's own counters at the end (how decoder calls were read, batching, errors)
python3 -c "import sys, urllib.request; sys.stdout.write(''.join(l for l in
urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().splitlines(True) if l.startswith('voxcpm_')))" \
    "http://127.0.0.1:$TRITON_METRICS_PORT/metrics" >"$OUT/metrics.txt" \
    || echo "[run_served_gpu] could not read the server's metrics"
if [[ -n ${DRAIN:-} ]]; then  # SIGTERM with DRAIN long streams in flight: $OUT/drain.json
    if ! python3 benchmarks/shutdown_drain.py --url "127.0.0.1:$TRITON_GRPC_PORT" --pid "$sup_pid" \
        --log "$OUT/tritonserver.log" --streams "$DRAIN" --length "${DRAIN_LENGTH:-3000}" \
        --exit-timeout "${TRITON_EXIT_TIMEOUT:-30}" --json-out "$OUT/drain.json"; then
        rc=1
        kill -TERM "$sup_pid" 2>/dev/null  # in case it failed before its SIGTERM
    fi
    wait "$sup_pid"
    echo "[run_served_gpu] the supervisor exited with code $?"
    tail -n 5 "$OUT/tritonserver.log"
else
    device_triton_stop
fi
echo "[run_served_gpu] done after $((SECONDS - t0)) s"
exit $rc
