"""What pretrain_mlm.py and train_text_gmlp.py share: the CIFAR examples' command line and run
(``cli.py``, ``run_files.py``: flags, checks, checkpoints, metrics, curves, resume), with text in
place of images.

A text run stores the tokenizer it was trained with inside its checkpoint (its vocabulary, in
the checkpoint's metadata), and writes it beside ``checkpoint.npz``/``metrics.json``/``curves.png``
as ``tokenizer.json`` too (plain JSON, ``tinymlp.data.Tokenizer.load``). A resumed run, and
fine-tuning from a pretrained checkpoint, take the tokenizer from the checkpoint itself, so a
checkpoint is never paired with another run's tokenizer and ids always mean the same pieces.

Text recipe (defaults; the course work's fine-tuning recipe, section 3.3: AdamW (0.9, 0.999),
linear decay, batch 32, sequences of 128 tokens; its lr 2e-5 is for a pretrained model, from
scratch a small gMLP wants about 1e-3).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from cli import (
    BEST, CHECKPOINT, CURVES, METRICS, METRICS_CSV, MODEL_FLAGS, UsageError, check_args, check_data_flags,
    check_data_size, check_memory, count, explicit_flags, loss_function, make_model, make_parser, model_args,
    parameters,
)
from run_files import (
    CONFUSION, OWN_DATA, RUN, check_classes, check_resumable, confusion, describe_test, final_test, guard, keep_best,
    resume_into, write_metrics,
)
from run_folder import open_out, resume_path

from tinymlp import backend, checkpoint, data, optim, plot
from tinymlp.data.tokenizer import SPECIAL_TOKENS, Tokenizer
from tinymlp.models import config as preset_config
from tinymlp.train import History, evaluate, fit, format_epoch, summary

__all__ = ["TOKENIZER", "add_file_flags", "csv_datasets", "held_out_validation", "main", "model_overrides", "run",
           "text_parser", "tokenizer_for"]

TOKENIZER = "tokenizer.json"
IMAGE_ONLY = ("flip", "mixup", "cutmix")


def text_parser(description, datasets, default_dataset, **defaults):
    """cli's parser, its data flags reworded for text, plus the text model's flags."""
    p = make_parser(description)
    for action in p._actions:
        if action.dest == "dataset":
            action.choices, action.default = datasets, default_dataset
            action.help = "'synthetic' is generated text (no download)" + (
                "; 'csv' is your own CSV/TSV file (--train-file)" if "csv" in datasets else "")
        elif action.dest == "data_dir":
            action.help = ("folder holding (or receiving) the text archives; default: $TINYMLP_DATA, else "
                           "$XDG_CACHE_HOME/tinymlp, else ~/.cache/tinymlp")
        elif action.dest == "download_url":
            action.help = "fetch the archive from this URL (a mirror) instead of the official one"
        elif action.dest == "synthetic_size":
            action.help = "training examples of --dataset synthetic (the test set has N/5)"
        elif action.dest == "batch_size":
            action.help = "sequences per training step"
        elif action.dest == "test_fraction":
            action.help = ("--dataset csv without --test-file: F of each class's rows, chosen by a fixed seed, "
                           "are held out as the test set")
        elif action.dest == "val_fraction":
            action.help = ("F of each class's training rows, chosen by a fixed seed, are held out as the validation "
                           "set: the per-epoch metrics and best.npz (the best epoch) come from it, and the test set is "
                           "evaluated once, at the end. 0: no validation")
        elif action.dest in IMAGE_ONLY + ("optimizer", "schedule"):
            action.help = argparse.SUPPRESS       # image recipes: hidden here, refused if given
    for group in p._action_groups:
        if group.title and group.title.startswith("optimisation"):
            group.title = "optimisation (AdamW, linear warmup then linear decay)"
    p.set_defaults(**{"batch_size": 32, "epochs": 10, **defaults})
    g = model_args(p)
    g.title = "model (defaults: the small gMLP of the text presets, tinymlp/models/presets.py)"
    g.add_argument("--seq-len", type=int, default=128, help="tokens per sequence, [CLS] and [SEP] included")
    g.add_argument("--vocab-size", dest="max_vocab", type=int, default=8000,
                   help="at most this many pieces in the tokenizer trained on the data")
    g.add_argument("--dim", type=int, default=None, help="d_model (preset: 128)")
    g.add_argument("--depth", type=int, default=None, help="blocks (preset: 6)")
    g.add_argument("--ffn-dim", type=int, default=None, help="d_ffn (preset: 768)")
    g.add_argument("--attn-dim", type=int, default=0, help="width of aMLP's tiny attention (64 in the paper); 0: gMLP")
    g.add_argument("--sgu-variant", choices=["split", "linear", "additive", "multiplicative"], default="split",
                   help="the spatial gating unit's form (course work Table 6)")
    g.add_argument("--toeplitz", choices=["none", "1d"], default="none",
                   help="dense spatial weights, or Toeplitz over the token index (Table 8's tMLP)")
    g.add_argument("--position", choices=["none", "learned", "sinusoidal"], default="none",
                   help="a position embedding (gMLP needs none: W sees positions)")
    return p


def add_file_flags(p, labelled=True):
    """--train-file, --text-column, --pair-column (and --test-file, --label-column): --dataset csv."""
    g = [g for g in p._action_groups if g.title == "device and data"][0]
    g.add_argument("--train-file", default=None, metavar="FILE",
                   help="--dataset csv: a CSV or TSV file (UTF-8, a header line naming the columns)")
    if labelled:
        g.add_argument("--test-file", default=None, metavar="FILE",
                       help="--dataset csv: the test rows, in a file like --train-file (default: hold "
                            "--test-fraction of the training rows out)")
    g.add_argument("--text-column", default="text", metavar="NAME", help="--dataset csv: the column of the texts")
    if labelled:
        g.add_argument("--label-column", default="label", metavar="NAME",
                       help="--dataset csv: the column of the labels (strings or integers; sorted, they "
                            "number the classes 0..K-1 and name them)")
    g.add_argument("--pair-column", default=None, metavar="NAME",
                   help="--dataset csv: a second text column, for sentence pairs ([CLS] a [SEP] b [SEP])")


FILE_FLAGS = ("train_file", "test_file")


def csv_datasets(args, labelled=True):
    """(train, test) TextDatasets of --dataset csv (test None when not ``labelled``)."""
    for name in FILE_FLAGS:
        if getattr(args, name, None) and args.dataset != "csv":
            raise UsageError(f"--{name.replace('_', '-')} is read with --dataset csv (not --dataset {args.dataset})")
    if not args.train_file:
        raise UsageError("--dataset csv needs --train-file FILE (a CSV or TSV file with a header line; "
                         "--text-column and --label-column name its columns)")
    label = args.label_column if labelled else None
    train = data.read_text_table(args.train_file, args.text_column, label, args.pair_column)
    if not labelled:
        return train, None
    if args.test_file:
        test = data.read_text_table(args.test_file, args.text_column, label, args.pair_column,
                                    classes=train.classes)
        return train, test
    train, test = data.split_text_dataset(train, args.test_fraction, seed=0)
    print(f"note: no --test-file: {len(test):,} of the {len(train) + len(test):,} rows of {args.train_file} "
          f"({args.test_fraction:g} of each class, chosen by a fixed seed) are held out as the test set")
    return train, test


def model_overrides(args):
    """The preset name and the keyword arguments the model flags ask for."""
    if args.attn_dim < 0:
        raise UsageError("--attn-dim must be 0 (gMLP) or positive (aMLP)")
    if args.seq_len < 4 or args.max_vocab < 16:
        raise UsageError("--seq-len must be at least 4 and --vocab-size at least 16")
    preset = {"split": "gmlp_text_split"}.get(args.sgu_variant, f"gmlp_text_{args.sgu_variant}")
    overrides = {k: getattr(args, k) for k in ("dim", "depth", "ffn_dim") if getattr(args, k) is not None}
    overrides.update(seq_len=args.seq_len, attn_dim=args.attn_dim or None,
                     toeplitz=None if args.toeplitz == "none" else args.toeplitz,
                     position=None if args.position == "none" else args.position)
    return preset, overrides


def main(parser, prepare, argv=None, lm=False) -> int:
    """Parse, run ``run(args, prepare)``; errors as one line and exit status 2 (as image_recipe.main).
    ``lm``: the script trains masked language models (pretrain_mlm.py), not classifiers."""
    args = parser.parse_args(argv)
    return guard(lambda: run(args, prepare, explicit_flags(parser, argv), lm), argv)


def tokenizer_for(out, corpus, vocab_size, resumed, pretrained=None, meta=None):
    """The run's tokenizer: the one stored in the checkpoint resumed (``meta``) or in the
    pretrained checkpoint, else one trained on ``corpus()``. A checkpoint older than the stored
    tokenizer falls back on the ``tokenizer.json`` beside it."""
    if resumed or pretrained:
        source = meta if resumed else checkpoint.read_meta(pretrained)
        where = "the checkpoint resumed" if resumed else f"--pretrained {pretrained}"
        if isinstance(source, dict) and "tokenizer" in source:
            try:
                return Tokenizer.from_dict(source["tokenizer"])
            except (KeyError, TypeError, ValueError) as err:
                raise UsageError(f"{where}: its stored tokenizer is damaged ({err})") from None
        path = (Path(out) if resumed else Path(pretrained).parent) / TOKENIZER
        if not path.is_file():
            raise UsageError(f"{path} is missing: the run's ids cannot be read "
                             "without the tokenizer it was trained with")
        return Tokenizer.load(path)
    return Tokenizer.train(corpus(), vocab_size=vocab_size)


def run(args, prepare, explicit, lm=False):
    """One training run of the parsed flags ``args`` (``explicit``: those given on the command line).
    ``prepare(args, out, meta, preset, overrides) -> dict`` gives: the train, validation (``val``, or
    None) and test (or None: a masked-LM run, whose held-out lines are its validation) loaders, the
    tokenizer, preset, model kwargs, ``classes``, a description of the data and of its ``splits``,
    and optionally ``init`` (a function run on a new model), ``loss_fn``, ``report``, ``done``."""
    check_args(args)
    for name in IMAGE_ONLY:
        if name in explicit:
            raise UsageError(f"--{name} is for images; a text run has no such augmentation")
    for name, only in (("optimizer", "adamw"), ("schedule", "linear")):   # flags cli.make_parser offers
        if getattr(args, name, only) != only:
            raise UsageError(f"--{name} {getattr(args, name)}: the text examples train with AdamW and linear decay")
    backend.module_for_device(args.device)
    preset, overrides = model_overrides(args)
    out = Path(args.out or Path("runs") / _run_name(args, preset, overrides))
    resume = resume_path(args, out)
    if resume is not None and args.out is None:
        out = resume.parent
    meta = checkpoint.read_meta(resume) if resume else None
    if meta is not None:
        check_resumable(resume, meta, args, explicit, script="pretrain_mlm.py" if lm else "train_text_gmlp.py")
    check_data_flags(args)
    check_data_size(args, bytes_per_example=8 * getattr(args, "seq_len", 128))
    if meta is None and not getattr(args, "pretrained", None):    # too big: refused before data and tokenizer
        # with the smallest vocabulary a tokenizer can have (--vocab-size is only its upper bound): the
        # real one is checked when the model is built
        bound = {**overrides, "vocab_size": len(SPECIAL_TOKENS) + 1, "num_classes": 0 if lm else 2, "lm_head": lm}
        cls, kwargs = preset_config(preset, **bound)
        check_memory(cls, kwargs, args, explicit, parameters(preset, bound), kwargs.get("seq_len"), MODEL_FLAGS)
    folder = RUN["folder"] = open_out(args, out, resume)    # locked; maybe <out>-2 (see run_folder.py)
    out = folder.path
    job = prepare(args, out, meta, preset, overrides)
    classes = job.get("classes")
    if meta is not None and classes is not None:
        check_classes(resume, meta, classes)
    train_loader, val_loader, test_loader, tok = job["train"], job.get("val"), job.get("test"), job["tokenizer"]
    if len(train_loader) == 0:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the training set")

    name, config = (meta["preset"], meta["model_config"]) if meta else (job["preset"], job["overrides"])
    cls, kwargs = preset_config(name, **config)
    model = make_model(cls, kwargs, args, explicit, params=parameters(name, config), tokens=kwargs.get("seq_len"),
                       flags=MODEL_FLAGS)
    if meta is None and job.get("init"):
        job["init"](model)
    model.to(args.device)
    opt = optim.AdamW(optim.param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.999))
    steps = len(train_loader) if args.limit_batches is None else min(len(train_loader), args.limit_batches)
    total = steps * args.epochs
    warmup = min(total, round((args.warmup if args.warmup is not None else 0.05 * args.epochs) * steps))
    sched = optim.WarmupLinear(opt, warmup_steps=warmup, total_steps=total)

    history, start = History(), 0
    if meta is not None:
        history, start = resume_into(resume, meta, model, opt, sched, args, explicit, train_loader, total, warmup)

    print(f"{cls.__name__} ({name}{', aMLP' if kwargs.get('attn_dim') else ''}): {model.num_parameters():,} "
          f"parameters | {job['describe']} | {len(tok):,} pieces, {kwargs['seq_len']} tokens | {args.device} | "
          f"{count(args.epochs, 'epoch')} x {steps} steps of {args.batch_size}, AdamW lr {args.lr:g} "
          f"wd {args.weight_decay:g}, warmup {warmup} steps, clip {args.clip:g}")
    print(summary(model))
    RUN.update(out=out, resume=resume, started=time.time())
    show = False if args.no_progress else None
    bars = show is None and sys.stderr.isatty()
    loss_fn = job.get("loss_fn") or loss_function(args.label_smoothing)
    val_name = "held-out" if lm else "validation"
    report = job.get("report", lambda hist: format_epoch(hist, args.epochs, val_name=val_name, unit="samples"))
    preprocess = {"kind": "text", "seq_len": int(kwargs["seq_len"]), "paired": bool(job.get("paired"))}
    splits = job.get("splits")
    resumes = meta["resumes"] if meta is not None else []

    def save_run(epoch, hist):
        checkpoint.save(out / CHECKPOINT, model, opt, sched, epoch=epoch, history=hist.to_dict(),
                        rng=train_loader.rng, preset=name, model_config=model.config, dataset=args.dataset,
                        classes=None if classes is None else list(classes), args=vars(args),
                        tokenizer=tok.to_dict(), preprocess=preprocess, resumes=resumes)
        keep_best(out, epoch, hist, lower_loss=lm)
        tok.save(out / TOKENIZER)      # this run's, also over an older run's file (--overwrite)
        write_metrics(out, args, model, hist, splits, lower_loss=lm, resumes=resumes)
        plot.training_curves(hist, out / CURVES, title=f"{name} on {args.dataset}", val_name=val_name)
        folder.saved()                 # the first save: an overwritten run's other files go
        if not bars:
            print(report(hist), flush=True)

    if start < args.epochs:
        fit(model, opt, train_loader, val_loader, epochs=args.epochs, scheduler=sched, clip=args.clip or None,
            callbacks=[save_run], progress=show, limit_batches=args.limit_batches, loss_fn=loss_fn,
            start_epoch=start, history=history, unit="samples", val_name=val_name, graph=not args.no_graph)
    else:
        print(f"{count(start, 'epoch')} already done: pass --epochs larger than {start} to train further")
    if test_loader is not None:                      # the test set, once, at the end
        test = final_test(out, model, test_loader, history, args.limit_batches, loss_fn)
        ending = f"done: {describe_test(test)}"
    else:                                            # a masked LM: its held-out lines are all it has
        test = None
        if history.val_loss and history.val_loss[-1] is not None:
            loss, acc = history.val_loss[-1], history.val_acc[-1]
        else:
            loss, acc = evaluate(model, val_loader, args.limit_batches, loss_fn)
        ending = job["done"](loss, acc)
    write_metrics(out, args, model, history, splits, test, lower_loss=lm, resumes=resumes)
    plotted = args.dataset in OWN_DATA and classes is not None and test_loader is not None
    if plotted:
        confusion(model, test_loader, classes, out / CONFUSION, args.limit_batches,
                  title=f"{name} on {Path(args.train_file).name}: test set, {test['used']}")
    speed = f" | {history.images_per_sec[-1]:,.0f} samples/s training" if history.images_per_sec else ""
    files = [CHECKPOINT] + ([BEST] if (out / BEST).is_file() else []) + [METRICS, METRICS_CSV, CURVES, TOKENIZER]
    print(ending + f"{speed} | {count(len(history), 'epoch')} | outputs in {out}/ "
          f"({', '.join(files + ([CONFUSION] if plotted else []))})")
    return 0


def held_out_validation(args, train):
    """(train, validation or None): --val-fraction of each class of the TextDataset ``train`` held out
    by a fixed seed (another seed than the test split's). Too few rows to hold any out: a note, and
    no validation set."""
    if not args.val_fraction:
        return train, None
    if not len(data.held_out_split(train.labels, args.val_fraction, 1)[1]):
        print(f"note: too few training rows to hold {args.val_fraction:g} of each class out for validation: "
              "training without a validation set (no best.npz)")
        return train, None
    return data.split_text_dataset(train, args.val_fraction, seed=1, held_out="validation")


def _run_name(args, preset, overrides):
    extra = [f"{k}{v}" for k, v in sorted(overrides.items()) if v is not None and k not in ("seq_len",)]
    return "_".join([preset.replace("gmlp", "amlp") if overrides.get("attn_dim") else preset, args.dataset]
                    + [e for e in extra if not e.startswith("attn_dim")])
