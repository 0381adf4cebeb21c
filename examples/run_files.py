"""A run's files: the --out folder, its checkpoints and metrics, and continuing a run from them.

Every example writes ``checkpoint.npz`` (model, optimizer, schedule, history, the flags and what
``tinymlp.predict`` needs, after each epoch), ``best.npz`` (the same, of the epoch with the best
validation accuracy, when there is a validation set), ``metrics.json``, ``metrics.csv`` and ``curves.png`` into
--out. ``--resume PATH|auto`` continues a run from its checkpoint: ``check_resumable`` refuses a
checkpoint of another script, or model flags that contradict it (a resumed run keeps its
architecture), and takes the data and pipeline options from it (one given again with another
value is refused; nothing needs restating); ``resume_into`` loads it and stretches the schedule
when --epochs asks for more. ``check_out`` makes sure a new run never silently replaces another.
Ctrl-C ends a run with the command that continues it (``guard``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
from cli import BEST, CHECKPOINT, METRICS, METRICS_CSV, UsageError, check_data_flags, count, flag

from tinymlp import CudaUnavailableError, backend, checkpoint, models, no_grad, optim, plot
from tinymlp.checkpoint import CheckpointError
from tinymlp.data import DatasetError
from tinymlp.files import atomic_write
from tinymlp.models import config as preset_config
from tinymlp.predict import architecture, model_class
from tinymlp.train import History, evaluate

__all__ = [
    "CONFUSION", "OWN_DATA", "RUN", "architecture", "best_epoch", "check_classes", "check_out", "check_resumable",
    "confusion", "describe_test", "final_test", "guard", "interrupted_message", "is_text_preset", "keep_best",
    "model_class", "resume_command", "resume_into", "resume_path", "script_of_checkpoint", "script_of_preset",
    "write_metrics",
]

OWN_DATA = ("folder", "npz", "csv")     # datasets whose class names the user gives: confusion.png shows them
CONFUSION = "confusion.png"


# ---------------------------------------------------------------------- how a run ends
# where the current run writes, for the message of an interrupted run: out, resume, saved
RUN = {}


def guard(run, argv=None) -> int:
    """``run()``'s exit status; a usage or data error printed as one line (status 2), Ctrl-C
    answered with the command that continues the run (status 130)."""
    RUN.clear()
    try:
        return run()
    except (UsageError, DatasetError, CudaUnavailableError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n" + interrupted_message(argv), file=sys.stderr)
        return 130


def interrupted_message(argv=None) -> str:
    """What an interrupted run says: the command that continues it, or why there is none."""
    out = RUN.get("out")
    if out is None:
        return "interrupted before training started: nothing was written"
    saved = _saved_epoch(Path(out) / CHECKPOINT, RUN["started"])
    if not saved:
        if RUN.get("resume") is not None:
            return (f"interrupted before this run finished an epoch: {RUN['resume']} is as it was; "
                    f"continue with the same command")
        return "interrupted before the first epoch finished: nothing was saved; run the same command to start again"
    return (f"interrupted; epoch {saved} is saved in {Path(out) / CHECKPOINT}; continue with:\n  "
            + resume_command(argv, out))


def _saved_epoch(path, since):
    """The epoch of the checkpoint ``path`` if this run wrote it (after ``since``), else None."""
    try:
        if os.stat(path).st_mtime < since - 1:
            return None
        return int(checkpoint.read_meta(path)["epoch"])
    except (OSError, CheckpointError, KeyError, TypeError, ValueError):
        return None


def resume_command(argv, out) -> str:
    """The command line that continues the run written to ``out``: this one, with ``--resume
    auto --out <out>`` in place of any --resume, --out or --overwrite it had."""
    argv = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--resume", "--out"):
            skip = True
            continue
        if arg.startswith(("--resume=", "--out=")) or arg == "--overwrite":
            continue
        kept.append(arg)
    script = os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0].endswith(".py") else "examples/<script>.py"
    return shlex.join(["python", script, *kept, "--resume", "auto", "--out", str(out)])


# ---------------------------------------------------------------------- the output folder
def check_out(args, out: Path, resume):
    """--out is a folder we can write in, and writing there erases no other run: a checkpoint
    in it is only replaced by the run resumed from it, or with --overwrite."""
    _check_writable(out)
    existing = out / CHECKPOINT
    if not existing.is_file() or getattr(args, "overwrite", False):
        return
    if resume is not None and resume.resolve() == existing.resolve():
        return
    try:
        meta = checkpoint.read_meta(existing)
        what = f": {meta.get('preset')}, {count(int(meta.get('epoch')), 'epoch')} done"
    except Exception:      # a damaged file is still someone's: it is not replaced silently either
        what = ""
    if resume is None:
        raise UsageError(f"--out {out} already holds a run ({existing}{what}); continue it with --resume auto, "
                         "pass --overwrite to replace it with a new run, or choose another --out")
    raise UsageError(f"--out {out} holds another run ({existing}{what}), which continuing {resume} there would "
                     "replace; choose another --out, or pass --overwrite")


def _check_writable(out: Path):
    """--out must be a folder we can create and write in: checked before any download or training."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file, expected a folder")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == out else f" (cannot create it inside {existing})"
        raise UsageError(f"--out {out}: not writable{where}; choose a folder you can write to")


