"""The package version, in a module of its own so that any layer can read it, and the commit
of the source it runs from."""

import functools
import pathlib
import subprocess

__version__ = "0.1.0"


@functools.cache
def source_commit() -> str:
    """The git commit of the package's source, with ``+modified`` when its files differ from
    it; ``"unknown"`` outside a git checkout (an installed wheel)."""
    here = pathlib.Path(__file__).resolve().parent

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10
        )
        if out.returncode:
            raise OSError(out.stderr)
        return out.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        modified = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+modified" if modified else "")
