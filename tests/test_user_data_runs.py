"""A run folder is the user's (examples/run_folder.py, run_files.py), the scripts run in-process on the
synthetic set (CPU, no network):

- nothing in --out that a run did not write is removed or replaced: a folder holding a run's files
  (a best.npz alone, a user's own metrics.json) sends a new run to <out>-2; ``--resume auto`` there is
  refused; ``--overwrite`` replaces at the first save, so an interrupted or refused run changes
  nothing; one run at a time writes in a folder, and a killed run's lock is not stuck;
- the run's record is the truth: after a resume the recorded flags are those in effect, a changed
  learning rate is said in one line and kept in "resumes", the seed cannot change, the messages
  quote what the run started with; a damaged history is one line;
- a failed write names its file; the text models' memory check uses the real vocabulary.
"""

import importlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tinymlp
from tinymlp.checkpoint import read_meta
from tinymlp.files import LOCK_NAME, FolderLock

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ["--dataset", "synthetic", "--synthetic-size", "200", "--batch-size", "16", "--limit-batches", "2",
         "--no-progress"]
MIXER = [*SMOKE, "--dim", "16", "--depth", "2", "--token-mlp-dim", "8", "--channel-mlp-dim", "32"]
TEXT = ["--dataset", "synthetic", "--synthetic-size", "200", "--seq-len", "16", "--dim", "16", "--depth", "2",
        "--ffn-dim", "32", "--vocab-size", "120", "--batch-size", "16", "--limit-batches", "2", "--no-progress"]


