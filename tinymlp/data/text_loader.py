"""Text as arrays: sentences with labels, their token ids, and the loaders that batch them.

    train = SentencePolarity(train=True)          # downloads once, then reads the cached files
    tok = Tokenizer.train(train.texts, vocab_size=8000)
    loader = TokenLoader(train.encode(tok, max_len=128), batch_size=32, shuffle=True, rng=0)
    for ids, labels in loader:                     # int64 (32, 128), int64 (32,)
        ...

A ``TextDataset`` is sentences (``texts``, and ``pairs`` for two-sentence tasks), ``labels``
(N,) int64 and ``classes``; ``encode(tokenizer, max_len)`` turns it into a ``TokenDataset``:
``ids`` (N, max_len) int64, ``[CLS] a [SEP] (b [SEP])`` padded with [PAD] = 0. A model reads
the padding mask (ids != 0) and the segments (after the first [SEP]) from the ids themselves.

``TokenLoader`` batches a TokenDataset as ``DataLoader`` batches images; ``MaskedLMLoader``
hides tokens behind [MASK] for masked-LM pretraining.
"""

from __future__ import annotations

import numpy as np

from ..backend import module_for_device, parse_device, to_device
from ..tensor import Tensor
from .loader import as_count, as_fraction, check_range

__all__ = ["MaskedIds", "MaskedLMLoader", "TextDataset", "TokenDataset", "TokenLoader"]


class TextDataset:
    """Sentences with labels: ``texts`` (N str), ``pairs`` (N str or None), ``labels`` (N,) int64."""

    def __init__(self, texts, labels, classes, pairs=None, name="text"):
        self.texts = list(texts)
        self.pairs = None if pairs is None else list(pairs)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.classes = tuple(classes)
        self.name = name
        if self.labels.shape != (len(self.texts),) or (self.pairs is not None and len(self.pairs) != len(self.texts)):
            raise ValueError(f"{name}: {len(self.texts)} texts, {self.labels.shape} labels, "
                             f"{None if self.pairs is None else len(self.pairs)} pairs")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return (self.texts[i] if self.pairs is None else (self.texts[i], self.pairs[i])), int(self.labels[i])

    def corpus(self):
        """Every sentence (both sides of the pairs): what a tokenizer is trained on."""
        return self.texts + (self.pairs or [])

    def encode(self, tokenizer, max_len=128) -> "TokenDataset":
        """Ids cut and padded to ``max_len``; ``.truncated`` counts the examples that were cut
        (only a row without padding can have been: those are measured again uncut)."""
        max_len = as_count(max_len, "TextDataset.encode: max_len")
        ids, _ = tokenizer.encode_batch(self.texts, self.pairs, max_len)
        pairs = self.pairs or [None] * len(self)
        full = np.flatnonzero(ids[:, -1] != tokenizer.pad_id)
        truncated = sum(len(tokenizer.encode(self.texts[i], pairs[i], None)[0]) > max_len for i in full)
        return TokenDataset(ids, self.labels, self.classes, self.pairs is not None, truncated=truncated,
                            vocab_size=tokenizer.vocab_size)

    def __repr__(self):
        kind = "sentence pairs" if self.pairs is not None else "sentences"
        return f"{self.name}({len(self)} {kind}, {self.num_classes} classes)"


class TokenDataset:
    """Token ids (N, S) int64 and labels (N,) int64, ready for a ``TokenLoader``; ``vocab_size``
    (None: unknown), the tokenizer's, bounds the ids the loaders accept."""

    def __init__(self, ids, labels, classes, paired=False, truncated=0, vocab_size=None):
        self.vocab_size = None if vocab_size is None else int(vocab_size)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.classes, self.paired = tuple(classes), bool(paired)
        self.truncated = int(truncated)                # examples cut to fit seq_len

    @property
    def num_classes(self):
        return len(self.classes)

    @property
    def seq_len(self):
        return self.ids.shape[1]

    def __len__(self):
        return len(self.labels)

    def __repr__(self):
        cut = f", {self.truncated} truncated" if self.truncated else ""
        return f"TokenDataset({len(self)} x {self.seq_len} ids, {self.num_classes} classes{cut})"


