"""TextTokenizer vs. the reference: mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(dir)), under
the transformers the reference installs today (5.x)."""

import json
import os
import random
import subprocess
import sys

import pytest

from tests.reference import reference_utils

mask_multichar_chinese_tokens = reference_utils().mask_multichar_chinese_tokens
from transformers import LlamaTokenizerFast  # noqa: E402

from voxcpm_triton.formats.tokenizer import TextTokenizer, TokenizerFileError  # noqa: E402
from voxcpm_triton.testing.tokenizer_builder import (  # noqa: E402
    AUDIO_TOKENS,
    DEFAULT_VOCAB_SIZE,
    build_tiny_tokenizer,
    write_tiny_tokenizer,
)

SP = "\u2581"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_tokenizer")
    write_tiny_tokenizer(str(d))
    return str(d)


@pytest.fixture(scope="module")
def hf(tok_dir):
    return LlamaTokenizerFast.from_pretrained(tok_dir)


@pytest.fixture(scope="module")
def ref(hf):
    return mask_multichar_chinese_tokens(hf)


@pytest.fixture(scope="module")
def ours(tok_dir):
    return TextTokenizer.from_dir(tok_dir)


CASES = [
    "",
    " ",
    "   ",
    "Hello world",
    "Hello world, this is a test of the speech model.",
    "The quick brown fox jumps over the lazy dog.",
    "hello   world",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n",
    "\n",
    "line one\n\nline two",
    "你好世界",
    "你好，世界！",
    "我们今天天气很好。",
    "今天天气不错",
    "中国人喜欢音乐和电影",
    "你好 世界",
    " 你好",
    " 中国",
    "  中国",
    "谢谢 谢谢",
    "谢谢你",
    "再见",
    "我 中 你",
    "(温柔的女声)你好世界",
    "（温柔的男声）今天天气怎么样？",
    "Hello 你好 world 世界",
    "VoxCPM2 是一个 TTS model。",
    "0123456789",
    "In 2024, 19 people paid $20.00 (100%).",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "…—“”《》",
    "café naïve straße niño",
    "emoji 😀🎉 test 👍🏽",
    "🇨🇳",
    "<s>",
    "</s>",
    "<unk>",
    "Hello <s> world </s> <unk>",
    "a<s>b</s>c",
    "<|audio_start|>你好<|audio_end|>",
    "<|ref_audio_start|><|ref_audio_end|>",
    "<|im_start|>user\n你好<|im_end|>",
    "<s",
    "龘靐",
    "龘",
    "你好龘靐世界",
    " 龘靐 ",
    SP,
    SP + "你好",
    SP * 3 + "hello",
    "很错误",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ",
    "日本語のテキスト",
    "한국어 텍스트",
    "Ελληνικά кириллица",
    "\u200b zero width \ufeff bom",
    "\x00\x01 control",
    "a" * 300,
    "你好" * 50,
]


