"""Write a tiny, deterministic Llama/MiniCPM-style tokenizer directory.

Tests and the tiny end-to-end model need a tokenizer with the same *shape* as
VoxCPM2's (MiniCPM4) one without shipping the real 73k-entry vocabulary:

* ``tokenizer.json`` in the layout that ``transformers`` writes for a
  sentencepiece-converted Llama tokenizer ("legacy" layout): normalizer
  ``Sequence[Prepend("▁"), Replace(" " -> "▁")]``, no pre-tokenizer, a BPE model
  with ``byte_fallback=True``, ``fuse_unk=True`` and the 256 ``<0xNN>`` byte
  tokens, a ``TemplateProcessing`` post-processor that prepends ``<s>``, and the
  usual Replace/ByteFallback/Fuse/Strip decoder.
* ``tokenizer_config.json`` as ``save_pretrained`` writes it for
  ``LlamaTokenizerFast`` (``added_tokens_decoder``, ``bos/eos/unk``,
  ``add_bos_token``/``add_eos_token``...).

Id layout (``V`` = ``vocab_size``)::

    0 <unk>   1 <s>   2 </s>                      added, special
    3..100    <reserved_N>                         plain vocabulary, unreachable
    101..104  <|audio_start|> <|audio_end|>        added, special: VoxCPM2 uses
              <|ref_audio_start|> <|ref_audio_end|>  these ids as raw ids
    105..360  <0x00>..<0xFF>                       byte-fallback tokens
    361..     "▁", ASCII, CJK characters, subwords, words, merge intermediates
    ..V-4     <reserved_pad_N> padding up to V (unreachable)
    V-3       龘靐          added, NOT special: a multi-character CJK token whose
                            characters are not in the vocabulary (see below)
    V-2       <|im_start|>  added, special
    V-1       <|im_end|>    added, special

What the vocabulary exercises in VoxCPM's ``mask_multichar_chinese_tokens``
wrapper: multi-character CJK tokens (``你好``, ``世界``, ``今天天气``...),
``▁``-prefixed multi-character CJK tokens whose bare form is also a token
(``▁你好``: the wrapper splits it and drops the ``▁``), ``▁``-prefixed ones
whose bare form is *not* a token (``▁谢谢``: kept whole), ``▁`` + one CJK
character (``▁中``: kept), ``▁▁中国`` (every "▁" is removed before the lookup, so it
is split), and the added token ``龘靐`` whose characters are not
in the vocabulary (the wrapper splits it into two characters that
``convert_tokens_to_ids`` maps to ``<unk>``).

``tokenizer_config.json`` choices, as transformers 5's ``LlamaTokenizer`` reads
them (it keeps only the vocabulary, merges and post-processor of tokenizer.json
and builds its own Metaspace pre-tokenizer, see ``formats/tokenizer.py``):

* no ``add_prefix_space`` key: a "▁" is prepended to the text.
* ``legacy: true``: that "▁" is also prepended to text following an added
  token (prepend scheme ``always``), as this file's sentencepiece-style
  Prepend normalizer does; ``false`` would prepend at the start only.
* ``add_bos_token: true``/``add_eos_token: false``: dropped when a
  tokenizer.json exists; its post-processor (``<s>`` first) serves
  ``encode(add_special_tokens=True)``; ``tokenize()`` (which VoxCPM uses) never
  adds special tokens.

Only the ``tokenizers`` library is used, to check that the written file loads.
The output is byte-identical from run to run.
"""

from __future__ import annotations

import json
import os

__all__ = ["write_tiny_tokenizer", "DEFAULT_VOCAB_SIZE", "AUDIO_TOKENS"]

DEFAULT_VOCAB_SIZE = 2048

SPIECE_UNDERLINE = "\u2581"  # "▁"

# VoxCPM2 feeds these raw ids to the model (voxcpm2.py: 101..104).
AUDIO_TOKENS = {
    101: "<|audio_start|>",
    102: "<|audio_end|>",
    103: "<|ref_audio_start|>",
    104: "<|ref_audio_end|>",
}

_BYTE_BASE = 105
# Added (non-special) token whose characters are deliberately not in the vocab.
_UNK_QUIRK_TOKEN = "龘靐"
_TAIL_SPECIALS = ("<|im_start|>", "<|im_end|>")

# A few hundred common Chinese characters (duplicates are removed in order).
_CJK_CHARS = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可"
    "她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三"
    "已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明社西者正新向力情四完间相被世界"
    "气今工加电话少问题它门重题期物果表第最爱走吗再思给路应关口白色难百信次通活亲女声音温柔男孩"
    "读书写字语言名叫朋友欢迎谢请听北京上海城市东南海山水火风雨雪春夏秋冬早晚饭菜茶酒钱买卖车站"
    "飞机票快慢远近左右先每位先生姐妹哥弟爸妈儿孙王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁"
    "谁哪怎呢吧啊哦嗯喂请让教认识准备开始结束今天明天昨天现在时候分钟小时星期号岁公司工作医院"
    "学校老师同学考试问题答案意思知道觉得希望喜欢需要可能应该已经一直非常特别真正其实因为所以"
    "但是如果虽然而且或者还是除了只有关于通过根据为了比较更加最后首先然后终于突然马上刚才"
    "化科技术研究发展经济政治历史地理物理数学音乐电影游戏运动体育健康身体眼睛耳朵鼻子嘴巴"
    "深浅红绿蓝紫黑灰金银铁木土石花草树叶鸟鱼狗猫牛羊猪鸡龙虎"
)

