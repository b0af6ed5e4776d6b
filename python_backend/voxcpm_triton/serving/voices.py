"""Stored voices: latents encoded once by `vae_encoder`, kept on disk under a name.

Layout of the voices directory (`VOXCPM_VOICES_DIR`, default `$XDG_DATA_HOME/voxcpm/voices`,
i.e. `~/.local/share/voxcpm/voices`: user data that survives restarts and checkouts):

    .lock                           fcntl lock taken around every change
    .store/<name>.<hex>/            one version of a voice, written whole before it is visible
        latents.safetensors         "reference" [n, P, D] float32; "prompt" too with a transcript
        voice.json                  name, transcript, sample rate, created, latent shape, lora
    <name> -> .store/<name>.<hex>   the visible voice: a symlink, swapped with one rename

A version is written and fsynced under a name no reader looks at; the symlink is then replaced
with os.replace, so a reader sees the old voice or the new one, never half of either. Names
cannot start with '.', so nothing of the store is ever listed as a voice. No torch here: the
light orchestrator processes import this.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import json
import os
import secrets
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from .. import checks
from .triton_io import Busy, InputError

MODES = ("reference", "continuation", "both")
STORE, LOCK = ".store", ".lock"
CACHE_VOICES = 64  # latents kept in memory per process (a 60 s voice is ~0.5 MB)
READ_TIMEOUT_S = 10.0  # a voice read off the event loop (`load_async`) past it is an error
READERS = 4  # such reads at once per process: one stuck on its disk holds its thread, not more


def default_dir() -> str:
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "voxcpm", "voices")


def check_voice_name(name: str | None, input_name: str = "NAME") -> str:
    if name is None:
        raise InputError(f"{input_name} is required")
    if not checks.NAME_RE.fullmatch(name):
        raise InputError(f"{input_name} {checks.shown(name)} is not a valid voice name: {checks.NAME_RULE}")
    return name


@dataclass(frozen=True)
class Voice:
    name: str
    reference: np.ndarray  # [n, P, D] float32: the REFERENCE_AUDIO encoding
    prompt: np.ndarray | None  # the PROMPT_AUDIO encoding; None without a transcript
    transcript: str | None
    sample_rate: int
    lora: str | None = None  # the LoRA adapter a request with this voice and no LORA of its own uses


def _fsync_dir(path: str):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, data: bytes):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class VoiceStore:
    def __init__(self, root: str | None):
        self.root = os.path.realpath(os.path.expanduser(root or default_dir()))  # real: links resolve into it
        self.store = os.path.join(self.root, STORE)
        self._cache: collections.OrderedDict = collections.OrderedDict()  # name -> (stamp, Voice)
        self._cache_lock = threading.Lock()
        self._readers = threading.BoundedSemaphore(READERS)

    def ensure(self):
        """Made on the first add, not at load: a server whose voices dir cannot be written still
        serves everything else (and says why at `add`)."""
        try:
            for d in (self.root, self.store):
                os.makedirs(d, mode=0o700, exist_ok=True)  # voices are user data: private
        except OSError as e:
            raise OSError(f"the voices directory {self.root} cannot be made (VOXCPM_VOICES_DIR): {e}") from None

    @contextmanager
    def _locked(self):
        """Exclusive across processes (every model instance is one) and across threads."""
        with open(os.path.join(self.root, LOCK), "a+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def names(self) -> list[str]:
        """The stored voices: links whose version is there (one removed by hand is not listed)."""
        if not os.path.isdir(self.root):
            return []
        return sorted(n for n in os.listdir(self.root)
                      if checks.NAME_RE.fullmatch(n) and (t := self._target(n)) and os.path.isdir(t))

    def check_room(self, name: str, max_voices: int | None):
        """Busy when adding `name` would store more than `max_voices` voices (a replacement never
        does). `add` checks again under the store's lock; a caller may ask first, before the work."""
        if max_voices is not None and self._target(name) is None and (stored := len(self.names())) >= max_voices:
            raise Busy(f"{stored} voices are stored already, the most allowed is {max_voices} (parameter "
                       "max_voices of model 'voices'); remove one first")

    def add(self, name: str, reference: np.ndarray, prompt: np.ndarray | None, transcript: str | None,
            sample_rate: int, info: dict | None = None, max_voices: int | None = None,
            lora: str | None = None) -> list[str]:
        """Store (or replace) voice `name`, with `lora` its default adapter (None: the base model);
        returns the names afterwards. A new name past `max_voices` stored voices is refused (clients
        can reach `add`: the disk they may fill is bounded)."""
        check_voice_name(name)
        self.ensure()
        version = f"{name}.{secrets.token_hex(8)}"
        tmp = os.path.join(self.store, f".tmp-{version}")  # never a version a link points at
        os.mkdir(tmp, 0o700)
        try:
            tensors = {"reference": np.ascontiguousarray(reference, np.float32)}
            if prompt is not None:
                tensors["prompt"] = np.ascontiguousarray(prompt, np.float32)
            _write(os.path.join(tmp, "latents.safetensors"), st_save(tensors))
            meta = {"name": name, "transcript": transcript, "sample_rate": int(sample_rate),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "latent_shape": list(tensors["reference"].shape[1:]), "lora": lora or None, **(info or {})}
            _write(os.path.join(tmp, "voice.json"), json.dumps(meta, ensure_ascii=False, indent=1).encode())
            _fsync_dir(tmp)
            with self._locked():
                self.check_room(name, max_voices)
                os.rename(tmp, os.path.join(self.store, version))
                link = os.path.join(self.root, f".link-{version}")
                os.symlink(os.path.join(STORE, version), link)
                old = self._target(name)
                os.replace(link, os.path.join(self.root, name))  # the swap: atomic
                _fsync_dir(self.store)
                _fsync_dir(self.root)
                if old:
                    shutil.rmtree(old, ignore_errors=True)
                self._sweep()
                return self.names()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def remove(self, name: str) -> list[str]:
        check_voice_name(name)
        if not os.path.isdir(self.root) or self._target(name) is None:  # before the lock, which needs a writable dir
            raise InputError(f"unknown voice {name!r}")
        with self._locked():
            target = self._target(name)
            if target is None:
                raise InputError(f"unknown voice {name!r}")
            os.unlink(os.path.join(self.root, name))
            _fsync_dir(self.root)
            shutil.rmtree(target, ignore_errors=True)
            return self.names()

    def _target(self, name: str) -> str | None:
        """The version directory voice `name` links to, or None. Only a link as `add` makes them
        (`.store/<version>`) is a voice: a stray one is neither listed, read nor deleted through."""
        try:
            head, version = os.path.split(os.readlink(os.path.join(self.root, name)))
        except OSError:
            return None
        return os.path.join(self.store, version) if head == STORE and version and version[0] != "." else None

    def _sweep(self):
        """Under the lock: drop what a writer that died left behind (versions no link names, temp
        links and directories of another process are left to it unless an hour old)."""
        live = {self._target(n) for n in self.names()}
        now = time.time()
        for d, entries in ((self.store, os.listdir(self.store)), (self.root, os.listdir(self.root))):
            for e in entries:
                path = os.path.join(d, e)
                try:
                    stale = e.startswith((".tmp-", ".link-")) and now - os.lstat(path).st_mtime > 3600
                except FileNotFoundError:  # another process's temp, removed outside the lock meanwhile
                    continue
                dangling = d == self.root and (t := self._target(e)) is not None and not os.path.isdir(t)
                if (d == self.store and not e.startswith(".") and path not in live) or stale or dangling:
                    if os.path.islink(path) or os.path.isfile(path):
                        os.unlink(path)
                    else:
                        shutil.rmtree(path, ignore_errors=True)

    async def load_async(self, name: str, timeout: float = READ_TIMEOUT_S) -> Voice:
        """`load` in a thread of its own, so that a read stuck on its disk (a hung network mount)
        holds that thread and fails its request after `timeout`, not the event loop and every stream
        on it. The threads are daemons: a stuck one cannot hold up the process's exit."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def settle(result, error):
            if not done.done():
                done.set_exception(error) if error is not None else done.set_result(result)

        def read():
            result = error = None
            if not self._readers.acquire(timeout=timeout / 2):  # READERS reads stuck already: none joins them
                error = RuntimeError(f"the voice store is not answering: {READERS} reads of it are stuck "
                                     "(a hung disk or mount?)")
            else:
                try:
                    result = self.load(name)
                except BaseException as e:  # noqa: BLE001 - handed to the waiting request
                    error = e
                finally:
                    self._readers.release()
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # its loop closed meanwhile (the process stopping): nobody waits for it
                pass

        threading.Thread(target=read, name="voxcpm-voice-read", daemon=True).start()
        try:
            return await asyncio.wait_for(done, timeout)  # cancelled past it: a late result is dropped (settle)
        except asyncio.TimeoutError:
            raise RuntimeError(f"the voice store did not answer in {timeout:g} s reading voice {name!r} "
                               "(a hung disk or mount?)") from None

    def load(self, name: str) -> Voice:
        """Voice `name`, from memory while its voice.json is the same file (a replaced voice is a new
        file, so it is read again)."""
        check_voice_name(name, "VOICE")
        for _ in range(3):  # a concurrent replace may remove the version between stat and read
            target = self._target(name)
            if target is None:
                raise InputError(f"unknown voice {name!r}")
            try:
                st = os.stat(os.path.join(target, "voice.json"))
                stamp = (target, st.st_mtime_ns, st.st_ino)
                with self._cache_lock:
                    hit = self._cache.get(name)
                    if hit and hit[0] == stamp:
                        self._cache.move_to_end(name)
                        return hit[1]
                with open(os.path.join(target, "voice.json"), encoding="utf-8") as f:
                    meta = json.load(f)
                with open(os.path.join(target, "latents.safetensors"), "rb") as f:
                    tensors = st_load(f.read())
                # Voices stored before adapters existed have no "lora": the base model.
                voice = Voice(name, tensors["reference"], tensors.get("prompt"), meta.get("transcript"),
                              int(meta["sample_rate"]), meta.get("lora") or None)
            except FileNotFoundError:
                continue
            except Exception as e:  # the store was changed by hand, or its disk failed
                detail = e.strerror if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
                raise RuntimeError(f"the voice store cannot read voice {name!r} ({detail}); "
                                   "remove it and add it again") from None
            with self._cache_lock:
                self._cache[name] = (stamp, voice)
                self._cache.move_to_end(name)
                while len(self._cache) > CACHE_VOICES:
                    self._cache.popitem(last=False)
            return voice
        raise InputError(f"unknown voice {name!r}")
