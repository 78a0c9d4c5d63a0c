"""Exceptions. Every message names the offending value, the limit, and the fix."""

from __future__ import annotations


class AttnrankError(Exception):
    """Base class of attnrank's own errors (the CLI prints their message as one line)."""


class InputError(AttnrankError, ValueError):
    """Bad user input: a corpus, query, parameter or file that cannot be used as given."""


class IndexFormatError(AttnrankError):
    """An index folder that is missing, incomplete, corrupted, or of another format version."""


class ModelError(AttnrankError):
    """A model that cannot be loaded or does not support what was asked of it."""


class MissingExtraError(AttnrankError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the package '{package}', which is not installed; "
            f"install it with: pip install 'attnrank[{extra}]'"
        )


def require(module: str, extra: str, purpose: str):
    """Import an optional module or raise :class:`MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingExtraError(module, extra, purpose) from e
