"""What the project's parts copy from one another because they do not import each other (the
client and the gateway never load the server's package; the liveness probe is standard library only): the
models' inputs and the messages that mean "not now". Each copy is checked against the server's
own definition, so that a change on one side fails here instead of in a client."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from tests.server import REPO

sys.path.insert(0, str(REPO / "client"))
sys.path.insert(0, str(REPO / "gateway"))

DTYPES = {"TYPE_STRING": np.object_, "TYPE_FP32": np.float32, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
          "TYPE_BOOL": np.bool_}


def model_inputs(model: str) -> dict[str, type]:
    """A model's inputs as its config.pbtxt declares them: name -> numpy dtype."""
    text = (REPO / "model_repository" / model / "config.pbtxt").read_text()
    block = re.search(r"^input \[(.*?)^\]", text, re.S | re.M)
    assert block, f"{model}: no input block"
    return {name: DTYPES[kind] for name, kind in re.findall(r'name: "(\w+)" data_type: (\w+)', block.group(1))}


def test_the_contract_is_what_tts_declares_and_tts_stream_is_it_without_retry_badcase():
    from voxcpm_triton.serving import contract

    tts, stream = model_inputs("tts"), model_inputs("tts_stream")
    assert set(contract.INPUT_NAMES) == set(tts)
    assert set(stream) == set(tts) - {"RETRY_BADCASE"}
    assert all(stream[n] == tts[n] for n in stream)


def test_the_client_sends_each_input_as_its_model_declares_it():
    from voxcpm_client import client

    tts = model_inputs("tts")
    sent = {"TEXT": np.object_, **dict(client.SCALAR_INPUTS.values()),
            **{name: np.float32 for name in client.AUDIO_INPUTS.values()}}
    assert sent == tts


def test_the_gateway_sends_each_input_as_tts_stream_declares_it():
    from voxcpm_gateway import speech_request

    stream = model_inputs("tts_stream")
    for name, (inp, dtype) in speech_request.EXTENSIONS.items():
        assert stream.get(inp) == dtype, f"{name}: {inp} is {stream.get(inp)} in tts_stream, sent as {dtype}"


def _not_now_messages() -> dict[str, str]:
    """The server's own "not now" messages, as they reach a client: kind -> message."""
    from voxcpm_triton.engine.block_manager import BlockManager
    from voxcpm_triton.engine.scheduler import EngineBusy, Scheduler
    from voxcpm_triton.serving.triton_io import SHUTTING_DOWN, Unhealthy

    scheduler = Scheduler(BlockManager(8, 4), 4, 1, (1,), lambda t: t, max_waiting=0)
    with pytest.raises(EngineBusy) as full:
        scheduler.check_room()
    return {"busy": str(full.value), "unhealthy": str(Unhealthy("the decoder's process died")),
            "shutting_down": SHUTTING_DOWN}


def test_the_client_gateway_and_probe_read_not_now_as_such():
    from voxcpm_client import client
    from voxcpm_gateway import errors
    from voxcpm_triton.serving.triton_io import Unhealthy
    from voxcpm_triton.supervisor import probe

    assert probe.UNHEALTHY_PREFIX == Unhealthy.PREFIX
    want_status = {"busy": 429, "unhealthy": 503, "shutting_down": 503}
    for kind, message in _not_now_messages().items():
        assert isinstance(client._answered(message), client.ServerBusy), (kind, message)
        assert errors.from_triton(message, {}).status == want_status[kind], (kind, message)
        if kind != "unhealthy":
            assert any(m in message for m in probe.BUSY_MARKERS), (kind, message)



def test_the_gateway_finds_nothing_to_speak_where_the_server_does():
    from voxcpm_gateway import speech_request
    from voxcpm_triton import checks

    for text, want in (("", True), (" \t\n", True), ("\u200b\ufeff\u200d", True), ("\ufe0f\u20e3", True),
                       ("e\u0301", False), ("a", False), ("\u200bhi", False), ("😀", False)):
        assert checks.blank(text) is want and speech_request.blank(text) is want, repr(text)
    with pytest.raises(Exception, match="input is empty"):  # instructions alone are not spoken
        speech_request.SpeechRequest(model="voxcpm2", input="\u200b", voice="default", instructions="calm").text()
