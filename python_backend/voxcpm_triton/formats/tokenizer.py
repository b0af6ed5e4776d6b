"""VoxCPM2's text tokenizer, without ``transformers``.

The reference builds its text ids as::

    tok = LlamaTokenizerFast.from_pretrained(path)          # transformers 5
    ids = voxcpm.model.utils.mask_multichar_chinese_tokens(tok)(text)

which is:

1. ``tok.tokenize(text)``: the ``tokenizers.Tokenizer`` that ``from_pretrained``
   built, encoding without special tokens, truncation or padding;
2. for every token, ``clean = token.replace("▁", "")`` (*every* "▁", not just a
   prefix); if ``clean`` is one of the vocabulary's multi-character pure-CJK
   tokens (``len >= 2`` and every character in U+4E00..U+9FFF, taken from
   ``tok.vocab``, which includes added tokens), the token is replaced by the
   characters of ``clean`` (so the "▁" is dropped), otherwise it is kept as is;
3. ``tok.convert_tokens_to_ids(tokens)``: ``Tokenizer.token_to_id`` per token,
   and ``unk_token_id`` where that is ``None``, which is where a split character
   that is not itself in the vocabulary ends up.

``TextTokenizer`` does the same with the ``tokenizers`` library alone. Since
transformers 5, ``LlamaTokenizer`` (``LlamaTokenizerFast`` is an alias) does not
load ``tokenizer.json`` as it is: it takes the BPE vocabulary and merges from it
and builds a new backend by its own recipe. ``_emulate_from_pretrained`` follows
transformers 5 (``tokenization_utils_base._from_pretrained``,
``TokenizersBackend.convert_to_native_format`` and ``__init__``,
``LlamaTokenizer.__init__``, ``PreTrainedTokenizerBase.__init__``) step by step:

* the backend is ``BPE(vocab, merges, fuse_unk=True, byte_fallback=True)``
  (no unk token, no dropout; the file's other BPE options are dropped), no
  normalizer, and a ``Metaspace("▁", split=False)`` pre-tokenizer whose prepend
  scheme is ``first`` (``always`` with ``legacy: true``, ``never`` with
  ``add_prefix_space: false``). The file's normalizer and pre-tokenizer are not
  used: a sentencepiece-style ``Prepend("▁")`` + ``Replace(" ", "▁")`` normalizer
  gave text with leading whitespace one "▁" more (one id more) under
  transformers 4;
* the file's post-processor, and its padding (whose ``pad_token`` becomes the
  default pad token); ``add_bos_token``/``add_eos_token`` in the config are
  ignored when a ``tokenizer.json`` exists;
* special tokens: ``unk/bos/eos`` default to ``"<unk>"/"<s>"/"</s>"`` when the
  config lacks the key (``null`` means unset), plus ``sep/pad/cls/mask``,
  ``extra_special_tokens`` (formerly ``additional_special_tokens``) and any
  other ``*_token`` string key (a model-specific special token);
* the file's ``added_tokens`` are dropped; every entry of the config's
  ``added_tokens_decoder`` (or, without it, of ``special_tokens_map.json`` and
  the file's ``added_tokens``) is added to the new backend in id order with
  ``Tokenizer.add_tokens``, then the special tokens that are not among them (a
  token already in the BPE vocabulary keeps its id, a new one gets the next);
* ``Tokenizer.encode_special_tokens`` = the config's ``split_special_tokens``;
* truncation and padding are switched off (``tokenize`` runs with
  ``DO_NOT_TRUNCATE``/``DO_NOT_PAD``).

Rejected, with an error naming the file: a ``tokenizer.json`` whose model is not
BPE, ``added_tokens.json`` without ``added_tokens_decoder`` in the config,
``fast_tokenizer_files`` (a versioned tokenizer file) and ``fix_mistral_regex``
(a rewritten pre-tokenizer) in the config.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

__all__ = ["TextTokenizer", "TokenizerFileError", "TokenizerInputError"]

SPIECE_UNDERLINE = "\u2581"  # "▁"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
ADDED_TOKENS_FILE = "added_tokens.json"

# transformers' PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES, in its order.
_SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# LlamaTokenizer.__init__ keyword defaults.
_LLAMA_DEFAULTS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}


class TokenizerFileError(ValueError):
    """A tokenizer directory file is missing, unreadable or unsupported."""


class TokenizerInputError(TypeError, ValueError):
    """Non-``str`` input. A ``TypeError``, and a ``ValueError`` too, because the
    reference wrapper's ``__call__`` re-raises its ``TypeError`` as ``ValueError``."""


