"""The supervisor's command line (scripts/supervise.py)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from . import loop, ports, server_args


def companion_grace() -> str:
    """The OpenAI gateway's drain after SIGTERM (its --shutdown-timeout, from the environment both
    share) plus 5 s; a value the gateway would refuse is left to it to say so."""
    try:
        drain = float(os.environ.get("VOXCPM_OPENAI_SHUTDOWN_TIMEOUT", "20"))
    except ValueError:
        return "25"
    return f"{drain + 5:g}" if drain > 0 else "25"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    i = argv.index("--") if "--" in argv else len(argv)
    # --print-restricted (serve.sh without supervision) takes none of the supervision's settings
    env = (lambda _var, default: default) if "--print-restricted" in argv[:i] else os.environ.get

    def number(kind, var: str):
        """argparse's type for an option whose default is environment variable `var`: its error names it."""
        def convert(text: str):
            try:
                return kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not {'a whole number' if kind is int else 'a number'}: {text!r} "
                                                 f"(given, or from {var})") from None
        return convert

    ap = argparse.ArgumentParser(usage="%(prog)s [options] -- tritonserver ARGS...",
                                 description="Run tritonserver and restart it when it breaks.")
    # string defaults: argparse converts them, so a bad value in the environment is a usage error too
    ap.add_argument("--probe-interval", type=number(float, "VOXCPM_PROBE_INTERVAL"), default=env("VOXCPM_PROBE_INTERVAL", "10"),
                    help="seconds between liveness probes once ready; 0: no probes, restart only on exit "
                         "or on a model process's beacon (env VOXCPM_PROBE_INTERVAL; default %(default)s)")
    ap.add_argument("--probe-timeout", type=number(float, "VOXCPM_PROBE_TIMEOUT"), default=env("VOXCPM_PROBE_TIMEOUT", "60"),
                    help="seconds a probe (a short synthesis) may take before it counts as failed "
                         "(env VOXCPM_PROBE_TIMEOUT; default %(default)s)")
    ap.add_argument("--probe-failures", type=number(int, "VOXCPM_PROBE_FAILURES"), default=env("VOXCPM_PROBE_FAILURES", "3"),
                    help="consecutive failed probes before a restart (a dead model process restarts at once; "
                         "env VOXCPM_PROBE_FAILURES; default %(default)s)")
    ap.add_argument("--start-timeout", type=number(float, "VOXCPM_START_TIMEOUT"), default=env("VOXCPM_START_TIMEOUT", "900"),
                    help="seconds a start may take to become ready, and ports held by another process may "
                         "keep it waiting (env VOXCPM_START_TIMEOUT; default %(default)s)")
    ap.add_argument("--max-failed-starts", type=number(int, "VOXCPM_MAX_FAILED_STARTS"), default=env("VOXCPM_MAX_FAILED_STARTS", "5"),
                    help="starts in a row that do not serve (never ready, or never pass a probe), or quick exits "
                         "in a row of a companion, before giving up (exit 1); 0: never give up "
                         "(env VOXCPM_MAX_FAILED_STARTS; default %(default)s)")
    ap.add_argument("--companion", action="append", default=[], metavar="CMD",
                    help="a command line (shell-quoted) to run beside the server and restart when it exits")
    ap.add_argument("--companion-port", action="append", default=[], metavar="HOST:PORT",
                    help="a port a companion listens on: no start while another process holds it")
    ap.add_argument("--companion-grace", type=number(float, "VOXCPM_COMPANION_GRACE"), default=env("VOXCPM_COMPANION_GRACE", companion_grace()),
                    help="seconds a stopping companion gets between SIGTERM and SIGKILL, for its requests in flight "
                         "(env VOXCPM_COMPANION_GRACE; default: the gateway's drain, VOXCPM_OPENAI_SHUTDOWN_TIMEOUT "
                         "(20 s), plus 5 s)")
    ap.add_argument("--port-hint", default="", metavar="TEXT",
                    help="said after a port another process holds: where other ports are set (scripts/serve.sh "
                         "names its variables)")
    ap.add_argument("--print-restricted", action="store_true",
                    help="only print the server command with the restricted-API flags, an argument a line "
                         "(scripts/serve.sh runs it so without supervision)")
    opts = ap.parse_args(argv[:i])  # --help stops here
    if i == len(argv):
        ap.error("no server command: give it after --")
    for flag, value, least in (("--probe-timeout", opts.probe_timeout, None),
                               ("--start-timeout", opts.start_timeout, None),
                               ("--companion-grace", opts.companion_grace, None),
                               ("--probe-interval", opts.probe_interval, 0.0)):
        if not math.isfinite(value) or not (value > 0 if least is None else value >= least):
            ap.error(f"{flag} must be a {'positive' if least is None else 'non-negative'} number of seconds, "
                     f"got {value:g} (or its VOXCPM_ variable)")
    for text in opts.companion_port:
        try:
            ports.host_port(text)
        except ValueError as e:
            ap.error(f"--companion-port: {e}")
    if opts.probe_failures < 1:
        ap.error(f"--probe-failures must be 1 or more, got {opts.probe_failures}")
    if opts.max_failed_starts < 0:
        ap.error(f"--max-failed-starts must be 0 or more, got {opts.max_failed_starts}")
    if not argv[i + 1:]:
        ap.error("no server command after --")
    server = argv[i + 1:]
    exit_timeout = server_args.option(server, "exit-timeout-secs", "30")
    if not (exit_timeout.isascii() and exit_timeout.isdigit() and int(exit_timeout) <= 2**31 - 1):
        # what the supervisor reads of the server's own arguments; tritonserver's is a 32-bit integer
        ap.error(f"tritonserver --exit-timeout-secs must be a whole number of seconds (0-2147483647), "
                 f"got {exit_timeout!r}")
    for name in ("http", "grpc", "metrics"):
        port = server_args.option(server, f"{name}-port", "0")
        if not port.isdigit() or int(port) > 65535:
            ap.error(f"tritonserver --{name}-port must be a port number (0-65535), got {port!r}")
    if opts.print_restricted:
        print("\n".join(server_args.restricted(argv[i + 1:])))
        return 0
    return loop.Supervisor(argv[i + 1:], opts).run()
