"""The title of a Markdown document, and its text without it: an ATX heading on its first line,
or the ``title:`` of its YAML front matter (read by :func:`attnrank.corpus.load_corpus` for a
folder of ``.md`` files)."""

from __future__ import annotations

import re

# an ATX heading: "# Title", not "#hashtag"; a closing run of "#" only after a space ("# C#" keeps it)
_HEADING = re.compile(r"^#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")


def markdown_title(text: str) -> tuple[str, str]:
    """``(title, text)`` of a Markdown file: YAML front matter (a first line ``---``, closed by
    ``---`` or ``...``) is metadata, taken out of the text, and its ``title:`` is the title; else
    the first non-blank line (after any front matter) is the title where that is a heading, taken
    out of the text (the title and the text are read together: the heading's words counted
    twice; so is a heading that repeats the front matter's title); else no title and the text."""
    meta, body = _front_matter_title(text)
    lines = body.strip().splitlines()
    m = _HEADING.match(lines[0].strip()) if lines else None
    heading = (m.group(1) or "").strip() if m else ""
    if meta:  # (a heading that repeats the front matter's title goes, as a heading title does)
        return meta, "\n".join(lines[1:] if heading.casefold() == meta.casefold() else lines)
    return (heading, "\n".join(lines[1:])) if heading else ("", body)


_TITLE_KEY = re.compile(r"^title[ \t]*:[ \t]*(.*?)[ \t]*$")
# what a YAML front matter's lines look like: a top-level key, an indented continuation, a list
# item, a comment (prose between two thematic breaks has other lines)
_YAML_KEY = re.compile(r"^[A-Za-z_][\w.-]*[ \t]*:(?:[ \t]|$)")
_YAML_LINE = re.compile(r"^(?:[A-Za-z_][\w.-]*[ \t]*:(?:[ \t]|$)|[ \t]+\S|-[ \t]|#)")


def _front_matter_title(text: str) -> tuple[str, str]:
    """``(title, text after the front matter)``: the ``title:`` of a Jekyll/Hugo-style YAML front
    matter block (a one-line value, plain or quoted, or a folded ``>``/``|`` one; "" where it has
    none), and ``("", text)`` where the file opens with no such block: a ``---`` never closed, or
    one whose lines are not YAML (prose between two thematic breaks stays text)."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return "", text
    end = next((i for i in range(1, len(lines)) if lines[i].strip() in ("---", "...")), None)
    if end is None:
        return "", text
    block = lines[1:end]
    filled = [line for line in block if line.strip()]
    if not any(_YAML_KEY.match(line) for line in filled) or not all(_YAML_LINE.match(line) for line in filled):
        return "", text
    title = ""
    for i, line in enumerate(block):
        m = _TITLE_KEY.match(line)  # (top-level key only: an indented "title:" belongs to a mapping)
        if m:
            value = m.group(1)
            if value[:1] in (">", "|"):  # a block scalar: its indented lines, joined
                folded = []
                for more in block[i + 1 :]:
                    if more.strip() and not more[:1].isspace():
                        break
                    folded.append(more.strip())
                value = " ".join(x for x in folded if x)
            elif len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            title = value.strip()
            break
    return title, "\n".join(lines[end + 1 :])
