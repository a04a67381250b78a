"""The one exception type for mistakes a user can fix (bad files, names, text, options).

The CLI prints `qkv: error: <message>` and exits with code 2 for these, never a traceback.
It subclasses `ValueError` so library callers can catch either.
"""


class QkvError(ValueError):
    """A user-facing error whose message names the problem and the offending value."""
