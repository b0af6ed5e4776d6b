"""`voices`: add, remove and list stored voices (serving/voices.py holds the storage).

`add` checks the audio as `tts` checks REFERENCE_AUDIO and encodes it through `vae_encoder` with
the orchestrator's own call, in the roles `tts` would: the reference encoding always, the prompt
encoding (left-padded) too when a transcript comes with it. So a request with VOICE hands the
decoder exactly the latents that the same audio sent inline gives.

`add` may record a default LoRA adapter (LORA): requests naming the voice without a LORA of their
own use it. It must be loaded in the decoder when the voice is added; if it is removed later, those
requests get an error naming the voice and the adapter from the orchestrator, as an unknown LORA does.
"""

from __future__ import annotations

import logging

from .. import checks
from ..coordination import liveness, runtime
from . import contract
from .internal_calls import InternalCalls
from .parameters import read, resolve_checkpoint
from .registry_model import RegistryModel
from .triton_io import InputError
from .voices import VoiceStore, check_voice_name

log = logging.getLogger("voxcpm_triton.voices")


class VoicesModel(RegistryModel):
    INPUT_NAMES = ("ACTION", "NAME", "AUDIO", "SAMPLE_RATE", "TEXT", "LORA")

    def initialize(self, args):
        runtime.model_process()
        params = read(args, "voices")
        self.checkpoint = resolve_checkpoint(params["checkpoint"])
        self.store = VoiceStore(params["voices_dir"])
        self.max_voices = params["max_voices"]
        try:
            self.store.ensure()
        except OSError as e:  # the rest of the server still serves; `add` reports it again
            log.warning("voices directory %s cannot be made: %s", self.store.root, e)
        self.calls = InternalCalls()
        self.beacon = liveness.Beacon("voices")

    async def _act(self, action: str, inputs: dict) -> list[str]:
        given = sorted(set(inputs) - {"ACTION"})
        if action == "list":
            if given:
                raise InputError(f"ACTION list takes no other input, got {given}")
            return self.store.names()
        name = check_voice_name(contract.text(inputs.get("NAME"), "NAME", required=True))
        if action == "remove":
            if given != ["NAME"]:
                raise InputError(f"ACTION remove takes only NAME, got {given}")
            return self.store.remove(name)
        # The checks (limits, messages) REFERENCE_AUDIO gets, under this model's input names.
        audio, rate = contract.waveform(inputs, "AUDIO", "SAMPLE_RATE")
        if audio is None:
            raise InputError("ACTION add needs AUDIO and SAMPLE_RATE")
        transcript = contract.text(inputs.get("TEXT"), "TEXT", required=False)
        if transcript is not None and checks.blank(transcript):
            raise InputError("TEXT (the transcript) is empty; leave it out for a reference-only voice")
        lora = contract.lora_name(inputs) or None  # empty: no default adapter
        self.calls.health.check()
        self.store.check_room(name, self.max_voices)  # before the encoding: a full store stays full
        if lora is not None:
            await self._check_loaded(lora)
        reference = await self.calls.encode(audio, rate, False, "AUDIO")
        prompt = None if transcript is None else await self.calls.encode(audio, rate, True, "AUDIO")
        return self.store.add(name, reference, prompt, transcript, rate, info={"checkpoint": self.checkpoint},
                              max_voices=self.max_voices, lora=lora)

    async def _check_loaded(self, lora: str):
        """A voice may only name an adapter the decoder serves now (a typo is caught at `add`, not at
        every request with the voice)."""
        loaded = await self.calls.lora_action("list")
        if lora not in loaded:
            raise InputError(f"LORA: unknown LoRA adapter {lora!r} (loaded: {', '.join(loaded) or 'none'}); "
                             "a voice's adapter must be loaded when the voice is added (model loras)")
