"""`loras`: add, remove and list the LoRA adapters the decoder serves, without a restart.

The adapters live in the decoder's LoRA directory (`lora_dir`, `VOXCPM_LORA_DIR`), one subfolder
per adapter; `add` NAME loads subfolder NAME (again, if it is loaded: requests running on the old
weights finish with them) into a free slot of the decoder's GPU tables, `remove` NAME takes it
away from new requests (its slot is freed once the requests on it end), `list` names the loaded
ones. This model only checks the request and forwards it to the decoder, which owns the tables.
"""

from __future__ import annotations

from ..formats import lora as lora_format
from ..coordination import liveness, runtime
from . import contract
from .internal_calls import InternalCalls
from .parameters import read
from .registry_model import RegistryModel
from .triton_io import InputError


class LorasModel(RegistryModel):
    def initialize(self, args):
        runtime.model_process()
        read(args, "loras")  # it takes no parameters: any in its config.pbtxt is an error naming it
        self.calls = InternalCalls()
        self.beacon = liveness.Beacon("loras")

    async def _act(self, action: str, inputs: dict) -> list[str]:
        name = contract.value(inputs.get("NAME"), "NAME", str)
        if action == "list":
            if name is not None:
                raise InputError("ACTION list takes no NAME")
        else:
            if name is None:  # (an empty one is no valid name: check_lora_name says so)
                what = "the adapter's subfolder in the LoRA directory" if action == "add" else "a loaded adapter's name"
                raise InputError(f"ACTION {action} needs NAME ({what})")
            try:
                lora_format.check_lora_name(name)
            except lora_format.LoraError as e:
                raise InputError(f"NAME: {e}") from None
        self.calls.health.check()
        return await self.calls.lora_action(action, name)
