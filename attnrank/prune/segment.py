"""Sentence segmentation with exact character spans, the unit of sentence-level context pruning.

Attention-guided pruners keep or drop whole sentences (AttentionRAG, Fang et al., arXiv
2503.10720; Sentinel, Zhang et al., arXiv 2505.23277), so sentences must (1) survive real text and
(2) map back exactly to the source: every :class:`Sentence` satisfies
``text[s.start:s.end] == s.text`` with no leading or trailing whitespace, which lets a pruner
re-emit kept sentences verbatim and map them to prompt tokens through the tokenizer's offsets.

Rules of :func:`split_sentences`, in order:

1. Fenced code blocks (```` ``` ```` or ``~~~``) are never split at periods; they become chunks
   of whole lines of at most ``max_words`` words.
2. Blank lines end paragraphs (Windows ``CRLF`` line ends too). Inside a paragraph a line
   break is a boundary before a list item (``-``, ``*``, ``•``, ``1.``, ``2)``, ``a)``,
   ``[ ]``; a line opening with a name's initial, ``J. Smith``, after a line that stops
   mid-sentence is no list item unless a list item is beside it), around a Markdown heading,
   after a list item unless the next line is indented (a continuation), and after a short
   title-like line (<= 8 words, no final punctuation) followed by a capitalised line; other line
   breaks are soft (hard-wrapped prose).
3. A paragraph with no sentence-final punctuation at all (``.``, ``!``, ``?``, ``…`` followed
   by whitespace or the end, or a CJK ``。！？``, or another script's stop: Devanagari ``।``/``॥``,
   Arabic ``؟``, Urdu ``۔``, Ethiopic ``።``, Myanmar ``။``) is split at every line break instead.
4. Elsewhere a sentence ends at ``.``/``!``/``?``/``…`` runs, with any closing quotes or
   brackets after them, followed by whitespace (none needed after CJK ``。！？`` or the other
   scripts' stops), unless the
   next word starts lowercase; a single period is not a boundary after title/reference
   abbreviations (``Dr.``, ``e.g.``, ``Fig.``, ``St.``, ...), after a list marker (``1.``), and
   after ambiguous ones (``etc.``, ``Inc.``, ``U.S.``, ``Ph.D.``, initials such as ``J. R. R.``,
   months) unless the next word is a common sentence opener ("The", "He", "In", ...). Decimals (``3.5``), ``e.g.``'s inner
   period and URLs have no whitespace after the period, so they never split.
5. Any unit longer than ``max_words`` words is cut into consecutive chunks of at most
   ``max_words`` words (text without any punctuation ends up here). A word is a run without
   whitespace, counted as one word per :data:`WORD_CHARS` (32) characters, so a long URL or a
   run of CJK text without spaces is cut too (inside the run where it alone exceeds the limit).

Pre-split sentences (HotpotQA ships ``sentences``) are located verbatim and in order, at whole
words where they can be, with :func:`locate_sentences`; :func:`segment` picks one or the other.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

logger = logging.getLogger(__name__)

DEFAULT_MAX_WORDS = 64
WORD_CHARS = 32  # characters of a run without spaces counted as one word when sentences are cut to max_words

_OPENERS = "\"'“‘„‚«»([{「『（【《〈"
_CLOSERS = "\"'”’»)]}」』）】》〉"
# German closes quotes with “ and ‘ (and »…« with «), which open them elsewhere: „Nein.“ ended no
# sentence. Taken as closers only where whitespace or the end follows (after a CJK stop, “ opens the
# next sentence: 他说。“你好。”)
_SPACED_CLOSERS = "“‘«"
# Stops of scripts without the Latin period (Devanagari's danda and double danda, the Arabic question
# mark, the Urdu full stop, Ethiopic and Myanmar full stops): sentences of Hindi or Urdu had run into
# 64-word chunks of several hundred tokens, which a pruning budget then skipped whole
_SCRIPT_STOPS = "।॥؟۔።။"
_CJK_STOPS = "。！？｡．" + _SCRIPT_STOPS  # CJK text puts no space after a sentence: these end one without it
# (the fullwidth full stop of Japanese technical writing only after kana or a kanji: "３．１４",
# "１．はじめに" and "Ｖｅｒ．２" keep theirs)
_STOP = r"(?:[。！？｡" + _SCRIPT_STOPS + r"]|(?<=[\u3040-\u30ff\u3400-\u9fff])．)"
# French sets its closing guillemet after a space ("« Non. » Puis"): taken where the space or the
# end follows it (German's »Nein« opens with it: "sagte. »Nein" keeps its split before »)
_END = re.compile(
    r"(?:[.!?…]|"
    + _STOP
    + r")+(?:[ \u00a0\u202f][»›](?=\s|$))?["
    + re.escape(_CLOSERS)
    + r"]*"
    + r"(?:["
    + _SPACED_CLOSERS
    + r"](?=\s|$))?"
)
_TERMINAL = re.compile(r"[.!?…][" + re.escape(_CLOSERS) + r"]*(?:\s|$)|" + _STOP)
# \r before a line break is whitespace: Windows line ends must not hide blank lines or fence ends
# (CommonMark: a backtick fence's info string holds no backtick, or "```x``` y" is an inline span;
# a fence closes at a run of its character at least as long; one never closed runs to the end)
_FENCE = re.compile(
    r"^[ \t]*(?:(`{3,})[^`\n]*$(?:\n.*?^[ \t]*\1`*[ \t\r]*$|.*\Z)|(~{3,})[^\n]*(?:\n.*?^[ \t]*\2~*[ \t\r]*$|.*\Z))",
    re.M | re.S,
)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r]*\n")
_LIST_ITEM = re.compile(r"[ \t]*(?:[-*+•‣◦▪●–—]|\(?\d{1,3}[.)]|\(?[a-zA-Z][.)]|\[[ xX]?\])[ \t]+\S")
_LIST_MARKER = re.compile(r"\s*\(?(?:\d{1,3}|[a-zA-Z])[.)]")
_INITIAL_LINE = re.compile(r"[ \t]*[A-Z]\.[ \t]+[A-Z][a-z]")  # "J. Smith": an initial, or item "A." of a list
_HEADING = re.compile(r"[ \t]*#{1,6}[ \t]+\S")
_WORD = re.compile(r"\S+")
_LATIN_WORD = re.compile(r"[A-Za-z]+")
_ACRONYM = re.compile(r"(?:[a-z]\.)+[a-z]")


def _words(text: str) -> frozenset[str]:
    """The words of ``text`` (a list of abbreviations written as one string: one per line took 130 lines)."""
    return frozenset(text.split())


# Never a sentence end before a capitalised word: titles and reference/Latin abbreviations.
_NEVER = _words(
    "mr mrs ms mx dr prof rev hon fr gen col lt sgt capt cmdr adm gov sen rep pres st mt ft e.g "
    "i.e cf vs viz approx ca fig figs eq eqs sec ch vol vols pp ed eds dept univ assn ref refs"
)
# A sentence end only if a common sentence opener follows ("et al." ends a sentence that cites).
_AMBIGUOUS = _words(
    "etc inc ltd co corp jr sr bros llc plc no nos op ph.d al jan feb mar apr jun jul aug sep sept oct nov dec"
)
# Words a line of hard-wrapped prose stops on mid-sentence, which no title ends with.
_CONTINUING = _words("a an the of in on at by to for from with and or but as than that into onto via")
_OPENER_WORDS = _words(
    "the a an this that these those it its he she they we i you his her their our my there here "
    "in on at for but however yet so then also after before when while as if although though "
    "since during thus hence therefore moreover furthermore meanwhile some many most all one not "
    "each every both what which who how why where today later finally"
)


@dataclass(frozen=True)
class Sentence:
    """One sentence: its text and its exact character range ``[start, end)`` in the source;
    ``given``: its position in the caller's pre-split list (None when segmented here)."""

    text: str
    start: int
    end: int
    given: int | None = None


