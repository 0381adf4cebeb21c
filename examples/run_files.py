"""A run's files: its checkpoints and metrics, and continuing a run from them (which folder a run
writes to, and what happens to what is already there: ``run_folder.py``).

Every example writes ``checkpoint.npz`` (model, optimizer, schedule, history, the flags and what
``tinymlp.predict`` needs, after each epoch), ``best.npz`` (the same, of the epoch with the best
validation accuracy, when there is a validation set), ``metrics.json``, ``metrics.csv`` and ``curves.png`` into
--out. ``--resume PATH|auto`` continues a run from its checkpoint: ``check_resumable`` refuses a
checkpoint of another script, or model flags that contradict it (a resumed run keeps its
architecture), and takes the data and pipeline options from it (one given again with another
value is refused; nothing needs restating), so that the flags a resumed run records are the ones
in effect; ``resume_into`` loads it, says which optimisation flags given now differ from the run's
(and records them), and stretches the schedule when --epochs asks for more. Ctrl-C ends a run
with the command that continues it; a failed write is one line naming its file (``guard``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
from cli import BEST, CHECKPOINT, METRICS, METRICS_CSV, MODEL_FLAGS, UsageError, check_data_flags, count, flag

from tinymlp import CudaUnavailableError, backend, checkpoint, models, no_grad, optim, plot
from tinymlp.checkpoint import CheckpointError
from tinymlp.data import DatasetError
from tinymlp.files import atomic_write
from tinymlp.models import config as preset_config
from tinymlp.predict import architecture, model_class
from tinymlp.train import History, evaluate

__all__ = [
    "CONFUSION", "OWN_DATA", "RUN", "architecture", "best_epoch", "check_classes", "check_resumable", "confusion",
    "describe_test", "final_test", "guard", "interrupted_message", "is_text_preset", "keep_best", "model_class",
    "resume_command", "resume_into", "script_of_checkpoint", "script_of_preset", "started_with", "write_metrics",
]

OWN_DATA = ("folder", "npz", "csv")     # datasets whose class names the user gives: confusion.png shows them
CONFUSION = "confusion.png"


# ---------------------------------------------------------------------- how a run ends
# the current run: where it writes (out, and its run_folder.RunFolder as folder), what it resumed, when
# it started: for the message of an interrupted run, and for closing its folder however it ends
RUN = {}


def guard(run, argv=None) -> int:
    """``run()``'s exit status; a usage or data error printed as one line (status 2), a write the
    system refused (a full disk: the message names the file) as one line (status 1), Ctrl-C answered
    with the command that continues the run (status 130), a closed stdout (``| head``) ended without a
    word (status 141, as a process killed by SIGPIPE). The run's folder is closed in every case."""
    RUN.clear()
    try:
        return run()
    except (UsageError, DatasetError, CudaUnavailableError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:               # stdout's reader is gone (| head): stop quietly, as a killed pipe would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\n" + interrupted_message(argv), file=sys.stderr)
        return 130
    finally:
        if RUN.get("folder") is not None:
            RUN["folder"].close()


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
        kept = f" ({out}'s files are as they were)" if getattr(RUN.get("folder"), "replaced", None) else ""
        return (f"interrupted before the first epoch finished: nothing was saved{kept}; run the same command to "
                "start again")
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


# ---------------------------------------------------------------------- what a run writes
def write_metrics(out: Path, args, model, history, splits=None, test=None, lower_loss=False, resumes=()):
    """metrics.json: the configuration, the splits (``splits``: {"train", "validation", "test"} ->
    a description of each), the per-epoch history (its ``val_*`` are the validation set's), the
    best epoch, the test results (``test``, reported once, at the end; None until then), and the
    run's resumes (``resume_into``: the epoch of each, and the flags it changed); and metrics.csv: the
    history alone, one line per epoch."""
    h = history.to_dict()
    last = {k: v[-1] for k, v in h.items()} if len(history) else {}
    best = best_epoch(history, lower_loss)
    payload = {
        "model": type(model).__name__, "model_config": model.config, "parameters": model.num_parameters(),
        "dataset": args.dataset, "splits": splits or {},
        "validation": (splits or {}).get("validation") or "none (--val-fraction 0): the history has no validation",
        "best_epoch": best, "test": test, "args": vars(args), "resumes": list(resumes), "final": last,
        "history": h,
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
# A resumed run's flags are the run's own: every flag left out takes the checkpoint's value (its
# record then holds the flags in effect), except those of this invocation alone. A flag given again:
# - with another value is refused when it shapes what the run is: its data, input pipeline, seed
#   and (in check_resumable) its model;
# - may change the optimisation from here on (CHANGEABLE): said in one line, and kept in the
#   checkpoint's and metrics.json's "resumes" (one entry per resume: the epoch, what changed).
THIS_INVOCATION = ("device", "out", "resume", "overwrite", "no_progress", "no_download", "download_url")
CHANGEABLE = ("epochs", "lr", "weight_decay", "clip", "warmup", "limit_batches")
RESUMED_PIPELINE = ("optimizer", "schedule", "image_size", "normalize", "pretrained", "seed")
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


def _adopt_saved_args(args, meta, explicit, resume):
    """The run's own flags in ``args``: a pipeline, data or seed flag given now with another value is
    refused; every flag left out (but those of this invocation) takes the checkpoint's value, a model
    flag recorded as None its model's."""
    saved_args = {**meta["args"], "dataset": meta.get("dataset", meta["args"].get("dataset"))}
    for name in RESUMED_PIPELINE + RESUMED_DATA:
        if not hasattr(args, name) or (name not in saved_args and name not in PIPELINE_DEFAULTS):
            continue
        saved = saved_args.get(name, PIPELINE_DEFAULTS.get(name))
        if name in explicit and not _same(name, getattr(args, name), saved):
            what = "its data" if name in RESUMED_DATA else "it"
            shown = "(none)" if saved is None else saved
            raise UsageError(f"--resume {resume}: the run was trained with {flag(name)} {shown}; a resumed run "
                             f"keeps {what} (leave {flag(name)} out, or start a new run without --resume)")
        setattr(args, name, saved)
    config = meta["model_config"]
    for name, saved in saved_args.items():
        if name in explicit or name in THIS_INVOCATION or not hasattr(args, name):
            continue
        if saved is None and name in MODEL_FLAGS and config.get(name) is not None:
            saved = config[name]              # recorded as None by an older resume: the model's own value
        setattr(args, name, saved)
    check_data_flags(args)


def started_with(meta, name):
    """The value of flag ``name`` when the run started (before any resume changed it)."""
    for entry in meta.get("resumes") or ():
        if isinstance(entry, dict) and name in (entry.get("changed") or {}):
            return entry["changed"][name][0]
    return meta["args"].get(name)


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
                         "architecture: leave these flags out, or start a new run without --resume to train the "
                         "new model")
    problem = _damaged(meta)
    if problem:
        raise UsageError(f"--resume {resume}: its metadata is damaged ({problem}); continue from another checkpoint "
                         "(best.npz?), or start a new run without --resume")
    _adopt_saved_args(args, meta, explicit, resume)


def _damaged(meta):
    """What is wrong with the training state a checkpoint's metadata holds, or None."""
    try:
        history = History.from_dict(meta["history"])
    except (ValueError, TypeError) as err:
        return f"its history: {err}"
    epoch = meta["epoch"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        return f"epoch {epoch!r} is not a count of epochs"
    if len(history) != epoch:
        return f"epoch {epoch} but a history of {count(len(history), 'epoch')}"
    if not isinstance(meta["rng"], np.random.Generator):
        return "rng is not a saved random generator"
    if not isinstance(meta.get("resumes", []), list):
        return "resumes is not a list"
    return None


def check_classes(resume, meta, classes):
    """A resumed run must see the classes it was trained on (checkpoints without them pass)."""
    saved = meta.get("classes")
    if saved is not None and list(saved) != list(classes):
        raise UsageError(f"--resume {resume}: the run was trained on the classes {', '.join(map(str, saved))}; "
                         f"the data given now has {', '.join(map(str, classes))}")


def resume_into(resume, meta, model, opt, sched, args, explicit, loader, total, warmup):
    """Load the checkpoint ``resume`` into the run; (History, epochs done). ``args`` holds the run's flags
    (``check_resumable``); those of ``CHANGEABLE`` given now with another value are said in one line and
    appended to ``meta["resumes"]``; a run asked to go further (--epochs) stretches its schedule, and
    says what that does to the learning rate."""
    decay = [group["weight_decay"] for group in opt.param_groups]     # built with the decay in effect now
    checkpoint.load(resume, model, opt, sched)
    history, start = History.from_dict(meta["history"]), int(meta["epoch"])
    before, old_total = sched.get_lr(), sched.total_steps
    for group, weight_decay in zip(opt.param_groups, decay):          # the exempt groups (biases, norms) stay 0
        group["weight_decay"] = weight_decay
    loader.rng.bit_generator.state = meta["rng"].bit_generator.state
    stretched = (sched.total_steps, sched.warmup_steps) != (total, warmup)
    state = {**sched.state_dict(), "base_lrs": [args.lr] * len(opt.param_groups)}
    if stretched:  # a longer (or shorter) run now
        state.update(total_steps=max(total, sched.step_count), warmup_steps=min(warmup, total))
    sched.load_state_dict(state)       # the learning rate of the step it is at, set in the optimizer
    changed = {name: [meta["args"].get(name), getattr(args, name)] for name in CHANGEABLE
               if name in explicit and hasattr(args, name) and meta["args"].get(name) != getattr(args, name)}
    meta["resumes"] = [*(meta.get("resumes") or []), {"epoch": start, "changed": changed}]
    print(f"resuming {resume}: {count(start, 'epoch')} done, training until epoch {args.epochs}")
    said = [f"{flag(k)} {_shown(k, new)} (until now {_shown(k, old)})" for k, (old, new) in changed.items()
            if k != "epochs"]
    if said:
        print(f"changed on resume: {', '.join(said)}, from step {sched.step_count} on; the run's record keeps "
              "the change (\"resumes\" in metrics.json and the checkpoint)")
    if stretched and start < args.epochs:
        kind = "cosine" if isinstance(sched, optim.WarmupCosine) else "linear"
        first, planned = started_with(meta, "epochs"), meta["args"].get("epochs")
        plan = (f"the run was started with --epochs {first}" if first == planned else
                f"the run was started with --epochs {first} and continued with --epochs {planned}")
        print(f"schedule: --epochs {args.epochs} ({plan}): the {kind} decay now reaches its end at step "
              f"{sched.total_steps} instead of {old_total}; at step {sched.step_count} the learning rate goes from "
              f"{before:.3g} to {sched.get_lr():.3g} and decays from there")
    return history, start


def _shown(name, value):
    if value is None:
        return {"warmup": "5% of --epochs", "limit_batches": "all batches"}.get(name, "none")
    return f"{value:g}" if isinstance(value, float) else str(value)