def is_multichar_chinese(token: str) -> bool:
    """The reference's test for tokens to split: >= 2 chars, all in U+4E00..U+9FFF."""
    return len(token) >= 2 and all("\u4e00" <= c <= "\u9fff" for c in token)


def _read_json(path: str, what: str) -> Any:
    if not os.path.isfile(path):
        raise TokenizerFileError(f"{what} not found: {path}")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerFileError(f"{what} is not valid UTF-8 JSON: {path}: {e}") from e


def _token_str(tok) -> Optional[str]:
    return None if tok is None else str(tok)


def _convert_added_tokens(obj, AddedToken):
    """transformers' ``convert_added_tokens(obj, save=False)``: ``{"__type": "AddedToken", ...}``
    dicts, at any depth, become ``AddedToken``s."""
    if isinstance(obj, dict) and obj.get("__type") == "AddedToken":
        obj = dict(obj)
        obj.pop("__type")
        return AddedToken(**obj)
    if isinstance(obj, (list, tuple)):
        return [_convert_added_tokens(o, AddedToken) for o in obj]
    if isinstance(obj, dict):
        return {k: _convert_added_tokens(v, AddedToken) for k, v in obj.items()}
    return obj


def _prepend_scheme(add_prefix_space, legacy) -> str:
    """LlamaTokenizer's Metaspace prepend scheme (``_get_prepend_scheme``)."""
    if add_prefix_space is None or add_prefix_space:
        return "always" if legacy else "first"
    return "never"


def _check_special(key: str, value, cfg_path: str, AddedToken):
    if not isinstance(value, (str, AddedToken)):
        raise TokenizerFileError(
            f"{CONFIG_FILE}: {key} must be a string or an AddedToken object, got {value!r}: {cfg_path}")


