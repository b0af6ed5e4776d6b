"""`tokenizer`: TEXT (+ PROMPT_TEXT) -> the token ids the decoder is fed, and the target text's token count.

With NORMALIZE, TEXT is normalised first (`formats.text_normalize`, built on the first such
request); PROMPT_TEXT never is, as in the reference.
"""

from __future__ import annotations

import numpy as np

from ..checks import clean_text
from ..formats.text_normalize import NormalizationError, normalize_target
from ..formats.tokenizer import TextTokenizer
from . import runtime
from .contract import text, value
from .parameters import read, resolve_checkpoint
from .triton_io import InputError, get, internal_error_response, pb, require_internal, tensor


class TokenizerModel:
    def initialize(self, args):
        runtime.model_process()
        self.tokenizer = TextTokenizer.from_dir(resolve_checkpoint(read(args, "tokenizer")["checkpoint"]))
        self.beacon = runtime.Beacon("tokenizer")

    def finalize(self):
        self.beacon.stop()

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                require_internal(request, "tokenizer")
                target_text = clean_text(text(get(request, "TEXT"), "TEXT", required=True))
                if value(get(request, "NORMALIZE"), "NORMALIZE", bool):
                    target_text = _normalized(target_text)
                prompt_text = text(get(request, "PROMPT_TEXT"), "PROMPT_TEXT", required=False)
                target = self.tokenizer(target_text)
                ids = self.tokenizer(prompt_text + target_text) if prompt_text is not None else target
                responses.append(pb().InferenceResponse(output_tensors=[
                    tensor("TOKEN_IDS", np.asarray(ids, dtype=np.int64)),
                    tensor("TARGET_TOKENS", np.asarray([len(target)], dtype=np.int32)),
                ]))
            except Exception as e:
                responses.append(internal_error_response(e))  # an InputError stays one past the BLS hop
        return responses


def _normalized(target_text: str) -> str:
    try:
        return normalize_target(target_text)
    except NormalizationError as e:
        raise InputError(f"NORMALIZE: {e}; send this TEXT with NORMALIZE off") from None