@pytest.fixture
def script(monkeypatch, tmp_path):
    """script(name, *argv) -> exit status of examples/<name>.py run in-process in tmp_path."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYMLP_DATA", str(tmp_path / "no-data-here"))

    def call(name, *argv):
        monkeypatch.setattr(sys, "argv", [f"examples/{name}.py"])
        module = importlib.import_module(name)
        argv = [str(a) for a in argv]
        if name.startswith("train_cifar"):
            return module.main(module.build_parser(), module.model_spec, argv=argv)
        return module.main(module.build_parser(), module.prepare, argv=argv, lm=name == "pretrain_mlm")
    return call


def contents(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


def one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------- nothing of the user's is replaced
def test_a_folder_with_a_best_npz_or_the_users_own_files_is_left_alone(script, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    for name, text in (("best.npz", "the best epoch of a week of runs"), ("metrics.json", "{\"mine\": 1}"),
                       ("curves.png", "my own plot"), ("notes.txt", "keep")):
        (out / name).write_text(text)
    before = contents(out)

    assert script("train_cifar_mixer", *MIXER, "--epochs", "1", "--out", out) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"note: {out} holds another run (best.npz, metrics.json, curves.png); this run writes "
                           f"to {out}-2")
    assert contents(out) == before and (tmp_path / "run-2" / "checkpoint.npz").is_file()

    assert script("train_cifar_mixer", *MIXER, "--epochs", "1", "--resume", "auto", "--out", out) == 2
    error = one_error_line(capsys.readouterr().err)
    assert f"--resume auto: {out} holds best.npz, metrics.json, curves.png but no checkpoint.npz to continue" in error
    assert f"--resume {out / 'best.npz'}" in error and contents(out) == before


@pytest.mark.parametrize("name,flags,extra", [("train_cifar_mixer", MIXER, "token_mixing.png"),
                                              ("train_text_gmlp", TEXT, "tokenizer.json")], ids=["image", "text"])
def test_overwrite_replaces_at_the_first_save_and_not_before(script, tmp_path, capsys, monkeypatch, name, flags,
                                                             extra):
    out = tmp_path / "run"
    assert script(name, *flags, "--epochs", "1", "--out", out) == 0
    (out / "notes.txt").write_text("the user's")
    before = contents(out)
    assert {"best.npz", extra} <= set(before)

    real_save = tinymlp.checkpoint.save

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(tinymlp.checkpoint, "save", interrupted)
    capsys.readouterr()
    assert script(name, *flags, "--epochs", "1", "--seed", "5", "--overwrite", "--out", out) == 130
    said = capsys.readouterr()
    assert f"--overwrite: {out} holds checkpoint.npz (" in said.out and "replaced at this run's first save" in said.out
    assert contents(out) == before                                      # Ctrl-C before the first save: all kept

    monkeypatch.setattr(tinymlp.checkpoint, "save", real_save)
    assert script(name, *flags, "--epochs", "1", "--seed", "5", "--val-fraction", "0", "--overwrite",
                  "--out", out) == 0
    after = contents(out)
    assert "best.npz" not in after                       # the other run's best epoch: gone with its run
    assert after["notes.txt"] == b"the user's" and after[extra] != before[extra]
    assert read_meta(out / "checkpoint.npz")["args"]["seed"] == 5


def test_one_run_at_a_time_and_a_stale_lock_is_no_lock(script, tmp_path, capsys):
    out = tmp_path / "run"
    assert script("train_cifar_mixer", *MIXER, "--epochs", "1", "--out", out) == 0
    capsys.readouterr()
    with FolderLock(out):                               # another run is writing there
        assert script("train_cifar_mixer", *MIXER, "--epochs", "2", "--resume", "auto", "--out", out) == 2
        error = one_error_line(capsys.readouterr().err)
        assert f"--out {out} is in use by another run (process " in error
        assert script("train_cifar_mixer", *MIXER, "--epochs", "1", "--overwrite", "--out", out) == 2
        assert "is in use by another run" in one_error_line(capsys.readouterr().err)
        assert script("train_cifar_mixer", *MIXER, "--epochs", "1", "--out", out) == 0     # a new run: elsewhere
        assert f"note: {out} is in use by another run (process {os.getpid()}" in capsys.readouterr().out
        assert read_meta(tmp_path / "run-2" / "checkpoint.npz")["epoch"] == 1
        assert not (tmp_path / "run-2" / LOCK_NAME).exists()
    assert read_meta(out / "checkpoint.npz")["epoch"] == 1
    (out / LOCK_NAME).write_text("process 999999999, started long ago")   # a killed run's file, not locked
    assert script("train_cifar_mixer", *MIXER, "--epochs", "2", "--resume", "auto", "--out", out) == 0
    assert read_meta(out / "checkpoint.npz")["epoch"] == 2 and not (out / LOCK_NAME).exists()


def test_a_refused_run_creates_no_folder_and_an_out_inside_the_images_is_refused(script, tmp_path, capsys):
    assert script("train_cifar_mixer", *MIXER, "--dataset", "npz", "--data-dir", tmp_path / "missing.npz",
                  "--epochs", "1", "--out", tmp_path / "new" / "run") == 2
    assert "missing.npz: no such file" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "new").exists()

    for name in ("cat", "dog"):
        (tmp_path / "pets" / "train" / name).mkdir(parents=True)
    assert script("train_cifar_mixer", *MIXER, "--dataset", "folder", "--data-dir", tmp_path / "pets",
                  "--epochs", "1", "--out", tmp_path / "pets" / "train" / "cat") == 2
    error = one_error_line(capsys.readouterr().err)
    assert f"--out {tmp_path / 'pets' / 'train' / 'cat'} is inside --data-dir {tmp_path / 'pets'}" in error
    assert sorted(p.name for p in (tmp_path / "pets" / "train" / "cat").iterdir()) == []


# ---------------------------------------------------------------------- the run's record is the truth
def test_a_resumed_run_records_the_flags_in_effect_and_names_what_changed(script, tmp_path, capsys):
    out = tmp_path / "run"
    assert script("train_cifar_mixer", *MIXER, "--epochs", "1", "--clip", "0", "--out", out) == 0
    capsys.readouterr()
    assert script("train_cifar_mixer", "--epochs", "2", "--lr", "0.01", "--resume", "auto", "--out", out) == 0
    said = capsys.readouterr().out
    assert ("changed on resume: --lr 0.01 (until now 0.001), from step 2 on; the run's record keeps the change"
            in said)
    assert "2 epochs x 2 steps of 16" in said and "clip 0" in said             # --limit-batches, --clip kept
    record = json.loads((out / "metrics.json").read_text())
    for args in (record["args"], read_meta(out / "checkpoint.npz")["args"]):
        assert (args["dim"], args["depth"], args["lr"], args["clip"], args["epochs"]) == (16, 2, 0.01, 0, 2)
    assert record["resumes"] == [{"epoch": 1, "changed": {"epochs": [1, 2], "lr": [0.001, 0.01]}}]
    assert read_meta(out / "checkpoint.npz")["resumes"] == record["resumes"]

    assert script("train_cifar_mixer", "--epochs", "3", "--resume", "auto", "--out", out) == 0
    said = capsys.readouterr().out
    assert "schedule: --epochs 3 (the run was started with --epochs 1 and continued with --epochs 2)" in said
    assert "changed on resume" not in said and "lr 0.01" in said               # the lr of the run, unchanged now

    before = contents(out)
    assert script("train_cifar_mixer", "--epochs", "4", "--seed", "7", "--resume", "auto", "--out", out) == 2
    error = one_error_line(capsys.readouterr().err)
    assert "the run was trained with --seed 0; a resumed run keeps it" in error and contents(out) == before


def test_a_damaged_history_is_one_line(script, tmp_path, capsys):
    out = tmp_path / "run"
    assert script("train_cifar_mixer", *MIXER, "--epochs", "1", "--out", out) == 0
    model, meta = tinymlp.predict.load_model(out / "checkpoint.npz")
    for history, words in (([1, 2], "its history"), ({**meta["history"], "train_loss": "x"}, "its history"),
                           ({**meta["history"], "epoch": [1, 2]}, "its history")):
        tinymlp.checkpoint.save(out / "checkpoint.npz", model, **{**meta, "history": history})
        capsys.readouterr()
        assert script("train_cifar_mixer", "--epochs", "2", "--resume", "auto", "--out", out) == 2
        error = one_error_line(capsys.readouterr().err)
        assert "its metadata is damaged (" + words in error


# ---------------------------------------------------------------------- what the machine refuses
def test_a_full_disk_is_one_line_naming_the_file(script, tmp_path, capsys, with_file_size_limit):
    out = tmp_path / "run"

    def run():
        return script("train_cifar_mixer", *MIXER, "--epochs", "1", "--out", out), capsys.readouterr().err

    status, err = with_file_size_limit(20_000, run)                  # the checkpoint needs about 100 kB
    assert status == 1
    error = one_error_line(err)
    assert f"checkpoint.save: writing {out / 'checkpoint.npz'} failed: File too large" in error
    assert not out.exists()                  # nothing was written: the folder the run created is gone


def test_the_text_memory_check_counts_the_real_vocabulary(script, tmp_path, capsys, monkeypatch):
    import cli

    # the tokenizer has about 100 pieces: --vocab-size 50000 is only its upper bound
    params = {}
    real = cli.check_memory

    def record(cls, kwargs, args, explicit, params_=None, tokens=None, flags=()):
        params[kwargs["vocab_size"]] = cli.training_bytes(params_, kwargs, args.batch_size, tokens)
        return real(cls, kwargs, args, explicit, params_, tokens, flags)
    monkeypatch.setattr(cli, "check_memory", record)
    monkeypatch.setattr(cli, "memory_limit", lambda device: (400_000, "of memory on this cpu"))
    flags = [a if a != "120" else "50000" for a in TEXT]
    assert script("train_text_gmlp", *flags, "--epochs", "1", "--out", tmp_path / "run") == 0, capsys.readouterr()
    vocab = max(params)
    assert vocab < 200 and sum(params[vocab]) < 400_000
    at_the_bound = cli.training_bytes(tinymlp.models.num_parameters("gmlp_text_split", seq_len=16, dim=16, depth=2,
                                                                    ffn_dim=32, vocab_size=50000, num_classes=2),
                                      {"dim": 16, "depth": 2, "ffn_dim": 32}, 16, 16)
    assert sum(at_the_bound) > 400_000                 # what the old check took as the vocabulary


def test_the_heads_flag_is_checked(script, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import finetune

    weights = tmp_path / "w.npz"
    np.savez(weights, x=np.zeros(1))
    monkeypatch.setattr(sys, "argv", ["examples/finetune.py"])
    status = finetune.main(finetune.build_parser(), finetune.Pretrained().spec, argv=[
        "--pretrained", str(weights), "--heads", "-3", *SMOKE, "--out", str(tmp_path / "run")])
    assert status == 2
    assert "--heads -3: expected a value at least 1" in one_error_line(capsys.readouterr().err)
