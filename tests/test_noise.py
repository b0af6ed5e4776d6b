"""The request key behind each request's noise (model/noise.py): the engine computes it from one
Python int at submit, the offline API and the step from int64 tensors; both must agree. On a GPU,
the noise compiled as the engine runs it equals the eager noise."""

import pytest
import torch

from voxcpm_triton.checks import SEED_RANGE
from voxcpm_triton.model.noise import gaussian_noise, request_key


def test_a_request_key_from_an_int_equals_its_int64_tensor_form():
    lo, hi = SEED_RANGE
    seeds = [lo, lo + 1, -(2**32) - 1, -(2**32), -(2**31), -1, 0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
             2**32 + 1, 0x3C6EF372, 123456789012345, hi - 1, hi]
    seeds += torch.randint(lo, hi, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    want = request_key(torch.tensor(seeds, dtype=torch.int64)).tolist()
    got = [request_key(s) for s in seeds]
    assert all(type(k) is int and 0 <= k < 2**32 for k in got)
    assert got == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled as served: on a GPU")
def test_compiled_noise_is_the_eager_noise_to_the_bit():
    """The engine compiles `gaussian_noise` with the model (`DecodeStepRunner.noise`): integer hashing and
    the same float64 functions, so a request's noise must not move by a bit, at any batch."""
    compiled = torch.compile(gaussian_noise, dynamic=True)
    g = torch.Generator().manual_seed(0)
    for batch in (2, 64, 256):
        key = request_key(torch.randint(-2**62, 2**62, (batch,), generator=g)).cuda()
        step = torch.randint(0, 20000, (batch,), generator=g).cuda()
        for dtype in (torch.bfloat16, torch.float32):
            assert torch.equal(compiled(key, step, (64, 4), dtype), gaussian_noise(key, step, (64, 4), dtype))
