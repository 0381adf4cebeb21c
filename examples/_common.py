"""What train_cifar_mixer.py and train_cifar_gmlp.py share: the command line and the CIFAR recipe.

A script adds its model's flags to ``make_parser()`` and calls ``main(parser, model_spec)``,
where ``model_spec(args) -> (preset name, overrides, weight-plot function, plot file name)``.
finetune.py also passes ``build_model(args, num_classes) -> model`` (a pretrained model with a
new head) and changes the defaults to its recipe (SGD, cosine decay: ``--optimizer``, ``--schedule``).

The recipe (defaults, all flags can change them):

- data: CIFAR-10 (or CIFAR-100, the generated ``synthetic`` set, or your own images: ``folder``,
  ``npz``, resized to the model's size; see ``OWN_DATA``), random crop with 4 pixels
  of zero padding and horizontal flip, per-channel normalisation with the dataset's true mean
  and std (``tinymlp.data.CIFAR10_MEAN``/``_STD``); batches moved to the device as uint8;
- optimiser: AdamW, betas (0.9, 0.999), lr 1e-3, weight decay 0.05 on weights (not on
  biases and LayerNorm parameters), batch 128, gradient clipping at global norm 1;
- schedule: linear warmup for the first 5% of the steps, then linear decay to 0 (or cosine).

Adam(W) with betas (0.9, 0.999), linear warmup then linear decay and clipping at norm 1 are
the MLP-Mixer training recipe the course work describes (section 2.1); its warmup length and
batch size are for ImageNet-scale pre-training, so the step counts here are scaled to a
CIFAR run. The course work does not give its from-scratch CIFAR learning rate; lr 1e-3 with
weight decay 0.05 at batch 128 is the usual AdamW setting for training small Mixer and ViT
models on CIFAR from scratch, and it is what tinymlp's defaults use.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

try:
    import tinymlp  # noqa: F401
except ImportError:  # run from a source checkout without installing: use the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinymlp import CudaUnavailableError, backend, checkpoint, data, optim, plot
from tinymlp import functional as F
from tinymlp.checkpoint import CheckpointError
from tinymlp.data import DatasetError
from tinymlp.models import config as preset_config
from tinymlp.train import History, evaluate, fit, format_epoch

CHECKPOINT = "checkpoint.npz"
METRICS = "metrics.json"
CURVES = "curves.png"


class UsageError(Exception):
    """A problem with what was asked (flags, files): printed as one line, exit status 2."""


# ---------------------------------------------------------------------- command line
class DefaultsOnceFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: X)`` after a flag's help, once: not where the help already says its default
    (or the preset's), and not for flags whose default is "not given" (None, False)."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if unset or "default" in text or "preset" in text:
            return text
        return super()._get_help_string(action)


def make_parser(description: str) -> argparse.ArgumentParser:
    """The flags every example shares; a script adds its model's own."""
    p = argparse.ArgumentParser(
        description=description,
        formatter_class=DefaultsOnceFormatter,
        epilog="CPU threads: set OMP_NUM_THREADS (e.g. OMP_NUM_THREADS=4) before running.",
    )
    g = p.add_argument_group("device and data")
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where to train ('cuda' needs CuPy and a GPU: see python -m tinymlp doctor)")
    g.add_argument("--dataset", choices=["cifar10", "cifar100", "synthetic", "folder", "npz"], default="cifar10",
                   help="'synthetic' is a generated 10-class set in the CIFAR format: no download; your own "
                        "images: 'folder' (--data-dir DIR with DIR/train/<class>/*.png|jpg and DIR/test/<class>/...; "
                        "needs Pillow) or 'npz' (--data-dir FILE.npz with x_train, y_train, x_test, y_test)")
    g.add_argument("--data-dir", default=None,
                   help="folder holding (or receiving) the CIFAR files; default: $TINYMLP_DATA, else "
                        "$XDG_CACHE_HOME/tinymlp, else ~/.cache/tinymlp. With --dataset folder: the image "
                        "folder; with --dataset npz: the .npz file")
    g.add_argument("--test-fraction", type=float, default=0.1, metavar="F",
                   help="--dataset folder without a test/ folder: F of each class's images, chosen by a "
                        "fixed seed, are held out as the test set")
    g.add_argument("--no-download", action="store_true",
                   help="never use the network: fail if the data is not already in --data-dir")
    g.add_argument("--download-url", default=None, metavar="URL",
                   help="fetch the CIFAR archive from this URL (a mirror) instead of the official one")
    g.add_argument("--synthetic-size", type=int, default=10_000, metavar="N",
                   help="training images of --dataset synthetic (the test set has N/5)")
    g.add_argument("--flip", action=argparse.BooleanOptionalAction, default=None,
                   help="random horizontal flips (default: on for CIFAR, off for synthetic, whose "
                        "classes are left/right arrangements that a flip would swap)")
    g.add_argument("--mixup", type=float, default=0.0, metavar="ALPHA",
                   help="mixup with Beta(ALPHA, ALPHA) blending (0: off)")
    g.add_argument("--cutmix", type=float, default=0.0, metavar="ALPHA",
                   help="cutmix with Beta(ALPHA, ALPHA) box sizes (0: off)")

    g = p.add_argument_group("optimisation (AdamW or SGD, linear warmup then linear or cosine decay)")
    g.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                   help="AdamW with betas (0.9, 0.999), or SGD with momentum 0.9 (a resumed run keeps its own)")
    g.add_argument("--schedule", choices=["linear", "cosine"], default="linear",
                   help="the decay after the warmup, down to 0 (a resumed run keeps its own)")
    g.add_argument("--epochs", type=int, default=50,
                   help="total epochs of the run (with --resume: train until this many are done)")
    g.add_argument("--batch-size", type=int, default=128, help="images per training step")
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    g.add_argument("--weight-decay", type=float, default=0.05,
                   help="AdamW's decoupled weight decay (biases and norms are exempt)")
    g.add_argument("--warmup", type=float, default=None, metavar="EPOCHS",
                   help="length of the linear warmup, in EPOCHS (fractions allowed; "
                        "default: 5%% of --epochs)")
    g.add_argument("--clip", type=float, default=1.0, help="clip the gradients' global norm (0: off)")
    g.add_argument("--label-smoothing", type=float, default=0.0,
                   help="weight moved from the true class to a uniform target, in [0, 1)")
    g.add_argument("--seed", type=int, default=0, help="model initialisation, shuffling, augmentation")

    g = p.add_argument_group("outputs and runs")
    g.add_argument("--out", default=None,
                   help=f"output folder: {CHECKPOINT} (the last epoch), {METRICS}, {CURVES} and "
                        "the weight plot (default: runs/<model>)")
    g.add_argument("--resume", default=None, metavar="PATH|auto",
                   help=f"continue from a checkpoint (outputs go to its folder unless --out is given); "
                        f"'auto': from --out's {CHECKPOINT} if there is one")
    g.add_argument("--overwrite", action="store_true",
                   help=f"start a new run in an --out that holds a checkpoint, replacing it (without this, "
                        f"such an --out is refused: continue it with --resume auto)")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bars (one line per epoch instead; also the case when stderr "
                        "is not a terminal)")
    g.add_argument("--limit-batches", type=int, default=None, metavar="N",
                   help="at most N batches per epoch, training and evaluation (smoke runs)")
    return p


