"""Notes: what diagnose did on the user's behalf that changes what is measured, said once.

A `Note` is a warning (UserWarning), so Python code sees it through `warnings` (filter it, or
turn it into an error with `warnings.simplefilter("error", Note)`), and the CLI prints each as
one `note: ...` line on stderr. Examples: a checkpoint's `_orig_mod.` prefix stripped, a model
scored on its last position only, a padding mask the model's forward has no place for.
No torch here: the CLI imports this before any command runs.
"""

from __future__ import annotations

import warnings

__all__ = ["Note", "note"]


class Note(UserWarning):
    """Something diagnose did for the user that they should know about (one line)."""


def note(message: str, stacklevel: int = 2) -> None:
    """Say `message` once per place it is said from (warnings' default filter)."""
    warnings.warn(message, Note, stacklevel=stacklevel + 1)
