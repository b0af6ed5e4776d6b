"""`loras`: add, remove and list the LoRA adapters the decoder serves, without a restart.

The adapters live in the decoder's LoRA directory (`lora_dir`, `VOXCPM_LORA_DIR`), one subfolder
per adapter; `add` NAME loads subfolder NAME (again, if it is loaded: requests running on the old
weights finish with them) into a free slot of the decoder's GPU tables, `remove` NAME takes it
away from new requests (its slot is freed once the requests on it end), `list` names the loaded
ones. This model only checks the request and forwards it to the decoder, which owns the tables.
"""

from __future__ import annotations

import numpy as np

from ..formats import lora as lora_format
from . import contract, runtime
from .orchestrator import InternalCalls
from .parameters import read
from .registry_model import RegistryModel
from .triton_io import InputError


class LorasModel(RegistryModel):
    def initialize(self, args):
        runtime.watch_parent()
        read(args, "loras")  # it takes no parameters: any in its config.pbtxt is an error naming it
        self.calls = InternalCalls()

    async def _act(self, action: str, inputs: dict) -> list[str]:
        name = contract.value(inputs.get("NAME"), "NAME", str)
        dec_in = {"LORA_ACTION": np.array([action.encode()], dtype=object)}
        if action == "list":
            if name is not None:
                raise InputError("ACTION list takes no NAME")
        else:
            if not name:
                raise InputError(f"ACTION {action} needs NAME (the adapter's subfolder in the LoRA directory)")
            try:
                lora_format.check_name(name)
            except lora_format.LoraError as e:
                raise InputError(f"NAME: {e}") from None
            dec_in["LORA"] = np.array([name.encode()], dtype=object)
        self.calls.health.check()
        (names,) = await self.calls.infer_decoupled("decoder", dec_in, ["LORAS"])
        return sorted(bytes(n).decode() for n in names.reshape(-1))
