"""User-facing errors.

Anything the user can cause (a missing file, a malformed GGUF, a prompt that does not fit) raises
`NextnError`; the CLI prints its message as one line on stderr and exits non-zero, without a traceback.
"""


class NextnError(Exception):
    """A user-facing error: the message names the file/tensor/key and what was expected; the CLI prints it as one line."""


def shown(value, limit: int = 80) -> str:
    """A name or value read from a user's file as an error message shows it: one line (non-printable characters
    escaped), at most `limit` characters."""
    s = value if isinstance(value, str) else repr(value)
    if not s.isprintable():
        s = s.encode("unicode_escape").decode("ascii")
    return s if len(s) <= limit else s[:limit] + "..."
