"""Python client for VoxCPM2 TTS on Triton (gRPC streaming, HTTP, wav files)."""
from .client import (
    Result,
    ServerBusy,
    ServerUnavailable,
    SynthesisError,
    SynthesisTimeout,
    VoxCPMClientError,
    add_lora,
    add_voice,
    input_arrays,
    list_loras,
    list_voices,
    load_audio,
    make_inputs,
    remove_lora,
    remove_voice,
    synthesize,
    synthesize_stream,
)

__all__ = [
    "Result", "ServerBusy", "ServerUnavailable", "SynthesisError", "SynthesisTimeout", "VoxCPMClientError",
    "input_arrays", "load_audio", "make_inputs", "synthesize", "synthesize_stream",
    "add_voice", "list_voices", "remove_voice", "add_lora", "list_loras", "remove_lora",
]
