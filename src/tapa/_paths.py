"""Where commands write: one rule for every output directory, and what a run directory is.

The rule (`check_output_dir`, called before the command does any work):
- a path that is a file is refused;
- a training run directory, or any path inside one (its checkpoints/, a step folder), is refused,
  always, --overwrite or not: writing there would replace the run's config.json or a checkpoint's
  weights. A command may name direct subfolders it owns there (`tapa eval`: RUN/eval, RUN/eval-*);
- a directory holding anything this command does not write, or lacking the command's marker file
  (so a directory with a config.json of another program's model is not taken for ours), is refused
  unless the user passes --overwrite;
- an absent or empty directory, or an earlier output of the same command, is fine.

`replacing_outputs` then writes: the command's earlier outputs are moved aside first, so a file the
new run does not write (a stale tokenizer, an old passkey plot) does not survive it, and restored
if the new run fails half-way. While it writes, PARTIAL names what it writes; a write killed half-way
(kill -9) leaves it behind, so the next run of the same command recognises the folder as its own
and writes it again.

This module imports nothing from the rest of tapa, so every layer may use it.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

RUN_CONFIG = "config.json"
RUN_CHECKPOINTS = "checkpoints"
RUN_LOCK = ".tapa-run.lock"  # held by the `tapa train` writing the run (tapa.train.rundir.RunLock)
_ASIDE = ".tapa-replaced-"  # earlier outputs while a command rewrites them (left behind by a kill)
PARTIAL = ".tapa-partial.json"  # the outputs a command is writing (left behind by a kill)


def is_run_dir(path: str | os.PathLike) -> bool:
    """A training run directory: config.json and checkpoints/ (what `tapa train` writes)."""
    path = Path(path)
    return (path / RUN_CONFIG).is_file() and (path / RUN_CHECKPOINTS).is_dir()


def enclosing_run_dir(path: str | os.PathLike) -> Path | None:
    """The training run directory that `path` is or lies inside (links resolved), or None. A
    directory with config.json and the run lock counts, even before its first checkpoint."""
    resolved = Path(os.path.realpath(Path(path).expanduser()))
    for candidate in (resolved, *resolved.parents):
        if is_run_dir(candidate) or ((candidate / RUN_CONFIG).is_file() and (candidate / RUN_LOCK).exists()):
            return candidate
    return None


def run_dirs_inside(path: str | os.PathLike) -> list[Path]:
    """The run directories directly inside `path`, sorted (e.g. the rope/ and tapa/ of a demo)."""
    path = Path(path)
    if not path.is_dir():
        return []
    return sorted(child for child in path.iterdir() if child.is_dir() and is_run_dir(child))


def set_default_mode(path: str | os.PathLike) -> None:
    """Give a file the permissions of a newly created one (0666 less the umask): some writers
    (safetensors) create their files 0600, unreadable to the rest of a shared machine."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _matches(name: str, outputs: Sequence[str]) -> bool:
    if name == PARTIAL or name.startswith(_ASIDE):  # the bookkeeping of replacing_outputs
        return False
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in outputs)


def _partial_outputs(path: Path) -> tuple[str, ...] | None:
    """The outputs an interrupted `replacing_outputs` was writing into path, or None."""
    try:
        return tuple(json.loads((path / PARTIAL).read_text())["outputs"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_output_dir(path: str | os.PathLike, *, outputs: Sequence[str], marker: str,
                     overwrite: bool = False, command: str = "tapa",
                     run_subdirs: Sequence[str] = ()) -> Path:
    """Refuse an output directory this command should not write into (see the module docstring).

    outputs: the names (fnmatch patterns) the command writes there; marker: the file among them
    that only this command writes; run_subdirs: names (fnmatch patterns) of folders directly inside
    a run directory that the command owns. Raises ValueError naming the directory and what to do.
    """
    path = check_not_in_run(path, command=command, run_subdirs=run_subdirs)
    if not path.is_dir() or overwrite:
        return path
    entries = sorted(entry.name for entry in path.iterdir()
                     if not entry.name.startswith(_ASIDE) and entry.name != PARTIAL)
    foreign = [name for name in entries if not _matches(name, outputs)]
    # a write of this command that was killed half-way: its marker may not be written yet
    interrupted = _partial_outputs(path) == tuple(outputs)
    if entries and (foreign or (marker not in entries and not interrupted)):
        shown = foreign or entries
        listing = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
        raise ValueError(f"output directory {str(path)!r} holds files {command} did not write ({listing}); "
                         "choose an empty or new directory, or pass --overwrite to write there anyway")
    return path


def check_not_in_run(path: str | os.PathLike, *, command: str = "tapa",
                     run_subdirs: Sequence[str] = ()) -> Path:
    """The first half of check_output_dir's rule, for commands that may share a directory with
    other files (tapa demo): refuse a file, a training run directory and any path inside one but
    the run_subdirs the command owns. Returns the path, user-expanded."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"output directory {str(path)!r} is a file; choose a directory")
    if is_run_dir(path):
        raise ValueError(f"{str(path)!r} is a training run directory ({RUN_CONFIG} + {RUN_CHECKPOINTS}/); "
                         f"{command} would overwrite its files: choose another output directory")
    run = enclosing_run_dir(path)
    if run is not None:
        inside = Path(os.path.realpath(path)).relative_to(run)
        owned = len(inside.parts) == 1 and _matches(inside.parts[0], run_subdirs)
        if not owned:
            raise ValueError(f"{str(path)!r} is inside the training run directory {str(run)!r} ({inside}); "
                             f"{command} would write among the run's files (--overwrite or not): "
                             "choose an output directory outside it")
    return path


@contextmanager
def replacing_outputs(path: str | os.PathLike, outputs: Sequence[str]) -> Iterator[Path]:
    """Create `path`; move its entries matching `outputs` aside while the body writes the new ones;
    drop them on success, put them back (and remove the partial new ones) on failure. PARTIAL names
    `outputs` meanwhile, so a write killed half-way is known as this command's by the next one."""
    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    for leftover in path.glob(f"{_ASIDE}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    (path / PARTIAL).write_text(json.dumps({"outputs": list(outputs), "pid": os.getpid()}) + "\n")
    aside = path / f"{_ASIDE}{uuid.uuid4().hex[:8]}"
    previous = [entry.name for entry in path.iterdir() if _matches(entry.name, outputs)]
    try:
        if previous:
            aside.mkdir()
            for name in previous:
                os.replace(path / name, aside / name)
        try:
            yield path
        except BaseException:
            for entry in path.iterdir():
                if _matches(entry.name, outputs):
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            for name in previous:
                os.replace(aside / name, path / name)
            raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        (path / PARTIAL).unlink(missing_ok=True)


def write_csv(path: str | os.PathLike, rows: Sequence[dict]) -> None:
    """rows as CSV, one column per key any row has (in first-seen order; a missing key is empty).
    No rows: no file."""
    if not rows:
        return
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
