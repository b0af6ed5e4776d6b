"""VoxCPM2's text tokenizer, without ``transformers``.

The reference builds its text ids as::

    tok = LlamaTokenizerFast.from_pretrained(path)          # transformers 4.57
    ids = voxcpm.model.utils.mask_multichar_chinese_tokens(tok)(text)

which is:

1. ``tok.tokenize(text)`` = ``encode_plus(text, add_special_tokens=False).tokens()``,
   i.e. the Rust ``tokenizers.Tokenizer`` that ``from_pretrained`` built, encoding
   without special tokens, truncation or padding;
2. for every token, ``clean = token.replace("▁", "")`` (*every* "▁", not just a
   prefix); if ``clean`` is one of the vocabulary's multi-character pure-CJK
   tokens (``len >= 2`` and every character in U+4E00..U+9FFF, taken from
   ``tok.vocab``, which includes added tokens), the token is replaced by the
   characters of ``clean`` (so the "▁" is dropped), otherwise it is kept as is;
3. ``tok.convert_tokens_to_ids(tokens)``: ``Tokenizer.token_to_id`` per token,
   and ``unk_token_id`` where that is ``None``, which is where a split character
   that is not itself in the vocabulary ends up.

``TextTokenizer`` does the same with the ``tokenizers`` library alone. The
``tokenizers.Tokenizer`` it uses is put in the state ``from_pretrained`` leaves
its backend in; ``_emulate_from_pretrained`` follows transformers 4.57
(``tokenization_utils_base._from_pretrained``,
``PreTrainedTokenizerFast.__init__``, ``LlamaTokenizerFast.__init__``) step by
step:

* special tokens: ``unk/bos/eos`` default to ``"<unk>"/"<s>"/"</s>"`` when the
  config lacks the key (``null`` means unset), plus ``pad/sep/cls/mask`` and
  ``additional_special_tokens`` from the config, and ``pad_token`` from
  tokenizer.json's padding section when the config lacks it;
* every entry of the config's ``added_tokens_decoder`` is added again with
  ``Tokenizer.add_tokens`` (transformers compares ``repr(AddedToken)`` against
  the *ids* of the existing added tokens, so nothing ever matches), which also
  updates the attributes (``normalized``, ``lstrip``...) of tokens already in
  tokenizer.json; special-token strings not among the added tokens are added
  the same way;
* ``Tokenizer.encode_special_tokens`` = the config's ``split_special_tokens``;
* the pre-tokenizer ``add_prefix_space`` adjustment (a no-op for
  ``LlamaTokenizerFast``, whose ``add_prefix_space`` is ``None``; reproduced
  anyway);
* truncation and padding from tokenizer.json are switched off (``tokenize``
  runs with ``DO_NOT_TRUNCATE``/``DO_NOT_PAD``).

Configurations that make transformers rebuild the tokenizer from the
sentencepiece ``tokenizer.model`` or from another file instead of reading
``<path>/tokenizer.json`` (``add_prefix_space`` not null, ``from_slow`` true, a
``tokenizer_file`` key that does not name ``<path>/tokenizer.json``: that key
overrides the file found in the directory) are rejected, as is ``added_tokens.json`` without
``added_tokens_decoder`` in the config. Not reproduced: the Mistral regex patch
(only for vocabularies over 100k tokens with a pre-tokenizer and a Mistral
``config.json``).
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

# transformers' SpecialTokensMixin.SPECIAL_TOKENS_ATTRIBUTES, in its order.
_SPECIAL_ATTRS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens",
)
# LlamaTokenizerFast.__init__ keyword defaults.
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
    """transformers' ``convert_added_tokens(obj, save=False)``."""
    if isinstance(obj, dict) and obj.get("__type") == "AddedToken":
        obj = dict(obj)
        obj.pop("__type")
        return AddedToken(**obj)
    if isinstance(obj, (list, tuple)):
        return [_convert_added_tokens(o, AddedToken) for o in obj]
    if isinstance(obj, dict):
        return {k: _convert_added_tokens(v, AddedToken) for k, v in obj.items()}
    return obj


