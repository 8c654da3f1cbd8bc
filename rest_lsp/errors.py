"""Errors meant for the user: printed as one sentence, never as a traceback."""


class UserError(Exception):
    """Bad input from the user: the command prints it and exits with status 2."""


class ModelLoadError(RuntimeError):
    """The model could not be loaded; str(err) is one sentence meant for the user."""
