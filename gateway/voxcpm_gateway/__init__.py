"""VoxCPM2's OpenAI speech API: an ASGI gateway in front of Triton (gRPC streaming to
`tts_stream`, the `voices` registry). No model code and no torch here."""

__version__ = "0.1.0"
