"""User-facing errors.

Anything the user can cause (a missing file, a malformed GGUF, a prompt that does not fit) raises
`NextnError`; the CLI prints its message as one line on stderr and exits non-zero, without a traceback.
"""


class NextnError(Exception):
    """A user-facing error: the message names the file/tensor/key and what was expected; the CLI prints it as one line."""