def _init_kwargs(path: str, cfg: dict, tok_json: dict, AddedToken) -> dict:
    """The keyword arguments ``_from_pretrained`` gives the tokenizer class: the config, its
    special tokens, and ``added_tokens_decoder`` (id -> AddedToken)."""
    cfg_path = os.path.join(path, CONFIG_FILE)
    init = dict(cfg)
    init.pop("tokenizer_class", None)
    init.pop("init_inputs", None)
    # With a tokenizer.json, the file's post-processor decides; the config's flags are dropped.
    init.pop("add_bos_token", None)
    init.pop("add_eos_token", None)
    if "additional_special_tokens" in init and not init.get("extra_special_tokens"):
        init["extra_special_tokens"] = init.pop("additional_special_tokens")
    # Any other "*_token" string is a model-specific special token.
    model_specific = {k: init.pop(k) for k in list(init)
                      if k not in _SPECIAL_ATTRS and k.endswith("_token") and isinstance(init[k], str)}
    if isinstance(init.get("extra_special_tokens"), dict):
        model_specific.update(init.pop("extra_special_tokens"))
    if model_specific:
        init["model_specific_special_tokens"] = model_specific

    decoder: dict[int, Any] = {}
    by_content: dict[str, Any] = {}
    if "added_tokens_decoder" in init:
        entries = init["added_tokens_decoder"]
        if not isinstance(entries, dict):
            raise TokenizerFileError(f"{CONFIG_FILE}: added_tokens_decoder must be an object: {cfg_path}")
        for idx, token in entries.items():
            try:
                if isinstance(token, dict):
                    token = AddedToken(**token)
                if not isinstance(token, AddedToken):
                    raise TypeError(f"expected an object, got {type(token).__name__}")
                decoder[int(idx)] = token
            except (TypeError, ValueError) as e:
                raise TokenizerFileError(
                    f"{CONFIG_FILE}: bad added_tokens_decoder entry {idx!r}: {e}: {cfg_path}") from e
            by_content[str(token)] = token
    else:
        if os.path.exists(os.path.join(path, ADDED_TOKENS_FILE)):
            raise TokenizerFileError(
                f"{ADDED_TOKENS_FILE} without added_tokens_decoder in {CONFIG_FILE} is not supported: {path}")
        stm_path = os.path.join(path, SPECIAL_TOKENS_MAP_FILE)
        if os.path.exists(stm_path):
            stm = _read_json(stm_path, SPECIAL_TOKENS_MAP_FILE)
            if not isinstance(stm, dict):
                raise TokenizerFileError(f"{SPECIAL_TOKENS_MAP_FILE} must hold a JSON object: {stm_path}")
            try:
                for key, value in stm.items():
                    if isinstance(value, dict) and key != "extra_special_tokens":
                        value = dict(value)
                        value.pop("special", None)
                        value = AddedToken(**value, special=True)
                    elif key == "extra_special_tokens" and isinstance(value, list):
                        merged = list(init.get("extra_special_tokens") or [])
                        for t in value:
                            t = AddedToken(**t, special=True) if isinstance(t, dict) else t
                            if t not in merged:
                                merged.append(t)
                        value = merged
                    init[key] = value
            except TypeError as e:
                raise TokenizerFileError(f"{SPECIAL_TOKENS_MAP_FILE}: bad entry: {e}: {stm_path}") from e
            if isinstance(init.get("extra_special_tokens"), dict):
                init.setdefault("model_specific_special_tokens", {}).update(init.pop("extra_special_tokens"))
        for entry in tok_json.get("added_tokens") or []:
            entry = dict(entry)
            idx = entry.pop("id")
            decoder[idx] = AddedToken(**entry)
            by_content[str(decoder[idx])] = decoder[idx]
    init["added_tokens_decoder"] = decoder
    init = _convert_added_tokens(init, AddedToken)
    for key in _SPECIAL_ATTRS:
        if key in init and by_content and init[key] is not None:
            init[key] = by_content.get(str(init[key]), init[key])
    return init


def _special_tokens(init: dict, cfg_path: str, AddedToken) -> tuple[dict[str, Any], list]:
    """The named special tokens (attribute -> token) and the extra ones, from the tokenizer's init
    arguments, as PreTrainedTokenizerBase.__init__ sorts them (`init` loses the keys it renames or takes);
    a token of the wrong kind is an error."""
    if "additional_special_tokens" in init and "extra_special_tokens" not in init:
        init["extra_special_tokens"] = init.pop("additional_special_tokens")
    special_map: dict[str, Any] = dict.fromkeys(_SPECIAL_ATTRS)
    extra: list = []
    model_specific = init.pop("model_specific_special_tokens", None) or {}
    if not isinstance(model_specific, dict):
        raise TokenizerFileError(f"{CONFIG_FILE}: extra_special_tokens must be a list or an object: {cfg_path}")
    auto_specific: dict[str, Any] = {}
    for key in list(init):
        value = init[key]
        if key in _SPECIAL_ATTRS:
            if value is None:
                continue
            _check_special(key, value, cfg_path, AddedToken)
            special_map[key] = value
        elif key == "extra_special_tokens":
            if value is None:
                continue
            if isinstance(value, dict):
                for name, token in value.items():
                    _check_special(name, token, cfg_path, AddedToken)
                    special_map[name] = token
            elif isinstance(value, (list, tuple)):
                extra = list(value)
            else:
                raise TokenizerFileError(f"{CONFIG_FILE}: extra_special_tokens must be a list or an object: {cfg_path}")
        elif key.endswith("_token") and isinstance(value, (str, AddedToken)):
            auto_specific[key] = value
    for key, value in {**auto_specific, **model_specific}.items():
        _check_special(key, value, cfg_path, AddedToken)
        special_map[key] = value
    if not all(isinstance(t, (str, AddedToken)) for t in extra):
        raise TokenizerFileError(f"{CONFIG_FILE}: extra_special_tokens must hold strings or AddedToken "
                                 f"objects: {cfg_path}")
    return special_map, extra


