"""VoxCPM2 for Triton: the model, its offline API, and the serving engine."""

from .voxcpm2 import VoxCPM2

__all__ = ["VoxCPM2"]
