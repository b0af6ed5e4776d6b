"""What the `voices` and `loras` models share: a request names an ACTION (add, remove or list),
and the response is NAMES, the registered names after it. Each model supplies its inputs and
`_act`, the action itself."""

from __future__ import annotations

import numpy as np

from .. import checks
from ..coordination import liveness
from . import contract
from .bls import caller
from .triton_io import InputError, error_response, get, pb, tensor


class RegistryModel:
    INPUT_NAMES: tuple = ("ACTION", "NAME")

    @liveness.counted
    async def execute(self, requests):
        return [await self._one(r) for r in requests]

    def finalize(self):
        self.beacon.stop()
        caller.close()  # its BLS calls: the decoder's LoRA actions

    async def _one(self, request):
        try:
            contract.check_parameters(request.parameters(), self.INPUT_NAMES)
            inputs = {n: np.array(a) for n in self.INPUT_NAMES if (a := get(request, n)) is not None}
            names = await self._act(self._action(inputs), inputs)
            return pb().InferenceResponse(output_tensors=[
                tensor("NAMES", np.array([n.encode() for n in names], dtype=object))])
        except Exception as e:
            return error_response(e)

    @staticmethod
    def _action(inputs: dict) -> str:
        action = contract.value(inputs.get("ACTION"), "ACTION", str)
        if action is None:  # Triton checks required inputs only when their count is short
            raise InputError(f"ACTION is required: one of {', '.join(contract.ACTIONS)}")
        if action not in contract.ACTIONS:
            raise InputError(f"ACTION must be one of {', '.join(contract.ACTIONS)}, got {checks.shown(action)}")
        return action

    async def _act(self, action: str, inputs: dict) -> list[str]:
        raise NotImplementedError
