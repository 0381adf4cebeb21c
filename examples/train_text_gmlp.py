"""Train a gMLP (or aMLP, with --attn-dim 64) sentence classifier on text.

    python examples/train_text_gmlp.py --dataset polarity               # Pang & Lee, 10,662 sentences
    python examples/train_text_gmlp.py --dataset sst2 --attn-dim 64     # aMLP on SST-2 (GLUE)
    python examples/train_text_gmlp.py --dataset synthetic --synthetic-task lookup --position learned --attn-dim 16
    python examples/train_text_gmlp.py --dataset polarity --pretrained runs/mlm/checkpoint.npz
    python examples/train_text_gmlp.py --dataset csv --train-file reviews.csv --text-column text --label-column label

The model is the "gmlp_text_split" preset (C = 128, 6 blocks, d_ffn = 768, S = 128 tokens, mean
pooling over the real tokens; tinymlp/models/text_gmlp.py); a WordPiece tokenizer is trained on
the training sentences (--vocab-size pieces), stored in the checkpoint and saved as tokenizer.json
beside it.
``--pretrained`` starts from a masked-LM checkpoint of examples/pretrain_mlm.py: its architecture,
its tokenizer and its weights; the classification head is new. Outputs and resume as the CIFAR
examples (examples/run_files.py): checkpoint.npz, metrics.json, curves.png, --resume auto.
The polarity data has no official test split: 10% of each class, chosen by a fixed seed, is held out.
Your own data: ``--dataset csv --train-file F [--test-file F]`` (CSV or TSV with a header line;
``--text-column``, ``--label-column``, ``--pair-column`` for sentence pairs); without a test file,
``--test-fraction`` of each class is held out by a fixed seed. The class names (the labels, sorted)
are kept in the checkpoint and label the test set's confusion matrix, confusion.png.
"""

import dataclasses
import sys
from pathlib import Path

import numpy as np
from cli import UsageError
from text_recipe import add_file_flags, csv_datasets, held_out_validation, main, text_parser, tokenizer_for

from tinymlp import checkpoint, data
from tinymlp.checkpoint import CheckpointError
from tinymlp.nn import StateDictError


def build_parser():
    p = text_parser(__doc__.splitlines()[0], ["polarity", "sst2", "synthetic", "csv"], "polarity",
                    synthetic_size=2000, lr=1e-3)
    add_file_flags(p)
    g = [g for g in p._action_groups if g.title.startswith("model")][0]
    g.add_argument("--pooling", choices=["mean", "cls"], default="mean",
                   help="sentence vector: the mean over the real tokens, or the [CLS] token")
    g.add_argument("--pretrained", default=None, metavar="CKPT",
                   help="start from this masked-LM checkpoint (examples/pretrain_mlm.py) and its tokenizer.json")
    g.add_argument("--synthetic-task", choices=["order", "pairs", "lookup"], default="order",
                   help="--dataset synthetic: which marker comes first (order), do two sentences share a word "
                        "(pairs), where in A is B's word (lookup; give it --position learned)")
    return p


def datasets(args):
    if args.dataset == "csv" or args.train_file or args.test_file:
        return csv_datasets(args)
    if args.dataset == "synthetic":
        make = {"order": data.OrderTask, "pairs": data.PairMatchTask,
                "lookup": data.PairLookupTask}[args.synthetic_task]
        n = args.synthetic_size
        return make(n, seed=args.seed, train=True), make(max(10, n // 5), seed=args.seed, train=False)
    if args.download_url:
        data.TEXT_ARCHIVES[args.dataset] = dataclasses.replace(data.TEXT_ARCHIVES[args.dataset],
                                                               urls=(args.download_url,))
    kwargs = dict(root=args.data_dir, download=not args.no_download, progress=not args.no_progress)
    return (data.get_text_dataset(args.dataset, train=True, **kwargs),
            data.get_text_dataset(args.dataset, train=False, **kwargs))


def load_pretrained(path):
    """(meta, model state) of a masked-LM checkpoint, read without pickle."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--pretrained {path}: no such file")
    meta = checkpoint.read_meta(path)
    if "model_config" not in meta or not meta["model_config"].get("lm_head"):
        raise UsageError(f"--pretrained {path}: not a masked-LM checkpoint of examples/pretrain_mlm.py")
    with np.load(path, allow_pickle=False) as npz:
        state = {k[len("model/"):]: npz[k] for k in npz.files if k.startswith("model/")}
    return meta, state


def prepare(args, out, meta, preset, overrides):
    train_set, test_set = datasets(args)
    whole = len(train_set)
    train_set, val_set = held_out_validation(args, train_set)
    pretrained = None
    if args.pretrained and meta is None:
        pretrained = load_pretrained(args.pretrained)
        base = pretrained[0]["model_config"]
        preset, overrides = pretrained[0]["preset"], {**base, "lm_head": False, "causal": False}
    tok = tokenizer_for(out, train_set.corpus, args.max_vocab, resumed=meta is not None,
                        pretrained=args.pretrained if pretrained else None, meta=meta)
    seq_len = meta["model_config"]["seq_len"] if meta else overrides["seq_len"]
    train_ids, test_ids = train_set.encode(tok, seq_len), test_set.encode(tok, seq_len)
    val_ids = val_set.encode(tok, seq_len) if val_set is not None else None
    train = data.TokenLoader(train_ids, args.batch_size, shuffle=True, drop_last=True,
                             rng=args.seed, device=args.device)
    test = data.TokenLoader(test_ids, 2 * args.batch_size, device=args.device)
    val = data.TokenLoader(val_ids, 2 * args.batch_size, device=args.device) if val_ids is not None else None
    overrides = {**overrides, "vocab_size": len(tok), "num_classes": train_set.num_classes,
                 "pooling": args.pooling, "seed": args.seed}

    def init(model):
        if pretrained is not None:
            try:
                result = model.load_state_dict(pretrained[1], strict=False)     # shapes and values must fit
            except StateDictError as err:
                raise CheckpointError(f"--pretrained {args.pretrained}: {err}") from None
            if sorted(result.missing_keys) != ["head.bias", "head.weight"]:
                raise CheckpointError(f"--pretrained {args.pretrained}: it lacks {result.missing_keys}")
            print(f"pretrained weights from {args.pretrained} (new: the classification head)")

    kind = "sentence pairs" if train_set.pairs is not None else "sentences"
    cut = train_ids.truncated + test_ids.truncated + (val_ids.truncated if val_ids is not None else 0)
    if cut:
        print(f"note: {cut:,} {kind} are longer than --seq-len {seq_len} tokens and were cut to fit")
    held = f" / {len(val_set):,} validation" if val_set is not None else ""
    splits = {"train": f"the training {kind}: {len(train_set):,}",
              "validation": (f"{args.val_fraction:g} of each class of the {whole:,} training {kind}, held out by a "
                             f"fixed seed (--val-fraction {args.val_fraction:g}): {len(val_set):,}")
              if val_set is not None else None,
              "test": f"{test_set.name}: {len(test_set):,}"}
    return dict(train=train, val=val, test=test, tokenizer=tok, preset=preset, overrides=overrides, init=init,
                classes=train_set.classes, paired=train_set.pairs is not None, splits=splits,
                describe=f"{args.dataset}: {len(train_set):,} train{held} / {len(test_set):,} test {kind}")


if __name__ == "__main__":
    sys.exit(main(build_parser(), prepare))