def model_args(p: argparse.ArgumentParser):
    """The group for a script's model flags (width overrides are mostly for quick runs)."""
    return p.add_argument_group("model (defaults: the course work's CIFAR configuration)")


# ---------------------------------------------------------------------- the run
def main(parser: argparse.ArgumentParser, model_spec, argv=None, build_model=None) -> int:
    """Parse the flags, train, write the outputs; the exit status (0 ok, 2 usage/data error)."""
    args = parser.parse_args(argv)
    return guard(lambda: _run(args, model_spec, explicit=_explicit_flags(parser, argv), build_model=build_model),
                 argv)


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


def _explicit_flags(parser, argv) -> set[str]:
    """The flags given on the command line: a second parse in which every default is suppressed."""
    probe = argparse.ArgumentParser(add_help=False)
    for action in parser._actions:  # the same flags, without their defaults
        if action.option_strings and action.dest != "help":
            kwargs = {"dest": action.dest, "default": argparse.SUPPRESS}
            if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
                probe.add_argument(*action.option_strings, action=type(action), **kwargs)
            else:
                probe.add_argument(*action.option_strings, **kwargs)
    return set(vars(probe.parse_known_args(argv)[0]))


# what a resumed run keeps from the checkpoint unless the command line says otherwise
RESUMED_OPTIMISATION = ("lr", "weight_decay")


