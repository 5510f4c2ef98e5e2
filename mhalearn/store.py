"""Results on disk: netCDF (through xarray and h5netcdf), atomic writes, resume.

A study's folder holds ``config.json`` (the full config: study, grid, instances, seed,
precision), one ``cells/<cell>.nc`` per finished cell and, at the end, ``results.nc`` (the
merged Dataset). Every file is written to a temporary name in the same folder, flushed to disk
and renamed, so a run killed at any moment leaves only whole files; started again, it computes
the missing cells only. A folder that holds another config is refused. No pickle anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

ENGINE = "h5netcdf"


def _atomic_write(path: Path, write) -> None:
    """``write(tmp_path)``, fsync, then rename onto ``path`` (atomic on POSIX)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class Store:
    """The folder of one study's results. ``Store(folder, config)`` creates it, or checks that
    the config it holds is ``config`` (``overwrite=True``: clears it instead)."""

    def __init__(self, folder: str | os.PathLike, config: dict[str, Any], overwrite: bool = False):
        self.folder = Path(folder)
        self.cells = self.folder / "cells"
        saved = self.folder / "config.json"
        text = json.dumps(config, indent=1, sort_keys=True)
        if overwrite:
            self.clear()
        elif saved.exists():
            if json.loads(saved.read_text()) != json.loads(text):
                raise ValueError(
                    f"{self.folder} holds results of a different config; pass --overwrite to "
                    f"replace them or choose another folder with --out"
                )
        elif self.folder.exists() and any(self.folder.iterdir()):
            raise ValueError(
                f"{self.folder} is not empty and holds no config.json; pass --overwrite to "
                f"replace its contents or choose another folder with --out"
            )
        self.cells.mkdir(parents=True, exist_ok=True)
        for stale in self.folder.glob("**/.*.tmp*"):  # left by a run killed mid-write
            stale.unlink(missing_ok=True)
        if not saved.exists():
            _atomic_write(saved, lambda tmp: tmp.write_text(text))

    def clear(self) -> None:
        """Remove what a study left here (its config, cells, results and figure)."""
        for path in (self.folder / "config.json", self.results_path, self.figure_path):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.cells, ignore_errors=True)

    @property
    def results_path(self) -> Path:
        return self.folder / "results.nc"

    @property
    def figure_path(self) -> Path:
        return self.folder / "figure.png"

    def _cell(self, name: str) -> Path:
        return self.cells / f"{name}.nc"

    def has(self, name: str) -> bool:
        return self._cell(name).exists()

    def write_cell(self, name: str, ds) -> None:
        _atomic_write(self._cell(name), lambda tmp: ds.to_netcdf(tmp, engine=ENGINE))

    def read_cell(self, name: str):
        return load(self._cell(name))

    def write_results(self, ds) -> Path:
        _atomic_write(self.results_path, lambda tmp: ds.to_netcdf(tmp, engine=ENGINE))
        return self.results_path


def load(path: str | os.PathLike):
    """A results file as an in-memory ``xarray.Dataset`` (the file is closed on return)."""
    import xarray as xr

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no results file at {path}")
    return xr.load_dataset(path, engine=ENGINE)
