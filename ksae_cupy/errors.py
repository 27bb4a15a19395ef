"""The exceptions that user-facing entry points turn into a one-line message, and one-line notes."""
import warnings


class KsaeError(ValueError):
    """A mistake the user can fix: bad option, missing data, corrupt file.

    The message is one line that names the bad value and what is allowed. The CLI prints
    it as ``error: <message>`` and exits with status 2; it never shows a traceback.
    A ``ValueError`` (a bad value), so callers that catch ``ValueError`` catch it too.
    """


class OptionError(KsaeError):
    """A bad value of one parameter, named as the Python API spells it (``field``: ``n_hidden``,
    ``k``, ``lr``): the library speaks Python, and each front end spells the name its own way.

    ``template`` is the one-line message with ``{name}`` where the parameter's name goes:
    ``OptionError("k", "{name} 0 is not allowed; use 1 <= k <= n_hidden")``. ``str()`` reads it
    with the field's name; the CLI prints :meth:`spelled` with its flag (``--k``), from the one
    field -> flag table in :mod:`ksae_cupy.cli.common`. Another parameter the message names is a
    ``{field}`` of its own (``"{name} y.npy is not allowed without {test}"``), spelled alike.
    """

    def __init__(self, field: str, template: str):
        self.field, self.template = field, template
        super().__init__(self.spelled(field))

    def __reduce__(self):  # pickled whole (a Dask worker's error reaches the client), not as its message alone
        return _rebuilt_option_error, (type(self), self.field, self.template, self.__dict__)

    def spelled(self, name: str, spell=None) -> str:
        """The message with the parameter called ``name`` (e.g. a command line's flag), and any
        other parameter it names called ``spell(field)`` (by default, as Python spells it)."""
        return self.template.format_map(_Names(name, spell or str))


def _rebuilt_option_error(cls, field: str, template: str, state: dict):
    error = cls.__new__(cls)
    OptionError.__init__(error, field, template)
    error.__dict__.update(state)
    return error


class _Names(dict):
    """``{name}`` and the other parameters' ``{field}`` of an :class:`OptionError` template."""

    def __init__(self, name: str, spell):
        super().__init__(name=name)
        self.spell = spell

    def __missing__(self, field: str) -> str:
        return self.spell(field)


def literal(value) -> str:
    """``str(value)`` ready to go inside an :class:`OptionError` template: its braces doubled, so
    that a value the user typed (``--device '{'``) reads as typed and cannot break the template."""
    return str(value).replace("{", "{{").replace("}", "}}")


class TrainingDiverged(KsaeError):
    """The loss became NaN or infinite; the last good checkpoint is left untouched (exit status 1).

    Carries where it happened (``loss``, ``epoch``, ``step``, ``lr``) when a batch's loss was the
    first sign, so that callers can say more: the estimator adds what was saved and the rate
    ``lr="auto"`` gives for the data. With ``fields=True`` the message is a template that names the
    parameters it advises as ``{field}`` (``"... try a smaller {lr_start}"``, nothing else in braces):
    Python spells them as the fields, the CLI as its flags.
    """

    def __init__(self, message: str, loss: float | None = None, epoch: int | None = None, step: int | None = None,
                 lr: float | None = None, *, fields: bool = False):
        self.template = message if fields else None
        super().__init__(self.spelled(str) if fields else message)
        self.loss, self.epoch, self.step, self.lr = loss, epoch, step, lr

    def spelled(self, spell) -> str:
        """The message with each parameter it names called ``spell(field)``."""
        return str(self) if self.template is None else self.template.format_map(_Names("", spell))


class KsaeNote(UserWarning):
    """Something the user should know that is not an error (e.g. a checkpoint written before
    checksums existed). The CLI prints it as one ``note: <message>`` line on stderr; the
    Python API sees an ordinary warning."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`KsaeError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise KsaeError(message)


def note(message: str) -> None:
    """Tell the user ``message`` (one line) without stopping: a :class:`KsaeNote` warning."""
    warnings.warn(one_line(message), KsaeNote, stacklevel=2)


def one_line(text: str) -> str:
    """``text`` folded onto one line: libraries (HDF5, Dask, MPI) put line breaks inside their
    messages, and cutting at the first one loses the reason ("No space left on device")."""
    return " ".join(str(text).split())
def cli_name(parameter: str) -> str:
    """How a command line names a parameter in messages: ``valid_fraction`` -> ``--valid-fraction``."""
    return "--" + parameter.replace("_", "-")


def python_name(parameter: str) -> str:
    """How the Python API names a parameter in messages: as it is spelled."""
    return parameter
