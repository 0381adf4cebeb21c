"""A run's --out folder is the user's: which folder a run writes to, one run at a time in it, and
nothing in it replaced that the run did not write.

- A new run writes to --out (default ``runs/<model>``) when nothing there is a run's (none of
  ``OUTPUTS``); else, as timm numbers an experiment folder that exists, to the first free
  ``<out>-2``, ``<out>-3``, ..., and says so: rerunning a command never refuses and never replaces.
- ``--overwrite`` starts the new run in --out itself: the files an earlier run left there are named
  when the run starts and replaced at its first save (what that save does not write again, e.g.
  another run's best.npz, is removed then); a run stopped or refused before that leaves them as
  they were.
- ``--resume`` continues a run in its own folder (or into an --out holding no other run).
  ``--resume auto`` starts a new run in an --out that holds nothing of a run, and refuses one that
  holds a run's files but no checkpoint.npz to continue (a best.npz alone, say).
- One run at a time writes in a folder: a ``tinymlp.files.FolderLock`` that the operating system
  releases when its process ends, killed or not. A new run finding --out locked goes to the next
  free folder; a resumed or overwriting run is refused.
- An --out inside the images read for training (``--dataset folder``) is refused: its files would
  become training data.

``open_out`` does all this before any data is read and returns the ``RunFolder``; ``RunFolder.close``
(run by ``guard`` when the run ends) lets go of the lock and removes the folders it created that
are still empty.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cli import BEST, CHECKPOINT, CURVES, METRICS, UsageError, count

from tinymlp import checkpoint
from tinymlp.files import FolderBusyError, FolderLock

__all__ = ["OUTPUTS", "RunFolder", "check_writable", "open_out", "resume_path"]

# every file a run of the example scripts writes in its --out: the folder holds a run when one is there
OUTPUTS = (CHECKPOINT, BEST, METRICS, "metrics.csv", CURVES, "confusion.png", "tokenizer.json", "token_mixing.png",
           "spatial_weights.png", "weights.png")
MAX_FOLDERS = 1000          # <out>-2 .. <out>-1000


class RunFolder:
    """The folder a run writes to (``path``), locked for it; ``replaced``: the files of an earlier run
    there (--overwrite), removed at this run's first save unless that save wrote them again."""

    def __init__(self, path: Path, lock: FolderLock, created: list, replaced: dict):
        self.path, self.lock, self.created, self.replaced = path, lock, created, replaced

    def saved(self) -> None:
        """After each save of the run: the first one removes what the run replaced and did not write again."""
        for name, before in self.replaced.items():
            with contextlib.suppress(OSError):
                if _identity(self.path / name) == before:        # not written by this run: the old run's
                    os.unlink(self.path / name)
        self.replaced = {}

    def close(self) -> None:
        """Let go of the lock; remove the folders ``open_out`` created that are still empty."""
        self.lock.release()
        for folder in self.created:                              # deepest first
            try:
                folder.rmdir()
            except OSError:
                return


def _identity(path: Path):
    info = os.stat(path)
    return info.st_ino, info.st_mtime_ns, info.st_size


def _outputs(folder: Path) -> list:
    return [name for name in OUTPUTS if (folder / name).exists()]


def _describe(folder: Path, found) -> str:
    """'checkpoint.npz (mixer_cifar, 3 epochs done), best.npz, metrics.json'."""
    parts = []
    for name in found:
        text = name
        if name in (CHECKPOINT, BEST):
            try:
                meta = checkpoint.read_meta(folder / name)
                text += f" ({meta.get('preset')}, {count(int(meta.get('epoch')), 'epoch')} done)"
            except Exception:      # a damaged or foreign file is still someone's: named, never replaced
                pass
        parts.append(text)
    return ", ".join(parts)


