"""What goes into the engine, what comes out, and the one object that holds a request's state."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..checks import DEFAULT_CFG_VALUE, DEFAULT_MIN_LENGTH, DEFAULT_TIMESTEPS, draw_seed
from ..model.prompt import Prompt
from .block_manager import chain_hashes


class RequestError(ValueError):
    """A request the engine cannot take as it is (its lengths, settings, adapter, or an id already in
    flight): the caller's to change, unlike a ValueError from inside the engine."""


@dataclass
class EngineRequest:
    request_id: str
    prompt: Prompt
    min_len: int = DEFAULT_MIN_LENGTH
    max_len: int | None = None  # None: the reference's default for this text
    cfg_value: float = DEFAULT_CFG_VALUE
    inference_timesteps: int = DEFAULT_TIMESTEPS
    seed: int | None = None  # None: a random one
    lora: str | None = None  # a LoRA adapter's name; None or "": the base model
    playback: bool = True  # a client plays the chunks as they come (the playback margin applies)


@dataclass
class LatentChunk:
    request_id: str
    patches: torch.Tensor  # [n, P, D] float32, CPU
    first_step: int  # step index of patches[0]


@dataclass
class Finished:
    request_id: str
    reason: str  # "stop" | "max_len" | "cancelled" | "error"
    steps: int
    error: str | None = None


Event = LatentChunk | Finished


class RequestHandle:
    """The caller's side: events arrive on a queue (unless a custom sink was given)."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.queue: queue.Queue = queue.Queue()

    def events(self, timeout: float | None = None):
        while True:
            ev = self.queue.get(timeout=timeout)
            yield ev
            if isinstance(ev, Finished):
                return

    def result(self, timeout: float | None = None) -> tuple[torch.Tensor, Finished]:
        """All patches [steps, P, D] and the final event."""
        chunks = []
        for ev in self.events(timeout):
            if isinstance(ev, LatentChunk):
                chunks.append(ev.patches)
        return (torch.cat(chunks) if chunks else torch.zeros(0)), ev


@dataclass
class RequestState:
    """Everything the engine knows about one request, keyed by its id. A step's batch is built from these."""

    req: EngineRequest
    sink: Callable[[Event], None]
    max_len: int
    seed_key: int  # 32-bit key derived from the seed (noise = f(key, step))
    blocks_reserved: int  # worst-case blocks promised at admission
    block_hashes: list = field(default_factory=list)  # of the prompt's cacheable blocks (`prompt_block_hashes`)
    block_table: list[int] = field(default_factory=list)
    cached_blocks: int = 0  # leading entries of block_table taken from the prefix cache (read only)
    slot: int | None = None  # row of the step runner's state buffers (LM hidden states, previous patch)
    lora_slot: int = 0  # its adapter's slot in the LoRA tables, held until it ends (0: the base model)
    prompt_len: int = 0
    step: int = 0  # patches delivered so far
    launched: int = 0  # steps launched; one may be in flight, ahead of `step`
    pending: list = field(default_factory=list)  # patches not yet sent
    pending_from: int = 0  # step index of pending[0]
    chunks_sent: int = 0
    patches_sent: int = 0
    first_sent_at: float | None = None  # monotonic time its first chunk went out

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def position(self) -> int:
        """KV position of the next launched step's new token."""
        return self.prompt_len + self.launched


def resolve_seed(seed) -> int:
    return int(seed) if seed is not None else draw_seed()


def prompt_block_hashes(prompt: Prompt, block_size: int, salt: bytes = b"") -> list[bytes]:
    """Chained hashes of the prompt blocks another request may reuse: the full blocks before the
    one holding the last prompt position (a prefill must compute that position, and decoding
    writes after it). Each covers what sets its positions' K/V in both LMs: token ids, text and
    audio masks, latent bytes, and (through the chain) every position before. salt: anything
    else that changes them (an adapter's name)."""
    n = (len(prompt) - 1) // block_size
    if n <= 0:
        return []
    m = n * block_size
    arrays = [t[:m].cpu().contiguous().numpy() for t in (prompt.tokens.to(torch.int64), prompt.text_mask.float(),
                                                   prompt.audio_mask.float(), prompt.feats.float())]
    return chain_hashes(([a[i * block_size:(i + 1) * block_size].tobytes() for a in arrays] for i in range(n)), salt)
