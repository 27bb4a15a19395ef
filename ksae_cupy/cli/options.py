"""Click options made from the declarations of :mod:`ksae_cupy.session.fields` (one source for a
command's flags, help, defaults and resume policy), and the resume table of every training command:

    python -m ksae_cupy.cli.options       # prints it, as markdown (what --resume does with each option)
"""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.cli.given_path import GivenPath
from ksae_cupy.session.fields import PATH, Option

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
    if kind == PATH:
        kind = GivenPath(path_type=Path)
    elif isinstance(kind, dict):
        kind = RegistryChoice(kind)
    elif isinstance(kind, tuple):
        kind = click.Choice(kind)
    return click.option(option.spelled, option.name, type=kind, default=option.default, help=option.help)


def declared(options: list[Option]):
    """Decorate a command with ``options``, in their order in ``--help``."""
    def decorate(func):
        for option in reversed(options):
            func = click_option(option)(func)
        return func

    return decorate


def dataset_command(options: list[Option]):
    """A training command on an optional DATASET argument (``ksae-train``, ``ksae-baseline``): its
    declared ``options``, the user-data options, the click context, one-line errors."""
    from ksae_cupy.cli.common import data_options, report_errors
    from ksae_cupy.cli.version import version_option

    def decorate(func):
        from ksae_cupy.datasets.registry import names, spelled
        from ksae_cupy.supervised.baselines import BASELINES

        # the help names the registries' datasets and baselines
        func.__doc__ = func.__doc__.replace("{datasets}", spelled(names())).replace("{baselines}", ", ".join(BASELINES))
        # as the decorators stacked above a def would apply: the innermost first
        func = declared(options)(data_options(click.pass_context(report_errors(func))))
        return click.command(context_settings=CONTEXT)(version_option(click.argument("dataset", required=False)(func)))

    return decorate


def commands() -> dict[str, list[Option]]:
    """The declared options of every training command, by command."""
    from ksae_cupy.supervised.commands import BASELINE, FINETUNE
    from ksae_cupy.session.fields import TRAIN

    return {"ksae-train": TRAIN, "ksae-baseline": BASELINE, "ksae-finetune": FINETUNE}


def run_of(ctx, command: str, kind: str, values: dict):
    """The session's :class:`~ksae_cupy.session.lifecycle.RunLifecycle`: the options typed on this
    command line known, the run folder released when the command ends."""
    from ksae_cupy.cli.resume import given
    from ksae_cupy.session.lifecycle import RunLifecycle

    run = RunLifecycle(command, kind, values, given(ctx), click.echo)
    ctx.call_on_close(run.release)
    return run


def resume_table() -> str:
    """What --resume does with every option of ksae-train, ksae-baseline and ksae-finetune (markdown)."""
    from ksae_cupy.session.fields import resume_table as table

    return table(commands())


if __name__ == "__main__":
    print(resume_table())
