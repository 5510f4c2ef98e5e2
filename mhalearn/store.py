"""Results on disk: netCDF (through xarray and h5netcdf), atomic writes, resume, growing grids.

A study's folder holds ``config.json`` (the full config: study, grid, instances, seed,
precision), one ``cells/<cell>.nc`` per finished cell and, at the end, ``results.nc`` (the
merged Dataset). Every file is written to a temporary name in the same folder, flushed to disk
and renamed, so a run killed at any moment leaves only whole files; started again, it computes
the missing cells only. No pickle anywhere.

:class:`Store` checks before it touches anything: constructing one validates the folder (it
can be created and written) and the config it holds; the folder is created, cleared
(``overwrite``) or its config replaced only at the first write. A folder whose config differs
only in the values of the grid axes (``grid``) is *grown*: its finished cells are kept and
the new grid's missing cells are computed. Any other difference is refused, naming the fields.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENGINE = "h5netcdf"


def _tmp_suffix() -> str:
    """A temporary name's mark of the process writing it: host and process id."""
    return f".tmp-{socket.gethostname()}-{os.getpid()}"


def _abandoned(tmp: Path) -> bool:
    """Whether a temporary file was left by a process of this host that has ended (a file of
    another host, or of a process still writing, may be in use: left alone)."""
    match = re.search(r"\.tmp-(.+)-(\d+)$", tmp.name)
    if match is None or match[1] != socket.gethostname():
        return False
    try:
        os.kill(int(match[2]), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _atomic_write(path: Path, write) -> None:
    """``write(tmp_path)``, fsync, then rename onto ``path`` (atomic on POSIX)."""
    tmp = path.with_name(f".{path.name}{_tmp_suffix()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


#: the folders whose lock this process holds, and how deeply (the lock is re-entrant)
_HELD: dict[Path, int] = {}


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike) -> Iterator[None]:
    """Exclusive use of ``folder``'s config, job ledger and merged results across processes
    (``fcntl.flock`` on ``folder/.lock``); re-entrant within a process."""
    folder = Path(folder).resolve()
    if _HELD.get(folder):
        _HELD[folder] += 1
        try:
            yield
        finally:
            _HELD[folder] -= 1
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD[folder] = 1
        try:
            yield
        finally:
            _HELD[folder] = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


def _only_leftovers(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but what a run stopped before writing its config
    leaves: the lock, temporary files, an empty ``cells`` folder."""
    for path in folder.iterdir():
        if path.name == ".lock" or re.search(r"\.tmp-.+-\d+$", path.name):
            continue
        if path.name == "cells" and path.is_dir() and not any(path.iterdir()):
            continue
        return False
    return True


def writable_folder(option: str, folder: str | os.PathLike) -> Path:
    """Check that ``folder`` is, or can be created as, a folder this process can write to
    (``option``: the name used in the message); nothing is left behind. Returns it."""
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is" if existing == folder else f"lies inside {existing}, which is"
        raise ValueError(f"{option}: {folder} {what} a file, not a folder")
    try:  # the only sure test: make something there, and remove it
        os.rmdir(tempfile.mkdtemp(prefix=".mhalearn-probe-", dir=existing))
    except OSError as err:
        raise ValueError(
            f"{option}: cannot write to {folder} ({err.strerror or err} in {existing})"
        ) from None
    return folder


def _differences(saved: dict[str, Any], wanted: dict[str, Any], grid: tuple[str, ...]) -> str:
    names = sorted((set(saved) | set(wanted)) - set(grid))
    diff = [n for n in names if saved.get(n) != wanted.get(n)]
    return "; ".join(f"{n} is {saved.get(n)!r} there, {wanted.get(n)!r} here" for n in diff)


class Store:
    """The folder of one study's results.

    ``Store(folder, config, overwrite, grid)`` only checks: that the folder can be written,
    and that what it holds is this config (or this config with other values on the ``grid``
    axes, which grows it; ``overwrite=True``: anything, to be replaced). The folder is
    prepared at the first write (:meth:`open`): created, emptied when overwriting, its
    ``config.json`` written."""

    def __init__(
        self,
        folder: str | os.PathLike,
        config: dict[str, Any],
        overwrite: bool = False,
        grid: tuple[str, ...] = (),
    ):
        self.folder = writable_folder("out", folder)
        self.cells = self.folder / "cells"
        self.config = json.loads(json.dumps(config))
        self.overwrite = overwrite
        self._open = False
        saved = self.folder / "config.json"
        if overwrite or not self.folder.exists():
            return
        if saved.is_file():
            try:
                held = json.loads(saved.read_text())
            except (OSError, ValueError) as err:
                raise ValueError(
                    f"{saved} cannot be read ({err}); pass --overwrite to replace the folder"
                ) from None
            diff = _differences(held, self.config, grid)
            if diff:
                raise ValueError(
                    f"{self.folder} holds results of a different config ({diff}); pass "
                    f"--overwrite to replace them or choose another folder with --out"
                )
        elif not _only_leftovers(self.folder):
            raise ValueError(
                f"{self.folder} is not empty and holds no config.json; pass --overwrite to "
                f"replace its contents or choose another folder with --out"
            )

    def open(self) -> None:
        """Prepare the folder for writing (once): create it, empty it when overwriting
        (everything in it goes, stray files included), remove temporary files left by a run
        of this host killed mid-write (not those of a process still writing: a job beside
        this one), and write ``config.json``."""
        if self._open:
            return
        with folder_lock(self.folder):
            self._prepare()
        # emptied: from now on the cells in the folder are this run's
        self._open, self.overwrite = True, False

    def _prepare(self) -> None:
        if self.overwrite and self.folder.exists():
            for path in self.folder.iterdir():
                if path.name == ".lock":  # held by this process: kept, or the lock breaks
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in self.folder.glob("**/.*.tmp-*"):
            if _abandoned(stale):  # a job of another process may be writing its own
                stale.unlink(missing_ok=True)
        # the config first: a run stopped before it leaves nothing a rerun would refuse
        text = json.dumps(self.config, indent=1, sort_keys=True)
        saved = self.folder / "config.json"
        if not saved.is_file() or saved.read_text() != text:
            _atomic_write(saved, lambda tmp: tmp.write_text(text))
        self.cells.mkdir(exist_ok=True)

    @property
    def results_path(self) -> Path:
        return self.folder / "results.nc"

    @property
    def figure_path(self) -> Path:
        return self.folder / "figure.png"

    def _cell(self, name: str) -> Path:
        return self.cells / f"{name}.nc"

    def has(self, name: str) -> bool:
        return not self.overwrite and self._cell(name).is_file()

    def write_cell(self, name: str, ds) -> None:
        self.open()
        _atomic_write(self._cell(name), lambda tmp: ds.to_netcdf(tmp, engine=ENGINE))

    def read_cell(self, name: str):
        return load(self._cell(name))

    def write_results(self, ds) -> Path:
        self.open()
        with folder_lock(self.folder):
            _atomic_write(self.results_path, lambda tmp: ds.to_netcdf(tmp, engine=ENGINE))
        return self.results_path

    def write_figure(self, fig) -> Path:
        """The figure as ``figure.png`` (through a temporary file, as every write)."""
        from mhalearn import plots

        self.open()
        _atomic_write(self.figure_path, lambda tmp: plots.save(fig, tmp))
        return self.figure_path


def load(path: str | os.PathLike):
    """A results file as an in-memory ``xarray.Dataset`` (the file is closed on return); a
    folder stands for the ``results.nc`` in it."""
    import xarray as xr

    path = Path(path)
    if path.is_dir():
        if not (path / "results.nc").is_file():
            raise ValueError(f"{path} is a folder without a results.nc")
        path = path / "results.nc"
    if not path.is_file():
        raise ValueError(f"no results file at {path}")
    try:
        return xr.load_dataset(path, engine=ENGINE)
    except Exception as err:  # h5py, h5netcdf and xarray each raise their own kind
        why = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"{path} is not a readable netCDF results file ({why})") from None
