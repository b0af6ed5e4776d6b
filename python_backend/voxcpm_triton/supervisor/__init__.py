"""The supervisor: run tritonserver and keep it serving. Restart it when it exits, when a model
process's beacon says it died, stopped answering or cannot serve (checked every half second once it
is ready, probes or not), or when the liveness probe (`probe`, a real tiny synthesis) says it is
broken.

Triton 2.51's Python backend does not restart a model process that died, and its health
endpoints keep answering 200 afterwards; recovery has to come from outside. This is that
outside, for scripts/serve.sh and for the container. Standard library only (and the project's
voxcpm_triton.coordination, which is too): no torch.

    python3 scripts/supervise.py [options] -- tritonserver --model-repository=... [args]

Each start gets a fresh VOXCPM_RUN_DIR (the models' shared directory, removed after the
server stops) and, unless already set, a fresh VOXCPM_INTERNAL_KEY. VOXCPM_STATE_DIR, the
directory those are made in, lives as long as the supervisor: what the models keep there
(the LoRA adapters loaded at run time) carries over a restart. Triton's shared-memory,
model-repository, logging and trace APIs are restricted to clients that send the header
`voxcpm-admin-key: $VOXCPM_ADMIN_KEY` (over gRPC, Triton prefixes it:
`triton-grpc-protocol-voxcpm-admin-key`); unset, the key is random, so nobody can use them.
Arguments that already restrict something are left as they are.

SIGTERM / SIGINT stop the server (SIGTERM, then SIGKILL to its whole process group 10 s after
its exit timeout) and exit; nothing the server started outlives it. First it writes the time
by which running requests must end, half the exit timeout away, to `stopping` in the run
directory: the orchestrators refuse new requests from then on, and the decoder ends those still
running at that time with an error (Triton 2.51 tells a model nothing before its finalize, which
waits for them); the other half is for the models to unload.

A server killed (SIGKILL after its grace period) leaves its model processes' shared-memory
regions in /dev/shm, since a killed process removes nothing: each restart after a crash would
leave more, until the server could not start. So the supervisor notes the regions named on the
model processes' command lines while the server runs and removes those left once its whole
process group is gone. It keeps their names in the state directory too, which it and every process
of its server hold (a lock): a supervisor starting up removes the state directories nobody holds
any more, those of killed supervisors, with the regions their servers left if killed too.

A start that does not serve (never ready: a bad checkpoint; or broken before it passed a probe) is
retried with a growing pause; after `--max-failed-starts` of them in a row, or as many exits in a row
of a companion within a minute of its start (a setting it refuses), the supervisor stops everything
and exits 1, so that a container's restart policy or a person sees it. It starts a server only when
the server's ports are free, so it never takes another server's answers for its own; one held by
another process (a server still draining) is waited for up to `--start-timeout`.

`--companion CMD` (repeatable; CMD one shell-quoted command line) runs a process beside the
server, such as the OpenAI API gateway (scripts/serve.sh): started with it, restarted when it
exits (backing off while it keeps failing), left running while the server restarts, and stopped
with it. Each of its starts gets a TMPDIR of its own in the state directory, removed once that
start's processes are gone, however it ended.

Where each part lives: `cli` (the command line), `loop` (the policy: when to start, restart or
give up), `tritonserver` (the mechanism: one server's start, stop and health), `companion` (a
process beside the server), `guard` (what a killed supervisor's server leaves), `probe` (the
liveness probe), `server_args` (what tritonserver's command line says), `ports` (free ports and
claims on them), `groups` (process groups, children), `leftovers` (shared-memory regions, state
directories), `log`.
"""
