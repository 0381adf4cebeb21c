"""Text sets: sentence polarity (Pang and Lee), SST-2 (GLUE), and two generated tasks.

    train = SentencePolarity(train=True)          # downloads once, then reads the cached files
    tok = Tokenizer.train(train.texts, vocab_size=8000)
    loader = TokenLoader(train.encode(tok, max_len=128), batch_size=32, shuffle=True, rng=0)
    for ids, labels in loader:                     # int64 (32, 128), int64 (32,)
        ...

A ``TextDataset`` is sentences (``texts``, and ``pairs`` for two-sentence tasks), ``labels``
(N,) int64 and ``classes``; ``encode(tokenizer, max_len)`` turns it into a ``TokenDataset``:
``ids`` (N, max_len) int64, ``[CLS] a [SEP] (b [SEP])`` padded with [PAD] = 0. A model reads
the padding mask (ids != 0) and the segments (after the first [SEP]) from the ids themselves.

The official archives, read without pickle (``TEXT_ARCHIVES``, replaceable like CIFAR's):

- **Sentence polarity v1.0** (Pang and Lee 2005; ``rt-polaritydata.tar.gz`` from Cornell):
  ``rt-polaritydata/rt-polarity.pos`` and ``rt-polarity.neg``, 5,331 sentences each, one a line,
  lowercased and tokenised, in Latin-1. There is no official split: papers use 10-fold cross-
  validation. Here a fixed seeded permutation puts ``test_fraction`` (10%) of each class in the
  test split. The archive's MD5 is not pinned (it could not be verified from a trusted source
  while writing this); the archive is read only up to ``max_size`` (8 MiB, for an archive of
  about 0.5 MB) and the files are checked by their line counts instead.
- **SST-2** (Socher et al. 2013, as distributed by GLUE: ``SST-2.zip``): ``SST-2/train.tsv``
  (67,349 sentences) and ``SST-2/dev.tsv`` (872), tab-separated with a header ``sentence\tlabel``;
  GLUE's ``test.tsv`` has no labels, so the test split here is ``dev.tsv``. MD5 as pinned by
  torchtext's SST2 loader.

Where the data lives, the download (temporary file, checksum, rename) and the unpacking
(temporary folder, checked, renamed into place) follow ``tinymlp.data.cifar``: ``root``
(``--data-dir``), else $TINYMLP_DATA, else $XDG_CACHE_HOME/tinymlp, else ~/.cache/tinymlp.

Generated tasks (no download; ``OrderTask``, ``PairMatchTask`` and ``PairLookupTask``):

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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend import module_for_device, parse_device, to_device
from .loader import check_range
from ..tensor import Tensor
from .cifar import DatasetError, prepare

__all__ = [
    "MaskedIds", "MaskedLMLoader", "OrderTask", "PairLookupTask", "PairMatchTask", "SST2", "SentencePolarity", "TEXT_ARCHIVES",
    "TextArchive",
    "TextDataset", "TokenDataset", "TokenLoader", "get_text_dataset",
]


# --------------------------------------------------------------------------- datasets as arrays
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
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.dataset, self.batch_size = dataset, int(batch_size)
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

    Each real, non-special token is hidden behind [MASK] with probability ``mask_prob`` (15% as
    in BERT; at least one per batch); ``targets`` are the hidden ids in row-major order, the
    order in which ``TextGMLP`` returns the [MASK] rows' logits. The ids come as ``MaskedIds``,
    which carry those positions. (BERT also leaves 10% of the
    chosen tokens as they are and swaps 10% for random ones; here every chosen token is masked.)
    ``fixed=True`` draws the same masks every epoch (a validation set).
    """

    def __init__(self, dataset, batch_size, mask_prob=0.15, mask_id=4, first_normal_id=5, fixed=False, **kwargs):
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


# --------------------------------------------------------------------------- generated tasks
FILLER = ("the", "a", "film", "movie", "story", "was", "is", "very", "quite", "long", "short", "and",
          "but", "with", "of", "actor", "scene", "plot", "music", "ending", "it", "this", "that", "so")
CONTENT = ("apple", "river", "stone", "cloud", "tiger", "violin", "garden", "rocket", "candle", "forest",
           "mirror", "island", "pepper", "marble", "lantern", "harbor", "meadow", "falcon", "copper",
           "velvet", "glacier", "orchid", "thunder", "saddle")


def OrderTask(num_examples=2000, seq_words=12, seed=0, train=True, markers=("red", "blue")):
    """Which marker comes first? ``seq_words`` words: fillers, and ``markers`` once each at two
    random places; label 0 when the first marker comes first, 1 otherwise (balanced)."""
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


# --------------------------------------------------------------------------- official archives
@dataclass(frozen=True)
class TextArchive:
    """One archive: URLs tried in order, MD5 (None: not pinned), the files it holds inside
    ``folder`` with their line counts (None: not checked), and ``kind`` ("tar.gz" or "zip")."""

    name: str
    urls: tuple
    filename: str
    md5: str | None
    size: int | None              # bytes, for the progress bar when the server does not say
    folder: str
    files: dict
    kind: str
    max_members: int = 1000       # more members than this: refused, nothing unpacked
    max_unpacked: int = 1 << 30   # members adding up to more bytes than this: refused
    max_size: int | None = None   # a larger archive (download or file): refused; set where md5 is None


