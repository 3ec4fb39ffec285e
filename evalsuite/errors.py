"""One exception type for bad user input: the CLI prints its message on one line and exits non-zero."""


class UserError(Exception):
    """A problem the user can fix; the message says how."""
