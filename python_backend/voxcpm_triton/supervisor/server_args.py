"""What tritonserver's own command line says that the supervisor needs: option values, the
endpoints it will listen on, its python backend's region prefix, and the restricted-API flags."""

from __future__ import annotations

import os
import re
import secrets

from ..coordination import liveness
from .log import log

RESTRICTED_APIS = "shared-memory,model-repository,logging,trace"
ADMIN_HEADER = "voxcpm-admin-key"
SHM_PREFIX = "triton_python_backend_shm_region_"  # the python backend's shm-region-prefix-name by default
OWN_PREFIX = re.compile(rf"{SHM_PREFIX}vx[0-9a-f]{{8}}_")  # a supervisor's own (own_shm_prefix): a token added


def restricted(server_args: list[str]) -> list[str]:
    """The server's command with the restricted-API flags (VOXCPM_ADMIN_KEY, else a random key) added,
    unless it restricts something already."""
    if any(a.startswith(("--http-restricted-api", "--grpc-restricted-protocol")) for a in server_args):
        return list(server_args)
    key = os.environ.get("VOXCPM_ADMIN_KEY") or secrets.token_hex(16)
    if not os.environ.get("VOXCPM_ADMIN_KEY"):
        log(f"{RESTRICTED_APIS} APIs closed (set VOXCPM_ADMIN_KEY and send the header {ADMIN_HEADER} to use them)")
    return [*server_args, f"--http-restricted-api={RESTRICTED_APIS}:{ADMIN_HEADER}={key}",
            f"--grpc-restricted-protocol={RESTRICTED_APIS}:{ADMIN_HEADER}={key}"]


def option(args: list[str], name: str, default: str) -> str:
    """The value of option --name (`--name=value` or `--name value`), the last one given; else default."""
    value = default
    for i, a in enumerate(args):
        if a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
        elif a == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
    return value


def endpoints(args: list[str]) -> list[tuple[str, str, int]]:
    """(name, address, port) of each endpoint the server will listen on, from its arguments (Triton's
    defaults where they say nothing)."""
    out = []
    http_address = option(args, "http-address", "0.0.0.0")
    defaults = {"http": ("0.0.0.0", "8000"), "grpc": ("0.0.0.0", "8001"), "metrics": (http_address, "8002")}
    for name, (address, port) in defaults.items():
        if option(args, f"allow-{name}", "true").lower() in ("false", "0", "no", "off"):
            continue
        address = option(args, f"{name}-address", address)
        if address.startswith("ipv6:"):  # evhtp's spelling of an IPv6 address
            address = address[5:]
        try:
            out.append((name, address.strip("[]"), int(option(args, f"{name}-port", port))))
        except ValueError:
            continue  # the server reports a malformed port itself
    return out


def only_beacon_models(args: list[str]) -> bool:
    """True if every model in the server's repositories is one of this project's, each of whose
    processes writes a beacon with its busy count (liveness.WATCHED_MODELS)."""
    repos = [a.split("=", 1)[1] for a in args if a.startswith("--model-repository=")]
    repos += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model-repository"]
    try:
        models = {m for r in repos for m in os.listdir(r) if os.path.isdir(os.path.join(r, m))}
    except OSError:
        return False
    return bool(repos) and models <= set(liveness.WATCHED_MODELS)


def own_shm_prefix(args: list[str]) -> list[str]:
    """The server's command with a region prefix of the supervisor's own (OWN_PREFIX), unless it
    names one: its regions then tell themselves from every other server's on the machine, whatever
    container or pid namespace those run in, and all of them can go once it has stopped."""
    if any(a.startswith("--backend-config=python,shm-region-prefix-name=") for a in args):
        return list(args)
    return [*args, f"--backend-config=python,shm-region-prefix-name={SHM_PREFIX}vx{secrets.token_hex(4)}_"]


def shm_prefix(args: list[str]) -> str:
    """The python backend's region prefix: its backend config's shm-region-prefix-name, else the default."""
    for a in args:
        if a.startswith("--backend-config=python,shm-region-prefix-name="):
            return a.split("=", 2)[2]
    return SHM_PREFIX