def _add_tokens(tok, decoder: dict, special_map: dict[str, Any], extra: list, AddedToken):
    """Add to `tok` the tokens of added_tokens_decoder (`decoder`: id -> token), then the special
    tokens that are not among them, as TokenizersBackend.__init__ does (its new backend has none yet)."""
    tokens_to_add = [t for _, t in sorted(decoder.items(), key=lambda x: x[0])]
    encoder = [str(t) for t in tokens_to_add]
    for value in special_map.values():
        if value is not None and str(value) not in encoder and value not in tokens_to_add:
            tokens_to_add.append(value)
    for value in extra:
        if str(value) not in encoder and value not in tokens_to_add:
            tokens_to_add.append(value)
    if tokens_to_add:
        named = [str(t) for t in special_map.values() if t]
        final = []
        for t in tokens_to_add:
            if isinstance(t, str):
                t = AddedToken(t, special=True)
            elif not t.special and str(t) in named:
                t.special = True
            final.append(t)
        tok.add_tokens(final)


def _emulate_from_pretrained(path: str):
    """Load ``path`` the way ``LlamaTokenizerFast.from_pretrained(path)`` does in transformers 5.

    Returns ``(tokenizers.Tokenizer, special_tokens)`` where ``special_tokens``
    maps ``unk_token``/``bos_token``/``eos_token``... to their strings (or None).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    tok_path = os.path.join(path, TOKENIZER_FILE)
    cfg_path = os.path.join(path, CONFIG_FILE)
    tok_json = _read_json(tok_path, TOKENIZER_FILE)
    try:  # validates the file, and gives its post-processor, padding and truncation
        original = Tokenizer.from_file(tok_path)
    except Exception as e:  # tokenizers raises a bare Exception on bad layouts
        raise TokenizerFileError(f"{TOKENIZER_FILE} cannot be loaded by tokenizers: {tok_path}: {e}") from e
    model = tok_json.get("model") if isinstance(tok_json, dict) else None
    if not (isinstance(model, dict) and model.get("type", "BPE") == "BPE" and isinstance(model.get("vocab"), dict)):
        raise TokenizerFileError(f"{TOKENIZER_FILE}: the model must be BPE with a vocabulary (a Llama "
                                 f"tokenizer): {tok_path}")
    cfg = _read_json(cfg_path, CONFIG_FILE)
    if not isinstance(cfg, dict):
        raise TokenizerFileError(f"{CONFIG_FILE} must hold a JSON object: {cfg_path}")
    for key, why in (("fast_tokenizer_files", f"names another file than {TOKENIZER_FILE}"),
                     ("fix_mistral_regex", "rewrites the pre-tokenizer")):
        if cfg.get(key):
            raise TokenizerFileError(f"{CONFIG_FILE}: {key} {why} (unsupported): {cfg_path}")

    init = _init_kwargs(path, cfg, tok_json, AddedToken)

    # --- LlamaTokenizer.__init__ -------------------------------------------------
    for key, default in _LLAMA_DEFAULTS.items():
        init.setdefault(key, default)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges") or []]
    add_prefix_space = init.get("add_prefix_space")
    try:
        tok = Tokenizer(BPE(vocab=model["vocab"], merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
    except Exception as e:
        raise TokenizerFileError(f"{TOKENIZER_FILE}: its BPE vocabulary and merges do not load: {tok_path}: {e}") from e
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPIECE_UNDERLINE, prepend_scheme=_prepend_scheme(add_prefix_space, init.get("legacy", False)),
        split=False)
    steps = [decoders.Replace(SPIECE_UNDERLINE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space is None or add_prefix_space:
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)

    # --- TokenizersBackend.__init__ ----------------------------------------------
    if original.padding is not None:
        init.setdefault("pad_token", original.padding["pad_token"])
    if original.post_processor is not None:
        tok.post_processor = original.post_processor

    # --- PreTrainedTokenizerBase.__init__: the special tokens ----------------------
    special_map, extra = _special_tokens(init, cfg_path, AddedToken)
    split_special_tokens = init.get("split_special_tokens", False)
    if not isinstance(split_special_tokens, bool):
        raise TokenizerFileError(f"{CONFIG_FILE}: split_special_tokens must be true or false: {cfg_path}")
    tok.encode_special_tokens = split_special_tokens

    # --- TokenizersBackend.__init__: the added tokens -------------------------------
    _add_tokens(tok, init["added_tokens_decoder"], special_map, extra, AddedToken)
    if original.post_processor is None:  # update_post_processor(), with add_bos/eos_token off
        tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])

    # --- tokenize(): DO_NOT_TRUNCATE / DO_NOT_PAD -------------------------------
    tok.no_truncation()
    tok.no_padding()

    specials = {k: _token_str(special_map[k]) for k in _SPECIAL_ATTRS}
    return tok, specials


class TextTokenizer:
    """Text -> token ids exactly as VoxCPM2's reference feeds its model.

    ``TextTokenizer.from_dir(path)(text)`` ==
    ``mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(path))(text)``.
    """

    def __init__(self, tokenizer, special_tokens: dict[str, Optional[str]], path: Optional[str] = None):
        self._tok = tokenizer
        self.path = path
        self.special_tokens = dict(special_tokens)
        self._unk_id: Optional[int] = None
        self._unk_id = self._lookup(self.special_tokens.get("unk_token"))
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.multichar_tokens = frozenset(t for t in vocab if is_multichar_chinese(t))
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str) -> "TextTokenizer":
        """Load ``<path>/tokenizer.json`` and ``<path>/tokenizer_config.json``."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise TokenizerFileError(f"tokenizer directory not found: {path}")
        tok, specials = _emulate_from_pretrained(path)
        return cls(tok, specials, path)

    # -- properties -----------------------------------------------------------------
    def _lookup(self, token: Optional[str]) -> Optional[int]:
        if token is None:
            return None
        idx = self._tok.token_to_id(token)
        return self._unk_id if idx is None else idx

    @property
    def vocab_size(self) -> int:
        """Number of tokens including added ones (``len(hf_tokenizer)``)."""
        return self._vocab_size

    @property
    def unk_id(self) -> Optional[int]:
        return self._unk_id

    @property
    def bos_id(self) -> Optional[int]:
        return self._lookup(self.special_tokens.get("bos_token"))

    @property
    def eos_id(self) -> Optional[int]:
        return self._lookup(self.special_tokens.get("eos_token"))

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer`` (state as after ``from_pretrained``)."""
        return self._tok

    def token_to_id(self, token: str) -> Optional[int]:
        """``convert_tokens_to_ids`` for one token: its id, or ``unk_id``."""
        return self._lookup(token)

    # -- tokenization ---------------------------------------------------------------
    def base_tokenize(self, text: str) -> list[str]:
        """``LlamaTokenizerFast.tokenize(text)``: tokens, no special tokens added."""
        if not isinstance(text, str):
            raise TokenizerInputError(f"Expected string input, got {type(text)}")
        return self._tok.encode(text, add_special_tokens=False).tokens

    def tokenize(self, text: str) -> list[str]:
        """The reference wrapper's ``tokenize``: multi-character CJK tokens split
        into characters (dropping any "▁")."""
        out: list[str] = []
        multichar = self.multichar_tokens
        for token in self.base_tokenize(text):
            clean = token.replace(SPIECE_UNDERLINE, "")
            if clean in multichar:
                out.extend(clean)
            else:
                out.append(token)
        return out

    def __call__(self, text: str) -> list[int]:
        ids = []
        for token in self.tokenize(text):
            idx = self._tok.token_to_id(token)
            if idx is None:
                idx = self._unk_id
                if idx is None:
                    raise ValueError(f"token {token!r} is not in the vocabulary and the tokenizer has no unk_token")
            ids.append(idx)
        return ids

    def __repr__(self) -> str:
        return f"TextTokenizer(path={self.path!r}, vocab_size={self.vocab_size})"
