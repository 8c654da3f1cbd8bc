"""Errors meant for the user: printed as one sentence, never as a traceback."""


class UserError(Exception):
    """Bad input from the user: the command prints it and exits with status 2."""
