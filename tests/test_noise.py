"""The request key behind each request's noise (model/noise.py): the engine computes it from one
Python int at submit, the offline API and the step from int64 tensors; both must agree."""

import torch

from voxcpm_triton.checks import SEED_RANGE
from voxcpm_triton.model.noise import request_key


def test_a_request_key_from_an_int_equals_its_int64_tensor_form():
    lo, hi = SEED_RANGE
    seeds = [lo, lo + 1, -(2**32) - 1, -(2**32), -(2**31), -1, 0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
             2**32 + 1, 0x3C6EF372, 123456789012345, hi - 1, hi]
    seeds += torch.randint(lo, hi, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    want = request_key(torch.tensor(seeds, dtype=torch.int64)).tolist()
    got = [request_key(s) for s in seeds]
    assert all(type(k) is int and 0 <= k < 2**32 for k in got)
    assert got == want
