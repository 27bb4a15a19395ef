"""How a ``bin/`` script that works in its own process ends on a user's mistake: one ``error:`` line, exit
status 2, as the commands do (:func:`ksae_cupy.cli.common.report_errors`), never a traceback."""
from __future__ import annotations

import sys

from ksae_cupy.errors import KsaeError, one_line

EXIT_USAGE = 2


def run_main(main) -> int:
    """``main()``'s exit status (None: 0); a :class:`KsaeError` (a folder it cannot read, data not there) or
    an ``OSError`` is one ``error:`` line on stderr and status 2."""
    try:
        return main() or 0
    except KsaeError as exc:
        print(f"error: {one_line(exc) or type(exc).__name__}", file=sys.stderr)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{one_line(exc.strerror or exc)}", file=sys.stderr)
    return EXIT_USAGE


def refuse_no_arguments(parser, what_to_give: str, argv=None) -> None:
    """With no arguments at all: the usage line and one ``error:`` line saying what to give, status 2. A bare
    script name must not start an hours-long run or write a file: the whole run takes a flag."""
    if sys.argv[1:] if argv is None else argv:
        return
    parser.print_usage(sys.stderr)
    print(f"error: no arguments; {what_to_give}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def positive_int(text: str) -> int:
    """An argparse ``type=``: a whole number >= 1, else argparse's one-line usage error (no traceback)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a whole number >= 1")
    return value


def positive_ints(text: str) -> list[int]:
    """An argparse ``type=``: comma-separated whole numbers >= 1 (``10,25,40``)."""
    return [positive_int(part.strip()) for part in text.split(",")]
