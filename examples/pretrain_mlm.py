"""Pretrain a gMLP (or aMLP) as a masked language model on any text file; perplexity reported.

    python examples/pretrain_mlm.py --text corpus.txt --epochs 10       # one sentence/paragraph a line
    python examples/pretrain_mlm.py --dataset csv --train-file reviews.csv --text-column text   # a table's texts
    python examples/pretrain_mlm.py --dataset polarity                  # the polarity sentences, unlabelled
    python examples/pretrain_mlm.py --dataset synthetic --epochs 3      # generated sentences, offline
    python examples/train_text_gmlp.py --dataset polarity --pretrained runs/<this run>/checkpoint.npz

As BERT and the course work's gMLP (section 3.3): 15% of the real tokens of every sequence are
hidden behind [MASK] (``--mask-prob``) and the model predicts them through the output head tied
to the input embedding; the loss is the mean cross-entropy over the hidden tokens, and the
perplexity exp(loss) is reported on 5% of the lines held out (``--test-fraction``, chosen by a
fixed seed; the same masks every epoch). ``--text FILE`` is UTF-8 text, one text a line (empty
lines skipped); ``--dataset csv`` reads the texts of a CSV/TSV file's ``--text-column`` (and
``--pair-column``), its labels unused, so that a classifier can later be fine-tuned on the same file.
The lines are tokenized with a WordPiece tokenizer trained on them (tokenizer.json in --out);
lines longer than --seq-len tokens are cut. Outputs and resume as the CIFAR examples:
checkpoint.npz, metrics.json, curves.png (accuracy there: of the hidden tokens), --resume auto.
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from cli import UsageError
from text_recipe import add_file_flags, csv_datasets, main, text_parser, tokenizer_for

from tinymlp import data
from tinymlp.data.text_tasks import FILLER

NOUNS = ("film", "actor", "story", "scene", "plot", "music", "ending", "director", "camera", "script")
ADJECTIVES = ("good", "bad", "long", "short", "funny", "dull", "warm", "cold", "quiet", "loud")
VERBS = ("likes", "hates", "follows", "ruins", "saves", "needs")


def generated_corpus(n, seed):
    """Sentences of a small grammar ("the dull actor ruins a funny plot ."): each masked word is
    predictable from its neighbours (a noun after an adjective, a verb after the subject, ...)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        det1, det2 = rng.choice(["the", "a", "this"], size=2)
        words = [det1, rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(VERBS), det2,
                 rng.choice(ADJECTIVES), rng.choice(NOUNS), "."]
        if rng.random() < 0.5:
            words[-1:] = ["and", rng.choice(FILLER[:6]), rng.choice(NOUNS), "."]
        lines.append(" ".join(words))
    return lines


def build_parser():
    p = text_parser(__doc__.splitlines()[0], ["text", "polarity", "sst2", "synthetic", "csv"], "text",
                    synthetic_size=4000, lr=1e-3, warmup=None, test_fraction=0.05)
    add_file_flags(p, labelled=False)
    p.set_defaults(val_fraction=0.0)
    for action in p._actions:
        if action.dest == "test_fraction":
            action.help = ("this share of the lines (or rows), chosen by a fixed seed, is held out for the perplexity "
                           "(and picks best.npz, the epoch where it is lowest)")
        elif action.dest == "val_fraction":
            action.help = argparse.SUPPRESS           # the held-out lines (--test-fraction) are the validation
    g = [g for g in p._action_groups if g.title.startswith("model")][0]
    g.add_argument("--text", default=None, metavar="FILE", help="--dataset text: the UTF-8 text file to learn from")
    g.add_argument("--mask-prob", type=float, default=0.15, help="share of the real tokens hidden behind [MASK]")
    return p


def read_lines(args):
    if args.text and args.dataset != "text":
        raise UsageError(f"--text is read with --dataset text (the default), not --dataset {args.dataset}")
    if args.dataset == "csv" or args.train_file:
        return csv_datasets(args, labelled=False)[0].corpus()
    if args.dataset == "text":
        if not args.text:
            raise UsageError("--dataset text needs --text FILE (or use --dataset csv, synthetic, polarity, sst2)")
        path = Path(args.text)
        if not path.is_file():
            raise UsageError(f"--text {path}: no such file")
        return data.read_lines(path)
    if args.dataset == "synthetic":
        return generated_corpus(args.synthetic_size, args.seed)
    kwargs = dict(root=args.data_dir, download=not args.no_download, progress=not args.no_progress)
    return data.get_text_dataset(args.dataset, train=True, **kwargs).corpus()


def prepare(args, out, meta, preset, overrides):
    if not 0 < args.mask_prob < 1:
        raise UsageError(f"--mask-prob {args.mask_prob:g}: expected a value in (0, 1)")
    if args.val_fraction:
        raise UsageError(f"--val-fraction {args.val_fraction:g}: a masked-LM run holds --test-fraction of its lines "
                         "out (the held-out perplexity, and best.npz); it has no other validation set")
    lines = read_lines(args)
    if len(lines) < 2:
        raise UsageError(f"--{args.dataset}: {len(lines)} non-empty line(s); masked-LM training needs at least 2")
    order = np.random.default_rng(0).permutation(len(lines))         # a fixed held-out share (5%)
    n_val = min(max(1, int(len(lines) * args.test_fraction)), len(lines) - 1)
    val_lines, train_lines = [lines[i] for i in order[:n_val]], [lines[i] for i in order[n_val:]]
    tok = tokenizer_for(out, lambda: train_lines, args.max_vocab, resumed=meta is not None, meta=meta)
    seq_len = meta["model_config"]["seq_len"] if meta else overrides["seq_len"]

    def tokens(texts):
        return data.TokenDataset(tok.encode_batch(texts, max_len=seq_len)[0], np.zeros(len(texts)), ())

    kwargs = dict(mask_prob=args.mask_prob, mask_id=tok.mask_id, device=args.device)
    train = data.MaskedLMLoader(tokens(train_lines), args.batch_size, shuffle=True, drop_last=True,
                                rng=args.seed, **kwargs)
    held_out = data.MaskedLMLoader(tokens(val_lines), 2 * args.batch_size, fixed=True, rng=1, **kwargs)
    overrides = {**overrides, "vocab_size": len(tok), "num_classes": 0, "lm_head": True, "seed": args.seed}

    def report(hist):
        r = hist.last()
        return (f"epoch {r['epoch']}/{args.epochs}: train loss {r['train_loss']:.4f} (perplexity "
                f"{math.exp(min(r['train_loss'], 50)):.2f}) | "
                f"held-out perplexity {math.exp(min(r['val_loss'], 50)):.2f}, "
                f"hidden tokens right {100 * r['val_acc']:.1f}% | lr {r['lr']:.2e} | {r['epoch_time']:.1f} s")

    splits = {"train": f"{len(train_lines):,} lines",
              "validation": f"{args.test_fraction:g} of the lines, held out by a fixed seed (--test-fraction): "
                            f"{len(val_lines):,}", "test": None}
    return dict(train=train, val=held_out, test=None, tokenizer=tok, preset=preset, overrides=overrides, report=report,
                splits=splits,
                describe=f"{args.dataset}: {len(train_lines):,} train / {len(val_lines):,} held-out lines",
                done=lambda loss, acc: (f"done: held-out perplexity {math.exp(min(loss, 50)):.2f} (loss {loss:.4f}), "
                                        f"{100 * acc:.1f}% of the hidden tokens predicted"))


if __name__ == "__main__":
    sys.exit(main(build_parser(), prepare, lm=True))
