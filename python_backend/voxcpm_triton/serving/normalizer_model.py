"""`text_normalizer`: TEXT -> the text to speak with numbers, dates, units... written out
(`formats.text_normalize`), for requests with NORMALIZE.

A model of its own, not a step of `tokenizer`: normalising 4 KB of digits and symbols takes
seconds, and every request is tokenized, so a few NORMALIZE requests in the tokenizer's
instances would hold up everyone's first audio. Here they wait only for each other, and Triton's
queue bound (`max_queue_size` in its config.pbtxt) refuses one more at once.
"""

from __future__ import annotations

import logging

import numpy as np

from ..checks import clean_text
from ..formats.text_normalize import NormalizationError, normalize_target, normalizer
from ..coordination import liveness, runtime
from .contract import text
from .parameters import read
from .triton_io import InputError, answer_each, get, tensor

log = logging.getLogger("voxcpm_triton.text_normalizer")


class TextNormalizerModel:
    def initialize(self, args):
        runtime.model_process()
        read(args, "text_normalizer")  # it takes no parameters: any in its config.pbtxt is an error naming it
        try:
            normalizer()  # wetext's grammars loaded now, not in the first request's time
            self.unavailable = None
        except Exception as e:  # its packages missing or broken: the server serves, without NORMALIZE
            log.warning("text normalisation is not available (%s): requests with NORMALIZE will be refused", e)
            self.unavailable = str(e)
        self.beacon = liveness.Beacon("text_normalizer")

    def finalize(self):
        self.beacon.stop()

    @liveness.counted
    def execute(self, requests):
        return answer_each(requests, "text_normalizer", self._answer)

    def _answer(self, request) -> list:
        if self.unavailable is not None:
            raise InputError(f"NORMALIZE is not available on this server ({self.unavailable}); send this TEXT "
                             "with NORMALIZE off")
        target = clean_text(text(get(request, "TEXT"), "TEXT", required=True))
        try:
            out = normalize_target(target)
        except NormalizationError as e:
            raise InputError(f"NORMALIZE: {e}; send this TEXT with NORMALIZE off") from None
        # [1, 1]: a batch of one (the queue bound needs Triton's batching dimension)
        return [tensor("NORMALIZED_TEXT", np.array([[out.encode()]], dtype=object))]