TEXT_ARCHIVES = {
    "polarity": TextArchive(
        name="sentence polarity v1.0",
        urls=("https://www.cs.cornell.edu/people/pabo/movie-review-data/rt-polaritydata.tar.gz",),
        filename="rt-polaritydata.tar.gz", md5=None, size=None, folder="rt-polaritydata",
        files={"rt-polarity.pos": 5331, "rt-polarity.neg": 5331}, kind="tar.gz",
        max_size=8 << 20,         # the archive is about 0.5 MB; without an MD5, a size limit
    ),
    "sst2": TextArchive(
        name="SST-2",
        urls=("https://dl.fbaipublicfiles.com/glue/data/SST-2.zip",),
        filename="SST-2.zip", md5="9f81648d4199384278b86e315dac217c", size=None, folder="SST-2",
        files={"train.tsv": 67_350, "dev.tsv": 873}, kind="zip",    # with their header lines
    ),
}


def _how_to_fix(spec, root):
    return (f"To use a copy you already have, pass its folder (the one holding {spec.folder}/ or "
            f"{spec.filename}) as root=... (--data-dir in the examples) or set TINYMLP_DATA; it is "
            f"looked for in {root}. To work without it, use a generated set: tinymlp.data.OrderTask "
            f"or PairMatchTask (--dataset synthetic in the examples).")


def prepare_text(spec: TextArchive, root=None, download=True, progress=True) -> Path:
    """Make sure ``root/spec.folder`` holds the checked files; return that folder (CIFAR's
    ``prepare``: the same download, checksum, safe unpacking and offline message)."""
    return prepare(spec, root, download, progress, check=_check_files, advice=_how_to_fix)


def _lines(path):
    return path.read_bytes().decode("latin-1").splitlines()


def _utf8_lines(path, folder):
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DatasetError(f"{path}, line {line}: the bytes are not UTF-8 (the file is corrupted); delete "
                           f"{folder} and run again with download=True.") from None


def _check_files(spec, folder, fix):
    for name, count in spec.files.items():
        path = folder / name
        if not path.is_file():
            raise DatasetError(f"{path} is missing. {fix}")
        if count is not None and (n := len(_lines(path))) != count:
            raise DatasetError(f"{path} is truncated or corrupted: {n} lines, expected {count}. {fix}")


class SentencePolarity(TextDataset):
    """Pang and Lee's 10,662 movie-review sentences: label 1 positive, 0 negative; a seeded
    ``test_fraction`` of each class is the test split (there is no official one)."""

    def __init__(self, root=None, train=True, download=True, progress=True, test_fraction=0.1, seed=0):
        spec = TEXT_ARCHIVES["polarity"]
        self.root = prepare_text(spec, root, download, progress)
        texts, labels = [], []
        for label, name in ((0, "rt-polarity.neg"), (1, "rt-polarity.pos")):
            lines = [s.strip() for s in _lines(self.root / name)]
            order = np.random.default_rng([seed, label]).permutation(len(lines))
            n_test = int(round(test_fraction * len(lines)))
            keep = order[n_test:] if train else order[:n_test]
            texts += [lines[i] for i in sorted(keep)]
            labels += [label] * len(keep)
        super().__init__(texts, labels, ("negative", "positive"), name="SentencePolarity")
        self.train = train


class SST2(TextDataset):
    """SST-2 from GLUE: train.tsv (train=True) or dev.tsv (train=False, GLUE's test has no labels);
    label 1 positive, 0 negative."""

    def __init__(self, root=None, train=True, download=True, progress=True):
        spec = TEXT_ARCHIVES["sst2"]
        self.root = prepare_text(spec, root, download, progress)
        path = self.root / ("train.tsv" if train else "dev.tsv")
        rows = _utf8_lines(path, self.root)
        if not rows or rows[0].split("\t") != ["sentence", "label"]:
            raise DatasetError(f"{path}: expected the header 'sentence<TAB>label'. Delete {self.root} and "
                               f"run again with download=True.")
        texts, labels = [], []
        for k, row in enumerate(rows[1:], start=2):
            sentence, _, label = row.rpartition("\t")
            if label not in ("0", "1"):
                raise DatasetError(f"{path}, line {k}: label {label!r} is not 0 or 1; the file is corrupted.")
            texts.append(sentence.strip())
            labels.append(int(label))
        super().__init__(texts, labels, ("negative", "positive"), name="SST2")
        self.train = train


TEXT_DATASETS = {"polarity": SentencePolarity, "sst2": SST2, "order": OrderTask, "pairs": PairMatchTask,
                 "lookup": PairLookupTask}


def get_text_dataset(name, train=True, root=None, download=True, **kwargs):
    """"polarity", "sst2" (``root``, ``download`` apply) or the generated "order", "pairs", "lookup"."""
    key = str(name).lower().replace("-", "")
    if key not in TEXT_DATASETS:
        raise ValueError(f"unknown text dataset {name!r}: expected one of {sorted(TEXT_DATASETS)}")
    if key in ("order", "pairs", "lookup"):
        return TEXT_DATASETS[key](train=train, **kwargs)
    return TEXT_DATASETS[key](root=root, train=train, download=download, **kwargs)