def segment(text: str, sentences: Sequence[str] | None = None, *, max_words: int = DEFAULT_MAX_WORDS) -> list[Sentence]:
    """Sentences of ``text``: the given pre-split ``sentences`` located verbatim, else
    :func:`split_sentences`."""
    if sentences is not None:
        return locate_sentences(text, sentences)
    return split_sentences(text, max_words=max_words)


def document_sentences(
    docs: Sequence[Any], given: Sequence[Any] | None, max_words: int, *, warn: bool = True
) -> list[list[Sentence]]:
    """Each document's sentences: ``given[i]`` (pre-split, located in its text), else its
    ``metadata["sentences"]`` where they can be located (where not, a warning unless ``warn`` is
    False: a check ahead of the pruner, which warns itself), else :func:`split_sentences`
    (``max_words``)."""
    out = []
    for i, doc in enumerate(docs):
        pre = given[i] if given is not None else None
        if pre is not None:
            try:
                out.append(locate_sentences(doc.text, pre))
            except InputError as e:  # (which of the passages it means)
                raise InputError(f"document #{i} ({doc.id!r}): {e}") from None
            continue
        meta = doc.metadata.get("sentences") if doc.metadata else None
        if meta is not None:
            try:
                out.append(locate_sentences(doc.text, meta))
                continue
            except InputError as e:
                if warn:
                    logger.warning("document %s: metadata sentences unusable (%s); segmenting", doc.id, e)
        out.append(segment(doc.text, max_words=max_words))
    return out


