"""The example scripts keep runs safe and resumes exact (CPU, synthetic data, no network):

- a new run never erases an earlier one: an --out holding a checkpoint needs --resume auto or
  --overwrite; a text run's tokenizer lives in its checkpoint;
- a resumed run with dropout equals the uninterrupted one bit for bit; Ctrl-C prints the
  command that continues it; data options are compared like the model flags; another
  script's checkpoint is refused before any training; a longer --epochs says what happens to
  the schedule;
- sizes that cannot fit in memory and model-constructor errors are one line, exit status 2.

Scripts run in a subprocess as a user runs them, except the interrupted run, which is run
in-process so that the interruption can come at a chosen moment (after epoch 1's checkpoint).
"""

import sys

import numpy as np
import pytest

import tinymlp
from tinymlp.checkpoint import read_meta
from tinymlp.data.tokenizer import Tokenizer
from test_examples import GMLP, MIXER, ROOT, SMOKE, TINY, assert_clean_failure, assert_ok, run
from test_examples_text import CLS, MLM
from test_examples_text import TINY as TEXT

TEXT_RUN = ["--dataset", "synthetic", "--synthetic-size", "200", *TEXT]


def _arrays(path):
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files if k.startswith("model/")}


# ---------------------------------------------------------------------- a new run never erases one
@pytest.mark.parametrize("script,flags", [(MIXER, [*SMOKE, *TINY[MIXER]]), (CLS, TEXT_RUN), (MLM, TEXT_RUN)],
                         ids=["mixer", "text", "mlm"])