# what each numeric flag accepts (the model flags are checked when a script has them):
# name -> (lowest, lowest allowed?, highest or None, highest allowed?)
FLAG_RANGES = {
    "epochs": (1, True, None, False), "batch_size": (1, True, None, False),
    "synthetic_size": (1, True, None, False), "limit_batches": (1, True, None, False),
    "seed": (0, True, None, False),
    "lr": (0, False, None, False), "weight_decay": (0, True, None, False), "clip": (0, True, None, False),
    "warmup": (0, True, None, False), "label_smoothing": (0, True, 1, False), "test_fraction": (0, False, 1, False),
    "mixup": (0, True, None, False), "cutmix": (0, True, None, False),
    "dim": (1, True, None, False), "depth": (1, True, None, False), "token_mlp_dim": (1, True, None, False),
    "channel_mlp_dim": (1, True, None, False), "ffn_dim": (1, True, None, False),
    "attn_dim": (0, True, None, False), "dropout": (0, True, 1, False),
}


FLAG_NAMES = {"max_vocab": "--vocab-size"}     # flags whose dest is not their name


def _flag(name):
    return FLAG_NAMES.get(name) or "--" + name.replace("_", "-")


def _check_args(args):
    """Every flag checked before any download, model or output folder: one line per problem."""
    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{_flag(name)} {value}: expected a finite number")
    for name, (lo, lo_ok, hi, hi_ok) in FLAG_RANGES.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if value < lo or (value == lo and not lo_ok) or (hi is not None and (value > hi or (value == hi and not hi_ok))):
            if hi is None:
                expected = f"at least {lo}" if lo_ok else f"greater than {lo}"
            else:
                expected = f"in {'[' if lo_ok else '('}{lo}, {hi}{']' if hi_ok else ')'}"
            raise UsageError(f"{_flag(name)} {value:g}: expected a value {expected}")
    if args.warmup is not None and args.warmup > args.epochs:
        raise UsageError(f"--warmup {args.warmup:g} epochs is longer than the run (--epochs {args.epochs}): "
                         "expected at most --epochs")
    if getattr(args, "dataset", None) in OWN_IMAGES and not args.data_dir:
        raise UsageError(f"--dataset {args.dataset} needs --data-dir {OWN_IMAGES[args.dataset]}")


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


# your own images: --dataset -> what --data-dir names
OWN_IMAGES = {"folder": "DIR (DIR/train/<class>/*.png|jpg and DIR/test/<class>/...)",
              "npz": "FILE.npz (arrays x_train, y_train, x_test, y_test)"}
OWN_DATA = ("folder", "npz", "csv")     # datasets whose class names the user gives: confusion.png shows them
CONFUSION = "confusion.png"


def _model_image_size(args, preset, overrides, meta=None) -> int:
    """The side in pixels the model takes: --image-size (finetune.py), the checkpoint's, or the preset's."""
    size = getattr(args, "image_size", None)
    if size is None and meta is not None:
        size = meta["model_config"].get("image_size")
    if size is None:
        try:
            size = preset_config(preset, **overrides)[1].get("image_size")
        except KeyError:
            size = None
    size = size or 32
    return size if isinstance(size, int) else int(size[0])


def _own_images(args, size):
    """(train, test) from --data-dir, resized to ``size``: a class folder tree or an npz file."""
    from tinymlp.data import folder

    if args.dataset == "npz":
        return folder.load_npz(args.data_dir, size=size)
    root = Path(args.data_dir)
    train = folder.ImageFolder(root, "train", size=size)
    if (root / "test").exists():
        return train, folder.ImageFolder(root, "test", size=size, classes=train.classes)
    keep, held = folder.held_out_split(train.labels, args.test_fraction, seed=0)
    if len(held) == 0:
        raise DatasetError(f"{root} has no test/ folder and too few images to hold {args.test_fraction:g} of each "
                           "class out: add a test/ folder")
    print(f"note: {root} has no test/ folder: {len(held)} of its {len(train)} images ({args.test_fraction:g} of "
          "each class, chosen by a fixed seed) are held out as the test set")
    return folder.subset(train, keep), folder.subset(train, held)


