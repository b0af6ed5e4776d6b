"""Opt-in text normalisation (``NORMALIZE`` on `tts`/`tts_stream`, ``normalize=True`` offline):
numbers, dates, currencies, units and symbols written out as words, as the reference's
``VoxCPM.generate(normalize=True)`` does with ``voxcpm.utils.text_normalize.TextNormalizer``.

The reference's steps, in its order:

1. the language: Chinese when the text holds a character in U+4E00..U+9FFF, else English
   (looked at before any clean-up);
2. clean-up: Markdown (fenced and inline code and images dropped, links reduced to their text,
   list dashes and heading marks dropped, HTML tags dropped, blank lines squeezed, ends
   stripped), then emoji dropped, newlines and tabs made spaces, curly double quotes made
   straight;
3. Chinese: "=" read as 等于; when the text holds a digit or one of ``$%^*_+≥≤≠×÷?=``, a "-"
   between a letter or digit and a digit is spaced out (so ``x-2`` is not read as "x negative
   2"); wetext's Chinese text normalisation (erhua removed); spaces kept only between two
   ASCII characters; ² ³ √ ≈ < spelled out; （ ） 【 】 and —— made spaces, backticks dropped;
4. English: wetext's English text normalisation, then any digits left spelled out by inflect.

One departure: where wetext's English grammar fails on a text with two spaces in a row (step 2
leaves them where it drops an emoji between words), the reference fails; here the spaces are
squeezed and the text normalised again. Every text the reference normalises comes out the same.

`wetext` ships its grammars as FST files inside its wheel and reads only those: nothing is
downloaded. The engines are built on first use, once per process (`normalizer()`).
"""

from __future__ import annotations

import itertools
import re
import threading

from ..checks import blank

__all__ = ["NormalizationError", "TextNormalizer", "normalize", "normalize_target", "normalizer"]

_CJK = re.compile("[\u4e00-\u9fff]")

# (pattern, replacement) applied in order.
_MARKDOWN = (
    (re.compile(r"```.*?```", re.DOTALL), ""),  # fenced code
    (re.compile(r"`[^`]*`"), ""),  # inline code
    (re.compile(r"!\[[^\]]*\]\([^)]+\)"), ""),  # images
    (re.compile(r"\[([^\]]+)\]\([^)]+\)"), r"\1"),  # links: their text
    (re.compile(r"^(\s*)-\s+", re.MULTILINE), r"\1"),  # list dashes
    (re.compile(r"<[^>]+>"), ""),  # HTML tags
    (re.compile(r"^#{1,6}\s*", re.MULTILINE), ""),  # heading marks
    (re.compile(r"\n\s*\n"), "\n"),  # blank lines
)
_PLAIN = str.maketrans({"\n": " ", "\t": " ", "\u201c": '"', "\u201d": '"'})

_SPACES = re.compile(" {2,}")

# Chinese
_MATH_HINT = re.compile(r"[\d$%^*_+≥≤≠×÷?=]")
_MINUS = re.compile(r"(?<=[a-zA-Z0-9])-(?=\d)")
# A space survives only with an ASCII non-space character on both sides.
_ASCII_NON_SPACE = "[\x00-\x1f\x21-\x7f]"
_LONE_SPACE = re.compile(f" (?!{_ASCII_NON_SPACE})|(?<!{_ASCII_NON_SPACE}) ")
_ZH_SYMBOLS = str.maketrans({"²": "平方", "³": "立方", "√": "根号", "≈": "约等于", "<": "小于",
                             "（": " ", "）": " ", "【": " ", "】": " ", "`": ""})


class NormalizationError(ValueError):
    """The normaliser could not process a text (wetext fails on some symbol sequences)."""


class TextNormalizer:
    """wetext's Chinese and English normalisers and an inflect engine. Calls are serialised: the
    engines are not documented as thread-safe, and a call takes milliseconds."""

    def __init__(self):
        try:
            import inflect
            import regex
            from wetext import Normalizer
        except ImportError as e:
            raise RuntimeError(f"text normalisation needs the wetext, inflect and regex packages "
                               f"(requirements.txt): {e}") from e

        self._zh = Normalizer(lang="zh", operator="tn", remove_erhua=True)
        self._en = Normalizer(lang="en", operator="tn")
        self._inflect = inflect.engine()
        self._emoji = regex.compile(r"\p{Emoji_Presentation}|\p{Emoji}\uFE0F")
        self._lock = threading.Lock()

    def __call__(self, text: str) -> str:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        chinese = _CJK.search(text) is not None
        text = self._clean(text)
        with self._lock:
            try:
                return self._chinese(text) if chinese else self._english(text)
            except Exception as e:  # wetext asserts, with no message, on inputs its grammar cannot parse
                detail = f" ({type(e).__name__}: {e})" if str(e) else ""
                raise NormalizationError(f"text normalisation failed: wetext's {'Chinese' if chinese else 'English'} "
                                         f"grammar cannot parse this text{detail}") from e

    def _clean(self, text: str) -> str:
        for pattern, repl in _MARKDOWN:
            text = pattern.sub(repl, text)
        text = self._emoji.sub("", text.strip())
        return text.translate(_PLAIN)

    def _chinese(self, text: str) -> str:
        text = text.replace("=", "等于")
        if _MATH_HINT.search(text):
            text = _MINUS.sub(" - ", text)
        text = self._zh.normalize(text)
        text = _LONE_SPACE.sub("", text)
        return text.translate(_ZH_SYMBOLS).replace("——", " ")

    def _english(self, text: str) -> str:
        try:
            text = self._en.normalize(text)
        except AssertionError:
            # wetext's English grammar often fails on two spaces in a row, which the clean-up
            # leaves where it drops an emoji or an image between words ("Hi 😀 there"). The
            # reference fails there; squeezing them gives what it gives for the squeezed text.
            squeezed = _SPACES.sub(" ", text)
            if squeezed == text:
                raise
            text = self._en.normalize(squeezed)
        # str.isdigit, not \d: superscripts and circled digits count too, as in the reference.
        return "".join(self._inflect.number_to_words(run) if digits else run
                       for digits, run in ((d, "".join(g)) for d, g in itertools.groupby(text, str.isdigit)))


_instance: TextNormalizer | None = None
_instance_lock = threading.Lock()


def normalizer() -> TextNormalizer:
    """This process's normaliser, built on first use (wetext loads its FSTs then)."""
    global _instance
    if _instance is None:
        with _instance_lock:
            if _instance is None:
                _instance = TextNormalizer()
    return _instance


def normalize(text: str) -> str:
    """`text` normalised as the reference's TextNormalizer.normalize does it."""
    return normalizer()(text)


def normalize_target(text: str) -> str:
    """The text to speak, normalised. Unlike the reference, which would go on with an empty text,
    a text with nothing left to speak (only emoji, say) is an error."""
    out = normalize(text)
    if blank(out):
        raise NormalizationError("nothing is left to speak after text normalisation")
    return out
