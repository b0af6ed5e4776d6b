"""The decoder engine: paged KV cache, continuous batching, per-request state.

Its names are imported lazily, so that the torch-free parts (`scheduler`, `block_manager`) load
without torch.
"""

import importlib

_HOMES = {"Engine": "engine", "EngineConfig": "engine", "EngineShutdown": "engine", "EngineBusy": "scheduler",
          "EngineRequest": "request", "RequestError": "request", "Finished": "request", "LatentChunk": "request",
          "RequestHandle": "request", "LoraFull": "lora_registry"}

__all__ = list(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
