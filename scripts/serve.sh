#!/usr/bin/env bash
# Run Triton Inference Server (the nvidia-pytriton 2.51 binary) in the
# foreground on this project's model repository, under scripts/supervise.py:
# the server is restarted when it exits or when the liveness probe (a real tiny
# synthesis, scripts/probe.py) finds a model process dead. Ctrl-C / SIGTERM stop
# it within its exit timeout, and every process it started with it.
#
#   scripts/serve.sh [extra tritonserver args...]
#   scripts/serve.sh --print-env      # where its tools come from (tritonserver, backends, venv, PYTHONPATH),
#                                     # KEY=VALUE; the ports and addresses are those below
#   scripts/serve.sh --print-cmd      # the tritonserver command it would run (scripts/supervise.py
#                                     # adds the restricted-API flags: VOXCPM_ADMIN_KEY below)
#   scripts/serve.sh --help           # this text
#
# Environment:
#   MODEL_REPOSITORY      default $REPO/model_repository
#   TRITON_HTTP_PORT      default 8000
#   TRITON_GRPC_PORT      default 8001
#   TRITON_METRICS_PORT   default 8002
#   TRITON_BIND           address of gRPC, metrics and the gateway, default 127.0.0.1 (0.0.0.0: all)
#   TRITON_HTTP_BIND      address of the HTTP endpoint, default 127.0.0.1 whatever TRITON_BIND says
#                         (Triton 2.51's HTTP JSON parser is for trusted clients: README, "Running it
#                         safely"); 0.0.0.0 serves HTTP to other hosts too
#   (ports and addresses go through these variables, not extra tritonserver arguments: the gateway
#   and the supervisor read them)
#   TRITON_LOG_VERBOSE    tritonserver --log-verbose level, default 0
#   TRITON_EXIT_TIMEOUT   seconds a SIGTERM gives the server, default 30: running requests get half,
#                         then end with an error; the models unload in the rest
#   VOXCPM_ADMIN_KEY      value of the header voxcpm-admin-key that opens Triton's
#                         shared-memory, model-repository, logging and trace APIs
#                         (unset: a random key, they stay closed); it goes on tritonserver's
#                         command line, which every local user can read (ps)
#   VOXCPM_SUPERVISE=0    exec tritonserver directly (no restarts, no probe, no OpenAI gateway; the
#                         restricted APIs closed all the same: VOXCPM_ADMIN_KEY above)
#   OPENAI_API_PORT       port of the OpenAI speech API gateway (gateway/voxcpm_gateway), run
#                         beside tritonserver on TRITON_BIND and supervised like it; default 9000,
#                         0: no gateway
#   VOXCPM_OPENAI_API_KEY the API key the gateway requires (Authorization: Bearer), unset: none
#   VOXCPM_PROBE_INTERVAL seconds between liveness probes, default 10 (0: none)
#   VOXCPM_PROBE_TIMEOUT  seconds a probe's synthesis may take, default 60
#   VOXCPM_PROBE_FAILURES failed probes in a row before a restart, default 3 (a dead model: at once)
#   VOXCPM_START_TIMEOUT  seconds a start may take to become ready, and the longest wait for ports
#                         another process holds, default 900
#   VOXCPM_MAX_FAILED_STARTS starts in a row that do not serve (never ready, or never pass a probe),
#                         or quick exits in a row of the gateway, before giving up (exit 1),
#                         default 5 (0: never give up)
#   VOXCPM_COMPANION_GRACE seconds the stopping gateway gets between SIGTERM and SIGKILL, default
#                         its drain (VOXCPM_OPENAI_SHUTDOWN_TIMEOUT, 20) plus 5
#   VOXCPM_CHECKPOINT     the VoxCPM2 checkpoint directory; unset: the embedded tiny one, generated
#                         once into VOXCPM_TINY_DIR (default checkpoints/tiny)
#   VOXCPM_INTERNAL_KEY   the key the models' internal requests carry; unset: a random one per start
#   VOXCPM_VOICES_DIR     where stored voices are kept (persistent data), default
#                         ${XDG_DATA_HOME:-~/.local/share}/voxcpm/voices
#   VOXCPM_LORA_DIR       the LoRA adapters the decoder may load, one subfolder each; unset: none
#   VOXCPM_DEVICE, VOXCPM_DTYPE  the models' torch device and the decoder's dtype; unset: cuda if
#                         there is a GPU, else cpu; bfloat16 on a GPU, float32 on the CPU
#   (the models read these and the other overrides of their parameters from the environment, see
#   the README's configuration table: VOXCPM_SPLIT_K, VOXCPM_GC_FREEZE, VOXCPM_TIMELINE,
#   VOXCPM_FUSED_LOCAL_LAYERS, VOXCPM_FUSED_STACKS, VOXCPM_FUSED_LM_LAYERS, VOXCPM_FUSED_FP8_LAYERS)
#   (the gateway's own settings are in the README; its --host and --triton-url come from above)
#   VENV                  virtual environment, default $REPO/.venv
#   SKIP_SETUP=1          do not run scripts/setup.sh first
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VENV="${VENV:-$REPO/.venv}"

