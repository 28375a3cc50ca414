"""User-facing errors: bad input that the CLI reports in one line, exit code 2.

Raise :class:`InputError` (or a subclass) wherever a user-supplied value is
wrong; say where (file, field or line) and what was expected. The CLI prints
``error: <message>`` and exits 2 without a traceback (unless ``--debug``).
Anything else escaping to the CLI is a batchsim bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["InputError", "bool_as_number"]


class InputError(Exception):
    """A user-supplied input is invalid.

    ``where`` names the file, field or line (e.g. ``"scenario.yaml: policy.max_num_seqs"``).
    """

    def __init__(self, message: str, where: str | None = None) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


def bool_as_number(value: object, out: object) -> str | None:
    """What a boolean became, when validation turned one into a number, else None.

    pydantic's lax mode reads ``true`` as ``1`` for an int or float field, so
    ``num_requests: true`` ran one request. Validators call this with the input
    and the validated value (lists compared item by item; values passed through
    unchanged, such as a ``dict[str, Any]``'s, are not walked) and refuse it:
    "an integer" or "a number".
    """
    if value is out:
        return None
    if isinstance(value, bool):
        return None if isinstance(out, bool) else ("an integer" if isinstance(out, int) else "a number")
    if isinstance(value, (list, tuple)) and isinstance(out, (list, tuple)) and len(value) == len(out):
        for v, o in zip(value, out):
            kind = bool_as_number(v, o)
            if kind is not None:
                return kind
    return None
