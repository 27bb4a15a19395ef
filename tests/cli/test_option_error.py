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


def test_a_divergence_names_the_rate_to_change_as_python_and_as_the_command_spell_it():
    from ksae_cupy.errors import TrainingDiverged

    error = TrainingDiverged("the loss became nan at epoch 3; try a smaller {lr_start} (now 1e30)", fields=True)
    assert str(error) == "the loss became nan at epoch 3; try a smaller lr_start (now 1e30)"

    @click.command()
    @click.option("--lr-start", type=float, default=1.0)
    @report_errors
    def command(lr_start):
        raise error

    result = CliRunner().invoke(command, [])
    assert result.exit_code == 1  # diverged, not a usage error
    assert "error: the loss became nan at epoch 3; try a smaller --lr-start (now 1e30)" in result.output


def test_a_divergence_message_without_fields_keeps_its_braces():
    from ksae_cupy.errors import TrainingDiverged

    assert str(TrainingDiverged("checkpoint runs/{x}/checkpoint.h5 kept")) == "checkpoint runs/{x}/checkpoint.h5 kept"
