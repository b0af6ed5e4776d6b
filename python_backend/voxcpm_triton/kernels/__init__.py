"""GPU kernels in Triton. Leaf modules: they import torch, triton and `_triton` only."""