def write_metrics(out: Path, args, model, history, splits=None, test=None, lower_loss=False):
    """metrics.json: the configuration, the splits (``splits``: {"train", "validation", "test"} ->
    a description of each), the per-epoch history (its ``val_*`` are the validation set's), the
    best epoch, and the test results (``test``, reported once, at the end; None until then); and
    metrics.csv: the history alone, one line per epoch."""
    h = history.to_dict()
    last = {k: v[-1] for k, v in h.items()} if len(history) else {}
    best = best_epoch(history, lower_loss)
    payload = {
        "model": type(model).__name__, "model_config": model.config, "parameters": model.num_parameters(),
        "dataset": args.dataset, "splits": splits or {},
        "validation": (splits or {}).get("validation") or "none (--val-fraction 0): the history has no validation",
        "best_epoch": best, "test": test, "args": vars(args), "final": last, "history": h,
    }
    text = json.dumps(payload, indent=2, allow_nan=True) + "\n"
    atomic_write(out / METRICS, lambda f: f.write(text), what="metrics.json", binary=False)
    table = history.to_csv()
    atomic_write(out / METRICS_CSV, lambda f: f.write(table), what="metrics.csv", binary=False)


def best_epoch(history, lower_loss=False):
    """The epoch (counted from 1) with the best validation accuracy (ties: the lower loss, then the
    earlier epoch), or the lowest validation loss with ``lower_loss``; None without validation."""
    rows = [(e, loss, acc) for e, loss, acc in zip(history.epoch, history.val_loss, history.val_acc)
            if loss is not None and np.isfinite(loss)]
    if not rows:
        return None
    key = (lambda r: (r[1], r[0])) if lower_loss else (lambda r: (-r[2], r[1], r[0]))
    return min(rows, key=key)[0]


def final_test(out: Path, model, test_loader, history, limit_batches=None, loss_fn=None, lower_loss=False) -> dict:
    """The test set, evaluated once, at the end: with the last epoch's model (checkpoint.npz) and,
    when the best validation epoch is another one, with best.npz's, which ``model`` then holds
    (the model ``tinymlp.predict`` uses for the run folder). The results as metrics.json keeps them."""
    kwargs = {} if loss_fn is None else {"loss_fn": loss_fn}
    last = history.epoch[-1] if len(history) else 0
    loss, acc = evaluate(model, test_loader, limit_batches, **kwargs)
    result = {"last": {"epoch": last, "checkpoint": CHECKPOINT, "loss": loss, "accuracy": acc}}
    best = best_epoch(history, lower_loss)
    result["used"] = f"{CHECKPOINT}, epoch {last}"
    if best is not None and (out / BEST).is_file():
        if best == last:
            result["best"] = {**result["last"], "checkpoint": BEST}
        else:
            checkpoint.load(out / BEST, model)
            loss, acc = evaluate(model, test_loader, limit_batches, **kwargs)
            result["best"] = {"epoch": best, "checkpoint": BEST, "loss": loss, "accuracy": acc}
        result["used"] = f"{BEST}, epoch {best}"
    if limit_batches:
        result["limit_batches"] = limit_batches
    return result


def describe_test(test) -> str:
    """'test accuracy 81.25%, test loss 0.4123 (best.npz, epoch 3; the last epoch, 5: 80.00%)'."""
    chosen = test.get("best", test["last"])
    limited = f", first {test['limit_batches']} batches" if test.get("limit_batches") else ""
    text = (f"test accuracy {100 * chosen['accuracy']:.2f}%, test loss {chosen['loss']:.4f} "
            f"({test['used']}{limited}")
    if chosen["epoch"] != test["last"]["epoch"]:
        text += f"; the last epoch, {test['last']['epoch']}: {100 * test['last']['accuracy']:.2f}%"
    return text + ")"