def check_writable(out: Path):
    """--out must be a folder we can create and write in: checked before any download or training."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file, expected a folder")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == out else f" (cannot create it inside {existing})"
        raise UsageError(f"--out {out}: not writable{where}; choose a folder you can write to")


def _check_not_in_data(args, out: Path):
    """An --out inside the image folder a run trains on would add its files to the data."""
    data = getattr(args, "data_dir", None)
    if getattr(args, "dataset", None) != "folder" or not data:
        return
    data, where = Path(data).resolve(), out.resolve()
    if where == data or data in where.parents:
        raise UsageError(f"--out {out} is inside --data-dir {args.data_dir}, the images this run trains on: its "
                         "checkpoints and plots would be read as data; choose an --out outside it")


def resume_path(args, out: Path):
    """The checkpoint --resume names (``auto``: --out's, if there is one yet), or None. ``auto`` in an
    --out that holds a run's files but no checkpoint.npz is refused: there is nothing to continue,
    and a new run there would replace them."""
    if args.resume is None:
        return None
    if args.resume == "auto":
        path = out / CHECKPOINT
        if path.is_file():
            return path
        found = _outputs(out) if out.is_dir() else []
        if found:
            hint = (f"continue from best.npz with --resume {out / BEST}, " if BEST in found else "")
            raise UsageError(f"--resume auto: {out} holds {_describe(out, found)} but no {CHECKPOINT} to continue; "
                             f"{hint}or leave --resume out to start a new run (it writes to a new folder)")
        print(f"--resume auto: no {path} yet, starting a new run")
        return None
    path = Path(args.resume)
    if not path.is_file():
        raise UsageError(f"--resume {args.resume}: no such file")
    return path


def _candidates(out: Path, new_run: bool):
    yield out
    if new_run:
        base = out if out.name else out.resolve()
        for n in range(2, MAX_FOLDERS + 1):
            yield base.with_name(f"{base.name}-{n}")


def _make(folder: Path) -> list:
    """Create ``folder``; the folders created (deepest first), for ``RunFolder.close`` to remove if unused."""
    created, missing = [], folder
    while not missing.exists() and missing != missing.parent:
        created.append(missing)
        missing = missing.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {folder}: cannot create it ({err.strerror or err})") from None
    return created


def open_out(args, out: Path, resume) -> RunFolder:
    """The folder this run writes to, locked (see the module docstring); refused runs change nothing."""
    check_writable(out)
    _check_not_in_data(args, out)
    overwrite = bool(getattr(args, "overwrite", False))
    continuing = resume is not None and resume.resolve().parent == out.resolve()
    new_run = args.resume is None and not overwrite     # may go to <out>-2, ...
    busy = None                                          # why --out itself was passed over, when it was busy
    for folder in _candidates(out, new_run):
        created = _make(folder)
        lock = FolderLock(folder)
        try:
            lock.acquire()
        except FolderBusyError as err:
            if new_run:
                busy = busy or err.holder
                continue
            RunFolder(folder, lock, created, {}).close()
            raise UsageError(f"--out {err}") from None
        found = [] if continuing else _outputs(folder)
        if found and new_run:
            lock.release()
            continue
        if found and not overwrite:      # continuing another folder's checkpoint here
            lock.release()
            raise UsageError(f"--out {folder} holds another run ({_describe(folder, found)}), which continuing "
                             f"{resume} there would replace; choose another --out, or pass --overwrite")
        if found:
            print(f"--overwrite: {folder} holds {_describe(folder, found)}; they are replaced at this run's first "
                  "save, and are as they were until then")
        elif folder != out and busy is not None:
            print(f"note: {out} is in use by another run ({busy}); this run writes to {folder}")
        elif folder != out:
            print(f"note: {out} holds another run ({_describe(out, _outputs(out))}); this run writes to {folder} "
                  f"(continue that one with --resume auto --out {out}, or replace it with --overwrite)")
        return RunFolder(folder, lock, created, {name: _identity(folder / name) for name in found})
    raise UsageError(f"--out {out}: {out}-2 to {out}-{MAX_FOLDERS} are all taken; choose another --out")