def _datasets(args, size=32):
    """(train, test) datasets; DatasetError (with what to do) when CIFAR cannot be had."""
    if args.dataset in OWN_IMAGES:
        return _own_images(args, size)
    if args.dataset == "synthetic":
        n = args.synthetic_size
        return (data.SyntheticImages(n, seed=0, train=True),
                data.SyntheticImages(max(10, n // 5), seed=0, train=False))
    if args.download_url:
        data.ARCHIVES[args.dataset] = dataclasses.replace(data.ARCHIVES[args.dataset],
                                                          urls=(args.download_url,))
    progress = not args.no_progress
    kwargs = {"root": args.data_dir, "download": not args.no_download, "progress": progress}
    return (data.get_dataset(args.dataset, train=True, **kwargs),
            data.get_dataset(args.dataset, train=False, **kwargs))


def _loaders(args, train_set, test_set):
    flip = args.flip if args.flip is not None else args.dataset != "synthetic"
    steps = [data.RandomCrop(4)] + ([data.HorizontalFlip()] if flip else [])
    mean, std = _normalization(args, train_set)
    steps.append(data.Normalize(mean, std))
    if getattr(args, "image_size", None):       # finetune.py: the pretrained model's resolution
        steps.append(data.transforms.Resize(args.image_size))
    if args.mixup:
        steps.append(data.Mixup(args.mixup, train_set.num_classes))
    if args.cutmix:
        steps.append(data.CutMix(args.cutmix, train_set.num_classes))
    train = data.DataLoader(train_set, args.batch_size, shuffle=True, drop_last=True, rng=args.seed,
                            transform=data.Compose(steps), device=args.device)
    if len(train) == 0:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {len(train_set)} training images")
    test_steps = [data.Normalize(mean, std)]
    if getattr(args, "image_size", None):
        test_steps.append(data.transforms.Resize(args.image_size))
    test = data.DataLoader(test_set, 2 * args.batch_size, transform=data.Compose(test_steps),
                           device=args.device)
    return train, test


# per-channel (mean, std) on the [0, 1] scale: "dataset" measures the training set; pretrained
# models expect their pre-training's ("inception": [-1, 1], the JAX Mixer and ViT; "imagenet")
NORMALIZATIONS = {"inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                  "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                  "none": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))}


def _normalization(args, train_set):
    return NORMALIZATIONS.get(getattr(args, "normalize", None) or "dataset", (train_set.mean, train_set.std))


# what a resumed run always takes from its checkpoint (a different value given now is refused):
# the input pipeline and the data, compared as the model flags are
RESUMED_PIPELINE = ("optimizer", "schedule", "image_size", "normalize")
RESUMED_DATA = ("synthetic_size", "synthetic_task", "text", "max_vocab", "mask_prob", "flip", "mixup", "cutmix",
                "label_smoothing", "batch_size", "test_fraction", "text_column", "label_column", "pair_column")
PIPELINE_DEFAULTS = {"optimizer": "adamw", "schedule": "linear"}   # checkpoints older than these flags


def _keep_pipeline(args, meta, explicit, resume):
    """A resumed run keeps the checkpoint's pipeline and data options: one given now with
    another value is refused; one left out takes the checkpoint's value."""
    saved_args = meta["args"]
    for name in RESUMED_PIPELINE + RESUMED_DATA:
        if not hasattr(args, name) or (name not in saved_args and name not in PIPELINE_DEFAULTS):
            continue
        saved = saved_args.get(name, PIPELINE_DEFAULTS.get(name))
        if name in explicit and getattr(args, name) != saved:
            what = "its data" if name in RESUMED_DATA else "it"
            raise UsageError(f"--resume {resume}: the run was trained with {_flag(name)} {saved}; a resumed run "
                             f"keeps {what} (leave {_flag(name)} out, or give a new --out for a new run)")
        setattr(args, name, saved)


def _model_class(name):
    """A model class of tinymlp.models named in a checkpoint (only those: a name read from a
    file never selects anything else)."""
    from tinymlp import models
    from tinymlp.nn import Module

    cls = getattr(models, name, None) if isinstance(name, str) and name in models.__all__ else None
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise UsageError(f"the checkpoint names the model class {name!r}, which is not one of tinymlp.models")
    return cls


def _architecture(meta):
    """(model class, kwargs) of a checkpoint: its preset's class, or (fine-tuned runs) its model class."""
    from tinymlp import models

    if meta["preset"] in models.PRESETS:
        return preset_config(meta["preset"], **meta["model_config"])
    return _model_class(meta.get("model_class")), dict(meta["model_config"])


def _resume_path(args, out: Path):
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


SCRIPTS = {"MLPMixer": "train_cifar_mixer.py", "GMLP": "train_cifar_gmlp.py", "AMLP": "train_cifar_gmlp.py"}
CIFAR_SCRIPTS = ("train_cifar_mixer.py", "train_cifar_gmlp.py")


def is_text_preset(preset) -> bool:
    """Whether ``preset`` names a TextGMLP configuration of tinymlp.models.PRESETS."""
    from tinymlp import models

    return preset in models.PRESETS and models.PRESETS[preset][0] is models.TextGMLP


def script_of_preset(preset) -> str:
    """The example script that trains a preset from scratch (finetune.py for the rest)."""
    from tinymlp import models

    if is_text_preset(preset):
        return "train_text_gmlp.py"
    if preset in models.PRESETS:
        return SCRIPTS.get(preset_config(preset)[0].__name__, "finetune.py")
    return "finetune.py"


def script_of_checkpoint(meta) -> str:
    """The example script that wrote a checkpoint, from its metadata."""
    from tinymlp import models

    preset, config = meta.get("preset"), meta.get("model_config") or {}
    if is_text_preset(preset):
        return "pretrain_mlm.py" if config.get("lm_head") else "train_text_gmlp.py"
    if preset in models.PRESETS:
        return SCRIPTS.get(preset_config(preset)[0].__name__, "finetune.py")
    return "finetune.py"


def _check_resumable(resume, meta, args, explicit, script=None):
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
    differences = [f"{_flag(k)} {v} (checkpoint: {config.get(k)})" for k, v in sorted(wanted.items())
                   if off(v) != off(config.get(k))]
    if differences:
        raise UsageError(f"--resume {resume}: the model flags given differ from the checkpoint's model "
                         f"({meta['preset']}): {', '.join(differences)}; a resumed run keeps the checkpoint's "
                         "architecture: leave these flags out, or give a new --out to train the new model")
    if meta.get("dataset") != args.dataset:
        raise UsageError(f"{resume} was trained on {meta.get('dataset')}, not on --dataset {args.dataset}")
    _keep_pipeline(args, meta, explicit, resume)


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
        what = f": {meta.get('preset')}, {_count(int(meta.get('epoch')), 'epoch')} done"
    except Exception:      # a damaged file is still someone's: it is not replaced silently either
        what = ""
    if resume is None:
        raise UsageError(f"--out {out} already holds a run ({existing}{what}); continue it with --resume auto, "
                         "pass --overwrite to replace it with a new run, or choose another --out")
    raise UsageError(f"--out {out} holds another run ({existing}{what}), which continuing {resume} there would "
                     "replace; choose another --out, or pass --overwrite")


def memory_available(device) -> int | None:
    """Bytes of memory on ``device`` (the machine's RAM, or the GPU's), None when unknown."""
    try:
        if device == "cuda":
            return int(backend.module_for_device("cuda").cuda.Device().mem_info[1])
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def training_bytes(params, kwargs, batch, tokens, itemsize=4) -> tuple[int, int]:
    """(parameters + gradients + two optimizer moments, one training step's saved activations):
    a lower estimate, in bytes, of what training a model of ``params`` parameters with the
    widths in ``kwargs`` takes at ``batch`` examples of ``tokens`` tokens."""
    dim, depth = int(kwargs.get("dim") or 0), int(kwargs.get("depth") or 0)
    hidden = max(int(kwargs.get(k) or 0) for k in ("ffn_dim", "channel_mlp_dim", "mlp_dim")) or 4 * dim
    per_block = tokens * (4 * dim + 3 * hidden) + 2 * dim * int(kwargs.get("token_mlp_dim") or 0)
    if kwargs.get("attn_dim") or kwargs.get("heads"):
        per_block += 2 * tokens * tokens * int(kwargs.get("heads") or 1)
    return 4 * params * itemsize, batch * depth * per_block * itemsize


def make_model(cls, kwargs, args, explicit, params=None, tokens=None, flags=()):
    """``cls(**kwargs)``, after checking that training it fits in memory (when ``params`` and
    ``tokens`` are known): too big, or a constructor that refuses the sizes asked for, is a
    UsageError naming the flags (exit status 2), not a traceback or the machine swapping."""
    given = " ".join(f"{_flag(k)} {getattr(args, k)}" for k in flags if k in explicit)
    if params is not None and tokens is not None:
        weights, activations = training_bytes(params, kwargs, args.batch_size, tokens)
        available = memory_available(args.device)
        if available is not None and weights + activations > available:
            raise UsageError(
                f"{given + ': ' if given else ''}training {cls.__name__} with {params:,} parameters at --batch-size "
                f"{args.batch_size} needs about {_gib(weights + activations)} (weights, gradients and optimizer "
                f"moments {_gib(weights)}; one step's activations {_gib(activations)}), more than the "
                f"{_gib(available)} of memory on this {args.device}: lower --batch-size or the model's sizes")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        what = f"the model flags ({given})" if given else "the model's configuration"
        raise UsageError(f"{what} do not make a valid {cls.__name__}: {err}") from None
    except MemoryError:
        raise UsageError(f"{given + ': ' if given else ''}not enough memory to build {cls.__name__} with "
                         f"{'about ' + format(params, ',') + ' parameters' if params else 'these sizes'}: "
                         "lower the model's sizes") from None


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
    sched.base_lrs = [args.lr] * len(opt.param_groups)
    for group in opt.param_groups:
        if group["weight_decay"]:  # the exempt groups (biases, norms) stay at 0
            group["weight_decay"] = args.weight_decay
    loader.rng.bit_generator.state = meta["rng"].bit_generator.state
    stretched = (sched.total_steps, sched.warmup_steps) != (total, warmup)
    if stretched:  # a longer (or shorter) run now
        sched.load_state_dict({**sched.state_dict(), "total_steps": max(total, sched.step_count),
                               "warmup_steps": min(warmup, total)})
    sched._apply()
    print(f"resuming {resume}: {_count(start, 'epoch')} done, training until epoch {args.epochs}")
    if stretched and start < args.epochs:
        kind = "cosine" if isinstance(sched, optim.WarmupCosine) else "linear"
        print(f"schedule: --epochs {args.epochs} (the run was started with --epochs {meta['args'].get('epochs')}): "
              f"the {kind} decay now reaches its end at step {sched.total_steps} instead of {old_total}; at step "
              f"{sched.step_count} the learning rate goes from {before:.3g} to {sched.get_lr():.3g} and decays from there")
    return history, start


MODEL_FLAGS = ("dim", "depth", "token_mlp_dim", "channel_mlp_dim", "ffn_dim", "attn_dim", "dropout", "toeplitz",
               "sgu_variant", "seq_len", "max_vocab", "position", "pooling")


def _run(args, model_spec, explicit=frozenset(), build_model=None) -> int:
    _check_args(args)
    backend.module_for_device(args.device)          # a clear CudaUnavailableError, before any work
    preset, overrides, weight_plot, weight_file = model_spec(args)
    out = Path(args.out or Path("runs") / _run_name(preset, overrides))
    resume = _resume_path(args, out)
    if resume is not None and args.out is None:
        out = resume.parent                           # keep writing where the run was
    meta = checkpoint.read_meta(resume) if resume else None
    if meta is not None:
        _check_resumable(resume, meta, args, explicit, script=script_of_preset(preset))
    check_out(args, out, resume)
    _check_data_size(args)

    train_set, test_set = _datasets(args, _model_image_size(args, preset, overrides, meta))
    if meta is not None:
        _check_classes(resume, meta, train_set.classes)
    train_loader, test_loader = _loaders(args, train_set, test_set)

    if meta is None and build_model is not None:   # e.g. finetune.py: a pretrained model with a new head
        model = build_model(args, train_set.num_classes)
        cls = type(model)
    else:
        if meta is None:
            cls, kwargs = preset_config(preset, **overrides, num_classes=train_set.num_classes, seed=args.seed)
            name, config = preset, {**overrides, "num_classes": train_set.num_classes}
        else:  # the architecture is the checkpoint's, whatever the model flags say now
            cls, kwargs = _architecture(meta)
            name, config = meta["preset"], meta["model_config"]
        model = make_model(cls, kwargs, args, explicit, params=_parameters(name, config), tokens=_tokens(kwargs),
                           flags=MODEL_FLAGS)
    model = model.to(args.device)
    groups = optim.param_groups(model, args.weight_decay)
    if args.optimizer == "sgd":
        opt = optim.SGD(groups, lr=args.lr, momentum=0.9)
    else:
        opt = optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999))

    steps_per_epoch = len(train_loader) if args.limit_batches is None else min(len(train_loader), args.limit_batches)
    total = steps_per_epoch * args.epochs
    warmup_epochs = args.warmup if args.warmup is not None else 0.05 * args.epochs
    warmup = min(total, round(warmup_epochs * steps_per_epoch))
    schedule = optim.WarmupCosine if args.schedule == "cosine" else optim.WarmupLinear
    sched = schedule(opt, warmup_steps=warmup, total_steps=total)

    history, start = History(), 0
    if meta is not None:
        history, start = resume_into(resume, meta, model, opt, sched, args, explicit, train_loader, total, warmup)

    print(f"{_model_title(cls, meta['preset'] if meta else preset, model)}: {model.num_parameters():,} parameters | "
          f"{args.dataset}: {len(train_set):,} train / {len(test_set):,} test images | {args.device} | "
          f"{_count(args.epochs, 'epoch')} x {steps_per_epoch} steps of {args.batch_size}, "
          f"{type(opt).__name__} lr {args.lr:g} "
          f"wd {args.weight_decay:g}, warmup {warmup} steps, clip {args.clip:g}")

    out.mkdir(parents=True, exist_ok=True)
    RUN.update(out=out, resume=resume, started=time.time())
    show = False if args.no_progress else None       # None: bars when stderr is a terminal
    bars = show is None and sys.stderr.isatty()
    loss_fn = _loss(args.label_smoothing)

    def save_run(epoch, hist):
        checkpoint.save(out / CHECKPOINT, model, opt, sched, epoch=epoch, history=hist.to_dict(), rng=train_loader.rng,
                        preset=meta["preset"] if meta else preset, model_config=model.config,
                        model_class=cls.__name__, classes=list(train_set.classes),
                        dataset=args.dataset, args=vars(args))
        _write_metrics(out, args, model, hist)
        plot.training_curves(hist, out / CURVES, title=f"{cls.__name__} on {args.dataset}", val_name="test")
        if not bars:
            print(format_epoch(hist, args.epochs, "test"), flush=True)

    if start < args.epochs:
        fit(model, opt, train_loader, test_loader, epochs=args.epochs, scheduler=sched,
            clip=args.clip or None, callbacks=[save_run], progress=show, limit_batches=args.limit_batches,
            loss_fn=loss_fn, start_epoch=start, history=history, val_name="test")
    else:
        print(f"{_count(start, 'epoch')} already done: pass --epochs larger than {start} to train further")
    if weight_plot is not None:
        weight_plot(model, out / weight_file)
    if args.dataset in OWN_DATA:
        confusion(model, test_loader, train_set.classes, out / CONFUSION, args.limit_batches,
                  title=f"{cls.__name__} on {args.dataset}: test set")

    if history.val_acc and history.val_acc[-1] is not None:
        test_loss, test_acc = history.val_loss[-1], history.val_acc[-1]
    else:
        test_loss, test_acc = evaluate(model, test_loader, args.limit_batches, loss_fn)
    _write_metrics(out, args, model, history)
    speed = f"{history.images_per_sec[-1]:,.0f} img/s training" if history.images_per_sec else "no training"
    limited = f" (first {args.limit_batches} batches)" if args.limit_batches else ""
    print(f"done: test accuracy {100 * test_acc:.2f}%{limited}, test loss {test_loss:.4f} | {speed} on "
          f"{args.device} | {_count(len(history), 'epoch')} | outputs in {out}/ ({CHECKPOINT}, {METRICS}, {CURVES}"
          f"{', ' + weight_file if weight_plot is not None else ''}{', ' + CONFUSION if args.dataset in OWN_DATA else ''})")
    return 0


