"""The one exception type for mistakes a user can make (flags, data, paths).

Entry points catch it and print its message on one line with a non-zero exit and no traceback;
anything else that escapes is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """A mistake the user can fix; the message names the flag or file and what to do.

    ``tfdp.run`` raises it as it is (a ``ValueError``); the command line prints its message."""
