"""The command line every example shares: its flags, their checks, and what they ask of the machine.

A script builds its parser with ``make_parser(description)`` (the data, optimisation and output
flags), adds its model's flags to ``model_args(parser)``, and hands the parsed flags to its recipe
(``image_recipe.main`` or ``text_recipe.main``). Every flag is checked before any download, model
or output folder (``check_args``; the data flags, which a resumed run takes from its checkpoint,
by ``check_data_flags`` once they are known): a problem is one ``UsageError`` line and exit
status 2, never a traceback. ``check_memory`` refuses a model whose training would not fit in the
memory this process may use (``tinymlp.backend.memory_limit``: the machine's, a container's cgroup
limit, ``ulimit``) before any
data is read; ``make_model`` builds it.

The scripts run from a source checkout without installing tinymlp: importing this module first
puts the checkout on the path when ``import tinymlp`` fails.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

try:
    import tinymlp  # noqa: F401
except ImportError:  # run from a source checkout without installing: use the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinymlp import models
from tinymlp.backend import cgroup_memory_limit, memory_limit
from tinymlp import functional as F

__all__ = [
    "BEST", "CHECKPOINT", "CURVES", "METRICS", "METRICS_CSV", "MODEL_FLAGS", "OWN_IMAGES", "UsageError",
    "cgroup_memory_limit", "check_args", "check_data_flags", "check_data_size", "check_memory", "count",
    "explicit_flags", "flag", "loss_function", "make_model", "make_parser", "memory_available", "memory_limit",
    "model_args", "parameters", "tokens_per_example", "training_bytes",
]

# what a run writes in its --out folder
CHECKPOINT = "checkpoint.npz"
BEST = "best.npz"
METRICS = "metrics.json"
METRICS_CSV = "metrics.csv"
CURVES = "curves.png"


class UsageError(Exception):
    """A problem with what was asked (flags, files): printed as one line, exit status 2."""


# ---------------------------------------------------------------------- the flags
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
    g.add_argument("--no-graph", action="store_true",
                   help="on CUDA, run every training step eagerly; by default the step is captured into a "
                        "CUDA graph after two warm-up steps and replayed for every full batch (the epoch line "
                        "says how many steps were replayed, and why the others ran eagerly)")
    g.add_argument("--dataset", choices=["cifar10", "cifar100", "synthetic", "folder", "npz"], default="cifar10",
                   help="'synthetic' is a generated 10-class set in the CIFAR format: no download; your own "
                        "images: 'folder' (--data-dir DIR with DIR/train/<class>/*.png|jpg and DIR/test/<class>/...; "
                        "needs Pillow) or 'npz' (--data-dir FILE.npz with x_train, y_train, x_test, y_test)")
    g.add_argument("--data-dir", default=None,
                   help="folder holding (or receiving) the CIFAR files; default: $TINYMLP_DATA, else "
                        "$XDG_CACHE_HOME/tinymlp, else ~/.cache/tinymlp. With --dataset folder: the image "
                        "folder; with --dataset npz: the .npz file")
    g.add_argument("--test-fraction", type=float, default=0.1, metavar="F",
                   help="--dataset folder without a test/ folder (or in torchvision's DIR/<class>/ layout): F of "
                        "each class's images, chosen by a fixed seed, are held out as the test set")
    g.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                   help="F of each class's training images, chosen by a fixed seed, are held out as the "
                        "validation set: the per-epoch metrics and best.npz (the best epoch) come from it, and the "
                        "test set is evaluated once, at the end. 0: no validation, every training image trained "
                        "on. For CIFAR the default holds out 5,000 of the 50,000 training images, the 45k/5k "
                        "split usual for tuning; pass 0 for a final run on all of them, whose test accuracy is "
                        "the number papers report. A DIR/val/ folder is used as it is")
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
                   help=f"output folder: {CHECKPOINT} (the last epoch), {BEST} (the best validation epoch), "
                        f"{METRICS}, {METRICS_CSV} (one line per epoch), {CURVES} and "
                        "the weight plot (default: runs/<model>). A new run never replaces another: when --out "
                        "holds one, it writes to <out>-2 (then -3, ...) and says so")
    g.add_argument("--resume", default=None, metavar="PATH|auto",
                   help="continue from a checkpoint (outputs go to its folder unless --out is given) with the "
                        "run's own flags: a changed --lr, --weight-decay, --clip, --warmup or --epochs is said "
                        "and recorded, a changed seed, model or data refused; "
                        f"'auto': from --out's {CHECKPOINT} if there is one, else a new run there")
    g.add_argument("--overwrite", action="store_true",
                   help="start a new run in --out itself though it holds another run: that run's files are "
                        "replaced at this run's first save (until then they stay as they are)")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bars (one line per epoch instead; also the case when stderr "
                        "is not a terminal)")
    g.add_argument("--limit-batches", type=int, default=None, metavar="N",
                   help="at most N batches per epoch, training and evaluation (smoke runs)")
    return p


def model_args(p: argparse.ArgumentParser):
    """The group for a script's model flags (width overrides are mostly for quick runs)."""
    return p.add_argument_group("model (defaults: the course work's CIFAR configuration)")


