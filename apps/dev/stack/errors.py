"""The one error type of the local stack."""

from __future__ import annotations

from ki.errors import PermanentError


class StackError(PermanentError):
    """A failure the user can act on; its message is one line."""
