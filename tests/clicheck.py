"""The one check every CLI test shares: a user mistake is one ``error:`` line, no traceback."""


def assert_one_line_error(result, *fragments, status=None):
    """One ``error:`` line ends stderr (progress lines may come before it) and names every fragment.

    ``status``, when given, is the exit status the command must have returned.
    """
    if status is not None:
        assert result.exit_code == status, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    assert "Traceback" not in result.output


SESSION = ["--device", "cpu", "--threads", "1", "--quiet"]  # a command's session options in tests
FINETUNE = ["--epochs", "1", "--batch-size", "50", "--lr-start", "0.1", "--lr-end", "0.01", *SESSION]


def invoke(command, args, expect=0):
    """``command`` run with ``args`` (made strings); its exit status must be ``expect`` (None: not checked)."""
    from click.testing import CliRunner

    result = CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=False)
    if expect is not None:
        assert result.exit_code == expect, result.output
    return result
