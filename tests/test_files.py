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