def keep_best(out: Path, epoch, history, lower_loss=False) -> bool:
    """After ``epoch``'s checkpoint.npz is written: copy it to best.npz when that epoch is the best
    so far (``best_epoch``); whether it was."""
    if best_epoch(history, lower_loss) != epoch:
        return False

    def copy(f):
        with open(out / CHECKPOINT, "rb") as src:
            shutil.copyfileobj(src, f)
    atomic_write(out / BEST, copy, what=BEST)
    return True


def confusion(model, loader, classes, path, limit_batches=None, title=None):
    """Write the test set's confusion matrix, rows and columns named by ``classes``."""
    truth, guess = [], []
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            for b, (x, y) in enumerate(loader):
                if limit_batches is not None and b >= limit_batches:
                    break
                guess.append(backend.to_device(model(x).data.argmax(axis=-1), "cpu"))
                truth.append(backend.to_device(y.data, "cpu"))
    finally:
        model.train(was_training)
    if truth:
        plot.confusion_matrix(np.concatenate(truth), np.concatenate(guess), classes, path, title=title)


# ---------------------------------------------------------------------- which script wrote a checkpoint
# model_class and architecture: a checkpoint's model, as tinymlp.predict builds it
SCRIPTS = {"MLPMixer": "train_cifar_mixer.py", "GMLP": "train_cifar_gmlp.py", "AMLP": "train_cifar_gmlp.py"}
CIFAR_SCRIPTS = ("train_cifar_mixer.py", "train_cifar_gmlp.py")


def is_text_preset(preset) -> bool:
    """Whether ``preset`` names a TextGMLP configuration of tinymlp.models.PRESETS."""
    return preset in models.PRESETS and models.PRESETS[preset][0] is models.TextGMLP


def script_of_preset(preset) -> str:
    """The example script that trains a preset from scratch (finetune.py for the rest)."""
    if is_text_preset(preset):
        return "train_text_gmlp.py"
    if preset in models.PRESETS:
        return SCRIPTS.get(preset_config(preset)[0].__name__, "finetune.py")
    return "finetune.py"


def script_of_checkpoint(meta) -> str:
    """The example script that wrote a checkpoint, from its metadata."""
    preset, config = meta.get("preset"), meta.get("model_config") or {}
    if is_text_preset(preset):
        return "pretrain_mlm.py" if config.get("lm_head") else "train_text_gmlp.py"
    if preset in models.PRESETS:
        return SCRIPTS.get(preset_config(preset)[0].__name__, "finetune.py")
    return "finetune.py"


# ---------------------------------------------------------------------- continuing a run
def resume_path(args, out: Path):
    """The checkpoint --resume names (``auto``: --out's, if there is one yet), or None."""
    if args.resume is None:
        return None
    if args.resume == "auto":
        path = out / CHECKPOINT
        if not path.is_file():
            print(f"--resume auto: no {path} yet, starting a new run")
            return None
        return path
    path = Path(args.resume)
    if not path.is_file():
        raise UsageError(f"--resume {args.resume}: no such file")
    return path


# what a resumed run keeps from the checkpoint unless the command line says otherwise
RESUMED_OPTIMISATION = ("lr", "weight_decay")


# what a resumed run always takes from its checkpoint (nothing needs restating; a different value
# given now is refused): the input pipeline, the weights it started from, and the data
RESUMED_PIPELINE = ("optimizer", "schedule", "image_size", "normalize", "pretrained")
RESUMED_DATA = ("dataset", "data_dir", "train_file", "test_file", "text", "synthetic_size", "synthetic_task",
                "max_vocab", "mask_prob", "flip", "mixup", "cutmix", "label_smoothing", "batch_size", "test_fraction",
                "val_fraction", "text_column", "label_column", "pair_column")
PATHS = ("data_dir", "train_file", "test_file", "text", "pretrained")     # compared as the files they name
# for checkpoints whose args lack a flag: the value their run had (no validation split before --val-fraction)
PIPELINE_DEFAULTS = {"optimizer": "adamw", "schedule": "linear", "val_fraction": 0.0}


def _same(name, given, saved) -> bool:
    if name in PATHS and given is not None and saved is not None:
        return os.path.abspath(os.path.expanduser(str(given))) == os.path.abspath(os.path.expanduser(str(saved)))
    return given == saved


def _keep_pipeline(args, meta, explicit, resume):
    """A resumed run keeps the checkpoint's pipeline and data options: one given now with
    another value is refused; one left out takes the checkpoint's value."""
    saved_args = meta["args"]
    saved_args = {**saved_args, "dataset": meta.get("dataset", saved_args.get("dataset"))}
    for name in RESUMED_PIPELINE + RESUMED_DATA:
        if not hasattr(args, name) or (name not in saved_args and name not in PIPELINE_DEFAULTS):
            continue
        saved = saved_args.get(name, PIPELINE_DEFAULTS.get(name))
        if name in explicit and not _same(name, getattr(args, name), saved):
            what = "its data" if name in RESUMED_DATA else "it"
            shown = "(none)" if saved is None else saved
            raise UsageError(f"--resume {resume}: the run was trained with {flag(name)} {shown}; a resumed run "
                             f"keeps {what} (leave {flag(name)} out, or give a new --out for a new run)")
        setattr(args, name, saved)
    check_data_flags(args)