def explicit_flags(parser, argv) -> set[str]:
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


MODEL_FLAGS = ("dim", "depth", "token_mlp_dim", "channel_mlp_dim", "ffn_dim", "attn_dim", "dropout", "toeplitz",
               "sgu_variant", "seq_len", "max_vocab", "position", "pooling")


# ---------------------------------------------------------------------- their checks
# what each numeric flag accepts (the model flags are checked when a script has them):
# name -> (lowest, lowest allowed?, highest or None, highest allowed?)
FLAG_RANGES = {
    "epochs": (1, True, None, False), "batch_size": (1, True, None, False),
    "synthetic_size": (1, True, None, False), "limit_batches": (1, True, None, False),
    "seed": (0, True, None, False),
    "lr": (0, False, None, False), "weight_decay": (0, True, None, False), "clip": (0, True, None, False),
    "warmup": (0, True, None, False), "label_smoothing": (0, True, 1, False), "test_fraction": (0, False, 1, False),
    "val_fraction": (0, True, 1, False),
    "mixup": (0, True, None, False), "cutmix": (0, True, None, False),
    "dim": (1, True, None, False), "depth": (1, True, None, False), "token_mlp_dim": (1, True, None, False),
    "channel_mlp_dim": (1, True, None, False), "ffn_dim": (1, True, None, False),
    "attn_dim": (0, True, None, False), "dropout": (0, True, 1, False),
    "heads": (1, True, None, False), "image_size": (1, True, None, False),
}
FLAG_NAMES = {"max_vocab": "--vocab-size"}     # flags whose dest is not their name


def flag(name):
    """The command-line spelling of an argument's ``dest``: "batch_size" -> "--batch-size"."""
    return FLAG_NAMES.get(name) or "--" + name.replace("_", "-")


# your own images: --dataset -> what --data-dir names
OWN_IMAGES = {"folder": "DIR (DIR/train/<class>/*.png|jpg and DIR/test/<class>/...)",
              "npz": "FILE.npz (arrays x_train, y_train, x_test, y_test)"}


def check_args(args):
    """Every flag checked before any download, model or output folder: one line per problem."""
    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag(name)} {value}: expected a finite number")
    for name, (lo, lo_ok, hi, hi_ok) in FLAG_RANGES.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if (value < lo or (value == lo and not lo_ok)
                or (hi is not None and (value > hi or (value == hi and not hi_ok)))):
            if hi is None:
                expected = f"at least {lo}" if lo_ok else f"greater than {lo}"
            else:
                expected = f"in {'[' if lo_ok else '('}{lo}, {hi}{']' if hi_ok else ')'}"
            raise UsageError(f"{flag(name)} {value:g}: expected a value {expected}")
    if args.warmup is not None and args.warmup > args.epochs:
        raise UsageError(f"--warmup {args.warmup:g} epochs is longer than the run (--epochs {args.epochs}): "
                         "expected at most --epochs")


