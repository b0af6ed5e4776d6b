"""The decoder engine: paged KV cache, continuous batching, per-request state."""

from .engine import Engine, EngineConfig, EngineShutdown
from .request import EngineRequest, Finished, LatentChunk, RequestHandle

__all__ = ["Engine", "EngineConfig", "EngineShutdown", "EngineRequest", "Finished", "LatentChunk", "RequestHandle"]