def check_resumable(resume, meta, args, explicit, script=None):
    """A checkpoint of ``script`` (or of a script whose models it also trains), whose
    architecture the model flags given now do not contradict (a resumed run keeps the
    checkpoint's architecture: a flag that asks for another is refused)."""
    needed = ("preset", "model_config", "history", "epoch", "args", "rng")
    if any(key not in meta for key in needed):
        raise UsageError(f"--resume {resume}: a tinymlp checkpoint, but not one written by these scripts "
                         f"(its metadata lacks {', '.join(k for k in needed if k not in meta)})")
    if not isinstance(meta["model_config"], dict) or not isinstance(meta["args"], dict):
        raise UsageError(f"--resume {resume}: its metadata is damaged (model_config and args are not dicts)")
    if script is not None:
        written_by = script_of_checkpoint(meta)
        accepted = {script} | (set(CIFAR_SCRIPTS) if script == "finetune.py" else set())
        if written_by not in accepted:
            raise UsageError(f"--resume {resume}: a checkpoint of examples/{written_by} ({meta['preset']}), not of "
                             f"this script's models; continue it with examples/{written_by} --resume {resume}, "
                             "or give a new --out for a new run")

    def off(value):  # 0, "none" and None all mean "no attention" / "dense weights"
        return None if value in (None, "none", 0) else value

    config = meta["model_config"]
    wanted = {k: getattr(args, k) for k in explicit if k in config and k != "seed"}  # the model flags given
    differences = [f"{flag(k)} {v} (checkpoint: {config.get(k)})" for k, v in sorted(wanted.items())
                   if off(v) != off(config.get(k))]
    if differences:
        raise UsageError(f"--resume {resume}: the model flags given differ from the checkpoint's model "
                         f"({meta['preset']}): {', '.join(differences)}; a resumed run keeps the checkpoint's "
                         "architecture: leave these flags out, or give a new --out to train the new model")
    _keep_pipeline(args, meta, explicit, resume)


def check_classes(resume, meta, classes):
    """A resumed run must see the classes it was trained on (checkpoints without them pass)."""
    saved = meta.get("classes")
    if saved is not None and list(saved) != list(classes):
        raise UsageError(f"--resume {resume}: the run was trained on the classes {', '.join(map(str, saved))}; "
                         f"the data given now has {', '.join(map(str, classes))}")


def resume_into(resume, meta, model, opt, sched, args, explicit, loader, total, warmup):
    """Load the checkpoint ``resume`` into the run; (History, epochs done). The lr and weight
    decay are the checkpoint's unless given now; a run asked to go further (--epochs) stretches
    its schedule, and says what that does to the learning rate."""
    checkpoint.load(resume, model, opt, sched)
    history, start = History.from_dict(meta["history"]), int(meta["epoch"])
    before, old_total = sched.get_lr(), sched.total_steps
    for name in RESUMED_OPTIMISATION:  # the checkpoint's values, unless given again now
        if name not in explicit:
            setattr(args, name, meta["args"][name])
    for group in opt.param_groups:
        if group["weight_decay"]:  # the exempt groups (biases, norms) stay at 0
            group["weight_decay"] = args.weight_decay
    loader.rng.bit_generator.state = meta["rng"].bit_generator.state
    stretched = (sched.total_steps, sched.warmup_steps) != (total, warmup)
    state = {**sched.state_dict(), "base_lrs": [args.lr] * len(opt.param_groups)}
    if stretched:  # a longer (or shorter) run now
        state.update(total_steps=max(total, sched.step_count), warmup_steps=min(warmup, total))
    sched.load_state_dict(state)       # the learning rate of the step it is at, set in the optimizer
    print(f"resuming {resume}: {count(start, 'epoch')} done, training until epoch {args.epochs}")
    if stretched and start < args.epochs:
        kind = "cosine" if isinstance(sched, optim.WarmupCosine) else "linear"
        print(f"schedule: --epochs {args.epochs} (the run was started with --epochs {meta['args'].get('epochs')}): "
              f"the {kind} decay now reaches its end at step {sched.total_steps} instead of {old_total}; at step "
              f"{sched.step_count} the learning rate goes from {before:.3g} to {sched.get_lr():.3g} "
              "and decays from there")
    return history, start
