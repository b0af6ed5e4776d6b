"""Decoupled stand-in for the decoder: a sender thread owns all sends (as the decoder's audio
thread does) and streams each request's N responses round-robin, its final flag right after its
last one. Its senders count for callers that ask (serving/bls), as the decoder's do."""

import os
import queue
import sys
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "python_backend"))

from voxcpm_triton.coordination import runtime  # noqa: E402
from voxcpm_triton.serving.bls import callee  # noqa: E402

runtime.model_process()  # a crash, or SIGUSR2, leaves every thread's Python stack in the server's log

CHUNK = np.zeros(4800, np.float32)  # 19 KB: a 0.2 s audio chunk at 24 kHz


class TritonPythonModel:
    def initialize(self, args):
        self.inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._send_loop, daemon=True).start()

    def execute(self, requests):
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy().reshape(-1)[0])
            self.inbox.put([callee.counting_sender(r, r.get_response_sender(),
                                                       pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL), n])
        return None

    def _send_loop(self):
        live = []
        while True:
            if not live:
                live.append(self.inbox.get())
            while not self.inbox.empty():
                live.append(self.inbox.get_nowait())
            for item in list(live):
                sender, left = item
                if left > 0:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", CHUNK)]))
                    item[1] = left = left - 1
                if left == 0:  # the final flag right after the last chunk, as the decoder sends it
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    live.remove(item)
