"""The one error type for user mistakes: caught once at each CLI, printed as one line, exit non-zero."""


class UserError(Exception):
    """A problem with what the user gave us (a flag, a file, a campaign). The message is one line
    naming the input and what to do."""

    exit_code = 2
