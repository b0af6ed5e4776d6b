"""CUDA graph capture shared by the decode step, the prefill and the VAE decoder."""

from __future__ import annotations

import torch


def capture_graph(body, device, pool, warm_up: int = 1):
    """Run `body` `warm_up` times on a side stream (compiles, allocates), then capture it into a
    CUDA graph sharing memory pool `pool` -> the graph (its .pool() is the pool to pass on).
    Raises whatever the warm-up or the capture raised."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warm_up):
            body()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        body()
    return graph
