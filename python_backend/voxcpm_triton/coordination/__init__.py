"""What a server's processes coordinate through, beside Triton: its model processes inside it and
the supervisor outside it. Files in the run directory and facts read from /proc, standard library
only: a model process's start, stop and exit (`runtime`), the run directory, internal key and kept
LoRA set (`run_state`), liveness beacons and busy counts (`liveness`), facts read from /proc
(`processes`)."""
