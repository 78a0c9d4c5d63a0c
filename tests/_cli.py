"""What the CLI tests share: a command's output as one line of text."""

from __future__ import annotations

import re


def cli_text(result) -> str:
    """A CliRunner result's output and exception with typer's error box and line wrapping removed."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", result.output + str(result.exception))