def locate_sentences(text: str, sentences: Sequence[str]) -> list[Sentence]:
    """Find pre-split ``sentences`` (whitespace-trimmed) in ``text``, in order; empty ones are
    skipped. Raises :class:`InputError` naming the first sentence that is not found, and where
    text other than whitespace lies outside every sentence (a highlight list of some of a
    passage's sentences): that text would drop out of the pruned context unscored."""
    if isinstance(sentences, str):  # a str would be a sequence of 1-character "sentences"
        raise InputError(f"pre-split sentences {sentences[:40]!r} are one string; pass a list of sentences, or None")
    if isinstance(sentences, Mapping) or not isinstance(sentences, Iterable):  # (a loader's count; a dict's keys)
        raise InputError(f"pre-split sentences {sentences!r} are no list of sentences; pass a list of strings, or None")
    out: list[Sentence] = []
    cursor = 0
    for i, raw in enumerate(sentences):
        if not isinstance(raw, str):  # (str() made None "None" and 1 "1", then searched for in the text)
            raise InputError(f"pre-split sentence #{i} is {raw!r}, not a string; pass a list of strings, or None")
        sent = raw.strip()
        if not sent:
            continue
        at = _find_whole(text, sent, cursor)
        if at < 0:
            raise InputError(
                f"pre-split sentence #{i} {sent[:40]!r} is not in the text after "
                f"character {cursor} (of {len(text)}); pass sentences copied verbatim "
                "from the text and in order, or none to segment automatically"
            )
        out.append(Sentence(sent, at, at + len(sent), given=i))  # i counts the skipped empty ones too
        cursor = at + len(sent)
    if out:
        _check_covered(text, out)
    if not out and text.strip():  # (the passage would drop out of the pruned context without a word)
        raise InputError(
            f"the pre-split sentences {list(sentences)[:3]!r} hold no sentence of a non-empty text; pass its "
            "sentences, or None to segment it automatically"
        )
    return out


def _check_covered(text: str, located: list[Sentence]) -> None:
    """Refuse ``located`` (in order) where text other than whitespace lies between, before or
    after them."""
    at = 0
    for start, end in [*((s.start, s.end) for s in located), (len(text), len(text))]:
        if text[at:start].strip():
            gap = text[at:start].strip()
            raise InputError(
                f"the pre-split sentences leave text of the passage out ({gap[:40]!r} at character "
                f"{at + text[at:start].index(gap[0])}), which pruning would drop unscored; pass every sentence "
                "of the text, or none to segment it automatically"
            )
        at = max(at, end)


