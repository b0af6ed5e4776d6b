"""EXPERIMENT, not used by the server: start reading weights into the GPU's L2 cache ahead of the
kernels that use them. Measured on an H100 (benchmarks/results.md, "Fifteenth session"): the
prefetch holds its program until the bytes are in (35 MB in ~10.5 us from 32 programs or more), so
on the decode stream it costs more than it saves; from a second stream, 1.04x on LocDiT's compiled
layers at 44 tokens and nothing at 22 (with every weight in L2 they are only 1.10-1.15x faster).

A few-token GEMM reads its weight once and is bound by DRAM latency more than by bandwidth: a
LocDiT GEMM of 5 MB runs at ~1 TB/s. Asking for the next kernels' weights early, while the current
ones run, lets DRAM stream at full rate and those kernels find their weights in L2.

`prefetch(tensors)` launches programs that each issue `cp.async.bulk.prefetch.L2` (sm_90) over
chunks of the tensors' bytes and exit: nothing waits for the data, nothing is written, and a
result never depends on it. Elsewhere (no triton, an older GPU, the CPU interpreter) it does
nothing.
"""

from __future__ import annotations

import torch

from voxcpm_triton.kernels._triton import HAVE_TRITON, interpreted, tl, triton

CHUNK = 4096  # bytes per prefetch instruction
MAX_TENSORS = 4


if HAVE_TRITON:

    @triton.jit
    def _prefetch_region(base, nbytes, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
        chunks = nbytes // CHUNK
        for c0 in range(tl.program_id(0) * BLOCK, chunks, tl.num_programs(0) * BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            ptrs = base + c.to(tl.int64) * CHUNK
            ptrs = tl.where(c < chunks, ptrs, base)  # past the end: the first chunk again
            tl.inline_asm_elementwise(
                f"cp.async.bulk.prefetch.L2.global [$1], {CHUNK}; mov.u32 $0, 0;", "=r,l", [ptrs],
                dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _prefetch_kernel(p0, n0, p1, n1, p2, n2, p3, n3, COUNT: tl.constexpr, BLOCK: tl.constexpr,
                         CHUNK: tl.constexpr):
        _prefetch_region(p0, n0, BLOCK, CHUNK)
        if COUNT > 1:
            _prefetch_region(p1, n1, BLOCK, CHUNK)
        if COUNT > 2:
            _prefetch_region(p2, n2, BLOCK, CHUNK)
        if COUNT > 3:
            _prefetch_region(p3, n3, BLOCK, CHUNK)

    _INTERPRETED = interpreted(_prefetch_kernel)
else:
    _INTERPRETED = False


def supported(device: torch.device) -> bool:
    return (HAVE_TRITON and not _INTERPRETED and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= (9, 0))


def prefetch(tensors, programs: int = 32) -> None:
    """Ask for up to four contiguous CUDA tensors' bytes (whole chunks of them) to be read into L2."""
    tensors = [t for t in tensors if t is not None]
    assert 1 <= len(tensors) <= MAX_TENSORS, len(tensors)
    if not supported(tensors[0].device):
        return
    args = []
    for t in tensors:
        assert t.is_contiguous() and t.device == tensors[0].device
        args += [t.view(torch.uint8).view(-1) if t.dtype != torch.uint8 else t.view(-1),
                 t.numel() * t.element_size()]
    while len(args) < 2 * MAX_TENSORS:
        args += [args[0], 0]
    _prefetch_kernel[(programs,)](*args, COUNT=len(tensors), BLOCK=128, CHUNK=CHUNK, num_warps=4)
