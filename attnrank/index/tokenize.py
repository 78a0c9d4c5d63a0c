"""BM25 tokenization: NFKC → lowercase → word tokens → stopword removal → optional Porter stemming.

The defaults follow Lucene's ``EnglishAnalyzer`` as used by Pyserini's BM25 baselines (the
published SciFact BM25-flat figure): its 33 English stopwords and the Porter stemmer. Tokens
are words by the word rule below (maximal runs of Unicode word characters, ``\\w+``, in indexes
built before it); possessive ``'s`` is dropped as Lucene does. Stemming uses PyStemmer (the
``stem`` extra); ``stemmer="auto"`` uses it when it is installed and otherwise indexes unstemmed,
recording the choice in the index manifest.
Unicode NFKC normalisation (new indexes since 2026-12-05, recorded as ``unicode``) makes a
decomposed "café" (e + combining accent) or full-width letters the same terms as the composed,
ASCII-width text; an index built before it keeps its terms (``unicode="none"``), and its queries
are tokenized the same way.

Word rule (new indexes since 2026-12-06, recorded as ``words="scripts"``): a term is a letter,
digit or ``_`` followed by a run of letters, combining marks, digits and ``_``, and each Han
ideograph or hiragana character is a term of its own, as Lucene's StandardTokenizer (UAX #29)
makes them; a lowered "İ" (i + combining dot) reads as "i". Python's ``\\w`` leaves combining
marks and vowel signs out, so ``\\w+`` cut Devanagari, Thai or voweled Arabic words into letters
("हिन्दी" into ह, न, द), and read a Chinese or Japanese sentence, written without spaces, as one
term that no query matched. Emoji variation selectors and enclosing marks are dropped ("1️⃣" is
"1"). As in StandardTokenizer, a Thai run without spaces stays one term and Arabic vowel marks stay
in their word (Lucene's Thai and Arabic analyzers segment and strip them; this does neither). An
index built before it keeps ``\\w+`` (``words="w"``). On the four benchmark datasets' texts both
rules give the same terms but for HotpotQA's 82 with "İ".
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import regex

from ..errors import InputError, require

logger = logging.getLogger(__name__)

# Lucene EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (the set Pyserini's default analyzer uses).
LUCENE_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    ]
)
_TOKEN = re.compile(r"\w+", re.UNICODE)
# (the regex package, which transformers needs, has Unicode's script and mark classes; re has not)
# (a mark continues a word, never starts one: an emoji's variation selector or a stray accent is no term)
_SCRIPT_TOKEN = regex.compile(
    r"[\p{Han}\p{Hiragana}]|[[\p{L}\p{N}_]--[\p{Han}\p{Hiragana}]][[\p{L}\p{M}\p{N}_]--[\p{Han}\p{Hiragana}]]*",
    regex.V1,
)
UNICODE_FORMS = ("nfkc", "none")
WORD_RULES = ("scripts", "w")
STOPWORD_LISTS = ("lucene", "sklearn", "none")
STEMMERS = ("porter", "none")
_POSSESSIVE = re.compile(r"(\w)['’]s\b", re.UNICODE)
_SCRIPT_POSSESSIVE = regex.compile(r"([\p{L}\p{M}\p{N}_])['’]s\b")  # ("हिन्दी's": its last letter is a mark)
# emoji presentation: variation selectors and enclosing marks ("1️⃣" is 1, U+FE0F, U+20E3) are no part of a word
_PRESENTATION = regex.compile(r"[\p{Me}\uFE00-\uFE0F\U000E0100-\U000E01EF]")


@dataclass(frozen=True)
class TokenizerConfig:
    """How text becomes BM25 terms; stored in the index manifest so queries match the index."""

    lowercase: bool = True
    stopwords: str = "lucene"  # "lucene" (33 words), "sklearn" (318 words) or "none"
    stemmer: str = "porter"  # "porter" or "none"
    unicode: str = "none"  # "nfkc" (new indexes: resolve_config) or "none" (as indexes built before it)
    words: str = "w"  # "scripts" (new indexes: resolve_config) or "w" (as indexes built before it)

    def __post_init__(self) -> None:
        if self.unicode not in UNICODE_FORMS:
            raise InputError(f"unicode={self.unicode!r} is not one of {', '.join(UNICODE_FORMS)}")
        if self.words not in WORD_RULES:
            raise InputError(f"words={self.words!r} is not one of {', '.join(WORD_RULES)}")

    def to_dict(self) -> dict:
        """The stored form; ``unicode="none"`` and ``words="w"`` are left out, so an index built
        before the settings existed writes, and is checked against, exactly the manifest it was built with."""
        stored = asdict(self)
        for name, before in (("unicode", "none"), ("words", "w")):
            if stored[name] == before:
                del stored[name]
        return stored


def check_names(stopwords: str, stemmer: str) -> None:
    """The stopword list and stemmer a user chose, each named with the allowed values."""
    if stopwords not in STOPWORD_LISTS:
        raise InputError(f"stopwords {stopwords!r} is not one of {', '.join(STOPWORD_LISTS)}")
    if stemmer not in ("auto", *STEMMERS):
        raise InputError(f"stemmer {stemmer!r} is not one of auto, {', '.join(STEMMERS)}")


def resolve_config(stopwords: str = "lucene", stemmer: str = "auto") -> TokenizerConfig:
    """Turn user choices into a concrete config (``stemmer="auto"`` → porter if available)."""
    check_names(stopwords, stemmer)
    if stemmer == "auto":
        stemmer = "porter" if _has_stemmer() else "none"
    return TokenizerConfig(stopwords=stopwords, stemmer=stemmer, unicode="nfkc", words="scripts")


@functools.cache
def _has_stemmer() -> bool:
    """Whether PyStemmer imports; warned once per process where it does not."""
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        logger.warning(
            "PyStemmer is not installed: BM25 makes its terms without stemming "
            "(install 'attnrank[stem]' for Porter stemming, as Pyserini does and every preset was measured)"
        )
        return False
    return True


def _stopword_set(name: str) -> frozenset[str]:
    if name == "lucene":
        return LUCENE_STOPWORDS
    if name == "sklearn":
        text = require("sklearn.feature_extraction.text", "train", "the 'sklearn' BM25 stopword list")
        return frozenset(text.ENGLISH_STOP_WORDS)
    return frozenset()


def make_tokenizer(config: TokenizerConfig) -> Callable[[str], list[str]]:
    """A function ``text -> list of terms`` for ``config``."""
    stop = _stopword_set(config.stopwords)
    stem_words: Callable[[list[str]], list[str]] | None = None
    scripts = config.words == "scripts"  # (the word rule, decided once: every text of a corpus passes here)
    pattern, possessive = (_SCRIPT_TOKEN, _SCRIPT_POSSESSIVE) if scripts else (_TOKEN, _POSSESSIVE)
    if config.stemmer == "porter":
        Stemmer = require("Stemmer", "stem", "Porter stemming for BM25")
        stem_words = Stemmer.Stemmer("porter").stemWords

    def tokenize(text: str) -> list[str]:
        if config.unicode == "nfkc":
            text = unicodedata.normalize("NFKC", text)
        if config.lowercase:
            text = text.lower()
            if scripts:  # (İ lowers to i + a combining dot: "İzmir" as "izmir", as Lucene lowers it)
                text = text.replace("i\u0307", "i")
        if scripts:
            text = _PRESENTATION.sub("", text)
        words = [w for w in pattern.findall(possessive.sub(r"\1", text)) if w not in stop]
        return stem_words(words) if stem_words else words

    return tokenize


def tokenize_all(texts: Iterable[str], config: TokenizerConfig) -> list[list[str]]:
    tok = make_tokenizer(config)
    return [tok(t) for t in texts]