def _parameters(preset, config):
    """The parameter count of a preset with ``config``, computed without building it (None if unknown)."""
    from tinymlp import models

    config = {k: v for k, v in config.items() if k != "seed"}
    try:
        return int(models.num_parameters(preset, **config))
    except Exception:      # an invalid configuration: the constructor says what is wrong with it
        return None


def _tokens(kwargs) -> int | None:
    """Tokens per example of a model's keyword arguments (patches of an image, or seq_len)."""
    if kwargs.get("seq_len"):
        return int(kwargs["seq_len"])
    try:
        size, patch = kwargs["image_size"], kwargs["patch_size"]
        size = (size, size) if isinstance(size, int) else size
        patch = (patch, patch) if isinstance(patch, int) else patch
        return max(1, (size[0] // patch[0]) * (size[1] // patch[1]))
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _check_data_size(args, bytes_per_example=3 * 32 * 32):
    """--synthetic-size is generated in memory: more than the machine holds is a one-line error."""
    if args.dataset != "synthetic":
        return
    need = int(args.synthetic_size * 1.2 * bytes_per_example)     # train + the test fifth
    available = memory_available("cpu")
    if available is not None and need > available:
        raise UsageError(f"--synthetic-size {args.synthetic_size}: generating it needs about {_gib(need)}, more "
                         f"than the {_gib(available)} of memory here: ask for fewer examples")


def _check_classes(resume, meta, classes):
    """A resumed run must see the classes it was trained on (checkpoints without them pass)."""
    saved = meta.get("classes")
    if saved is not None and list(saved) != list(classes):
        raise UsageError(f"--resume {resume}: the run was trained on the classes {', '.join(map(str, saved))}; "
                         f"the data given now has {', '.join(map(str, classes))}")


def confusion(model, loader, classes, path, limit_batches=None, title=None):
    """Write the test set's confusion matrix, rows and columns named by ``classes``."""
    from tinymlp import no_grad

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


def _count(n, noun) -> str:
    """'1 epoch', '3 epochs'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _model_title(cls, preset, model) -> str:
    """'MLPMixer (mixer_cifar with dim 16, depth 2)': the preset, and the real widths where they are not its own."""
    try:
        _, defaults = preset_config(preset)
    except KeyError:
        return f"{cls.__name__} ({preset})"
    config = getattr(model, "config", None) or {}
    changed = [f"{k} {v}" for k, v in config.items()
               if k in defaults and k != "num_classes" and defaults[k] != v]
    return f"{cls.__name__} ({preset}" + (f" with {', '.join(changed)}" if changed else "") + ")"


def _loss(label_smoothing):
    if not label_smoothing:
        return F.cross_entropy
    return lambda logits, target: F.cross_entropy(logits, target, label_smoothing=label_smoothing)


def _run_name(preset, overrides) -> str:
    extra = [f"{k}{v}" for k, v in sorted(overrides.items()) if k not in ("attn_dim",)]
    return "_".join([preset] + extra) if extra else preset


def _write_metrics(out: Path, args, model, history):
    """metrics.json: the configuration and the per-epoch history (the validation set is the test split)."""
    h = history.to_dict()
    last = {k: v[-1] for k, v in h.items()} if len(history) else {}
    payload = {
        "model": type(model).__name__, "model_config": model.config, "parameters": model.num_parameters(),
        "dataset": args.dataset, "validation": "the test split", "args": vars(args),
        "final": last, "history": h,
    }
    tmp = out / f".{METRICS}.tmp"
    tmp.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n")
    os.replace(tmp, out / METRICS)
