"""Data for tinymlp: images (CIFAR-10/100, a generated set, your own), text (a tokenizer, sentiment
sets, generated tasks, your own), the loaders that batch them and the image augmentations.

    from tinymlp.data import CIFAR10, DataLoader, Compose, RandomCrop, HorizontalFlip, Normalize

    train = CIFAR10(train=True)                  # downloads once, then reads the cached files
    augment = Compose([RandomCrop(4), HorizontalFlip(), Normalize(train.mean, train.std)])
    loader = DataLoader(train, batch_size=128, shuffle=True, rng=0, transform=augment, device="cuda")
    for images, labels in loader:                # float32 (128, 3, 32, 32), int64 (128,)
        ...

Without the network and without a copy of CIFAR, ``SyntheticImages`` is a drop-in
replacement with the same shapes and interface. ``get_dataset(name, ...)`` picks one by name.

Your own data: ``ImageFolder`` (root/train/<class>/*.png|jpg or root/<class>/..., needs Pillow) and ``load_npz``
(x_train, y_train, x_test, y_test) give ImageDatasets; ``read_text_table`` (a CSV/TSV file with
a text and a label column) gives a TextDataset (``tinymlp.data.folder``, ``tinymlp.data.textfile``).

Text (``get_text_dataset(name, ...)`` picks one by name):

    train = SentencePolarity(train=True)                      # or SST2, or OrderTask(...) offline
    tok = Tokenizer.train(train.corpus(), vocab_size=8000)
    loader = TokenLoader(train.encode(tok, max_len=128), batch_size=32, shuffle=True, rng=0)

One concept a module: ``archive`` (where data lives; download, checksum, bounded unpacking),
``cifar``, ``synthetic``, ``folder`` (images); ``labels`` (the class and label rules every format
shares, the held-out splits); ``loader`` (ImageDataset, DataLoader),
``transforms``; ``tokenizer``, ``text_loader`` (TextDataset, TokenDataset, TokenLoader,
MaskedLMLoader), ``sentiment`` (SentencePolarity, SST2), ``text_tasks`` (the generated tasks),
``textfile`` (your own text).
"""

from .archive import DatasetError, data_root
from .cifar import ARCHIVES, CIFAR10, CIFAR10_MEAN, CIFAR10_STD, CIFAR100, CIFAR100_MEAN, CIFAR100_STD, Archive
from .folder import IMAGE_SUFFIXES, ImageFolder, as_images, load_npz
from .labels import check_class_names, held_out_split, number_labels
from .loader import DataLoader, ImageDataset, channel_stats
from .sentiment import SST2, TEXT_ARCHIVES, SentencePolarity, TextArchive
from .synthetic import SyntheticImages
from .text_loader import MaskedLMLoader, TextDataset, TokenDataset, TokenLoader
from .text_tasks import OrderTask, PairLookupTask, PairMatchTask
from .textfile import read_lines, read_text_table, split_text_dataset
from .tokenizer import Tokenizer
from .transforms import (
    Compose, CutMix, HorizontalFlip, Mixup, Normalize, RandomCrop, Resize,
    cutmix, horizontal_flip, mixup, normalize, one_hot, random_crop, resize,
)

DATASETS = {"cifar10": CIFAR10, "cifar100": CIFAR100, "synthetic": SyntheticImages}


def get_dataset(name, train=True, root=None, download=True, **kwargs):
    """The dataset called ``name`` ("cifar10", "cifar100" or "synthetic"), train or test split.

    ``root`` and ``download`` apply to CIFAR; ``kwargs`` go to the dataset's constructor
    (e.g. ``label_mode="coarse"`` for CIFAR-100, ``num_images=2000`` or ``seed=1`` for synthetic).
    """
    key = str(name).lower().replace("-", "")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}: expected one of {sorted(DATASETS)}")
    if key == "synthetic":
        return SyntheticImages(train=train, **kwargs)
    return DATASETS[key](root=root, train=train, download=download, **kwargs)


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


__all__ = [
    "ARCHIVES", "Archive", "CIFAR10", "CIFAR100", "CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100_MEAN",
    "CIFAR100_STD", "Compose", "CutMix", "DATASETS", "DataLoader", "DatasetError",
    "HorizontalFlip", "ImageDataset", "Mixup", "Normalize", "RandomCrop", "Resize", "SyntheticImages",
    "channel_stats", "cutmix", "data_root", "get_dataset", "horizontal_flip", "mixup",
    "normalize", "one_hot", "random_crop", "resize",
    "MaskedLMLoader", "OrderTask", "PairLookupTask", "PairMatchTask", "SST2", "SentencePolarity", "TEXT_ARCHIVES",
    "TEXT_DATASETS", "TextArchive", "TextDataset", "TokenDataset", "TokenLoader", "Tokenizer", "get_text_dataset",
    "IMAGE_SUFFIXES", "ImageFolder", "as_images", "check_class_names", "held_out_split", "load_npz",
    "number_labels", "read_lines", "read_text_table",
    "split_text_dataset",
]
