"""``--version`` on every command and subcommand: the package version and the commit (a git checkout's, or the
one written when the package was built)."""
from __future__ import annotations

import click


def _print_version(ctx, param, value) -> None:
    if not value or ctx.resilient_parsing:
        return
    from ksae_cupy.made_with import version_line

    name = ctx.find_root().info_name or ""
    click.echo(f"{name.split()[-1] if name.strip() else 'ksae-cupy'}: {version_line()}")  # the MPI trainer's
    # usage names how it is started (mpiexec ... -m ksae_cupy.cli.mpi_train): its module is its name
    ctx.exit()


# Eager: answered before any other option or argument is read (as --help is); the commit is read only then.
version_option = click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
                              help="Print the package version (and the commit, from a git checkout) and exit.")


VERSION_HELP = "Print the package version (and the commit, from a git checkout) and exit."


def with_version(command: click.Command) -> click.Command:
    """``command`` answering ``--version`` too (a subcommand: ``ksae-data export --version``), its subcommands
    alike."""
    if not any(param.name == "version" for param in command.params):
        command.params.append(click.Option(["--version"], is_flag=True, expose_value=False, is_eager=True,
                                           callback=_print_version, help=VERSION_HELP))
    for sub in getattr(command, "commands", {}).values():
        with_version(sub)
    return command


class VersionedGroup(click.Group):
    """A command group whose every subcommand answers ``--version``, as the group does."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        super().add_command(with_version(cmd), name)
