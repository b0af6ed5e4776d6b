"""`tokenizer`: TEXT (+ PROMPT_TEXT) -> the token ids the decoder is fed, and the target text's token count.

With NORMALIZED, TEXT is `text_normalizer`'s output, tokenized as it is (the reference cleans the
text before normalising it, not after); PROMPT_TEXT is never normalised, as in the reference.
"""

from __future__ import annotations

import numpy as np

from ..checks import clean_text
from ..formats.tokenizer import TextTokenizer
from ..coordination import liveness, runtime
from .contract import text, value
from .parameters import read, resolve_checkpoint
from .triton_io import answer_each, get, tensor


class TokenizerModel:
    def initialize(self, args):
        runtime.model_process()
        self.tokenizer = TextTokenizer.from_dir(resolve_checkpoint(read(args, "tokenizer")["checkpoint"]))
        self.beacon = liveness.Beacon("tokenizer")

    def finalize(self):
        self.beacon.stop()

    @liveness.counted
    def execute(self, requests):
        return answer_each(requests, "tokenizer", self._answer)

    def _answer(self, request) -> list:
        if value(get(request, "NORMALIZED"), "NORMALIZED", bool):
            # checked before normalising, which writes numbers out: it may now pass the byte limit
            target_text = value(get(request, "TEXT"), "TEXT", str) or ""
        else:
            target_text = clean_text(text(get(request, "TEXT"), "TEXT", required=True))
        prompt_text = text(get(request, "PROMPT_TEXT"), "PROMPT_TEXT", required=False)
        target = self.tokenizer(target_text)
        ids = self.tokenizer(prompt_text + target_text) if prompt_text is not None else target
        return [tensor("TOKEN_IDS", np.asarray(ids, dtype=np.int64)),
                tensor("TARGET_TOKENS", np.asarray([len(target)], dtype=np.int32))]
