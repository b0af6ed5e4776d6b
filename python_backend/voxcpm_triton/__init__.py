"""VoxCPM2 for Triton: the model, its offline API, and the serving engine.

`VoxCPM2` is imported lazily so light processes (the BLS orchestrators, the
tokenizer) can use this package without loading torch.
"""

__all__ = ["VoxCPM2"]


def __getattr__(name):
    if name == "VoxCPM2":
        from .voxcpm2 import VoxCPM2

        return VoxCPM2
    raise AttributeError(name)
