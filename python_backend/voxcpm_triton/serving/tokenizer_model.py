"""`tokenizer`: TEXT (+ PROMPT_TEXT) -> the token ids the decoder is fed, and the target text's token count."""

from __future__ import annotations

import numpy as np

from ..checks import clean_text
from ..formats.tokenizer import TextTokenizer
from . import runtime
from .settings import model_parameters, resolve_checkpoint
from .triton_io import InputError, error_response, get, pb, require_internal, tensor


def _text(request, name):
    a = get(request, name)
    if a is None:
        return None
    try:
        return bytes(a.reshape(-1)[0]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{name} is not valid UTF-8: {e}") from None


class TokenizerModel:
    def initialize(self, args):
        runtime.watch_parent()
        self.tokenizer = TextTokenizer.from_dir(resolve_checkpoint(model_parameters(args)))
        self.beacon = runtime.Beacon("tokenizer")

    def finalize(self):
        self.beacon.stop()

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                require_internal(request, "tokenizer")
                text = clean_text(_text(request, "TEXT"))
                prompt_text = _text(request, "PROMPT_TEXT")
                target = self.tokenizer(text)
                ids = self.tokenizer(prompt_text + text) if prompt_text is not None else target
                responses.append(pb().InferenceResponse(output_tensors=[
                    tensor("TOKEN_IDS", np.asarray(ids, dtype=np.int64)),
                    tensor("TARGET_TOKENS", np.asarray([len(target)], dtype=np.int32)),
                ]))
            except Exception as e:
                responses.append(error_response(e))
        return responses
