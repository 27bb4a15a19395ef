"""The library names a bad parameter as Python spells it; the command line prints its flag."""
import click
from click.testing import CliRunner

from ksae_cupy.cli.common import report_errors
from ksae_cupy.errors import OptionError


def test_option_error_reads_in_python_terms():
    error = OptionError("n_hidden", "{name} 0 is not allowed; use a positive number of units")
    assert str(error) == "n_hidden 0 is not allowed; use a positive number of units"
    assert error.field == "n_hidden"


def _command_raising(field):
    @click.command()
    @click.option("--hidden", type=int, default=1)
    @click.option("--batch-size", type=int, default=1)
    @report_errors
    def command(hidden, batch_size):
        raise OptionError(field, "{name} 0 is not allowed; use a positive number")
    return command


def test_cli_prints_the_flag_of_a_renamed_field():
    result = CliRunner().invoke(_command_raising("n_hidden"), [])
    assert result.exit_code == 2
    assert "error: --hidden 0 is not allowed; use a positive number" in result.output


def test_cli_prints_the_option_of_the_same_name():
    result = CliRunner().invoke(_command_raising("batch_size"), [])
    assert "error: --batch-size 0 is not allowed" in result.output