def test_builder_is_deterministic(tmp_path):
    write_tiny_tokenizer(str(tmp_path / "a"))
    write_tiny_tokenizer(str(tmp_path / "b"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        a = (tmp_path / "a" / name).read_bytes()
        b = (tmp_path / "b" / name).read_bytes()
        assert a == b, name
    assert build_tiny_tokenizer()[0].encode("utf-8") == (tmp_path / "a" / "tokenizer.json").read_bytes()


def test_builder_vocab_layout(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        data = json.load(f)
    vocab = data["model"]["vocab"]
    assert len(vocab) == DEFAULT_VOCAB_SIZE
    assert sorted(vocab.values()) == list(range(DEFAULT_VOCAB_SIZE))
    assert (vocab["<unk>"], vocab["<s>"], vocab["</s>"]) == (0, 1, 2)
    for i, name in AUDIO_TOKENS.items():
        assert vocab[name] == i
    for b in range(256):
        assert f"<0x{b:02X}>" in vocab
    assert data["model"]["byte_fallback"] is True
    for word in ("你好", "世界", "中国", "我们", "今天天气", SP + "你好", SP + "谢谢", SP + "中", SP + SP + "中国"):
        assert word in vocab, word
    assert "谢谢" not in vocab  # "▁谢谢" is a token, its bare form is not
    assert "龘" not in vocab and "靐" not in vocab and "龘靐" in vocab
    added = {t["content"]: t for t in data["added_tokens"]}
    assert added["龘靐"]["special"] is False
    assert all(added[n]["special"] for n in ("<unk>", "<s>", "</s>", *AUDIO_TOKENS.values()))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    assert "add_prefix_space" not in cfg
    assert cfg["add_bos_token"] is True and cfg["add_eos_token"] is False


def test_builder_vocab_size_argument(tmp_path):
    write_tiny_tokenizer(str(tmp_path), vocab_size=3000)
    tok = TextTokenizer.from_dir(str(tmp_path))
    assert tok.vocab_size == 3000
    assert max(tok.backend.get_vocab().values()) == 2999
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_tokenizer(200)


def test_backend_is_the_one_transformers_builds(tok_dir, hf, ours):
    assert hf.is_fast
    hf.tokenize("")  # switches off tokenizer.json's truncation/padding, as every tokenize() call does
    # Our backend is in exactly the state from_pretrained (+ tokenize) leaves HF's in.
    assert ours.backend.to_str() == hf.backend_tokenizer.to_str()
    # The file's post-processor is kept: encode() with special tokens prepends <s>, tokenize() does not.
    assert hf.encode("hi")[0] == 1 and hf.encode("hi")[-1] != 2


def test_transformers5_rebuilds_the_llama_backend(tok_dir, hf, ours):
    """The reference as it installs today (transformers 5) does not run tokenizer.json's
    sentencepiece-style normalizer (Prepend "▁" + Replace " " -> "▁"): it builds a Metaspace
    pre-tokenizer that adds no "▁" to text already starting with whitespace, so such text has
    one token fewer than the file alone (and transformers 4) gives."""
    from tokenizers import Tokenizer, pre_tokenizers

    raw = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    assert hf.backend_tokenizer.normalizer is None
    assert isinstance(hf.backend_tokenizer.pre_tokenizer, pre_tokenizers.Metaspace)
    assert raw.encode(" ", add_special_tokens=False).tokens == [SP + SP]
    assert hf.tokenize(" ") == ours.base_tokenize(" ") == [SP]
    assert raw.encode(" hello", add_special_tokens=False).tokens == [SP, SP + "hello"]
    assert hf.tokenize(" hello") == ours.base_tokenize(" hello") == [SP + "hello"]
    assert ours("hello") == ours(" hello") == ref_ids(hf, " hello")
    differ = [t for t in CASES if hf.tokenize(t) != raw.encode(t, add_special_tokens=False).tokens]
    assert " 你好" in differ and "  leading and trailing spaces  " in differ and "Hello world" not in differ


def ref_ids(hf, text):
    return mask_multichar_chinese_tokens(hf)(text)


def test_properties(hf, ours):
    assert ours.vocab_size == len(hf) == DEFAULT_VOCAB_SIZE
    assert (ours.unk_id, ours.bos_id, ours.eos_id) == (hf.unk_token_id, hf.bos_token_id, hf.eos_token_id)
    assert (ours.unk_id, ours.bos_id, ours.eos_id) == (0, 1, 2)
    assert ours.multichar_tokens == mask_multichar_chinese_tokens(hf).multichar_tokens


@pytest.mark.parametrize("text", CASES, ids=range(len(CASES)))
def test_parity(text, ref, ours):
    assert ours.tokenize(text) == ref.tokenize(text)
    assert ours(text) == ref(text)


def test_reference_quirks(ours, ref):
    ids = ours.backend.token_to_id
    # "▁你好" is split and its "▁" dropped: the word-boundary marker disappears.
    assert ours.base_tokenize("你好世界") == [SP + "你好", "世界"]
    assert ours("你好世界") == [ids(c) for c in "你好世界"]
    assert ours("Hello 你好") == [ids(SP + "Hello"), ids("你"), ids("好")]
    # "▁谢谢" stays whole: "谢谢" is not itself a vocabulary token.
    assert ours("谢谢") == [ids(SP + "谢谢")]
    # "▁中" stays whole: one character after removing "▁".
    assert ours("我 中") == [ids(SP + "我"), ids(SP + "中")]
    # Every "▁" is removed before the lookup, not just a leading one.
    assert ours.base_tokenize("  中国") == [SP + SP + "中国"]
    assert ours("  中国") == [ids("中"), ids("国")]
    # A multi-character token whose characters are not in the vocabulary: the
    # split characters become <unk>.
    assert ours.base_tokenize("龘靐") == ["龘靐"]
    assert ours("龘靐") == [0, 0]
    # Special-token strings in text are matched as added tokens.
    assert ours("<s>") == [1]
    assert ours("<|audio_start|>") == [101]
    for text in ("你好世界", "Hello 你好", "谢谢", "我 中", "  中国", "龘靐"):
        assert ours(text) == ref(text)


def test_non_str_input(ours, ref):
    for bad in (None, 123, b"bytes", ["a"]):
        with pytest.raises(TypeError):
            ours(bad)
        with pytest.raises(ValueError):  # the reference wraps its TypeError in ValueError
            ours(bad)
        with pytest.raises(ValueError):
            ref(bad)


def _random_strings(n, seed=20240601):
    rng = random.Random(seed)
    pieces = (
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        + list(" \t\n\r.,!?;:'\"()[]<>-_/\\@#$%&*+=~`^|{}")
        + list("你好世界中国我们今天天气很错谢再见说温柔的女声男音乐是一个人不了")
        + list("，。！？、：；“”（）《》…—")
        + list("龘靐éüßñ😀🎉👍あア한")
        + [SP, "  ", "   ", "\n\n"]
        + ["你好", "世界", "今天天气", "谢谢", "中国人", "我们", "温柔", "女声"]
        + ["hello", "Hello", "world", "the", "ing", "tion", "VoxCPM", "café"]
        + ["<s>", "</s>", "<unk>", "<|audio_start|>", "<|ref_audio_end|>", "<|im_end|>", "龘靐", "<0x41>"]
    )
    out = []
    for _ in range(n):
        k = rng.randint(0, 24)
        out.append("".join(rng.choice(pieces) for _ in range(k)))
    return out


def test_random_parity(ours, ref):
    strings = _random_strings(300)
    assert len(set(strings)) > 250
    mismatches = [(s, ours(s), ref(s)) for s in strings if ours(s) != ref(s)]
    assert not mismatches, mismatches[:5]


# --- tokenizer directories that differ from the tiny one ----------------------------


def _variant(src, dst, edit_tok=None, edit_cfg=None, extra_files=None):
    os.makedirs(dst)
    for name, edit in (("tokenizer.json", edit_tok), ("tokenizer_config.json", edit_cfg)):
        with open(os.path.join(src, name), encoding="utf-8") as f:
            data = json.load(f)
        if edit is not None:
            edit(data)  # in place
        with open(os.path.join(dst, name), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
    for name, content in (extra_files or {}).items():
        with open(os.path.join(dst, name), "w", encoding="utf-8") as f:
            json.dump(content, f, ensure_ascii=False)
    return dst


def _set(d, **kw):
    d.update(kw)


def _minicpm_like(cfg):
    cfg["eos_token"] = "<|im_end|>"
    cfg["additional_special_tokens"] = ["<|im_start|>", "<|im_end|>"]


def _renormalize_audio(cfg):
    # Config attributes differ from tokenizer.json: transformers re-adds the
    # token with these (lstrip/rstrip change how surrounding spaces are eaten).
    cfg["added_tokens_decoder"]["101"].update(lstrip=True, rstrip=True)
    cfg["added_tokens_decoder"]["102"].update(normalized=True, special=False)


def _no_decoder_with_stm(cfg):
    del cfg["added_tokens_decoder"]
    cfg.pop("bos_token")


def _metaspace(tok):
    tok["normalizer"] = None
    tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": False}


def _bytelevel_pre(tok):
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Isolated", "invert": False}]}


def _padded_truncated(tok):
    tok["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    tok["padding"] = {"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": None,
                      "pad_id": 2, "pad_type_id": 0, "pad_token": "</s>"}


def _string_merges(tok):
    tok["model"]["merges"] = [" ".join(m) for m in tok["model"]["merges"]]


VARIANTS = {
    "minicpm_like_eos": dict(edit_cfg=_minicpm_like),
    "defaults_for_missing_keys": dict(edit_cfg=lambda c: [c.pop(k) for k in ("unk_token", "bos_token", "eos_token")]),
    "unk_not_in_vocab": dict(edit_cfg=lambda c: _set(c, unk_token="<unk_new>")),
    "new_additional_special": dict(edit_cfg=lambda c: _set(c, additional_special_tokens=["<|new|>", "你好"])),
    "pad_token_string": dict(edit_cfg=lambda c: _set(c, pad_token="<pad>")),
    "bos_as_addedtoken_dict": dict(edit_cfg=lambda c: _set(c, bos_token={
        "__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": True})),
    "config_attrs_override": dict(edit_cfg=_renormalize_audio),
    "split_special_tokens": dict(edit_cfg=lambda c: _set(c, split_special_tokens=True)),
    "special_tokens_map_only": dict(edit_cfg=_no_decoder_with_stm, extra_files={"special_tokens_map.json": {
        "bos_token": {"content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "additional_special_tokens": ["<|audio_start|>", "<|extra|>"]}}),
    "metaspace_pre_tokenizer": dict(edit_tok=_metaspace),
    "split_pre_tokenizer": dict(edit_tok=_bytelevel_pre),
    "padding_truncation_in_json": dict(edit_tok=_padded_truncated),
    "string_merges": dict(edit_tok=_string_merges),
    "legacy_false": dict(edit_cfg=lambda c: _set(c, legacy=False)),
    "add_prefix_space_null": dict(edit_cfg=lambda c: _set(c, add_prefix_space=None)),
    "add_prefix_space_true": dict(edit_cfg=lambda c: _set(c, add_prefix_space=True)),
    "add_prefix_space_false": dict(edit_cfg=lambda c: _set(c, add_prefix_space=False)),
    "add_prefix_space_false_legacy_false": dict(edit_cfg=lambda c: _set(c, add_prefix_space=False, legacy=False)),
    "from_slow": dict(edit_cfg=lambda c: _set(c, from_slow=True)),
    "bos_null": dict(edit_cfg=lambda c: _set(c, bos_token=None)),
    "add_bos_eos_flipped": dict(edit_cfg=lambda c: _set(c, add_bos_token=False, add_eos_token=True)),
    # transformers 5 reads <dir>/tokenizer.json whatever the config's tokenizer_file says.
    "tokenizer_file_null": dict(edit_cfg=lambda c: _set(c, tokenizer_file=None)),
    "tokenizer_file_elsewhere": dict(edit_cfg=lambda c: _set(c, tokenizer_file="/nonexistent/tokenizer.json")),
    "model_specific_token": dict(edit_cfg=lambda c: _set(c, audio_token="<|audio|>")),
    "no_post_processor": dict(edit_tok=lambda t: _set(t, post_processor=None)),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_config_variants(name, tok_dir, tmp_path):
    d = _variant(tok_dir, str(tmp_path / name), **VARIANTS[name])
    hf = LlamaTokenizerFast.from_pretrained(d)
    ref = mask_multichar_chinese_tokens(hf)
    ours = TextTokenizer.from_dir(d)
    hf.tokenize("")  # switches off tokenizer.json's truncation/padding, as every tokenize() call does
    assert ours.backend.to_str() == hf.backend_tokenizer.to_str()
    assert (ours.unk_id, ours.bos_id, ours.eos_id) == (hf.unk_token_id, hf.bos_token_id, hf.eos_token_id)
    assert ours.vocab_size == len(hf)
    for text in CASES + _random_strings(60, seed=7) + ["<unk_new>", "<pad>", "<|new|>", "<|extra|>", "<|audio|>"]:
        assert ours(text) == ref(text), text


# --- loading errors (what the server's tokenizer model meets at load: TextTokenizer.from_dir) ----


def test_load_errors(tok_dir, tmp_path):
    with pytest.raises(TokenizerFileError, match="directory not found"):
        TextTokenizer.from_dir(str(tmp_path / "nope"))

    def case(name, files):
        d = tmp_path / name
        d.mkdir()
        for fname, content in files.items():
            (d / fname).write_bytes(content)
        return str(d)

    with open(os.path.join(tok_dir, "tokenizer.json"), "rb") as f:
        tj = f.read()
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "rb") as f:
        cj = f.read()
    bad = {
        "no_tokenizer_json": ({"tokenizer_config.json": cj}, "tokenizer.json not found"),
        "no_config": ({"tokenizer.json": tj}, "tokenizer_config.json not found"),
        "tokenizer_json_garbage": ({"tokenizer.json": b"{nope", "tokenizer_config.json": cj},
                                   "tokenizer.json is not valid"),
        "tokenizer_json_wrong_layout": ({"tokenizer.json": b'{"model": 3}', "tokenizer_config.json": cj},
                                        "tokenizer.json cannot be loaded"),
        "config_garbage": ({"tokenizer.json": tj, "tokenizer_config.json": b"\xff\xfe"},
                           "tokenizer_config.json is not valid"),
        "config_not_object": ({"tokenizer.json": tj, "tokenizer_config.json": b"[]"},
                              "tokenizer_config.json must hold"),
        "not_bpe": ({"tokenizer.json": json.dumps({"model": {"type": "WordLevel", "vocab": {"<unk>": 0},
                                                              "unk_token": "<unk>"}}).encode(),
                     "tokenizer_config.json": cj}, "must be BPE"),
        "fast_tokenizer_files": ({"tokenizer.json": tj, "tokenizer_config.json": json.dumps(
            dict(json.loads(cj), fast_tokenizer_files=["tokenizer.4.0.json"])).encode()}, "fast_tokenizer_files"),
        "fix_mistral_regex": ({"tokenizer.json": tj, "tokenizer_config.json": json.dumps(
            dict(json.loads(cj), fix_mistral_regex=True)).encode()}, "fix_mistral_regex"),
        "bad_special": ({"tokenizer.json": tj, "tokenizer_config.json": json.dumps(
            dict(json.loads(cj), eos_token=5)).encode()}, "eos_token"),
        "bad_extra_special": ({"tokenizer.json": tj, "tokenizer_config.json": json.dumps(
            dict(json.loads(cj), additional_special_tokens=[{"content": "<x>"}])).encode()},
            "extra_special_tokens"),
        "split_special_not_bool": ({"tokenizer.json": tj, "tokenizer_config.json": json.dumps(
            dict(json.loads(cj), split_special_tokens="yes")).encode()}, "split_special_tokens"),
    }
    for name, (files, msg) in bad.items():
        d = case(name, files)
        with pytest.raises(TokenizerFileError, match=msg) as info:
            TextTokenizer.from_dir(d)
        assert d in str(info.value)  # the message names the offending file's path
        assert isinstance(info.value, ValueError)


def test_no_unk_token(tok_dir, tmp_path):
    d = _variant(tok_dir, str(tmp_path / "nounk"), edit_cfg=lambda c: _set(c, unk_token=None))
    ours = TextTokenizer.from_dir(d)
    assert ours.unk_id is None
    assert ours("hello") == mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(d))("hello")
    with pytest.raises(ValueError, match="unk"):
        ours("龘靐")  # the reference would return [None, None]


def test_module_does_not_import_transformers(tmp_path):
    path = os.path.join(os.path.dirname(__file__), os.pardir, "python_backend", "voxcpm_triton", "formats", "tokenizer.py")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('tok', {os.path.abspath(path)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"t = m.TextTokenizer.from_dir(sys.argv[1]); t('你好 hello')\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
    )
    write_tiny_tokenizer(str(tmp_path))
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=60)


def test_config_tokenizer_file_naming_itself(tok_dir, tmp_path):
    d = str(tmp_path / "self")
    _variant(tok_dir, d, edit_cfg=lambda c: _set(c, tokenizer_file=os.path.join(d, "tokenizer.json")))
    ref = mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(d))
    ours = TextTokenizer.from_dir(d)
    for text in CASES:
        assert ours(text) == ref(text), text