# Multi-character CJK vocabulary entries (all characters are also single tokens).
_CJK_WORDS = (
    "你好", "世界", "中国", "我们", "今天", "天气", "今天天气", "你们", "他们", "什么",
    "没有", "知道", "时候", "现在", "北京", "上海", "朋友", "欢迎", "学生", "老师",
    "喜欢", "音乐", "电影", "问题", "工作", "可以", "因为", "所以", "但是", "如果",
    "温柔", "女声", "男声", "声音", "非常", "特别", "已经", "中国人", "一个", "这个",
    "那个", "不是", "就是", "还是", "自己", "大家", "明天", "昨天", "再说",
)

# "▁" + word where the bare word is also a token: the wrapper splits these.
_SP_CJK_WORDS = ("你好", "我们", "今天", "中国", "北京", "世界", "今天天气", "这个")
# "▁" + word where the bare word is NOT a token: the wrapper keeps these whole.
_SP_CJK_ONLY = ("谢谢", "再见")
# "▁" + one character: never split (length 1 after stripping "▁").
_SP_CJK_SINGLE = "中我你他这是在有不了的一大上"

_ENGLISH_WORDS = (
    "the", "and", "to", "of", "a", "in", "is", "it", "you", "that", "he", "was", "for",
    "on", "are", "with", "as", "I", "his", "they", "be", "at", "one", "have", "this",
    "from", "or", "had", "by", "not", "but", "what", "all", "were", "we", "when", "your",
    "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their",
    "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so",
    "hello", "Hello", "world", "World", "good", "morning", "today", "weather", "nice",
    "speech", "voice", "text", "model", "test", "The", "This", "It", "We", "How",
    "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "VoxCPM", "Triton",
    "gentle", "female", "male", "warm", "happy", "sad", "very", "well", "time", "day",
)
_ENGLISH_SUFFIXES = (
    "ing", "ed", "er", "tion", "ly", "es", "s", "ment", "ness", "able", "est", "ous",
    "th", "st", "an", "en", "on", "in", "re", "at", "or", "al", "ar", "it", "ic",
)
_OTHER_TOKENS = (
    "▁▁", "▁▁▁▁", "▁▁▁▁▁▁▁▁", "▁1", "▁2", "▁20", "▁19", "00", "...", "▁(", "▁-", "▁\"",
    ").", "),", "'s", "▁'", "▁[", "▁<", "▁>", "▁@", "▁#", "▁$", "▁%", "▁&", "▁*",
    "，", "。", "！", "？", "、", "：", "；", "“", "”", "（", "）", "《", "》", "…", "—",
    "▁，", "▁。", "é", "ü", "ß", "ñ", "café",
)


def _cjk(c: str) -> bool:
    return "\u4e00" <= c <= "\u9fff"


def _unique(seq):
    seen = set()
    out = []
    for x in seq:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