class TokenLoader:
    """Batches ``(ids, labels)`` of a TokenDataset as int64 Tensors on ``device``; the same
    interface as ``DataLoader`` (``rng`` drives the shuffling; ``len`` = batches per epoch)."""

    def __init__(self, dataset, batch_size, shuffle=False, drop_last=False, rng=None, device="cpu"):
        self.dataset = dataset
        self.batch_size = as_count(batch_size, f"{type(self).__name__}: batch_size")
        self.shuffle, self.drop_last = shuffle, drop_last
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(0 if rng is None else rng)
        self.device = parse_device(device)
        module_for_device(self.device)

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _check_ids(self, ids, index):
        """Token ids within the vocabulary, checked on the host (see ``check_range``)."""
        vocab = getattr(self.dataset, "vocab_size", None)
        check_range(type(self).__name__, "token id", ids, vocab, index,
                    f"the tokenizer has {vocab} ids; encode the texts with the model's tokenizer" if vocab
                    else "token ids are counted from 0")

    def __iter__(self):
        n = len(self.dataset)
        order = self.rng.permutation(n) if self.shuffle else np.arange(n)
        classes = len(self.dataset.classes)
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            ids, labels = self.dataset.ids[index], self.dataset.labels[index]
            self._check_ids(ids, index)
            check_range("TokenLoader", "label", labels, classes or None, index,
                        f"the dataset has {classes} classes" if classes else "labels are class ids counted from 0")
            yield Tensor(to_device(ids, self.device)), Tensor(to_device(labels, self.device))


class MaskedIds(Tensor):
    """Token ids (B, S) with [MASK] tokens, and ``mask_positions``: the flat row-major indices of
    the masked tokens, found on the host by ``MaskedLMLoader`` and sent with the ids, so that the
    model need not search the ids on the device (on a GPU, a wait for the device each step)."""

    __slots__ = ("mask_positions",)

    def __init__(self, ids, mask_positions):
        super().__init__(ids)
        self.mask_positions = mask_positions


class MaskedLMLoader(TokenLoader):
    """Batches ``(masked ids, targets)`` for masked-LM training on a TokenDataset (labels unused).

    Each real, non-special token is hidden behind [MASK] with probability ``mask_prob`` (in (0, 1]; 15% as
    in BERT; at least one per batch); ``targets`` are the hidden ids in row-major order, the
    order in which ``TextGMLP`` returns the [MASK] rows' logits. The ids come as ``MaskedIds``,
    which carry those positions. (BERT also leaves 10% of the
    chosen tokens as they are and swaps 10% for random ones; here every chosen token is masked.)
    ``fixed=True`` draws the same masks every epoch (a validation set).
    """

    def __init__(self, dataset, batch_size, mask_prob=0.15, mask_id=4, first_normal_id=5, fixed=False, **kwargs):
        mask_prob = as_fraction(mask_prob, "MaskedLMLoader: mask_prob", low_ok=False)
        super().__init__(dataset, batch_size, **kwargs)
        self.mask_prob, self.mask_id, self.first_normal_id, self.fixed = mask_prob, mask_id, first_normal_id, fixed
        self._seed = int(self.rng.integers(2**31))

    def __iter__(self):
        n = len(self.dataset)
        order = self.rng.permutation(n) if self.shuffle else np.arange(n)
        draw = np.random.default_rng(self._seed) if self.fixed else self.rng
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            ids = self.dataset.ids[index].copy()
            self._check_ids(ids, index)
            candidates = ids >= self.first_normal_id
            hide = candidates & (draw.random(ids.shape) < self.mask_prob)
            if not hide.any() and candidates.any():
                hide.flat[draw.choice(np.flatnonzero(candidates))] = True
            targets = ids[hide]                          # row-major, as np.flatnonzero orders them
            ids[hide] = self.mask_id
            positions = to_device(np.flatnonzero(hide), self.device)       # the order of targets
            yield MaskedIds(to_device(ids, self.device), positions), Tensor(to_device(targets, self.device))
