"""The ``mhalearn`` command (also ``python -m mhalearn``).

    mhalearn run [STUDY] [--option value ...]   run a study (default: recovery), resumably
    mhalearn list                               the studies, their options and what they mean
    mhalearn plot RESULTS                       the figure of a saved results file
    mhalearn bench NAME [NAME ...] [-- ARGS]    benchmark scripts (source checkout)

A bad argument or an invalid config ends with a one-line message and exit code 2, before
anything is written; SIGINT or SIGTERM ends a run at once with a one-line message and exit code
130 or 143, finished cells kept.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from mhalearn.cli.actions import _exit_on_signals, bench, list_studies, plot, run, status
from mhalearn.cli.commands import List, Plot, Run, Status, _parse


def main(argv: Sequence[str] | None = None) -> int:
    """The command; ``argv`` (default: the process's) without the program name. Only the
    process's own command (``argv`` None) takes over SIGINT and SIGTERM."""
    own = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    try:
        command = _parse(argv)
        if isinstance(command, Run):
            if own:
                _exit_on_signals("finished cells are kept; run the same command to resume")
            run(command)
            if own:  # done and saved: a signal now would only race the interpreter's exit
                for sig in (signal.SIGINT, signal.SIGTERM):  # (which restores the default
                    signal.signal(sig, signal.SIG_IGN)  # handlers, killing it silently)
        elif isinstance(command, List):
            list_studies(command)
        elif isinstance(command, Plot):
            plot(command)
        elif isinstance(command, Status):
            status(command)
        else:
            return bench(command, extra)
        sys.stdout.flush()
    except ValueError as err:
        print(f"mhalearn: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `mhalearn list | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("mhalearn: interrupted", file=sys.stderr)
        return 130
    return 0
