"""Files written whole and read with care: ``atomic_write`` (a failure never leaves half a file),
the one naming of the temporary files and folders that stand in for a file until it is complete,
``npz_problem`` and ``npz_headers``, which read the headers of an ``.npz`` file's arrays before any
is loaded, and ``FolderLock``, which lets one run at a time write into a folder.

    atomic_write("run/vocab.json", lambda f: f.write(data), what="Tokenizer.save")

The file is written under a temporary name in the destination folder
(``.<name>.<pid>.<random>.tmp``, see ``temporary_file``), flushed to disk, then renamed over
``path`` in one step (``os.replace``): a reader sees the old file or the new one, never a mix,
and a crash leaves the old file as it was. Whatever stops the save (an error in ``write``, a
full disk, Ctrl-C), the temporary file is removed; a write the system refuses (a full disk, a
quota, the process's file-size limit) is an ``OSError`` of the same errno whose one sentence names
the path. A process killed mid-write cannot remove its own: ``remove_stale_temporaries(path)``
deletes those whose process is gone, and every save calls it first. A download or an unpacked
archive uses the same naming with its own suffix (``.part``, ``.unpacking``).

What the destination can be, and what happens:

- a new name in an existing folder: the file is created (mode 0666 less the umask);
- an existing file: it is replaced and keeps its permissions;
- a symbolic link: the file it points to is replaced (the link stays a link, as an ordinary
  ``open(path, "w")`` would write through it) and a ``UserWarning`` says so, naming the target;
- a read-only file (no write permission for its owner, whoever runs the save, root included):
  refused with ``PermissionError``; make it writable or save under another name;
- a folder, a folder that does not exist, a "folder" that is a file, a folder without write
  permission: refused with one sentence naming the path (``IsADirectoryError``,
  ``FileNotFoundError``, ``NotADirectoryError``, ``PermissionError``).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import math
import os
import stat
import sys
import tempfile
import warnings
import zipfile

import numpy as np

__all__ = ["FolderBusyError", "FolderLock", "LOCK_NAME", "atomic_write", "npz_headers", "npz_problem",
           "remove_stale_temporaries", "temporary_file", "temporary_folder", "write_failed"]


# ---------------------------------------------------------------------- temporary names
def _prefix(path):
    """(folder, ".<name>.<pid>.") of the temporaries that stand in for ``path``."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    return folder, f".{name}.{os.getpid()}."


def temporary_file(path, suffix=".tmp"):
    """(file descriptor, path) of a new empty file ``.<name>.<pid>.<random><suffix>`` beside
    ``path``, to be renamed over it once complete (``tempfile.mkstemp``: mode 0600)."""
    folder, prefix = _prefix(path)
    return tempfile.mkstemp(dir=folder, prefix=prefix, suffix=suffix)


def temporary_folder(path, suffix=".tmp"):
    """The path of a new empty folder ``.<name>.<pid>.<random><suffix>`` beside ``path``."""
    folder, prefix = _prefix(path)
    return tempfile.mkdtemp(dir=folder, prefix=prefix, suffix=suffix)


def remove_stale_temporaries(path, suffix=".tmp"):
    """Delete the temporary files of saves to ``path`` that were killed mid-write: the
    ``.<name>.<pid>.<random><suffix>`` whose process is gone, and any ``.<name>.<random><suffix>``
    (a name without a pid). Those of a save still running, here or in another process, stay,
    and so do those of another file (``.<name>.7.<pid>.<random>.tmp`` belongs to "<name>.7")."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    prefix = f".{name}."
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        if not (entry.startswith(prefix) and entry.endswith(suffix)):
            continue
        parts = entry[len(prefix):-len(suffix)].split(".")
        if len(parts) == 2 and parts[0].isdigit():          # <pid>.<random>
            pid = int(parts[0])
            if pid == os.getpid() or _process_alive(pid):
                continue  # a save still running (in this process's other thread, or elsewhere)
        elif len(parts) != 1:
            continue  # the temporary file of another file (e.g. "<name>.<suffix>")
        with contextlib.suppress(OSError):  # a killed save's leftover
            os.unlink(os.path.join(folder, entry))


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, owned by someone else
        return True
    return True


# ---------------------------------------------------------------------- saving


def atomic_write(path, write, *, what="save", binary=True):
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it over ``path``.

    ``what`` names the caller in the messages (e.g. "checkpoint.save"); ``binary=False``
    opens the temporary file as UTF-8 text. Returns the path written (the link's target when
    ``path`` is a symbolic link).
    """
    path = os.fspath(path)
    target = _destination(path, what)
    folder = os.path.dirname(target)
    remove_stale_temporaries(target)            # what a save killed mid-write left
    try:
        fd, tmp = temporary_file(target)
    except PermissionError:
        raise PermissionError(f"{what}: cannot write {path}: the folder {folder} is not writable "
                              f"(permission denied); save into a folder you can write to") from None
    except OSError as exc:
        raise type(exc)(f"{what}: cannot write {path}: creating a file in {folder} failed "
                        f"({exc.strerror}); save somewhere else") from None
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(target))
        os.replace(tmp, target)        # atomic: readers see the old file or the new one, never a mix
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.errno is None:          # raised by ``write`` with its own message
            raise
        raise write_failed(exc, path, what) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (POSIX)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target


SPACE = {errno.ENOSPC: "free some space or save elsewhere", errno.EFBIG: "the file is larger than this process "
         "may write (ulimit -f) or than the file system holds; raise the limit or save elsewhere",
         getattr(errno, "EDQUOT", -1): "your disk quota is used up; free some space or save elsewhere"}