class _VocabBuilder:
    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.merges: list[tuple[str, str]] = []
        self._ranks: dict[tuple[str, str], int] = {}

    def add(self, tok: str) -> None:
        if tok not in self.vocab:
            self.vocab[tok] = len(self.vocab)

    def merge(self, left: str, right: str) -> None:
        """Add the merge ``left right`` (both parts must already be tokens)."""
        assert left in self.vocab and right in self.vocab, (left, right)
        self.add(left + right)
        if (left, right) not in self._ranks:
            self._ranks[(left, right)] = len(self.merges)
            self.merges.append((left, right))

    def segment(self, text: str) -> list[str]:
        """BPE with the merges so far: merge the lowest-ranked adjacent pair
        (leftmost on ties) until none applies."""
        ranks = self._ranks
        syms = list(text)
        while len(syms) > 1:
            best = None
            for i in range(len(syms) - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            syms[i : i + 2] = [syms[i] + syms[i + 1]]
        return syms

    def compose(self, tok: str) -> None:
        """Make ``tok`` the BPE result for the isolated string ``tok``: segment
        it with the merges so far, then append left-to-right merges of those
        segments (new merges rank last, so the earlier segmentation holds)."""
        for c in tok:
            self.add(c)
        segs = self.segment(tok)
        cur = segs[0]
        for nxt in segs[1:]:
            self.merge(cur, nxt)
            cur += nxt


def _build_regular_tokens(b: _VocabBuilder) -> None:
    # Merge ranks follow insertion order, and BPE applies the lowest rank first.
    b.add(SPIECE_UNDERLINE)
    for code in range(0x21, 0x7F):  # printable ASCII except space (space becomes "▁")
        b.add(chr(code))
    cjk_words = list(_CJK_WORDS) + list(_SP_CJK_WORDS) + list(_SP_CJK_ONLY)
    for c in _unique([c for c in _CJK_CHARS if _cjk(c)] + [c for w in cjk_words for c in w]):
        b.add(c)
    for suffix in _ENGLISH_SUFFIXES:
        b.compose(suffix)
    for w in _ENGLISH_WORDS:
        b.compose(w)
        b.compose(SPIECE_UNDERLINE + w)
    for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789":
        b.compose(SPIECE_UNDERLINE + c)
    for w in _CJK_WORDS:  # CJK words outrank every "▁"+CJK merge
        b.compose(w)
    for w in _SP_CJK_WORDS:  # "▁" + an existing word: the wrapper splits these
        b.merge(SPIECE_UNDERLINE, w)
    for w in _SP_CJK_ONLY:  # "▁谢" + "谢": the bare "谢谢" is never a token
        b.compose(SPIECE_UNDERLINE + w[0])
        b.compose(SPIECE_UNDERLINE + w)
    for c in _SP_CJK_SINGLE:
        b.compose(SPIECE_UNDERLINE + c)
    for tok in _OTHER_TOKENS:
        b.compose(tok)
    # Two "▁" before a word: the wrapper removes *every* "▁" before its lookup.
    b.compose(SPIECE_UNDERLINE * 2 + "中国")


def _added(tok_id: int, content: str, special: bool = True, normalized: bool = False) -> dict:
    return {
        "id": tok_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": normalized,
        "special": special,
    }


def _tokenizer_json(vocab: dict[str, int], merges: list[tuple[str, str]], added: list[dict]) -> dict:
    bos = "<s>"
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": SPIECE_UNDERLINE},
                {"type": "Replace", "pattern": {"String": " "}, "content": SPIECE_UNDERLINE},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPIECE_UNDERLINE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, c] for a, c in merges],
        },
    }


def _tokenizer_config(added: list[dict]) -> dict:
    decoder = {}
    for t in added:
        d = {k: v for k, v in t.items() if k != "id"}
        decoder[str(t["id"])] = {k: d[k] for k in sorted(d)}
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [AUDIO_TOKENS[i] for i in sorted(AUDIO_TOKENS)],
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": True,
        "model_max_length": 4096,
        "pad_token": None,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "use_default_system_prompt": False,
    }


def build_tiny_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE) -> tuple[str, str]:
    """Return ``(tokenizer.json text, tokenizer_config.json text)``."""
    b = _VocabBuilder()
    for tok in ("<unk>", "<s>", "</s>"):
        b.add(tok)
    for i in range(3, 101):
        b.add(f"<reserved_{i}>")
    for i in sorted(AUDIO_TOKENS):
        b.add(AUDIO_TOKENS[i])
    assert len(b.vocab) == _BYTE_BASE
    for byte in range(256):
        b.add(f"<0x{byte:02X}>")
    _build_regular_tokens(b)

    tail = [_UNK_QUIRK_TOKEN, *_TAIL_SPECIALS]
    natural = len(b.vocab) + len(tail)
    if not isinstance(vocab_size, int) or vocab_size < natural:
        raise ValueError(f"vocab_size must be an int >= {natural} (the tiny vocabulary's own size), got {vocab_size!r}")
    pad = 0
    while len(b.vocab) < vocab_size - len(tail):
        b.add(f"<reserved_pad_{pad}>")
        pad += 1
    for tok in tail:
        assert tok not in b.vocab
        b.add(tok)
    assert len(b.vocab) == vocab_size
    for c in _UNK_QUIRK_TOKEN:  # the point of that token: its characters are unknown
        assert c not in b.vocab

    v = b.vocab
    added = [_added(v["<unk>"], "<unk>"), _added(v["<s>"], "<s>"), _added(v["</s>"], "</s>")]
    added += [_added(i, AUDIO_TOKENS[i]) for i in sorted(AUDIO_TOKENS)]
    added.append(_added(v[_UNK_QUIRK_TOKEN], _UNK_QUIRK_TOKEN, special=False, normalized=True))
    added += [_added(v[t], t) for t in _TAIL_SPECIALS]

    tok_json = json.dumps(_tokenizer_json(v, b.merges, added), ensure_ascii=False, indent=2) + "\n"
    cfg_json = json.dumps(_tokenizer_config(added), ensure_ascii=False, indent=2) + "\n"
    return tok_json, cfg_json


def write_tiny_tokenizer(out_dir: str, vocab_size: int = DEFAULT_VOCAB_SIZE) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``.

    ``vocab_size`` is the total number of ids (the vocabulary is padded with
    unreachable ``<reserved_pad_N>`` tokens); every id is below it, so it can be
    used directly as the text embedding size of a tiny model.
    """
    from tokenizers import Tokenizer

    tok_json, cfg_json = build_tiny_tokenizer(vocab_size)
    Tokenizer.from_str(tok_json)  # fail here, not in a consumer, if the layout is wrong
    os.makedirs(out_dir, exist_ok=True)
    for name, text in (("tokenizer.json", tok_json), ("tokenizer_config.json", cfg_json)):
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(text.encode("utf-8"))