def _find_whole(text: str, sent: str, start: int) -> int:
    """The first place of ``sent`` in ``text`` from ``start`` that cuts no word at either edge, else
    its first place at all (-1 if none). Why: a short pre-split sentence ("Cat.") also occurs inside
    an earlier word ("Tomcat."), where taking it would misplace it and every sentence after it."""
    first = at = text.find(sent, start)
    while at >= 0:
        end = at + len(sent)
        cuts_before = at > 0 and text[at - 1].isalnum() and sent[0].isalnum()
        cuts_after = end < len(text) and text[end].isalnum() and sent[-1].isalnum()
        if not cuts_before and not cuts_after:
            return at
        at = text.find(sent, at + 1)
    return first


def split_sentences(text: str, *, max_words: int = DEFAULT_MAX_WORDS) -> list[Sentence]:
    """Segment ``text`` into sentences with exact spans (rules in the module docstring)."""
    if max_words < 1:
        raise InputError(
            f"max_words={max_words} must be >= 1 (words per fallback chunk); the default is {DEFAULT_MAX_WORDS}"
        )
    spans: list[tuple[int, int]] = []
    cursor = 0
    for fence in _FENCE.finditer(text):
        spans += _prose_spans(text, cursor, fence.start())
        spans += _line_chunks(text, fence.start(), fence.end(), max_words)
        cursor = fence.end()
    spans += _prose_spans(text, cursor, len(text))
    out = []
    for s, e in spans:
        for a, b in _word_chunks(text, s, e, max_words):
            out.append(Sentence(text[a:b], a, b))
    return out


# --------------------------------------------------------------------------- internals


def _trim(text: str, s: int, e: int) -> tuple[int, int]:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e