def write_failed(exc: OSError, path, what) -> OSError:
    """``exc`` (a write the system refused) as the same kind of OSError whose message names ``path``
    and says that the file there, if any, is as it was."""
    hint = SPACE.get(exc.errno, "save elsewhere")
    error = type(exc)(f"{what}: writing {path} failed: {exc.strerror or exc}; the file there, if any, is as it "
                      f"was ({hint})")
    error.errno = exc.errno            # (strerror and filename stay unset: they would replace the message)
    return error


def _destination(path, what):
    """The file to replace (a link's target), after refusing what cannot or should not be replaced."""
    target = os.path.abspath(path)
    if os.path.islink(path):
        target = os.path.realpath(path)
        warnings.warn(f"{what}: {path} is a symbolic link; the file it points to, {target}, is replaced "
                      f"(the link itself is kept)", UserWarning, stacklevel=3)
    if os.path.isdir(target):
        raise IsADirectoryError(f"{what}: {path} is a folder; give a file name inside it, "
                                f"e.g. {os.path.join(path, 'name')}")
    folder = os.path.dirname(target)
    if not os.path.exists(folder):
        raise FileNotFoundError(f"{what}: cannot write {path}: the folder {folder} does not "
                                f"exist (create it first, e.g. os.makedirs({folder!r}))")
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"{what}: cannot write {path}: {folder} is a file, not a "
                                 f"folder; choose another path")
    with contextlib.suppress(FileNotFoundError):
        if not os.stat(target).st_mode & stat.S_IWUSR:
            raise PermissionError(f"{what}: {path} is read-only, so it was not replaced; make it "
                                  f"writable (chmod u+w) or save under another name")
    return target


def _file_mode(path):
    """The old file's permissions, or the usual ones for a new file (mkstemp uses 0600)."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# ---------------------------------------------------------------------- reading an .npz
def npz_headers(path) -> dict:
    """{array name: (shape, dtype)} of the ``.npz`` file ``path``, read from the arrays' headers alone
    (nothing is allocated); arrays whose header cannot be read are left out, and a file that is not
    a zip at all gives {}."""
    return {name: h[:2] for name, h in _npz_members(path).items() if not isinstance(h, str)}


def _npz_members(path) -> dict:
    """{array name: (shape, dtype, bytes its member holds), or the class name of the error reading it}."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError):
        return {}
    members = {}
    with archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-len(".npy")]
            try:
                with archive.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                    else:
                        continue                        # a newer format: np.load reads it
                    members[name] = (tuple(shape), dtype, info.file_size - f.tell())
            except Exception as err:   # a damaged header: ValueError, zlib.error, EOFError, ...
                members[name] = type(err).__name__
    return members


def npz_problem(path):
    """What is wrong with the arrays of the ``.npz`` file ``path``, in a sentence, or None.

    Only the headers are read, before anything is allocated: an array that needs pickle (an
    object array), or one whose header declares more bytes than its member holds (a damaged file
    whose shape would ask NumPy for terabytes, a raw MemoryError) is named with its shape. A file
    that is not a zip at all is left to the caller's own message (None)."""
    for name, header in _npz_members(path).items():
        if isinstance(header, str):
            return f"the array {name!r} has a damaged header ({header})"
        shape, dtype, held = header
        if dtype.hasobject:
            return (f"the array {name!r} holds Python objects (dtype {dtype}), which need pickle to be read; "
                    "tinymlp never unpickles: save plain numeric arrays (and text as a string array)")
        declared = math.prod(shape) * dtype.itemsize
        if declared > held:
            return (f"the array {name!r} declares the shape {tuple(shape)} of {dtype} ({declared:,} bytes) "
                    f"but holds {max(held, 0):,} bytes: the file is damaged or truncated")
    return None


# ---------------------------------------------------------------------- one writer per folder
LOCK_NAME = ".tinymlp.lock"


class FolderBusyError(RuntimeError):
    """A folder that another process holds a ``FolderLock`` on; ``holder``: what it wrote in the lock."""

    def __init__(self, folder, holder):
        self.folder, self.holder = folder, holder
        super().__init__(f"{folder} is in use by another run ({holder or 'a process that wrote no details'}); "
                         "wait for it to end, or write somewhere else")


class FolderLock:
    """One writer at a time in ``folder``: an exclusive ``flock`` on ``folder/.tinymlp.lock``.

        with FolderLock("runs/pets"):          # or lock = FolderLock(path).acquire(); ...; lock.release()
            ...

    The operating system lets go of the lock when its process ends, killed or not, so a killed run
    never leaves a folder locked (the file stays until the next holder removes it). ``acquire``
    does not wait: a folder locked by another process is a ``FolderBusyError`` naming that process
    (its pid, when it started, its command). The lock is advisory (only ``FolderLock`` looks at it)
    and a no-op where ``fcntl`` does not exist (Windows)."""

    def __init__(self, folder):
        self.folder = os.fspath(folder)
        self.path = os.path.join(self.folder, LOCK_NAME)
        self._fd = None

    def acquire(self) -> FolderLock:
        try:
            import fcntl
        except ImportError:       # no flock here: one run at a time is up to the user
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
                os.close(fd)
                raise FolderBusyError(self.folder, holder) from None
            try:                  # the file locked must still be the one at the path (a holder removes it)
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        started = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
        command = " ".join(sys.argv) if sys.argv and sys.argv[0] else "python"
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()}, started {started}: {command}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and let go of the lock (nothing when it is not held)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
