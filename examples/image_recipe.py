"""The image recipe of train_cifar_mixer.py, train_cifar_gmlp.py and finetune.py: data, model,
optimiser, schedule and the training run, from the flags of ``cli.py`` to the files of ``run_files.py``.

A script adds its model's flags to ``cli.make_parser()`` and calls ``main(parser, model_spec)``,
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
import sys
import time
from pathlib import Path

from cli import (
    BEST, CHECKPOINT, CURVES, METRICS, METRICS_CSV, MODEL_FLAGS, OWN_IMAGES, UsageError, check_args, check_data_flags,
    check_data_size, check_memory, count, explicit_flags, loss_function, make_model, parameters, tokens_per_example,
)
from run_files import (
    CONFUSION, OWN_DATA, RUN, architecture, check_classes, check_resumable, confusion, describe_test, final_test, guard,
    keep_best, resume_into, script_of_preset, write_metrics,
)
from run_folder import open_out, resume_path

from tinymlp import backend, checkpoint, data, optim, plot
from tinymlp.data import DatasetError, folder, held_out_split
from tinymlp.models import config as preset_config
from tinymlp.train import History, fit, format_epoch, summary

__all__ = ["NORMALIZATIONS", "main", "run"]


def main(parser: argparse.ArgumentParser, model_spec, argv=None, build_model=None) -> int:
    """Parse the flags, train, write the outputs; the exit status (0 ok, 2 usage/data error)."""
    args = parser.parse_args(argv)
    return guard(lambda: run(args, model_spec, explicit=explicit_flags(parser, argv), build_model=build_model),
                 argv)


def run(args, model_spec, explicit=frozenset(), build_model=None) -> int:
    """One training run of the parsed flags ``args``: checks, data, model (or the checkpoint's),
    optimiser and schedule, ``fit`` with a checkpoint and metrics after every epoch, the test set
    once at the end, the plots. ``explicit``: the flags given on the command line (a resumed run
    takes the others from its checkpoint)."""
    check_args(args)
    backend.module_for_device(args.device)          # a clear CudaUnavailableError, before any work
    preset, overrides, weight_plot, weight_file = model_spec(args)
    out = Path(args.out or Path("runs") / _run_name(preset, overrides))
    resume = resume_path(args, out)
    if resume is not None and args.out is None:
        out = resume.parent                           # keep writing where the run was
    meta = checkpoint.read_meta(resume) if resume else None
    if meta is not None:
        check_resumable(resume, meta, args, explicit, script=script_of_preset(preset))   # data options adopted
    check_data_flags(args)
    check_data_size(args)
    if meta is None and build_model is None:        # too big to train: refused before any data is read
        guess = {**overrides, "num_classes": NUM_CLASSES.get(args.dataset, 10)}     # own data: counted later
        cls, kwargs = preset_config(preset, **guess)
        check_memory(cls, kwargs, args, explicit, parameters(preset, guess), tokens_per_example(kwargs), MODEL_FLAGS)
    folder = RUN["folder"] = open_out(args, out, resume)    # locked; maybe <out>-2 (see run_folder.py)
    out = folder.path

    splits = _datasets(args, _model_image_size(args, preset, overrides, meta))
    train_set, val_set, test_set = splits.train, splits.validation, splits.test
    if meta is not None:
        check_classes(resume, meta, train_set.classes)
    mean, std = _normalization(args, train_set)
    train_loader, val_loader, test_loader = _loaders(args, train_set, val_set, test_set, mean, std)

    if meta is None and build_model is not None:   # e.g. finetune.py: a pretrained model with a new head
        model = build_model(args, train_set.num_classes)
        cls = type(model)
    else:
        if meta is None:
            cls, kwargs = preset_config(preset, **overrides, num_classes=train_set.num_classes, seed=args.seed)
            name, config = preset, {**overrides, "num_classes": train_set.num_classes}
        else:  # the architecture is the checkpoint's, whatever the model flags say now
            cls, kwargs = architecture(meta)
            name, config = meta["preset"], meta["model_config"]
        model = make_model(cls, kwargs, args, explicit, params=parameters(name, config),
                           tokens=tokens_per_example(kwargs), flags=MODEL_FLAGS)
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

    held = f" / {len(val_set):,} validation" if val_set is not None else ""
    print(f"{_model_title(cls, meta['preset'] if meta else preset, model)}: {model.num_parameters():,} parameters | "
          f"{args.dataset}: {len(train_set):,} train{held} / {len(test_set):,} test images | {args.device} | "
          f"{count(args.epochs, 'epoch')} x {steps_per_epoch} steps of {args.batch_size}, "
          f"{type(opt).__name__} lr {args.lr:g} "
          f"wd {args.weight_decay:g}, warmup {warmup} steps, clip {args.clip:g}")
    print(summary(model))

    RUN.update(out=out, resume=resume, started=time.time())
    show = False if args.no_progress else None       # None: bars when stderr is a terminal
    bars = show is None and sys.stderr.isatty()
    loss_fn = loss_function(args.label_smoothing)
    size = getattr(args, "image_size", None) or train_set.images.shape[-1]
    preprocess = {"kind": "image", "size": int(train_set.images.shape[-1]), "image_size": int(size),
                  "mean": [float(m) for m in mean], "std": [float(s) for s in std]}
    described = splits.describe()
    resumes = meta["resumes"] if meta is not None else []

    def save_run(epoch, hist):
        checkpoint.save(out / CHECKPOINT, model, opt, sched, epoch=epoch, history=hist.to_dict(), rng=train_loader.rng,
                        preset=meta["preset"] if meta else preset, model_config=model.config,
                        model_class=cls.__name__, classes=list(train_set.classes),
                        dataset=args.dataset, args=vars(args), preprocess=preprocess, resumes=resumes)
        keep_best(out, epoch, hist)
        write_metrics(out, args, model, hist, described, resumes=resumes)
        plot.training_curves(hist, out / CURVES, title=f"{cls.__name__} on {args.dataset}", val_name="validation")
        folder.saved()                               # the first save: an overwritten run's other files go
        if not bars:
            print(format_epoch(hist, args.epochs, "validation"), flush=True)

    if start < args.epochs:
        fit(model, opt, train_loader, val_loader, epochs=args.epochs, scheduler=sched,
            clip=args.clip or None, callbacks=[save_run], progress=show, limit_batches=args.limit_batches,
            loss_fn=loss_fn, start_epoch=start, history=history, val_name="validation", graph=not args.no_graph)
    else:
        print(f"{count(start, 'epoch')} already done: pass --epochs larger than {start} to train further")
    if weight_plot is not None:
        weight_plot(model, out / weight_file)

    test = final_test(out, model, test_loader, history, args.limit_batches, loss_fn)
    if args.dataset in OWN_DATA:                     # the model predict uses: best.npz when there is one
        confusion(model, test_loader, train_set.classes, out / CONFUSION, args.limit_batches,
                  title=f"{cls.__name__} on {args.dataset}: test set, {test['used']}")
    write_metrics(out, args, model, history, described, test, resumes=resumes)
    speed = f"{history.images_per_sec[-1]:,.0f} img/s training" if history.images_per_sec else "no training"
    files = [CHECKPOINT] + ([BEST] if (out / BEST).is_file() else []) + [METRICS, METRICS_CSV, CURVES]
    files += ([weight_file] if weight_plot is not None else []) + ([CONFUSION] if args.dataset in OWN_DATA else [])
    print(f"done: {describe_test(test)} | {speed} on {args.device} | "
          f"{count(len(history), 'epoch')} | outputs in {out}/ ({', '.join(files)})")
    return 0


# ---------------------------------------------------------------------- data
NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "synthetic": 10}


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


def _hold_out(dataset, fraction, seed, what, where, keep_stats=False):
    """(kept, held out) ImageDatasets: ``fraction`` of each class held out (``labels.held_out_split``)."""
    keep, held = held_out_split(dataset.labels, fraction, seed=seed)
    if len(held) == 0:
        raise DatasetError(f"{where}: too few images to hold {fraction:g} of each class out as the {what} set; add "
                           "a test/ folder (or raise --test-fraction)")
    return folder.subset(dataset, keep, keep_stats), folder.subset(dataset, held, keep_stats)


def _datasets(args, size=32) -> Splits:
    """The train, validation (None with --val-fraction 0) and test sets; DatasetError (with what
    to do) when the data cannot be had. Classes too small to spare an image at --val-fraction (6
    images at 0.1): a note, and no validation set."""
    splits = _own_images(args, size) if args.dataset in OWN_IMAGES else _builtin(args)
    if splits.validation is None and args.val_fraction:
        if not len(held_out_split(splits.train.labels, args.val_fraction, 1)[1]):
            print(f"note: too few training images to hold {args.val_fraction:g} of each class out for validation: "
                  "training without a validation set (no best.npz)")
            return splits
        keep_stats = args.dataset not in OWN_IMAGES        # CIFAR's published statistics stay
        splits.train, splits.validation = _hold_out(splits.train, args.val_fraction, 1, "validation",
                                                    args.data_dir or args.dataset, keep_stats)
        splits.names["validation"] = (f"{args.val_fraction:g} of each class of the training images, held out by a "
                                      f"fixed seed (--val-fraction {args.val_fraction:g})")
    return splits


def _own_images(args, size) -> Splits:
    """Train, validation (a val/ folder, else None) and test from --data-dir, resized to ``size``."""
    if args.dataset == "npz":
        train, test = folder.load_npz(args.data_dir, size=size)
        return Splits(train, None, test, {"test": f"x_test, y_test of {args.data_dir}"})
    root = Path(args.data_dir)
    if not (root / "train").is_dir() and folder.has_class_folders(root):     # torchvision's root/<class>/
        every = folder.ImageFolder(root, None, size=size)
        train, test = _hold_out(every, args.test_fraction, 0, "test", root)
        print(f"note: {root} holds one folder per class (torchvision's layout): {len(test)} of its {len(every)} "
              f"images ({args.test_fraction:g} of each class, chosen by a fixed seed) are held out as the test set")
        return Splits(train, None, test, {"test": f"{args.test_fraction:g} of each class of {root}, held out by a "
                                                  "fixed seed (--test-fraction)"})
    train = folder.ImageFolder(root, "train", size=size)
    val = folder.ImageFolder(root, "val", size=size, classes=train.classes) if (root / "val").is_dir() else None
    names = {"validation": f"{root / 'val'}/"} if val is not None else {}
    if (root / "test").exists():
        return Splits(train, val, folder.ImageFolder(root, "test", size=size, classes=train.classes),
                      {**names, "test": f"{root / 'test'}/"})
    every = train
    train, test = _hold_out(every, args.test_fraction, 0, "test", f"{root} (no test/ folder)")
    print(f"note: {root} has no test/ folder: {len(test)} of its {len(every)} images ({args.test_fraction:g} of "
          "each class, chosen by a fixed seed) are held out as the test set")
    return Splits(train, val, test, {**names, "test": f"{args.test_fraction:g} of each class of {root / 'train'}, "
                                                      "held out by a fixed seed (--test-fraction)"})


def _builtin(args) -> Splits:
    """CIFAR (found or downloaded) or the generated set: their own train and test splits."""
    if args.dataset == "synthetic":
        n = args.synthetic_size
        return Splits(data.SyntheticImages(n, seed=0, train=True),
                      None, data.SyntheticImages(max(10, n // 5), seed=0, train=False),
                      {"test": f"{max(10, n // 5)} generated images (another random stream)"})
    if args.download_url:
        data.ARCHIVES[args.dataset] = dataclasses.replace(data.ARCHIVES[args.dataset],
                                                          urls=(args.download_url,))
    progress = not args.no_progress
    kwargs = {"root": args.data_dir, "download": not args.no_download, "progress": progress}
    return Splits(data.get_dataset(args.dataset, train=True, **kwargs), None,
                  data.get_dataset(args.dataset, train=False, **kwargs), {"test": f"the {args.dataset} test split"})


@dataclasses.dataclass
class Splits:
    """The train, validation and test sets of a run, and how each was made (for metrics.json)."""

    train: object
    validation: object
    test: object
    names: dict

    def describe(self) -> dict:
        parts = {"train": self.train, "validation": self.validation, "test": self.test}
        return {k: (f"{self.names.get(k, 'the training images' if k == 'train' else k)}: {len(v):,} examples"
                    if v is not None else None) for k, v in parts.items()}


def _loaders(args, train_set, val_set, test_set, mean, std):
    flip = args.flip if args.flip is not None else args.dataset != "synthetic"
    steps = [data.RandomCrop(4)] + ([data.HorizontalFlip()] if flip else [])
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

    def held_out(dataset):
        return data.DataLoader(dataset, 2 * args.batch_size, transform=data.Compose(test_steps), device=args.device)
    return train, held_out(val_set) if val_set is not None else None, held_out(test_set)


# per-channel (mean, std) on the [0, 1] scale: "dataset" measures the training set; pretrained
# models expect their pre-training's ("inception": [-1, 1], the JAX Mixer and ViT; "imagenet")
NORMALIZATIONS = {"inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                  "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                  "none": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))}


def _normalization(args, train_set):
    return NORMALIZATIONS.get(getattr(args, "normalize", None) or "dataset", (train_set.mean, train_set.std))


# ---------------------------------------------------------------------- names
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


def _run_name(preset, overrides) -> str:
    extra = [f"{k}{v}" for k, v in sorted(overrides.items()) if k not in ("attn_dim",)]
    return "_".join([preset] + extra) if extra else preset
