"""The one error type of the local stack."""

from __future__ import annotations


class StackError(RuntimeError):
    """A failure the user can act on; its message is one line."""
