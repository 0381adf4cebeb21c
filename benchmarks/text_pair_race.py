r"""gMLP, aMLP and a lone tiny attention head on the generated pair task (lesson 12, section 5):
test accuracy, not time.

``PairLookupTask``: sentence A lists ``--words`` distinct words out of ``--vocab``, sentence B is one
of them, the label is B's word's place in A. Every word stays one token (the tokenizer gets room
for them all, and the script stops if a pair would be cut). Contenders, all with learned position
embeddings, AdamW, batch 32:

- ``gmlp``: ``TextGMLP`` with ``--depth`` blocks of width ``--dim`` (d_ffn = 2 dim);
- ``amlp``: the same with a tiny attention of width ``--attn-dim`` feeding each SGU's gate;
- ``amlp-frozen-w``: the aMLP with the SGU's W held at zero, so that only the head can route;
- ``head``: embeddings -> LN -> one ``TinyAttention`` head -> mean over the real tokens -> LN ->
  classes (lesson 12's ``AttentionReader``);
- ``head-gate``, ``head-ln``, ``head-gate-v-res``, ``head-gate-ln``: the head with what stands
  between it and the pooling in an aMLP block: the gate's product z1 * (1 + attn) (z1 = GELU(x U),
  the token's own features), the projection V, the residual, the per-token LayerNorm.

Prints one line per (contender, seed): accuracy at the last epoch, the best epoch's, and the
first epoch above 0.9. The lesson's race:

    python benchmarks/text_pair_race.py --words 16 --epochs 40 --seeds 0 1 2 3 4

the stages of aMLP put behind the lone head (lesson 12's counts):

    python benchmarks/text_pair_race.py --epochs 30 --seeds 0 1 2 3 4 \
        --runs head head-gate head-ln head-gate-v-res head-gate-ln

and the depth at which the SGU catches up:

    python benchmarks/text_pair_race.py --words 16 --depth 2 --epochs 40 --runs gmlp amlp
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tinymlp import F, nn
from tinymlp.data import PairLookupTask, TokenLoader
from tinymlp.models.text_gmlp import TextGMLP
from tinymlp.optim import AdamW, param_groups
from tinymlp.data.tokenizer import Tokenizer
from tinymlp.train import fit

RUNS = ("gmlp", "amlp", "amlp-frozen-w", "head", "head-gate", "head-ln", "head-gate-v-res", "head-gate-ln")


class AttentionReader(nn.Module):
    """Token + position embeddings -> LN -> one TinyAttention head -> mean over the real tokens
    -> LN -> classes. ``stages`` puts what an aMLP block has between its head and the pooling:
    "gate" (z1 * (1 + attn), z1 = GELU(x U)), "v" (a Linear after it), "res" (+ the embeddings),
    "ln" (LayerNorm token by token before the mean, as TextGMLP does, instead of after it)."""

    def __init__(self, vocab_size, seq_len, dim, attn_dim, num_classes, stages=(), seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.stages = frozenset(stages)
        self.embed = nn.Embedding(vocab_size, dim, rng=rng)
        self.position = nn.PositionEmbedding(seq_len, dim, rng=rng)
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.TinyAttention(dim, dim, attn_dim, rng=rng)
        self.out_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes, rng=rng)
        self.gate = nn.Linear(dim, dim, rng=rng) if "gate" in self.stages else None
        self.v = nn.Linear(dim, dim, rng=rng) if "v" in self.stages else None

    def forward(self, ids):
        real = np.asarray(ids) != 0                                      # (B, S)
        x = self.position(self.embed(ids))                               # (B, S, dim)
        h = self.norm(x)
        a = self.attn(h, mask=real)                                      # (B, S, dim)
        if self.gate is not None:
            a = F.gelu(self.gate(h)) * (a + 1.0)                         # z1 * (1 + attn)
        if self.v is not None:
            a = self.v(a)
        if "res" in self.stages:
            a = x + a
        if "ln" in self.stages:
            a = self.out_norm(a)                                         # per token, then the mean
        pooled = (a * real[:, :, None]).sum(axis=1) / real.sum(axis=1, keepdims=True)
        return self.head(pooled if "ln" in self.stages else self.out_norm(pooled))


def build(run, vocab_size, seq_len, args, seed):
    if run.startswith(("gmlp", "amlp")):
        model = TextGMLP(vocab_size, seq_len, dim=args.dim, depth=args.depth, ffn_dim=2 * args.dim,
                         num_classes=args.words, attn_dim=args.attn_dim if run.startswith("amlp") else None,
                         position="learned", seed=seed)
        if run == "amlp-frozen-w":                      # only the head can route: W = 0, not trained
            for block in model.blocks:
                block.sgu.weight.data[...] = 0
                block.sgu.weight.requires_grad = False
        return model
    stages = run.split("-")[1:]
    return AttentionReader(vocab_size, seq_len, args.dim, args.attn_dim, args.words, stages, seed=seed)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--words", type=int, default=16, help="words in sentence A (= classes)")
    p.add_argument("--vocab", type=int, default=24, help="distinct words to draw from (at most 24)")
    p.add_argument("--train", type=int, default=2000, help="training pairs (the test set has 400)")
    p.add_argument("--dim", type=int, default=32, help="model width")
    p.add_argument("--depth", type=int, default=1, help="gMLP/aMLP blocks")
    p.add_argument("--attn-dim", type=int, default=32, help="tiny attention width")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    args = p.parse_args(argv)

    train = PairLookupTask(args.train, words=args.words, vocab=args.vocab, seed=0)
    test = PairLookupTask(400, words=args.words, vocab=args.vocab, seed=0, train=False)
    tok = Tokenizer.train(train.corpus(), vocab_size=200)
    S = args.words + 4                                     # [CLS] A [SEP] b [SEP]
    train_ids, test_ids = train.encode(tok, S), test.encode(tok, S)
    if train_ids.truncated or test_ids.truncated:
        raise SystemExit(f"{train_ids.truncated + test_ids.truncated} pairs do not fit in {S} tokens")
    print(f"PairLookupTask: {args.words} words of {args.vocab}, {args.train} train / 400 test pairs, "
          f"S = {S}, chance {1 / args.words:.2f}; dim {args.dim}, depth {args.depth}, "
          f"d_attn {args.attn_dim}, {args.epochs} epochs, lr {args.lr}")
    for run in args.runs:
        for seed in args.seeds:
            model = build(run, len(tok), S, args, seed)
            start = time.perf_counter()
            history = fit(model, AdamW(param_groups(model, 0.01), lr=args.lr),
                          TokenLoader(train_ids, 32, shuffle=True, rng=seed), TokenLoader(test_ids, 400),
                          epochs=args.epochs, progress=False)
            acc = history.val_acc
            above = next((i + 1 for i, a in enumerate(acc) if a > 0.9), None)
            print(f"{run:>10} seed {seed}: {model.num_parameters():6,} parameters, train accuracy "
                  f"{history.train_acc[-1]:.2f}, test accuracy {acc[-1]:.2f} (best {max(acc):.2f}, "
                  f"above 0.9 from epoch {above or '-'}), "
                  f"{time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