mode=run
case "${1:-}" in
    --print-env) mode="env"; shift ;;
    --print-cmd) mode=cmd; shift ;;
    -h|--help)
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
        exit 0 ;;
esac

ckpt="${VOXCPM_CHECKPOINT:-}"
ckpt="${ckpt#"${ckpt%%[![:space:]]*}"}" && ckpt="${ckpt%"${ckpt##*[![:space:]]}"}"  # as the models strip it
if [[ $mode == run && -n $ckpt && ! -f $ckpt/config.json ]]; then
    # Every model would fail to load on it, and the supervisor retry: say so once, now (before setup).
    what="no config.json"
    [[ -d $ckpt ]] || what="no such directory"
    echo "[serve] VOXCPM_CHECKPOINT=$VOXCPM_CHECKPOINT is not a VoxCPM2 checkpoint directory ($what)" >&2
    exit 2
fi
if [[ $mode == run && ${SKIP_SETUP:-0} != 1 ]]; then
    bash "$REPO/scripts/setup.sh" >&2
fi

# shellcheck source=scripts/triton_env.sh
source "$REPO/scripts/triton_env.sh"
if [[ -z ${TRITONSERVER_BIN:-} ]]; then
    echo "[serve] no virtual environment at $VENV: run scripts/setup.sh" >&2
    exit 1
fi
if [[ $mode == env ]]; then
    _triton_env_print
    exit 0
fi
triton_env_ready || triton_build_backend_dir >&2

MODEL_REPOSITORY="${MODEL_REPOSITORY:-$REPO/model_repository}"
# Settings every start would fail on, the same way: said once, here, not five starts in a row.
if [[ $mode == run ]]; then
    bad=()
    [[ -d $MODEL_REPOSITORY ]] || bad+=("MODEL_REPOSITORY=$MODEL_REPOSITORY is not a directory")
    # Triton's Python backend starts its model processes through a bash command line that does not
    # quote these paths: with a space or a character special to the shell in one, no model process
    # starts and the server never gets ready.
    # (#, ~ and ! are not, inside an absolute path; braces only around a comma or ..)
    special='[][[:space:]"'"'"'\\$`;&|<>()*?]|\{[^}]*(,|\.\.)[^}]*\}'
    for v in MODEL_REPOSITORY TRITON_BACKEND_DIR; do
        [[ ${!v} =~ $special ]] && bad+=("$v=${!v} has a space or a character special to the shell ('${BASH_REMATCH[0]}') in it, which Triton's Python backend cannot start models from")
    done
    # tritonserver reads both as 32-bit integers (past that it refuses to start)
    int32='^(0|[1-9][0-9]{0,9})$'
    if ! [[ ${TRITON_LOG_VERBOSE:-0} =~ $int32 && ${TRITON_LOG_VERBOSE:-0} -le 2147483647 ]]; then
        bad+=("TRITON_LOG_VERBOSE=$TRITON_LOG_VERBOSE is not a whole number (0-2147483647)")
    fi
    if ! [[ ${TRITON_EXIT_TIMEOUT:-30} =~ $int32 && ${TRITON_EXIT_TIMEOUT:-30} -le 2147483647 ]]; then
        bad+=("TRITON_EXIT_TIMEOUT=$TRITON_EXIT_TIMEOUT is not a whole number of seconds (0-2147483647)")
    fi
    for v in TRITON_HTTP_PORT TRITON_GRPC_PORT TRITON_METRICS_PORT; do
        # 0 would be a port the system picks, which nothing here could find
        p="${!v:-}"
        if [[ -n $p ]] && ! [[ $p =~ ^[1-9][0-9]{0,4}$ && $p -le 65535 ]]; then
            bad+=("$v=$p is not a port number (1-65535)")
        fi
    done
    p="${OPENAI_API_PORT:-}"
    if [[ -n $p ]] && ! [[ $p =~ ^(0|[1-9][0-9]{0,4})$ && $p -le 65535 ]]; then
        bad+=("OPENAI_API_PORT=$p is not a port number (1-65535, or 0: no gateway)")
    fi
    used=("${TRITON_HTTP_PORT:-8000}" "${TRITON_GRPC_PORT:-8001}" "${TRITON_METRICS_PORT:-8002}" "${OPENAI_API_PORT:-9000}")
    if (($(printf '%s\n' "${used[@]}" | grep -vx 0 | sort | uniq -d | wc -l) > 0)); then
        bad+=("two of TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT, OPENAI_API_PORT are the same port")
    fi
    if ((${#bad[@]})); then
        printf '[serve] %s\n' "${bad[@]}" >&2
        exit 2
    fi
    # The checkpoint's files and config.json, VOXCPM_DTYPE, VOXCPM_DEVICE, VOXCPM_LORA_DIR and the models'
    # config.pbtxt parameters, checked as every model would check them: what is wrong is said once, here.
    "$VENV/bin/python" -c 'import sys; sys.path.insert(0, sys.argv[1])
from voxcpm_triton.serving.preflight import main
sys.exit(main(sys.argv[2]))' "$REPO/python_backend" "$MODEL_REPOSITORY" || exit 2
    if [[ ${OPENAI_API_PORT:-9000} != 0 && ${VOXCPM_SUPERVISE:-1} != 0 ]]; then
        # The gateway's own settings (VOXCPM_OPENAI_*), read as it reads them: refused there, the
        # supervisor would restart it five times, after Triton's whole start-up, then stop it all.
        if ! said="$(env "PYTHONPATH=$REPO/gateway" "$VENV/bin/python" -c 'import sys
from voxcpm_gateway.config import parse_args
parse_args(sys.argv[1:])' --port "${OPENAI_API_PORT:-9000}" 2>&1)"; then
            echo "[serve] the OpenAI gateway's settings: ${said##*error: }" >&2
            exit 2
        fi
    fi
fi
if [[ $mode == run && -z $ckpt ]]; then
    # The embedded default (VOXCPM_CHECKPOINT unset or blank, as the models read it): generate it once
    # here rather than in six model processes at once.
    "$VENV/bin/python" -c 'import sys; sys.path.insert(0, sys.argv[1])
from voxcpm_triton.testing import ensure_tiny_checkpoint
print("[serve] checkpoint:", ensure_tiny_checkpoint(progress=print))' "$REPO/python_backend" >&2
fi
BIND="${TRITON_BIND:-127.0.0.1}"
HTTP_BIND="${TRITON_HTTP_BIND:-127.0.0.1}"
BIND="${BIND#[}" BIND="${BIND%]}" HTTP_BIND="${HTTP_BIND#[}" HTTP_BIND="${HTTP_BIND%]}"
# An IPv6 address as each listener takes it: tritonserver's gRPC in brackets, its HTTP and metrics
# (evhtp) as ipv6:ADDRESS; a host:port in brackets (bind_host)
grpc_address="$BIND" metrics_address="$BIND" http_address="$HTTP_BIND" bind_host="$BIND" http_host="$HTTP_BIND"
if [[ $BIND == *:* ]]; then
    grpc_address="[$BIND]" metrics_address="ipv6:$BIND" bind_host="[$BIND]"
fi
if [[ $HTTP_BIND == *:* ]]; then
    http_address="ipv6:$HTTP_BIND" http_host="[$HTTP_BIND]"
fi
for a in "$@"; do
    case "$a" in
        --http-port*|--grpc-port*|--metrics-port*|--http-address*|--grpc-address*|--metrics-address*)
            echo "[serve] $a: set TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT, TRITON_BIND or" \
                 "TRITON_HTTP_BIND instead (the gateway and the supervisor read them)" >&2
            exit 2 ;;
        --print-env|--print-cmd|-h|--help)  # else passed on to tritonserver, which would refuse it
            echo "[serve] $a goes first: scripts/serve.sh $a" >&2
            exit 2 ;;
    esac
done
cmd=(
    "$TRITONSERVER_BIN"
    --model-repository="$MODEL_REPOSITORY"
    --backend-directory="$TRITON_BACKEND_DIR"
    --http-address="$http_address" --http-port="${TRITON_HTTP_PORT:-8000}"
    --grpc-address="$grpc_address" --grpc-port="${TRITON_GRPC_PORT:-8001}"
    --metrics-address="$metrics_address" --metrics-port="${TRITON_METRICS_PORT:-8002}"
    --allow-metrics=true
    --log-verbose="${TRITON_LOG_VERBOSE:-0}"
    --exit-timeout-secs="${TRITON_EXIT_TIMEOUT:-30}"
    "$@"
)
if [[ $mode == cmd ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
echo "[serve] tritonserver http $http_host:${TRITON_HTTP_PORT:-8000}, grpc $bind_host:${TRITON_GRPC_PORT:-8001}, metrics $bind_host:${TRITON_METRICS_PORT:-8002}, repo $MODEL_REPOSITORY" >&2
if [[ ${VOXCPM_SUPERVISE:-1} == 0 ]]; then
    # Bare, with the restricted-API flags the supervisor adds otherwise (its function makes them).
    mapfile -t cmd < <("$VENV/bin/python" "$REPO/scripts/supervise.py" --print-restricted -- "${cmd[@]}")
    (( ${#cmd[@]} )) || { echo "[serve] scripts/supervise.py --print-restricted failed" >&2; exit 1; }
    exec "${cmd[@]}"
fi
ports_from="TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT"
[[ ${OPENAI_API_PORT:-9000} == 0 ]] || ports_from+=", OPENAI_API_PORT (the gateway)"
supervise=(--port-hint "scripts/serve.sh takes its ports from $ports_from")
OPENAI_API_PORT="${OPENAI_API_PORT:-9000}"
if [[ $OPENAI_API_PORT != 0 ]]; then
    # the gateway reaches Triton's gRPC port on the loopback when Triton listens everywhere
    triton_host="$bind_host"
    [[ $bind_host == 0.0.0.0 || -z $bind_host || $bind_host == "[::]" ]] && triton_host=127.0.0.1
    gateway=(env "PYTHONPATH=$REPO/gateway" "$VENV/bin/python" -m voxcpm_gateway --host "$BIND"
             --port "$OPENAI_API_PORT" --triton-url "$triton_host:${TRITON_GRPC_PORT:-8001}")
    # shlex's quoting, which the supervisor reads back (bash's %q writes $'...' for non-ASCII bytes in a C locale)
    supervise+=(--companion "$("$VENV/bin/python" -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "${gateway[@]}")")
    supervise+=(--companion-port "$bind_host:$OPENAI_API_PORT")
    echo "[serve] OpenAI speech API on http://$bind_host:$OPENAI_API_PORT/v1" >&2
fi
exec "$VENV/bin/python" "$REPO/scripts/supervise.py" "${supervise[@]}" -- "${cmd[@]}"
