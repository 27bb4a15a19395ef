"""``--version`` on every command: the package version and, when run from a git checkout, the commit."""
from __future__ import annotations

import click


def _print_version(ctx, param, value) -> None:
    if not value or ctx.resilient_parsing:
        return
    from ksae_cupy.provenance import version_line

    click.echo(f"{ctx.find_root().info_name}: {version_line()}")
    ctx.exit()


# Eager: answered before any other option or argument is read (as --help is); the commit is read only then.
version_option = click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
                              help="Print the package version (and the commit, from a git checkout) and exit.")
