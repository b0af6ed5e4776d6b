"""GPU kernels in Triton. They import torch, triton and each other only (the persistent layer
kernel calls the attention kernels and the FP8 linear), never the model or the engine."""
