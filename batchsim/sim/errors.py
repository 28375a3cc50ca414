"""User-facing errors: bad input that the CLI reports in one line, exit code 2.

Raise :class:`InputError` (or a subclass) wherever a user-supplied value is
wrong; say where (file, field or line) and what was expected. The CLI prints
``error: <message>`` and exits 2 without a traceback (unless ``--debug``).
Anything else escaping to the CLI is a batchsim bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(Exception):
    """A user-supplied input is invalid.

    ``where`` names the file, field or line (e.g. ``"scenario.yaml: policy.max_num_seqs"``).
    """

    def __init__(self, message: str, where: str | None = None) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)
