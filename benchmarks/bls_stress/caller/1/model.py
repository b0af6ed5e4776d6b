"""Decoupled, async stand-in for `tts_stream`: each request keeps CONCURRENCY decoupled BLS
calls to `streamer` in flight for DURATION_S and answers with how many finished. MODE
"counted" reads them as the orchestrator does (voxcpm_triton.serving.bls); "waiting"
the way it did before, a thread per call waiting in the response iterator."""

import asyncio
import os
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "python_backend"))

from voxcpm_triton.coordination import runtime  # noqa: E402
from voxcpm_triton.serving.bls import caller  # noqa: E402

END = caller.ResponseStream.END
runtime.model_process()  # a crash, or SIGUSR2, leaves every thread's Python stack in the server's log


def _waiting_reader(iterator, queue: asyncio.Queue):
    loop = asyncio.get_running_loop()
    put = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)  # noqa: E731

    def pump():
        try:
            for response in iterator:
                put(response)
        finally:
            put(END)

    threading.Thread(target=pump, daemon=True).start()


class TritonPythonModel:
    async def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            get = lambda name: pb_utils.get_input_tensor_by_name(r, name).as_numpy().reshape(-1)[0]  # noqa: E731
            try:
                calls, waiting = await self._run(float(get("DURATION_S")), int(get("CONCURRENCY")),
                                                 int(get("RESPONSES")), bytes(get("MODE")).decode())
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("CALLS", np.array([calls], np.int64)),
                                                        pb_utils.Tensor("WAITING", np.array([waiting], np.int64))]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as e:  # noqa: BLE001
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(repr(e))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def finalize(self):
        caller.close()

    async def _run(self, duration: float, concurrency: int, responses: int, mode: str) -> tuple[int, int]:
        """-> (calls finished, calls of them read by a thread waiting in the iterator)."""
        if mode not in ("counted", "waiting"):
            raise ValueError(f"MODE must be 'counted' or 'waiting', got {mode!r}")
        end = time.monotonic() + duration
        done = waiting = 0

        def request(params: dict):
            return pb_utils.InferenceRequest(model_name="streamer", requested_output_names=["OUT"], parameters=params,
                                             inputs=[pb_utils.Tensor("N", np.array([responses], np.int32))])

        async def worker():
            nonlocal done, waiting
            while time.monotonic() < end:
                if mode == "counted":
                    stream = caller.call(lambda params: request(params).async_exec(decoupled=True))
                    queue = stream.queue
                else:
                    queue, stream = asyncio.Queue(), None
                    _waiting_reader(await request({}).async_exec(decoupled=True), queue)
                got = 0
                while (resp := await queue.get()) is not END:
                    if isinstance(resp, BaseException):
                        raise resp
                    if resp.has_error():
                        raise RuntimeError(resp.error().message())
                    got += bool(resp.output_tensors())
                if got != responses:
                    raise RuntimeError(f"{got} responses of {responses}")
                done += 1
                waiting += stream is None or stream.waited

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done, waiting