@pytest.mark.slow
def test_a_rerun_writes_a_new_folder_and_overwrite_replaces(tmp_path, script, flags):
    out = tmp_path / "run"
    assert_ok(run(script, *flags, "--epochs", "1", "--out", out, cwd=tmp_path))
    saved = {p.name: p.read_bytes() for p in out.iterdir()}

    again = run(script, *flags, "--epochs", "1", "--seed", "3", "--out", out, cwd=tmp_path)   # the same command
    assert_ok(again)
    assert again.stdout.startswith(f"note: {out} holds another run (checkpoint.npz (")
    assert f"this run writes to {out}-2 (continue that one with --resume auto --out {out}" in again.stdout
    assert {p.name: p.read_bytes() for p in out.iterdir()} == saved                   # untouched
    assert read_meta(tmp_path / "run-2" / "checkpoint.npz")["args"]["seed"] == 3

    assert_ok(run(script, *flags, "--epochs", "1", "--seed", "3", "--overwrite", "--out", out, cwd=tmp_path))
    assert read_meta(out / "checkpoint.npz")["args"]["seed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("run")) == ["run", "run-2"]


@pytest.mark.slow
def test_resuming_into_another_runs_out_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert_ok(run(MIXER, *SMOKE, *TINY[MIXER], "--epochs", "1", "--out", out, cwd=tmp_path))
    saved = (b / "checkpoint.npz").read_bytes()
    result = run(MIXER, *SMOKE, "--epochs", "2", "--resume", a / "checkpoint.npz", "--out", b, cwd=tmp_path)
    assert_clean_failure(result)
    assert "holds another run" in result.stderr and (b / "checkpoint.npz").read_bytes() == saved


@pytest.mark.slow
def test_a_text_checkpoint_carries_its_tokenizer(tmp_path):
    out, other = tmp_path / "run", tmp_path / "other"
    assert_ok(run(CLS, *TEXT_RUN, "--epochs", "1", "--out", out, cwd=tmp_path))
    assert_ok(run(CLS, *TEXT_RUN, "--synthetic-task", "pairs", "--epochs", "1", "--out", other, cwd=tmp_path))
    own = Tokenizer.load(out / "tokenizer.json").to_dict()
    assert read_meta(out / "checkpoint.npz")["tokenizer"] == own
    assert Tokenizer.load(other / "tokenizer.json").to_dict() != own

    (out / "tokenizer.json").write_bytes((other / "tokenizer.json").read_bytes())   # another run's tokenizer
    assert_ok(run(CLS, *TEXT_RUN, "--epochs", "2", "--resume", "auto", "--out", out, cwd=tmp_path))
    assert Tokenizer.load(out / "tokenizer.json").to_dict() == own == read_meta(out / "checkpoint.npz")["tokenizer"]


# ---------------------------------------------------------------------- resume is exact and checked
@pytest.fixture
def mixer_script(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["examples/train_cifar_mixer.py"])
    import train_cifar_mixer

    return lambda *argv: train_cifar_mixer.main(train_cifar_mixer.build_parser(), train_cifar_mixer.model_spec,
                                                argv=[str(a) for a in argv])


@pytest.mark.slow
def test_an_interrupted_run_with_dropout_resumes_bit_for_bit(mixer_script, tmp_path, monkeypatch, capsys):
    flags = [*SMOKE, *TINY[MIXER], "--dropout", "0.1", "--epochs", "2"]
    assert mixer_script(*flags, "--out", tmp_path / "straight") == 0

    real_save = tinymlp.checkpoint.save

    def save_then_interrupt(path, *args, **meta):
        real_save(path, *args, **meta)
        if meta["epoch"] == 1:
            raise KeyboardInterrupt
    monkeypatch.setattr(tinymlp.checkpoint, "save", save_then_interrupt)
    out = tmp_path / "interrupted"
    capsys.readouterr()
    assert mixer_script(*flags, "--out", out) == 130
    hint = capsys.readouterr().err
    assert f"epoch 1 is saved in {out / 'checkpoint.npz'}" in hint
    command = hint.strip().splitlines()[-1].strip()
    assert command.startswith("python examples/train_cifar_mixer.py --dataset synthetic")
    assert command.endswith(f"--dropout 0.1 --epochs 2 --resume auto --out {out}")

    monkeypatch.setattr(tinymlp.checkpoint, "save", real_save)
    assert mixer_script(*command.split()[2:]) == 0                     # the command the hint printed
    straight, resumed = _arrays(tmp_path / "straight" / "checkpoint.npz"), _arrays(out / "checkpoint.npz")
    assert straight.keys() == resumed.keys()
    for k in straight:
        assert np.array_equal(straight[k], resumed[k]), k
    assert read_meta(out / "checkpoint.npz")["history"]["train_loss"] == \
        read_meta(tmp_path / "straight" / "checkpoint.npz")["history"]["train_loss"]


@pytest.mark.slow
def test_data_options_are_kept_and_compared_on_resume(tmp_path):
    out = tmp_path / "run"
    assert_ok(run(MIXER, *SMOKE, *TINY[MIXER], "--epochs", "1", "--out", out, cwd=tmp_path))
    other = [a if a != "200" else "400" for a in SMOKE]                 # --synthetic-size 400
    refused = run(MIXER, *other, "--epochs", "2", "--resume", "auto", "--out", out, cwd=tmp_path)
    assert_clean_failure(refused)
    assert "trained with --synthetic-size 200; a resumed run keeps its data" in refused.stderr
    # nothing restated (not even --dataset): every data and pipeline option is the checkpoint's
    resumed = run(MIXER, "--epochs", "2", "--no-progress", "--resume", "auto", "--out", out, cwd=tmp_path)
    assert_ok(resumed)
    assert "synthetic: 180 train / 20 validation / 40 test images" in resumed.stdout
    assert "steps of 16," in resumed.stdout                              # --batch-size kept
    again = run(MIXER, *SMOKE, "--epochs", "3", "--resume", "auto", "--out", out, cwd=tmp_path)   # restated, the same
    assert_ok(again)
    other = [a if a != "16" else "8" for a in SMOKE]                     # --batch-size 8: another value
    refused = run(MIXER, *other, "--epochs", "4", "--resume", "auto", "--out", out, cwd=tmp_path)
    assert_clean_failure(refused)
    assert "trained with --batch-size 16; a resumed run keeps its data" in refused.stderr


@pytest.mark.parametrize("script,other,written_by", [
    (GMLP, MIXER, "train_cifar_mixer.py"), (MIXER, GMLP, "train_cifar_gmlp.py"), (CLS, MLM, "pretrain_mlm.py"),
])
@pytest.mark.slow
def test_a_checkpoint_of_another_model_family_is_refused_before_training(tmp_path, script, other, written_by):
    out = tmp_path / "run"
    flags = TEXT_RUN if other in (CLS, MLM) else [*SMOKE, *TINY[other]]
    assert_ok(run(other, *flags, "--epochs", "1", "--out", out, cwd=tmp_path))
    saved = (out / "checkpoint.npz").read_bytes()
    smoke = TEXT_RUN if script in (CLS, MLM) else SMOKE
    result = run(script, *smoke, "--epochs", "2", "--resume", out / "checkpoint.npz", cwd=tmp_path)
    assert_clean_failure(result)
    assert f"a checkpoint of examples/{written_by}" in result.stderr
    assert (out / "checkpoint.npz").read_bytes() == saved and "epoch" not in result.stdout


@pytest.mark.slow
def test_a_longer_run_says_what_happens_to_the_schedule(tmp_path):
    out = tmp_path / "run"
    assert_ok(run(MIXER, *SMOKE, *TINY[MIXER], "--epochs", "2", "--warmup", "0", "--out", out, cwd=tmp_path))
    longer = run(MIXER, *SMOKE, "--epochs", "4", "--warmup", "0", "--resume", "auto", "--out", out, cwd=tmp_path)
    assert_ok(longer)
    assert ("schedule: --epochs 4 (the run was started with --epochs 2): the linear decay now reaches its end at "
            "step 8 instead of 4; at step 4 the learning rate goes from 0 to 0.0005") in longer.stdout


# ---------------------------------------------------------------------- one line, exit status 2
@pytest.mark.parametrize("script,flags,words", [
    (GMLP, ["--ffn-dim", "3"], ["--ffn-dim 3", "do not make a valid GMLP: gMLP: the split SGU halves"]),
    (CLS, ["--ffn-dim", "3"], ["--ffn-dim 3", "--vocab-size 120", "do not make a valid TextGMLP"]),
    (MIXER, ["--dim", "10000000"], ["--dim 10000000 ", "training MLPMixer with"]),
    (GMLP, ["--depth", "1000000"], ["--depth 1000000", "training GMLP with"]),
    (MIXER, ["--synthetic-size", "10000000000"], ["--synthetic-size 10000000000: generating it needs about"]),
])
def test_impossible_sizes_and_constructor_errors_are_one_line(tmp_path, script, flags, words):
    base = TEXT_RUN if script is CLS else [*SMOKE, *TINY[script]]
    result = run(script, *base, *flags, "--epochs", "1", "--out", tmp_path / "run", cwd=tmp_path)
    assert_clean_failure(result)
    assert all(w in result.stderr for w in words) and len(result.stderr.strip().splitlines()) == 1
    if "training" in words[-1]:
        assert "GiB" in result.stderr and "of memory on this cpu" in result.stderr


@pytest.mark.slow
def test_text_runs_count_samples_and_epochs_in_words(tmp_path):
    result = run(CLS, *TEXT_RUN, "--epochs", "1", "--out", tmp_path / "run", cwd=tmp_path)
    assert_ok(result)
    assert "img/s" not in result.stdout and "samples/s" in result.stdout
    assert "1 epoch x" in result.stdout and "| 1 epoch |" in result.stdout and "1 epochs" not in result.stdout


def test_progress_is_on_in_a_notebook(monkeypatch):
    from tinymlp import train

    class ZMQInteractiveShell:          # the shell of a Jupyter kernel
        pass

    fake = type(sys)("IPython")
    fake.get_ipython = ZMQInteractiveShell
    monkeypatch.setitem(sys.modules, "IPython", fake)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert train._progress_enabled(None) and not train._progress_enabled(False)
    fake.get_ipython = lambda: None     # plain Python with IPython imported: no notebook
    assert not train._progress_enabled(None)


@pytest.mark.parametrize("name", ["create", "config", "__builtins__", "os", 3])
def test_a_model_class_named_by_a_checkpoint_is_only_a_tinymlp_model(monkeypatch, name):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import run_files

    with pytest.raises(tinymlp.checkpoint.CheckpointError, match="not one of tinymlp.models"):
        run_files.architecture({"preset": "finetune_x", "model_class": name, "model_config": {}})
    assert run_files.architecture({"preset": "finetune_x", "model_class": "ViT", "model_config": {}})[0] \
        is tinymlp.models.ViT


# ---------------------------------------------------------------------- the memory this process may use
def test_the_memory_check_counts_the_process_limit(tmp_path):
    import os
    import resource
    import subprocess

    limit = 1400 * 2**20
    if os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") < 4 * 2**30:
        pytest.skip("the machine itself has less memory than the run asks for")

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "TINYMLP_DATA": str(tmp_path / "no-data-here")}
    result = subprocess.run([sys.executable, str(MIXER), *SMOKE, "--dim", "512", "--channel-mlp-dim", "2048",
                             "--depth", "8", "--batch-size", "64", "--epochs", "1", "--out", tmp_path / "run"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, preexec_fn=capped)
    assert_clean_failure(result)
    assert "allowed by this process's memory limit (ulimit -v)" in result.stderr and "1.4 GiB" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_containers_cgroup_limit_is_read(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import cli

    (tmp_path / "proc").write_text("0::/user.slice/run-1.scope\n")
    group = tmp_path / "sys" / "user.slice" / "run-1.scope"
    group.mkdir(parents=True)
    (group / "memory.max").write_text("2147483648\n")
    assert cli.cgroup_memory_limit(tmp_path / "sys", tmp_path / "proc") == 2**31
    (group / "memory.max").write_text("max\n")
    assert cli.cgroup_memory_limit(tmp_path / "sys", tmp_path / "proc") is None
    (tmp_path / "proc").write_text("4:memory:/docker/abc\n")                           # cgroup v1
    v1 = tmp_path / "sys" / "memory" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("1073741824\n")
    assert cli.cgroup_memory_limit(tmp_path / "sys", tmp_path / "proc") == 2**30
    monkeypatch.setattr(tinymlp.backend, "cgroup_memory_limit", lambda: 2**20)
    assert cli.memory_limit("cpu") == (2**20, "allowed by this container's memory limit (cgroup)")


def test_a_text_model_too_big_is_refused_before_its_data_is_read(tmp_path):
    result = run(CLS, "--dataset", "csv", "--train-file", tmp_path / "missing.csv", "--dim", "10000000",
                 "--epochs", "1", "--out", tmp_path / "run", cwd=tmp_path)
    assert_clean_failure(result)
    assert "--dim 10000000: training TextGMLP with" in result.stderr and "missing.csv" not in result.stderr