def _lines(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """Non-blank lines of ``text[a:b]`` as (start, end) without the newline."""
    out, s = [], a
    while s < b:
        e = text.find("\n", s, b)
        e = b if e < 0 else e
        if text[s:e].strip():
            out.append((s, e))
        s = e + 1
    return out


def _prose_spans(text: str, a: int, b: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = a
    for brk in [*_PARAGRAPH_BREAK.finditer(text, a, b), None]:
        end = b if brk is None else brk.start()
        lines = _lines(text, start, end)
        if lines:
            if _TERMINAL.search(text[start:end]) is None:  # no punctuation: every line is a unit
                spans += lines
            else:
                for us, ue in _units(text, lines):
                    spans += _split_unit(text, us, ue)
        start = end if brk is None else brk.end()
    return spans


def _units(text: str, lines: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Group a paragraph's lines into units that sentence splitting never crosses."""
    units: list[list[int]] = []
    prev = ""
    for i, (s, e) in enumerate(lines):
        line = text[s:e]
        after = text[slice(*lines[i + 1])] if i + 1 < len(lines) else ""
        if not units or _hard_break(prev, line, after):
            units.append([s, e])
        else:
            units[-1][1] = e
        prev = line
    return [(s, e) for s, e in units]


def _hard_break(prev: str, line: str, after: str) -> bool:
    """Whether a unit ends between the lines ``prev`` and ``line`` (``after``: the line after ``line``)."""
    if _HEADING.match(line) or _HEADING.match(prev):
        return True
    if _LIST_ITEM.match(line) and not _initial_continues(prev, line, after):
        return True
    if _LIST_ITEM.match(prev) and not line[:1].isspace():
        return True
    p = prev.strip()
    title_like = p[:1].isupper() and len(p.split()) <= 8 and p[-1].isalnum() and line.lstrip()[:1].isupper()
    # ("The trial was led by\nJohn Smith." is one sentence: a line ending on "by" is no title)
    return title_like and p.split()[-1] not in _CONTINUING


def _initial_continues(prev: str, line: str, after: str) -> bool:
    """Whether ``line`` opens with a name's initial ("J. Smith") that carries on the sentence of
    ``prev`` (which stops mid-sentence, on a word or a comma), not an item "J." of a list: neither
    ``prev`` nor the line ``after`` it is a list item. (A line opening with a number, "250. It
    grew", is read as a list item: told apart from "1. Open the box" after a heading it is not.)"""
    end = prev.rstrip()[-1:]
    mid_sentence = end.isalnum() or end in ",;"
    in_list = bool(_LIST_ITEM.match(prev) or _LIST_ITEM.match(after))
    return bool(_INITIAL_LINE.match(line)) and mid_sentence and not in_list


def _split_unit(text: str, a: int, b: int) -> list[tuple[int, int]]:
    out, start = [], a
    for m in _END.finditer(text, a, b):
        after = m.end()
        if after >= b or not (text[after].isspace() or any(c in _CJK_STOPS for c in m.group())):
            continue  # the unit's end, or a period inside a token (3.5, e.g., U.S, a.com)
        if _is_boundary(text, start, m, b):
            out.append((start, after))
            start = after
    out.append((start, b))
    return [span for span in (_trim(text, s, e) for s, e in out) if span[0] < span[1]]


def _is_boundary(text: str, start: int, m: re.Match, b: int) -> bool:
    """Does the punctuation run ``m`` end the sentence that began at ``start``?"""
    k = m.end()
    while k < b and (text[k].isspace() or text[k] in _OPENERS):
        k += 1
    if k >= b:
        return True
    if text[k].islower():
        return False
    run = m.group()
    if run[-1] in "»›" and run[-2:-1].isspace():  # (a French closing guillemet: "etc. »" is an abbreviation's)
        run = run[:-2]
    if run != ".":  # ! ? … runs, and periods followed by a closing quote/bracket
        return True
    # (matched in place, never sliced to the end: a copy per period made a paragraph of 800 KB
    # with many abbreviations take 13 s)
    if _LIST_MARKER.fullmatch(text, start, m.end()):
        return False
    word = _word_before(text, start, m.start()).lstrip(_OPENERS).lower()
    if word in _NEVER:
        return False
    if word in _AMBIGUOUS or len(word) == 1 and word.isalpha() or _ACRONYM.fullmatch(word):
        nxt = _LATIN_WORD.match(text, k, b)
        return nxt is not None and nxt.group().lower() in _OPENER_WORDS
    return True


def _word_before(text: str, start: int, end: int) -> str:
    """The last whitespace-separated word of ``text[start:end]`` ("" if none), found by scanning
    back from ``end``."""
    while end > start and text[end - 1].isspace():
        end -= 1
    j = end
    while j > start and not text[j - 1].isspace():
        j -= 1
    return text[j:end]


def _line_chunks(text: str, a: int, b: int, max_words: int) -> list[tuple[int, int]]:
    """Whole lines of ``text[a:b]`` grouped into chunks of at most ``max_words`` words (a longer
    line becomes its own chunk, cut later by :func:`_word_chunks`)."""
    out: list[tuple[int, int]] = []
    cur: list[int] | None = None
    words = 0
    for s, e in _lines(text, a, b):  # (words counted as _word_chunks counts them: a long run is several)
        n = sum(len(_run_words(m.start(), m.end())) for m in _WORD.finditer(text, s, e))
        if cur is not None and words + n <= max_words:
            cur[1], words = e, words + n
        else:
            if cur is not None:
                out.append(_trim(text, *cur))
            cur, words = [s, e], n
    if cur is not None:
        out.append(_trim(text, *cur))
    return out


def _run_words(a: int, b: int) -> list[tuple[int, int]]:
    """A run of non-space characters ``[a, b)`` as words of WORD_CHARS characters, its last at least
    half that long (a shorter tail joins the word before): a sentence cut after a word of a few
    characters could lie inside the tokenizer's token across the cut, with no token of its own."""
    cuts = list(range(a, b, WORD_CHARS))
    if len(cuts) > 1 and b - cuts[-1] < WORD_CHARS // 2:
        cuts.pop()
    return [(c, cuts[i + 1] if i + 1 < len(cuts) else b) for i, c in enumerate(cuts)]


def _word_chunks(text: str, s: int, e: int, max_words: int) -> list[tuple[int, int]]:
    s, e = _trim(text, s, e)
    if s >= e:
        return []
    # a run without spaces (CJK without 。！？, a URL, base64) counts a word per WORD_CHARS characters,
    # so that it is cut too, and a lower max_words cuts it finer
    words = [w for m in _WORD.finditer(text, s, e) for w in _run_words(m.start(), m.end())]
    if len(words) <= max_words:
        return [(s, e)]
    return [(words[i][0], words[min(i + max_words, len(words)) - 1][1]) for i in range(0, len(words), max_words)]
