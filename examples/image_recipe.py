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
    CHECKPOINT, CURVES, METRICS, MODEL_FLAGS, OWN_IMAGES, UsageError, check_args, check_data_size, count,
    explicit_flags, loss_function, make_model, parameters, tokens_per_example,
)
from run_files import (
    CONFUSION, OWN_DATA, RUN, architecture, check_classes, check_out, check_resumable, confusion, guard,
    resume_into, resume_path, script_of_preset, write_metrics,
)

from tinymlp import backend, checkpoint, data, optim, plot
from tinymlp.data import DatasetError, folder
from tinymlp.models import config as preset_config
from tinymlp.train import History, evaluate, fit, format_epoch

__all__ = ["NORMALIZATIONS", "main", "run"]


def main(parser: argparse.ArgumentParser, model_spec, argv=None, build_model=None) -> int:
    """Parse the flags, train, write the outputs; the exit status (0 ok, 2 usage/data error)."""
    args = parser.parse_args(argv)
    return guard(lambda: run(args, model_spec, explicit=explicit_flags(parser, argv), build_model=build_model),
                 argv)


def run(args, model_spec, explicit=frozenset(), build_model=None) -> int:
    """One training run of the parsed flags ``args``: checks, data, model (or the checkpoint's),
    optimiser and schedule, ``fit`` with a checkpoint and metrics after every epoch, the plots.
    ``explicit``: the flags given on the command line (a resumed run keeps the others)."""
    check_args(args)
    backend.module_for_device(args.device)          # a clear CudaUnavailableError, before any work
    preset, overrides, weight_plot, weight_file = model_spec(args)
    out = Path(args.out or Path("runs") / _run_name(preset, overrides))
    resume = resume_path(args, out)
    if resume is not None and args.out is None:
        out = resume.parent                           # keep writing where the run was
    meta = checkpoint.read_meta(resume) if resume else None
    if meta is not None:
        check_resumable(resume, meta, args, explicit, script=script_of_preset(preset))
    check_out(args, out, resume)
    check_data_size(args)

    train_set, test_set = _datasets(args, _model_image_size(args, preset, overrides, meta))
    if meta is not None:
        check_classes(resume, meta, train_set.classes)
    train_loader, test_loader = _loaders(args, train_set, test_set)

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

    print(f"{_model_title(cls, meta['preset'] if meta else preset, model)}: {model.num_parameters():,} parameters | "
          f"{args.dataset}: {len(train_set):,} train / {len(test_set):,} test images | {args.device} | "
          f"{count(args.epochs, 'epoch')} x {steps_per_epoch} steps of {args.batch_size}, "
          f"{type(opt).__name__} lr {args.lr:g} "
          f"wd {args.weight_decay:g}, warmup {warmup} steps, clip {args.clip:g}")

    out.mkdir(parents=True, exist_ok=True)
    RUN.update(out=out, resume=resume, started=time.time())
    show = False if args.no_progress else None       # None: bars when stderr is a terminal
    bars = show is None and sys.stderr.isatty()
    loss_fn = loss_function(args.label_smoothing)

    def save_run(epoch, hist):
        checkpoint.save(out / CHECKPOINT, model, opt, sched, epoch=epoch, history=hist.to_dict(), rng=train_loader.rng,
                        preset=meta["preset"] if meta else preset, model_config=model.config,
                        model_class=cls.__name__, classes=list(train_set.classes),
                        dataset=args.dataset, args=vars(args))
        write_metrics(out, args, model, hist)
        plot.training_curves(hist, out / CURVES, title=f"{cls.__name__} on {args.dataset}", val_name="test")
        if not bars:
            print(format_epoch(hist, args.epochs, "test"), flush=True)

    if start < args.epochs:
        fit(model, opt, train_loader, test_loader, epochs=args.epochs, scheduler=sched,
            clip=args.clip or None, callbacks=[save_run], progress=show, limit_batches=args.limit_batches,
            loss_fn=loss_fn, start_epoch=start, history=history, val_name="test")
    else:
        print(f"{count(start, 'epoch')} already done: pass --epochs larger than {start} to train further")
    if weight_plot is not None:
        weight_plot(model, out / weight_file)
    if args.dataset in OWN_DATA:
        confusion(model, test_loader, train_set.classes, out / CONFUSION, args.limit_batches,
                  title=f"{cls.__name__} on {args.dataset}: test set")

    if history.val_acc and history.val_acc[-1] is not None:
        test_loss, test_acc = history.val_loss[-1], history.val_acc[-1]
    else:
        test_loss, test_acc = evaluate(model, test_loader, args.limit_batches, loss_fn)
    write_metrics(out, args, model, history)
    speed = f"{history.images_per_sec[-1]:,.0f} img/s training" if history.images_per_sec else "no training"
    limited = f" (first {args.limit_batches} batches)" if args.limit_batches else ""
    print(f"done: test accuracy {100 * test_acc:.2f}%{limited}, test loss {test_loss:.4f} | {speed} on "
          f"{args.device} | {count(len(history), 'epoch')} | outputs in {out}/ ({CHECKPOINT}, {METRICS}, {CURVES}"
          f"{', ' + weight_file if weight_plot is not None else ''}{', ' + CONFUSION if args.dataset in OWN_DATA else ''})")
    return 0


# ---------------------------------------------------------------------- data
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
