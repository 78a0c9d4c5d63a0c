"""Exceptions. Every message names the offending value, the limit, and the fix."""

from __future__ import annotations


class AttnrankError(Exception):
    """Base class of attnrank's own errors (the CLI prints their message as one line)."""


class InputError(AttnrankError, ValueError):
    """Bad user input: a corpus, query, parameter or file that cannot be used as given."""


class PromptTooLong(InputError):
    """A document no prompt holds even alone. ``fault`` says which and how long; the message adds
    ``fix``, the reranker's settings to change (a server, whose settings its clients cannot change,
    gives its own advice beside ``fault``)."""

    def __init__(self, fault: str, fix: str):
        super().__init__(f"{fault}; {fix}")
        self.fault, self.fix = fault, fix


class SentenceTooLong(PromptTooLong):
    """A sentence no pruning prompt holds even alone (or one whose prompt's query or title takes
    the room). ``remedy``: the change to the input that would fit it (shorten the query or the
    title, split a pre-split sentence), None where only the pruner's settings can (``fix`` names
    them): a command without those settings gives its own advice."""

    def __init__(self, fault: str, fix: str, remedy: str | None = None):
        super().__init__(fault, fix)
        self.remedy = remedy


class IndexFormatError(AttnrankError):
    """An index folder that is missing, incomplete, corrupted, or of another format version."""


class ModelError(AttnrankError):
    """A model that cannot be loaded or does not support what was asked of it."""


class MissingExtraError(AttnrankError, ImportError):
    """An optional dependency is missing (or fails to import); the message names the extra to
    install. ``cause``: why an installed package failed to import (None: it is not installed)."""

    def __init__(self, package: str, extra: str, purpose: str, cause: str | None = None):
        self.package, self.extra, self.purpose, self.cause = package, extra, purpose, cause
        if cause is None:
            text = f"{purpose} needs the package '{package}', which is not installed"
        else:  # (reinstalling would not help: say what failed)
            text = f"{purpose} needs the package '{package}', which is installed but fails to import ({cause})"
        super().__init__(f"{text}; install it with: pip install 'attnrank[{extra}]'")

    def __reduce__(self):  # (a Ray worker's error reaches the driver pickled)
        return (type(self), (self.package, self.extra, self.purpose, self.cause))


def require(module: str, extra: str, purpose: str):
    """Import an optional module or raise :class:`MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        missing = isinstance(e, ModuleNotFoundError) and (
            e.name is None or module == e.name or module.startswith(e.name + ".")
        )
        raise MissingExtraError(module, extra, purpose, None if missing else f"{type(e).__name__}: {e}") from e
