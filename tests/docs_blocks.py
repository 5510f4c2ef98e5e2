"""Run one documentation code block in this process and report what it printed, line by line.

Usage: ``python tests/docs_blocks.py < block.py`` prints one JSON list of
``[line number in the block, printed text]``: each ``print`` call is attributed to the block
line that made it (a print inside a loop or a function of the block counts at that line).
The tests run every block in a fresh process this way (tests/test_docs.py).
"""

import builtins
import json
import sys

NAME = "<docs block>"


def main() -> None:
    source = sys.stdin.read()
    printed: list[tuple[int, str]] = []
    real_print = builtins.print

    def record(*args, sep=" ", end="\n", file=None, flush=False):
        if file not in (None, sys.stdout):
            return real_print(*args, sep=sep, end=end, file=file, flush=flush)
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != NAME:
            frame = frame.f_back
        printed.append((frame.f_lineno if frame else 0, sep.join(str(a) for a in args)))

    builtins.print = record
    try:
        exec(compile(source, NAME, "exec"), {"__name__": "__main__"})
    finally:
        builtins.print = real_print
    sys.stdout.write(json.dumps(printed) + "\n")


if __name__ == "__main__":
    main()
