"""An agreed check's failure keeps a bad parameter's field, so the MPI command prints its flag
(``--threads``) where Python code reads the field (``n_threads``). No MPI here: a one-rank
stand-in for the communicator, whose all-gather returns this rank's value."""
import pytest

from ksae_cupy.errors import KsaeError, OptionError
from ksae_cupy.parallel.agree import RanksFailed, agree, describe


class _OneRank:
    rank, size = 0, 1

    def allgather(self, value):
        return [value]


def _refuse_threads():
    raise OptionError("n_threads", "{name} 0 is not allowed; use a positive number of threads")


def flag(field):
    return {"n_threads": "--threads"}.get(field, "--" + field.replace("_", "-"))


def test_an_agreed_option_error_is_spelled_by_the_command():
    with pytest.raises(RanksFailed) as failed:
        agree(_OneRank(), _refuse_threads)
    assert str(failed.value) == "n_threads 0 is not allowed; use a positive number of threads"
    assert failed.value.lines() == ["n_threads 0 is not allowed; use a positive number of threads"]
    assert failed.value.lines(flag) == ["--threads 0 is not allowed; use a positive number of threads"]
    assert failed.value.status == 2


def test_other_errors_read_as_before_with_or_without_spelling():
    def refuse():
        raise KsaeError("--resume nothere: no such run folder")

    with pytest.raises(RanksFailed) as failed:
        agree(_OneRank(), refuse)
    assert failed.value.lines(flag) == failed.value.lines() == ["--resume nothere: no such run folder"]
    # the failures a trainer builds itself (rank, line, status) still read
    assert RanksFailed([(0, "diverged", 1)], 2, job_wide=True).lines(flag) == ["diverged"]


def test_describe_spells_an_option_error_when_asked():
    error = OptionError("shard_hidden", "{name}: 2 hidden units cannot be split over 3 ranks")
    assert describe(error) == ("shard_hidden: 2 hidden units cannot be split over 3 ranks", 2)
    assert describe(error, flag) == ("--shard-hidden: 2 hidden units cannot be split over 3 ranks", 2)
