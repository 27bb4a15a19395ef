"""The one exception type that user-facing entry points turn into a one-line message."""


class KsaeError(ValueError):
    """A mistake the user can fix: bad option, missing data, corrupt file.

    The message is one line that names the bad value and what is allowed. The CLI prints
    it as ``error: <message>`` and exits with status 2; it never shows a traceback.
    A ``ValueError`` (a bad value), so callers that catch ``ValueError`` catch it too.
    """


def check(condition: bool, message: str) -> None:
    """Raise :class:`KsaeError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise KsaeError(message)


def cli_name(parameter: str) -> str:
    """How a command line names a parameter in messages: ``valid_fraction`` -> ``--valid-fraction``."""
    return "--" + parameter.replace("_", "-")


def python_name(parameter: str) -> str:
    """How the Python API names a parameter in messages: as it is spelled."""
    return parameter
