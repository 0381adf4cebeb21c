"""Saving files (tinymlp.files.atomic_write, and the saves built on it: Tokenizer.save, the plots):
each destination that cannot or should not be replaced gives one sentence naming the path, and no
temporary file is ever left behind.

The tests run as root in CI, where a folder without write permission is still writable: a
read-only folder is simulated by making the creation of the temporary file raise PermissionError,
as the operating system does for an ordinary user."""

import os
import tempfile

import numpy as np
import pytest

from tinymlp import files
from tinymlp.files import atomic_write
from tinymlp.data.tokenizer import Tokenizer


def write_text(text):
    return lambda f: f.write(text.encode())


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def tok():
    return Tokenizer.train(["a small corpus of words", "words of a corpus"] * 3, vocab_size=40)


def test_a_new_file_and_a_replaced_file(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write(path, write_text("one"))
    path.chmod(0o640)
    atomic_write(path, write_text("two"))
    assert path.read_text() == "two" and (path.stat().st_mode & 0o777) == 0o640   # permissions kept
    assert listing(tmp_path) == ["out.txt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write(path, write_text("old"))

    def crash(f):
        f.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, crash)
    assert path.read_text() == "old" and listing(tmp_path) == ["out.txt"]


def test_saving_onto_a_folder_is_refused(tmp_path, tok):
    folder = tmp_path / "run"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=rf"Tokenizer\.save: {folder} is a folder; give a file name inside it"):
        tok.save(folder)
    assert listing(tmp_path) == ["run"] and listing(folder) == []


def test_a_missing_folder_or_a_folder_that_is_a_file_is_named(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match=rf"the folder {tmp_path / 'nope'} does not exist"):
        tok.save(tmp_path / "nope" / "vocab.json")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=rf"{tmp_path / 'file'} is a file, not a folder"):
        tok.save(tmp_path / "file" / "vocab.json")
    assert listing(tmp_path) == ["file"]


def test_a_read_only_folder_is_named(tmp_path, tok, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkstemp", denied)
    with pytest.raises(PermissionError, match=rf"cannot write {tmp_path / 'vocab.json'}: the folder {tmp_path} "
                                              r"is not writable"):
        tok.save(tmp_path / "vocab.json")
    assert listing(tmp_path) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write in any folder")
def test_a_read_only_folder_for_real(tmp_path, tok):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match=f"the folder {folder} is not writable"):
            tok.save(folder / "vocab.json")
        assert listing(folder) == []
    finally:
        folder.chmod(0o755)


def test_a_read_only_file_is_not_replaced(tmp_path, tok):
    path = tmp_path / "vocab.json"
    path.write_text("keep me")
    path.chmod(0o444)
    with pytest.raises(PermissionError, match=rf"Tokenizer\.save: {path} is read-only, so it was not replaced"):
        tok.save(path)
    assert path.read_text() == "keep me" and listing(tmp_path) == ["vocab.json"]


def test_a_symbolic_link_is_written_through_and_says_so(tmp_path, tok):
    real = tmp_path / "runs" / "vocab.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "vocab.json"
    link.symlink_to(real)
    with pytest.warns(UserWarning, match=rf"{link} is a symbolic link; the file it points to, {real}, is replaced"):
        tok.save(link)
    assert link.is_symlink() and Tokenizer.load(real).vocab == tok.vocab
    assert listing(tmp_path) == ["runs", "vocab.json"] and listing(real.parent) == ["vocab.json"]


def test_plots_are_saved_the_same_way(tmp_path):
    pytest.importorskip("matplotlib")
    from tinymlp.plot import token_mixing_weights

    weight = np.random.default_rng(0).normal(size=(4, 4))
    path = tmp_path / "w.png"
    token_mixing_weights(weight, path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and listing(tmp_path) == ["w.png"]
    with pytest.raises(IsADirectoryError, match=rf"plot: {tmp_path} is a folder"):
        token_mixing_weights(weight, path=tmp_path)
    assert listing(tmp_path) == ["w.png"]


def test_no_temporary_files_in_the_system_folder_either(tmp_path, tok):
    before = set(os.listdir(tempfile.gettempdir()))
    tok.save(tmp_path / "vocab.json")
    assert {p for p in set(os.listdir(tempfile.gettempdir())) - before if p.endswith(".tmp")} == set()


# ---------------------------------------------------------------------- a failed write names its path
@pytest.mark.parametrize("code,words", [(28, "No space left on device"), (27, "File too large"),
                                        (122, "Disk quota exceeded")])
def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, code, words):
    path = tmp_path / "out.txt"
    atomic_write(path, write_text("old"))

    def full(f):
        f.write(b"half")
        raise OSError(code, os.strerror(code))

    with pytest.raises(OSError) as caught:
        atomic_write(path, full, what="checkpoint.save")
    message = str(caught.value)
    assert message.startswith(f"checkpoint.save: writing {path} failed") and os.strerror(code) in message
    assert "is as it was" in message and len(message.splitlines()) == 1
    assert caught.value.errno == code
    assert path.read_text() == "old" and listing(tmp_path) == ["out.txt"]


def test_the_process_file_size_limit_names_the_file(tmp_path):
    import resource
    import subprocess
    import sys

    code = ("import numpy as np; from tinymlp.files import atomic_write; "
            f"atomic_write({str(tmp_path / 'big.bin')!r}, lambda f: f.write(bytes(1 << 20)), what='save')")

    def capped():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=capped,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode != 0
    assert f"save: writing {tmp_path / 'big.bin'} failed: File too large" in result.stderr
    assert listing(tmp_path) == []


def test_a_killed_saves_temporary_is_removed_by_the_next_save_of_any_kind(tmp_path):
    pytest.importorskip("matplotlib")
    from tinymlp.plot import token_mixing_weights

    dead = tmp_path / ".w.png.999999999.abcd.tmp"       # a save killed mid-write by a process long gone
    dead.write_bytes(b"half a png")
    token_mixing_weights(np.eye(4), path=tmp_path / "w.png")
    assert listing(tmp_path) == ["w.png"]


# ---------------------------------------------------------------------- one writer per folder
def test_a_folder_lock_is_held_once_and_released(tmp_path):
    first = files.FolderLock(tmp_path).acquire()
    with pytest.raises(files.FolderBusyError, match=rf"{tmp_path} is in use by another run \(process {os.getpid()}"):
        files.FolderLock(tmp_path).acquire()
    first.release()
    with files.FolderLock(tmp_path):
        assert listing(tmp_path) == [files.LOCK_NAME]
    assert listing(tmp_path) == []


def test_a_killed_holder_does_not_leave_the_folder_locked(tmp_path):
    import signal
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (f"from tinymlp.files import FolderLock; FolderLock({str(tmp_path)!r}).acquire(); "
            "print('locked', flush=True); import time; time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(files.FolderBusyError, match=f"process {holder.pid}"):
            files.FolderLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert files.LOCK_NAME in listing(tmp_path)          # the file is left, but not the lock
    with files.FolderLock(tmp_path):
        pass
    assert listing(tmp_path) == []