def _emulate_from_pretrained(path: str):
    """Load ``path`` the way ``LlamaTokenizerFast.from_pretrained(path)`` does.

    Returns ``(tokenizers.Tokenizer, special_tokens)`` where ``special_tokens``
    maps ``unk_token``/``bos_token``/``eos_token``... to their strings (or None).
    """
    from tokenizers import AddedToken, Tokenizer
    from tokenizers import pre_tokenizers

    tok_path = os.path.join(path, TOKENIZER_FILE)
    cfg_path = os.path.join(path, CONFIG_FILE)
    _read_json(tok_path, TOKENIZER_FILE)  # clear error for missing / non-JSON files
    try:
        tok = Tokenizer.from_file(tok_path)
    except Exception as e:  # tokenizers raises a bare Exception on bad layouts
        raise TokenizerFileError(f"{TOKENIZER_FILE} cannot be loaded by tokenizers: {tok_path}: {e}") from e
    cfg = _read_json(cfg_path, CONFIG_FILE)
    if not isinstance(cfg, dict):
        raise TokenizerFileError(f"{CONFIG_FILE} must hold a JSON object: {cfg_path}")

    def bad_cfg(msg: str) -> TokenizerFileError:
        return TokenizerFileError(f"{CONFIG_FILE}: {msg} (unsupported: transformers would rebuild the "
                                  f"tokenizer from the sentencepiece tokenizer.model): {cfg_path}")

    if cfg.get("add_prefix_space") is not None:
        raise bad_cfg(f"add_prefix_space={cfg['add_prefix_space']!r} forces from_slow")
    if cfg.get("from_slow"):
        raise bad_cfg("from_slow is set")
    if "tokenizer_file" in cfg:  # the config's value wins over <path>/tokenizer.json
        named = cfg["tokenizer_file"]
        if not (isinstance(named, str) and os.path.isfile(named) and os.path.samefile(named, tok_path)):
            raise bad_cfg(f"tokenizer_file={named!r} overrides {TOKENIZER_FILE}")

    # --- tokenization_utils_base._from_pretrained -------------------------------
    init_kwargs = dict(cfg)
    init_kwargs.pop("tokenizer_class", None)
    init_kwargs.pop("init_inputs", None)
    added_tokens_decoder: dict[int, Any] = {}
    added_tokens_map: dict[str, Any] = {}
    if "added_tokens_decoder" in init_kwargs:
        decoder = init_kwargs["added_tokens_decoder"]
        if not isinstance(decoder, dict):
            raise TokenizerFileError(f"{CONFIG_FILE}: added_tokens_decoder must be an object: {cfg_path}")
        for idx, token in decoder.items():
            try:
                if isinstance(token, dict):
                    token = AddedToken(**token)
                if not isinstance(token, AddedToken):
                    raise TypeError(f"expected an object, got {type(token).__name__}")
                added_tokens_decoder[int(idx)] = token
            except (TypeError, ValueError) as e:
                raise TokenizerFileError(
                    f"{CONFIG_FILE}: bad added_tokens_decoder entry {idx!r}: {e}: {cfg_path}") from e
            added_tokens_map[str(token)] = token
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
                    if isinstance(value, dict):
                        value = AddedToken(**dict(value, special=True))
                    elif key == "additional_special_tokens" and isinstance(value, list):
                        extra = list(init_kwargs.pop("additional_special_tokens", []) or [])
                        for t in value:
                            if isinstance(t, dict):
                                t = AddedToken(**dict(t, special=True))
                            if t not in extra:
                                extra.append(t)
                        value = extra
                    init_kwargs[key] = value
            except TypeError as e:
                raise TokenizerFileError(f"{SPECIAL_TOKENS_MAP_FILE}: bad entry: {e}: {stm_path}") from e
        with open(tok_path, "rb") as f:
            serialized = json.loads(f.read().decode("utf-8")).get("added_tokens") or []
        for entry in serialized:
            entry = dict(entry)
            idx = entry.pop("id")
            added_tokens_decoder[idx] = AddedToken(**entry)
            added_tokens_map[str(added_tokens_decoder[idx])] = added_tokens_decoder[idx]
    init_kwargs["added_tokens_decoder"] = added_tokens_decoder
    init_kwargs = _convert_added_tokens(init_kwargs, AddedToken)
    for key in _SPECIAL_ATTRS:
        if key in init_kwargs and key != "additional_special_tokens" and added_tokens_map \
                and init_kwargs[key] is not None:
            init_kwargs[key] = added_tokens_map.get(str(init_kwargs[key]), init_kwargs[key])

    # --- LlamaTokenizerFast.__init__ defaults -----------------------------------
    for key, default in _LLAMA_DEFAULTS.items():
        init_kwargs.setdefault(key, default)

    # --- PreTrainedTokenizerFast.__init__ ----------------------------------------
    padding = tok.padding
    if padding is not None:
        init_kwargs.setdefault("pad_token", padding["pad_token"])
    special_map: dict[str, Any] = {k: None for k in _SPECIAL_ATTRS}
    special_map["additional_special_tokens"] = []
    for key in _SPECIAL_ATTRS:
        value = init_kwargs.get(key)
        if value is None:
            continue
        if key == "additional_special_tokens":
            if not isinstance(value, (list, tuple)) or not all(isinstance(t, (str, AddedToken)) for t in value):
                raise TokenizerFileError(f"{CONFIG_FILE}: additional_special_tokens must be a list of "
                                         f"strings or AddedToken objects: {cfg_path}")
            special_map[key] = list(value)
        elif isinstance(value, (str, AddedToken)):
            special_map[key] = value
        else:
            raise TokenizerFileError(
                f"{CONFIG_FILE}: {key} must be a string or an AddedToken object, got {value!r}: {cfg_path}")

    split_special_tokens = bool(init_kwargs.get("split_special_tokens", False))
    tok.encode_special_tokens = split_special_tokens

    # all_special_tokens_extended: unique by string, in attribute order
    special_extended: list = []
    seen: set[str] = set()
    for key in _SPECIAL_ATTRS:
        value = special_map[key]
        if not value:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        fresh = [t for t in values if str(t) not in seen]
        seen.update(map(str, fresh))
        special_extended.extend(fresh)
    special_strings = [str(t) for t in special_extended]

    # (sic) transformers hashes repr() of the existing added-token *ids*, so every
    # added_tokens_decoder entry is re-added.
    existing_hashes = {hash(repr(idx)) for idx in tok.get_added_tokens_decoder()}
    tokens_to_add = [t for _, t in sorted(added_tokens_decoder.items(), key=lambda x: x[0])
                     if hash(repr(t)) not in existing_hashes]
    existing = [t.content for _, t in sorted(tok.get_added_tokens_decoder().items(), key=lambda x: x[0])]
    encoder = existing + [str(t) for t in tokens_to_add]
    tokens_to_add += [t for t in special_extended if t not in encoder and t not in tokens_to_add]
    if tokens_to_add:
        final = []
        for t in tokens_to_add:
            if isinstance(t, AddedToken):
                t.special = bool(t.special or str(t) in special_strings)
            else:
                t = AddedToken(t, special=str(t) in special_strings)
            final.append(t)
        tok.add_tokens(final)

    try:  # no-op for LlamaTokenizerFast (add_prefix_space is None); mirrors transformers
        state = json.loads(tok.pre_tokenizer.__getstate__())
        if state.get("add_prefix_space", None) is not None:
            cls = getattr(pre_tokenizers, state.pop("type"))
            state["add_prefix_space"] = None
            tok.pre_tokenizer = cls(**state)
    except Exception:
        pass

    # --- LlamaTokenizerFast.update_post_processor checks -------------------------
    add_bos = init_kwargs.get("add_bos_token", True)
    add_eos = init_kwargs.get("add_eos_token", False)
    if special_map["bos_token"] is None and add_bos:
        raise TokenizerFileError(f"{CONFIG_FILE}: add_bos_token = True but bos_token = None: {cfg_path}")
    if special_map["eos_token"] is None and add_eos:
        raise TokenizerFileError(f"{CONFIG_FILE}: add_eos_token = True but eos_token = None: {cfg_path}")

    # --- tokenize(): DO_NOT_TRUNCATE / DO_NOT_PAD -------------------------------
    tok.no_truncation()
    tok.no_padding()

    specials = {k: _token_str(special_map[k]) for k in _SPECIAL_ATTRS if k != "additional_special_tokens"}
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