def check_data_flags(args):
    """The data flags, once they are known (a resumed run takes them from its checkpoint)."""
    if getattr(args, "dataset", None) in OWN_IMAGES and not args.data_dir:
        raise UsageError(f"--dataset {args.dataset} needs --data-dir {OWN_IMAGES[args.dataset]}")
    if getattr(args, "val_fraction", 0) and args.val_fraction + getattr(args, "test_fraction", 0) >= 1:
        raise UsageError(f"--val-fraction {args.val_fraction:g} and --test-fraction {args.test_fraction:g} leave no "
                         "training data: expected a sum below 1")


# ---------------------------------------------------------------------- what they ask of the machine
def memory_available(device) -> int | None:
    """Bytes of memory this process may use on ``device``, None when unknown (see ``memory_limit``)."""
    return memory_limit(device)[0]


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


def check_memory(cls, kwargs, args, explicit, params=None, tokens=None, flags=()):
    """Refuse, as a UsageError naming the flags, a model whose training (at ``params`` parameters
    and ``tokens`` tokens an example, when known) needs more memory than this process may use."""
    if params is None or tokens is None:
        return
    given = " ".join(f"{flag(k)} {getattr(args, k)}" for k in flags if k in explicit)
    weights, activations = training_bytes(params, kwargs, args.batch_size, tokens)
    available, where = memory_limit(args.device)
    if available is not None and weights + activations > available:
        raise UsageError(
            f"{given + ': ' if given else ''}training {cls.__name__} with {params:,} parameters at --batch-size "
            f"{args.batch_size} needs about {_gib(weights + activations)} (weights, gradients and optimizer "
            f"moments {_gib(weights)}; one step's activations {_gib(activations)}), more than the "
            f"{_gib(available)} {where}: lower --batch-size or the model's sizes")


def make_model(cls, kwargs, args, explicit, params=None, tokens=None, flags=()):
    """``cls(**kwargs)``, after ``check_memory``: too big, or a constructor that refuses the sizes
    asked for, is a UsageError naming the flags (exit status 2), not a traceback or the machine
    swapping."""
    check_memory(cls, kwargs, args, explicit, params, tokens, flags)
    given = " ".join(f"{flag(k)} {getattr(args, k)}" for k in flags if k in explicit)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        what = f"the model flags ({given})" if given else "the model's configuration"
        raise UsageError(f"{what} do not make a valid {cls.__name__}: {err}") from None
    except MemoryError:
        raise UsageError(f"{given + ': ' if given else ''}not enough memory to build {cls.__name__} with "
                         f"{'about ' + format(params, ',') + ' parameters' if params else 'these sizes'}: "
                         "lower the model's sizes") from None


def parameters(preset, config):
    """The parameter count of a preset with ``config``, computed without building it (None if unknown)."""
    config = {k: v for k, v in config.items() if k != "seed"}
    try:
        return int(models.num_parameters(preset, **config))
    except Exception:      # an invalid configuration: the constructor says what is wrong with it
        return None


def tokens_per_example(kwargs) -> int | None:
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


def check_data_size(args, bytes_per_example=3 * 32 * 32):
    """--synthetic-size is generated in memory: more than the machine holds is a one-line error."""
    if args.dataset != "synthetic":
        return
    need = int(args.synthetic_size * 1.2 * bytes_per_example)     # train + the test fifth
    available, where = memory_limit("cpu")
    if available is not None and need > available:
        raise UsageError(f"--synthetic-size {args.synthetic_size}: generating it needs about {_gib(need)}, more "
                         f"than the {_gib(available)} {where}: ask for fewer examples")


# ---------------------------------------------------------------------- small shared pieces
def loss_function(label_smoothing):
    """Cross-entropy, with ``label_smoothing`` (--label-smoothing) when it is not 0."""
    if not label_smoothing:
        return F.cross_entropy
    return lambda logits, target: F.cross_entropy(logits, target, label_smoothing=label_smoothing)


def count(n, noun) -> str:
    """'1 epoch', '3 epochs'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
