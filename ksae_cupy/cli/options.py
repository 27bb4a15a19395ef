"""Click options made from the declarations of :mod:`ksae_cupy.session.fields` (one source for a command's
flags, help, defaults and resume policy), their values one typed object (:func:`typed`), and the resume table:

    python -m ksae_cupy.cli.options       # prints it, as markdown (what --resume does with each option)
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import click

from ksae_cupy.cli.given_path import GivenPath
from ksae_cupy.session.fields import PATH, TEXT_PATH, Option

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True}


class RegistryChoice(click.Choice):
    """A choice among a registry's names (a dict: :data:`~ksae_cupy.optimizers.OPTIMIZERS`, ...) as they are
    when the command runs, so that one registered after the command was built is a choice too."""

    def __init__(self, registry: dict):
        self.registry = registry
        super().__init__(tuple(registry))

    @property
    def choices(self) -> tuple:
        return tuple(self.registry)

    @choices.setter
    def choices(self, _names) -> None:  # click.Choice sets a copy; the registry stays the source
        pass


def click_option(option: Option):
    """The click decorator of one declared option."""
    kind = option.type
    if kind is bool:
        return click.option(option.spelled, option.name, is_flag=True, help=option.help)
    if kind in (PATH, TEXT_PATH):
        kind = GivenPath(path_type=Path if kind == PATH else None)
    elif isinstance(kind, dict):
        kind = RegistryChoice(kind)
    elif isinstance(kind, tuple):
        kind = click.Choice(kind)
    return click.option(option.spelled, option.name, type=kind, default=option.default, help=option.help)


def declared(options: list[Option]):
    """Decorate a command with ``options``, in their order in ``--help``."""
    return lambda func: functools.reduce(lambda f, option: click_option(option)(f), reversed(options), func)


def typed(options_class):
    """In ``click.pass_context``'s place: the command called with the context and its values as one ``options_class``,
    ``given`` the names typed; a parameter no field names (PRETRAINED_RUN_DIR...) stays a keyword."""
    names = {field.name for field in dataclasses.fields(options_class)}

    def decorate(func):
        @functools.wraps(func)
        def command(**values):
            ctx = click.get_current_context()
            given = {n for n in values if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE}
            options = options_class(**{n: v for n, v in values.items() if n in names}, given=frozenset(given))
            return func(ctx, options, **{n: v for n, v in values.items() if n not in names})

        return command

    return decorate


def dataset_command(options_class):
    """A training command on an optional DATASET argument (``ksae-train``, ``ksae-baseline``): the options
    its class declares, the user-data options, its values as one ``options_class`` (:func:`typed`), one-line
    errors."""
    from ksae_cupy.cli.common import data_options, report_errors
    from ksae_cupy.cli.version import version_option

    def decorate(func):
        from ksae_cupy.datasets.registry import names, spelled
        from ksae_cupy.supervised.baselines import BASELINES

        # the help names the registries' datasets and baselines
        func.__doc__ = func.__doc__.replace("{datasets}", spelled(names())).replace("{baselines}", ", ".join(BASELINES))
        # as the decorators stacked above a def would apply: the innermost first
        func = data_options(report_errors(typed(options_class)(func)))
        func = declared(options_class.declarations)(func)
        return click.command(context_settings=CONTEXT)(version_option(click.argument("dataset", required=False)(func)))

    return decorate


def commands() -> dict[str, list[Option]]:
    """The declared options of every training command, by command."""
    from ksae_cupy.supervised.commands import BASELINE, FINETUNE
    from ksae_cupy.session.fields import TRAIN

    return {"ksae-train": TRAIN, "ksae-baseline": BASELINE, "ksae-finetune": FINETUNE}


def run_of(ctx, command: str, kind: str, options):
    """The session's :class:`~ksae_cupy.session.lifecycle.RunLifecycle`; its folder released when the command ends."""
    from ksae_cupy.session.lifecycle import RunLifecycle

    run = RunLifecycle(command, kind, options, click.echo)
    ctx.call_on_close(run.release)
    return run


def resume_table() -> str:
    """What --resume does with every option of ksae-train, ksae-baseline and ksae-finetune (markdown)."""
    from ksae_cupy.session.fields import resume_table as table

    return table(commands())


if __name__ == "__main__":
    print(resume_table())
