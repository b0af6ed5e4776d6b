"""Where the decoder's output goes: one sink per transport, picked per request by the decoder's
`_submit`.

- `latents_sink` (without decode_audio): the engine thread's; each chunk's LATENTS a response, then
  the final flag (with the error if the request failed).
- with decode_audio, the engine thread's `to_audio` hands chunks and the end to the audio thread,
  whose sink is `audio_sink`: each chunk's LATENTS and AUDIO a response, or, for a caller that
  offered an audio channel, `channel_sink`: the chunks and the end as frames on it.
"""

from __future__ import annotations

import logging

from ..engine import Finished
from .bls import audio_channel
from .triton_io import IPC_LOCK, locked, pb, tensor

log = logging.getLogger("voxcpm_triton.decoder")


class ClientGone(Exception):
    """Raised by a sink whose request's client has left: the engine drops the request."""


def end_error(end) -> str | None:
    """A request's end as the audio thread hands it over (its Finished, or the exception its audio
    failed with): the error it ends with, None if it ended well."""
    return end.error if isinstance(end, Finished) else f"decoding audio failed: {end}"


def channel_of(sender) -> "audio_channel.Writer | None":
    """The audio channel a call's sender writes its audio to, if its caller offered one."""
    return getattr(sender, "channel", None)


def to_audio(sender, audio, key):
    """The engine thread's sink with decode_audio: chunks and the end go to the audio thread.
    Whether the client left (an IPC round trip) is asked from the second chunk on: the first one
    goes to the audio thread at once, whose sink asks before it sends anything. A call with an
    audio channel is never asked: its caller, the orchestrator, never cancels the call itself
    but sends CANCEL_ID, and a caller gone breaks the channel (asked without a round trip)."""
    first, gone = True, False

    def deliver(event):
        nonlocal first, gone
        if isinstance(event, Finished):
            gone = gone or ((channel := channel_of(sender)) is not None and channel.broken)
            # Its chunks not decoded yet go undecoded when nobody wants them: it was cancelled
            # (CANCEL_ID; a cancel with an error is the shutdown's, whose clients still listen)
            # or its client was found gone here.
            wanted = not gone and not (event.reason == "cancelled" and event.error is None)
            audio.end(key, event, drop_pending=not wanted)
            return
        if (channel := channel_of(sender)) is not None:
            gone = channel.broken
            if gone:
                raise ClientGone(audio_channel.LOST)
        elif not first and (gone := locked(sender.is_cancelled)):
            raise ClientGone("request cancelled by its client")
        first = False
        audio.chunk(key, event.patches)

    return deliver


def audio_sink(sender):
    """The audio thread's: each chunk's LATENTS with its AUDIO, the final flag on the last one
    when the request ends well with it, else the final flag alone after (with the error if the
    request failed, or its audio could not be decoded)."""
    if channel_of(sender) is not None:
        return channel_sink(sender)
    p = pb()
    final = p.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    def finish(error: str | None):
        if error is not None:
            locked(sender.send, p.InferenceResponse(error=p.TritonError(error)), flags=final)
        else:
            locked(sender.send, flags=final)

    def deliver(patches, payload, end=None):
        if patches is None:
            finish(end_error(payload))
            return
        ends_well = end is not None and end_error(end) is None
        try:
            with IPC_LOCK:
                if not sender.is_cancelled():  # else the engine stops at its next chunk
                    response = p.InferenceResponse(output_tensors=[tensor("LATENTS", patches.numpy()),
                                                                   tensor("AUDIO", payload)])
                    sender.send(response, flags=final if ends_well else 0)
                    if ends_well:
                        return
        except Exception as e:
            if end is None:
                raise
            # Its end must still go, or the request stays open. (A final send that failed after the
            # stub closed the sender cannot be followed by another: finish raises, and it is logged.)
            log.exception("sending a request's last chunk failed")
            finish(f"sending the last audio chunk failed: {e}")
            return
        if end is not None:
            finish(end_error(end))

    return deliver


def channel_sink(sender):
    """The audio thread's, for a caller that offered an audio channel: each chunk's audio and the
    end go there (no round trip: the channel's thread writes them, then sends the final response)."""
    def deliver(patches, payload, end=None):
        if patches is not None:
            sender.chunk(len(patches), payload)
        else:
            end = payload
        if end is not None:
            sender.end(end_error(end))

    return deliver


def latents_sink(sender):
    """The engine thread's without decode_audio: each chunk's LATENTS a response (a client that left
    stops the request), then the final flag, with the error if the request failed."""
    p = pb()

    def deliver(event):
        if isinstance(event, Finished):
            if event.error is not None:
                locked(sender.send, p.InferenceResponse(error=p.TritonError(event.error)),
                       flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                locked(sender.send, flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        with IPC_LOCK:  # the engine thread: every stub call under the lock
            if sender.is_cancelled():
                raise ClientGone("request cancelled by its client")
            sender.send(p.InferenceResponse(output_tensors=[tensor("LATENTS", event.patches.numpy())]))

    return deliver
