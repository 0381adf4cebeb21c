"""Generated text tasks (no download): ``OrderTask``, ``PairMatchTask`` and ``PairLookupTask``.

- **order**: a sentence of filler words holds two marker words, once each; the label says which
  comes first. Both classes have the same bag of words, so a model must mix tokens by position.
- **pair matching**: two short sentences of content words; the label says whether they share a
  word. Where the shared word sits in either sentence varies, so it must be found by content:
  one attention head can compare every word of one sentence with every word of the other; the
  SGU can too, less directly (its gate multiplies a token's features with a fixed mix of the
  other tokens'), and at the small sizes tried so far a gMLP learned it no worse than an aMLP.
- **pair lookup**: where in sentence A is sentence B's word? The answer is a position found by
  content, what one attention head does in one step (the SGU learns it too: at small sizes which
  of gMLP and aMLP learns it faster depends on the seed).

Each returns a ``TextDataset``; the set is a pure function of its arguments (``train=False``
draws from another random stream than ``train=True`` with the same seed).
"""

from __future__ import annotations

import numpy as np

from .loader import as_count
from .text_loader import TextDataset

__all__ = ["CONTENT", "FILLER", "OrderTask", "PairLookupTask", "PairMatchTask"]

FILLER = ("the", "a", "film", "movie", "story", "was", "is", "very", "quite", "long", "short", "and",
          "but", "with", "of", "actor", "scene", "plot", "music", "ending", "it", "this", "that", "so")
CONTENT = ("apple", "river", "stone", "cloud", "tiger", "violin", "garden", "rocket", "candle", "forest",
           "mirror", "island", "pepper", "marble", "lantern", "harbor", "meadow", "falcon", "copper",
           "velvet", "glacier", "orchid", "thunder", "saddle")


def OrderTask(num_examples=2000, seq_words=12, seed=0, train=True, markers=("red", "blue")):
    """Which marker comes first? ``seq_words`` words: fillers, and ``markers`` once each at two
    random places; label 0 when the first marker comes first, 1 otherwise (balanced)."""
    num_examples = as_count(num_examples, "OrderTask: num_examples")
    seq_words = as_count(seq_words, "OrderTask: seq_words", minimum=2)
    rng = np.random.default_rng([seed, 0 if train else 1])
    texts, labels = [], np.zeros(num_examples, dtype=np.int64)
    for n in range(num_examples):
        words = list(rng.choice(FILLER, size=seq_words))
        i, j = rng.choice(seq_words, size=2, replace=False)
        labels[n] = int(i > j)
        words[min(i, j)], words[max(i, j)] = (markers if labels[n] == 0 else markers[::-1])
        texts.append(" ".join(words))
    return TextDataset(texts, labels, (f"{markers[0]} first", f"{markers[1]} first"), name="OrderTask")


def PairMatchTask(num_examples=2000, words_per_side=4, vocab=16, seed=0, train=True):
    """Do two sentences share a word? Each side holds ``words_per_side`` distinct words out of the
    first ``vocab`` CONTENT words; label 1 (half the examples): exactly one word in common, at a
    random place on each side; label 0: none in common."""
    num_examples = as_count(num_examples, "PairMatchTask: num_examples")
    words_per_side = as_count(words_per_side, "PairMatchTask: words_per_side")
    vocab = as_count(vocab, "PairMatchTask: vocab")
    if not 2 * words_per_side <= vocab <= len(CONTENT):
        raise ValueError(f"PairMatchTask: vocab must lie in [{2 * words_per_side}, {len(CONTENT)}]")
    rng = np.random.default_rng([seed, 2 if train else 3])
    texts, pairs, labels = [], [], np.zeros(num_examples, dtype=np.int64)
    for n in range(num_examples):
        chosen = rng.choice(vocab, size=2 * words_per_side, replace=False)
        a, b = list(chosen[:words_per_side]), list(chosen[words_per_side:])
        labels[n] = n % 2
        if labels[n]:
            b[rng.integers(words_per_side)] = a[rng.integers(words_per_side)]
        texts.append(" ".join(CONTENT[k] for k in a))
        pairs.append(" ".join(CONTENT[k] for k in b))
    return TextDataset(texts, labels, ("different", "shared word"), pairs=pairs, name="PairMatchTask")


def PairLookupTask(num_examples=2000, words=5, vocab=16, seed=0, train=True):
    """Where in sentence A is sentence B's word? A holds ``words`` distinct CONTENT words out of
    the first ``vocab``, B is one of them; the label is its place in A (``words`` classes).

    The answer is a position chosen by content. One attention head can do it in one step (B's word
    as the query finds its copy among A's keys and returns that key's position embedding); the
    SGU's gate can too, by multiplying B's features with a fixed mix of A's, but it needs more
    examples (lesson 12: 16 words of 24, C = 32, one block: from 2,000 pairs a lone head learns
    the rule, 0.9+ test accuracy, where gMLP and aMLP memorise them and stay near chance; from
    20,000 pairs gMLP learns it too). Give the model position
    embeddings (``position="learned"``) and a tokenizer that keeps each word whole
    (``vocab_size=200``), or a ``max_len`` that fits: ``encode(...).truncated`` counts the cut."""
    num_examples = as_count(num_examples, "PairLookupTask: num_examples")
    words, vocab = as_count(words, "PairLookupTask: words"), as_count(vocab, "PairLookupTask: vocab")
    if not 1 < words <= vocab <= len(CONTENT):
        raise ValueError(f"PairLookupTask: need 1 < words <= vocab <= {len(CONTENT)}")
    rng = np.random.default_rng([seed, 4 if train else 5])
    texts, pairs, labels = [], [], np.zeros(num_examples, dtype=np.int64)
    for n in range(num_examples):
        chosen = rng.choice(vocab, size=words, replace=False)
        labels[n] = rng.integers(words)
        texts.append(" ".join(CONTENT[k] for k in chosen))
        pairs.append(CONTENT[chosen[labels[n]]])
    return TextDataset(texts, labels, tuple(f"word {k + 1}" for k in range(words)), pairs=pairs,
                       name="PairLookupTask")
