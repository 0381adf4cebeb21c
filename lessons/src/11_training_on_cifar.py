# Source of lessons/11_training_on_cifar.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 11: training on CIFAR-10, the full recipe
#
# Everything so far, put together the way a real run is: a data pipeline with augmentation,
# AdamW with weight decay on the weights only, a warmup-then-decay learning rate, gradient
# clipping, the training loop, curves, and checkpoints that let a run stop and resume
# exactly where it was. The recipe is the MLP-Mixer paper's, as the course work describes it
# (section 2.2): Adam with $\beta = (0.9, 0.999)$, linear warmup and linear decay, weight
# decay, gradient clipping at norm 1.
#
# The lesson trains on CIFAR-10 if a copy is already on disk (it never downloads) and on
# the generated `SyntheticImages` set otherwise, with a small model, a subset of the images
# and a few epochs so that it finishes in well under a minute. The last section shows the
# command that runs the full thing.
#
# **Objectives.** Assemble the full recipe (data pipeline and augmentation, AdamW with
# weight decay on the weights only, warmup and decay, clipping, curves, checkpoints and an
# exact resume) and know the command that runs it at full size.
#
# **Prerequisites:** lessons 6 and 7 (the models), lesson 2 (the training loop). No exercises:
# this lesson is the capstone you adapt for your own runs.
#
# **In tinymlp:** `tinymlp/data/` (`cifar.py`: finding, checking and reading CIFAR;
# `loader.py`: `DataLoader`; `transforms.py`: crop, flip, normalise), `tinymlp/optim.py`
# (`AdamW`, `param_groups`, `WarmupLinear`, `clip_grad_norm`), `tinymlp/train.py` (`fit`,
# `evaluate`, `History`), `tinymlp/checkpoint.py`, `tinymlp/plot.py`, and
# `examples/train_cifar_mixer.py` with `examples/image_recipe.py`, the command-line version of this lesson.

# %%
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from tinymlp import checkpoint
from tinymlp.data import CIFAR10, DatasetError, SyntheticImages
from tinymlp.data.loader import DataLoader, ImageDataset
from tinymlp.data.transforms import Compose, HorizontalFlip, Normalize, RandomCrop
from tinymlp.models import create, num_parameters
from tinymlp.optim import AdamW, WarmupLinear, param_groups
from tinymlp.plot import training_curves
from tinymlp.train import History, evaluate, fit, format_epoch

lesson_start = time.perf_counter()

# %% [markdown]
# ## 1. The data
#
# `CIFAR10(download=False)` looks for the extracted files (or the archive) in the data folder
# (`$TINYMLP_DATA`, else `~/.cache/tinymlp`), checks that every file has the expected size,
# and raises a `DatasetError` that says what is missing and how to fix it. We catch it and
# fall back to the generated set, which has the same format: 32 x 32 RGB uint8 images in 10
# classes. For speed the lesson uses the first 2,000 training and 500 test images.

# %%
try:
    full_train = CIFAR10(train=True, download=False)
    full_test = CIFAR10(train=False, download=False)
    SOURCE = "cifar10"
except DatasetError as err:
    print(textwrap.fill(f"DatasetError: {err}", 110), "\n")
    full_train = SyntheticImages(2000, seed=0)
    full_test = SyntheticImages(500, seed=0, train=False)
    SOURCE = "synthetic"
print("training on:", SOURCE, "-", full_train)

def first(dataset, n):
    # The first n images, keeping the full set's class names and channel statistics.
    return ImageDataset(dataset.images[:n], dataset.labels[:n], dataset.classes, dataset.mean, dataset.std)

train, test = first(full_train, 2000), first(full_test, 500)
print(f"{len(train)} training and {len(test)} test images; images {train.images.shape[1:]} "
      f"{train.images.dtype}; images per class: {np.bincount(train.labels, minlength=10)}")
print("channel mean", np.round(train.mean, 3), "std", np.round(train.std, 3))

fig, axes = plt.subplots(2, 8, figsize=(12, 3.4))
for ax, i in zip(axes.ravel(), range(16)):
    ax.imshow(train.images[i].transpose(1, 2, 0))
    ax.set_title(train.classes[train.labels[i]], fontsize=7)
    ax.axis("off")
plt.show()

# %% [markdown]
# ## 2. The pipeline: crop, flip, normalise
#
# The `DataLoader` draws a shuffled batch of uint8 images, moves it to the device (a quarter
# of the bytes of float32), converts it to float32 in $[0, 1]$ and applies the transform to the
# whole batch at once. Three transforms make the CIFAR recipe:
#
# - `RandomCrop(4)`: pad by 4 pixels with zeros and cut a random 32 x 32 window, i.e. shift
#   the image by up to 4 pixels: the class of an object does not depend on where it sits;
# - `HorizontalFlip()`: mirror half of the images: a mirrored cat is a cat;
# - `Normalize(mean, std)`: per channel, $(x - \mu_c)/\sigma_c$, so that inputs have mean 0 and
#   standard deviation 1 (the test set uses only this one).
#
# An augmentation must not change the label. For the synthetic set, whose classes are
# *left/right arrangements* of two markers, a flip turns "B left of A" into "B right of A":
# there the flip is switched off (the example scripts do the same).

# %%
shifts_and_flips = [RandomCrop(4)] + ([HorizontalFlip()] if SOURCE != "synthetic" else [])
augment = Compose(shifts_and_flips + [Normalize(train.mean, train.std)])
plain = Normalize(train.mean, train.std)
print("training transform:", augment)

# one image, augmented eight times (without the normalisation, to look at it)
one = ImageDataset(np.repeat(train.images[:1], 8, axis=0), np.repeat(train.labels[:1], 8), train.classes)
views, _ = next(iter(DataLoader(one, 8, rng=1, transform=Compose(shifts_and_flips))))
fig, axes = plt.subplots(1, 8, figsize=(12, 1.8))
for ax, view in zip(axes, views.numpy()):
    ax.imshow(view.transpose(1, 2, 0))
    ax.axis("off")
plt.show()

batch, labels = next(iter(DataLoader(test, 500, transform=plain)))
x = batch.numpy()
print("a normalised test batch:", x.shape, x.dtype, "| channel means", np.round(x.mean(axis=(0, 2, 3)), 3),
      "| stds", np.round(x.std(axis=(0, 2, 3)), 3))
assert x.dtype == np.float32 and labels.numpy().dtype == np.int64
# near 0 and 1 (not exactly: the statistics are the training set's); raw pixels would be ~0.47 and ~0.25
assert np.all(np.abs(x.mean(axis=(0, 2, 3))) < 0.25) and np.all(np.abs(x.std(axis=(0, 2, 3)) - 1) < 0.25)

# %% [markdown]
# ## 3. Model, optimiser, schedule
#
# **Model.** The course work's CIFAR Mixer (`mixer_cifar`: 4 x 4 patches, so $S = 64$ tokens)
# at a fraction of its width and depth, so that a CPU trains it in seconds.
#
# **AdamW.** Adam with *decoupled* weight decay: the decay is applied to the weights
# directly instead of being added to the gradient, where Adam's per-parameter scaling
# would distort it,
#
# $$\theta \leftarrow \theta - \eta_t\Bigl(\frac{\hat m_t}{\sqrt{\hat v_t}+\epsilon} + \lambda\,\theta\Bigr).$$
#
# `param_groups(model, weight_decay)` makes two groups: the weight matrices, with decay, and
# the biases and LayerNorm parameters, without (pulling a gain towards 0 regularises nothing).
#
# **Schedule.** `WarmupLinear` raises the learning rate linearly from 0 during the warmup
# (Adam's early second-moment estimates are noisy, and big early steps can wreck a fresh
# network) and lowers it linearly to 0 at the last step. **Clipping** rescales the whole
# gradient when its norm exceeds 1: $g \leftarrow g\cdot\min(1, 1/\lVert g\rVert)$.

# %%
EPOCHS, BATCH, LR = 5, 50, 5e-3

def make_run(seed=0):
    # Model, optimizer, schedule and training loader: everything a run's state lives in.
    model = create("mixer_cifar", dim=64, depth=2, token_mlp_dim=64, channel_mlp_dim=128, seed=seed)
    optimizer = AdamW(param_groups(model, weight_decay=0.05), lr=LR)
    loader = DataLoader(train, BATCH, shuffle=True, drop_last=True, rng=seed, transform=augment)
    steps = EPOCHS * len(loader)
    scheduler = WarmupLinear(optimizer, warmup_steps=len(loader) // 2, total_steps=steps)
    return model, optimizer, scheduler, loader

model, optimizer, scheduler, loader = make_run()
val_loader = DataLoader(test, 250, transform=plain)
print(f"model: {model.num_parameters():,} parameters (the full mixer_cifar: {num_parameters('mixer_cifar'):,})")
for group in optimizer.param_groups:
    n = sum(p.size for p in group["params"])
    print(f"param group: {len(group['params']):2d} tensors, {n:6,} numbers, weight decay {group['weight_decay']}")

total = EPOCHS * len(loader)
plt.figure(figsize=(5, 2.5))
plt.plot([scheduler.get_lr(s) for s in range(total)])
plt.xlabel("step")
plt.ylabel("learning rate")
plt.title(f"WarmupLinear: {len(loader) // 2} warmup steps, {total} in all", fontsize=10)
plt.show()

# %% [markdown]
# ## 4. Training, with a checkpoint after every epoch
#
# `fit` runs the loop of lesson 2 (forward, loss, `zero_grad`, backward, clip, step, schedule
# step) over the epochs and returns a `History` of per-epoch metrics. Callbacks run after each
# epoch: one prints a line, one saves a checkpoint. A checkpoint holds everything needed to
# continue: the weights, the optimizer's moments, the schedule's step, the history so far,
# and the loader's random generator (the shuffling and the augmentation of the next epochs).
# It is one `.npz` file, written atomically, and never pickled.

# %%
run_dir = Path(tempfile.mkdtemp(prefix="tinymlp_lesson11_"))

def save_checkpoint(epoch, history):
    state = {"epoch": epoch, "history": history.to_dict(), "rng": loader.rng}
    checkpoint.save(run_dir / "last.npz", model, optimizer, scheduler, **state)
    if epoch == 3:
        checkpoint.save(run_dir / "epoch3.npz", model, optimizer, scheduler, **state)

def log(epoch, history):
    print(format_epoch(history, EPOCHS))

start = time.perf_counter()
history = fit(model, optimizer, loader, val_loader, epochs=EPOCHS, scheduler=scheduler, clip=1.0,
              progress=False, callbacks=[log, save_checkpoint])
print(f"trained in {time.perf_counter() - start:.1f} s; checkpoints: {sorted(p.name for p in run_dir.iterdir())}")

assert history.train_loss[-1] < np.log(10) - 0.05, "the loss fell below ln(10), the loss of a uniform guess"
if SOURCE == "synthetic":
    assert history.val_acc[-1] > 0.25, "well above chance (10 %)"

# %% [markdown]
# ## 5. Curves
#
# `tinymlp.plot.training_curves` draws loss and accuracy per epoch from a `History` (or
# from the `metrics.json` an example script writes).

# %%
training_curves(history, title=f"tiny Mixer on {SOURCE}, {len(train)} images")

# %% [markdown]
# In five short epochs the curves only start to bend; the real run (section 8) trains for
# tens of epochs on all 50,000 images. Two things to look for in a long run: the gap between
# training and validation accuracy (overfitting: MLP models overfit CIFAR easily, which is why
# the augmentation and weight decay are there), and a validation curve that flattens when the
# learning rate decays.
#
# ## 6. Loading a checkpoint
#
# A fresh model of the same architecture (with other random weights) takes the saved
# weights and must give exactly the same validation numbers. A checkpoint of a different
# architecture would be refused with a list of the mismatching keys, before anything is changed.

# %%
fresh = create("mixer_cifar", dim=64, depth=2, token_mlp_dim=64, channel_mlp_dim=128, seed=123)
meta = checkpoint.load(run_dir / "last.npz", fresh)
loss, acc = evaluate(fresh, val_loader)
print(f"checkpoint of epoch {meta['epoch']}: validation loss {loss:.4f}, accuracy {acc:.1%}; "
      f"the run ended at {history.val_loss[-1]:.4f}, {history.val_acc[-1]:.1%}")
assert np.isclose(loss, history.val_loss[-1], rtol=1e-6) and acc == history.val_acc[-1]

try:
    checkpoint.load(run_dir / "last.npz", create("mixer_cifar", dim=32, depth=1, token_mlp_dim=64, channel_mlp_dim=128))
except checkpoint.CheckpointError as err:
    print("\na narrower model is refused:", textwrap.shorten(str(err), 300))

# %% [markdown]
# ## 7. Resuming a run
#
# Pretend the run was killed after epoch 3. A new process builds the model, optimizer,
# schedule and loader as before, loads the epoch-3 checkpoint into them, restores the
# loader's generator and the history, and calls `fit` with `start_epoch=3`: it trains epochs
# 4 and 5 only. Because all the state came back, including the random draws of the
# remaining epochs, the resumed run ends with the same weights as the uninterrupted one.

# %%
model2, optimizer2, scheduler2, loader2 = make_run(seed=7)        # different seed: everything is overwritten
meta = checkpoint.load(run_dir / "epoch3.npz", model2, optimizer2, scheduler2)
loader2.rng = meta["rng"]
resumed = fit(model2, optimizer2, loader2, val_loader, epochs=EPOCHS, scheduler=scheduler2, clip=1.0,
              progress=False, start_epoch=meta["epoch"], history=History.from_dict(meta["history"]))
print("epochs in the resumed history:", resumed.epoch)

diff = max(float(np.abs(a - b).max()) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
print(f"largest weight difference between the uninterrupted and the resumed run: {diff:.1e}")
assert resumed.epoch == history.epoch and diff < 1e-6

# %% [markdown]
# ## 8. The full run
#
# `examples/train_cifar_mixer.py` is this lesson as a command-line program, with the course
# work's full-size model and the recipe's defaults (50 epochs, batch 128, AdamW lr $10^{-3}$,
# weight decay 0.05, 5 % warmup, clipping at 1); `examples/train_cifar_gmlp.py` does the same
# for gMLP and aMLP. They write `checkpoint.npz`, `metrics.json`, `curves.png` and a picture of the
# learned mixing weights to `--out`, and continue a run with `--resume auto`:
#
# ```bash
# python examples/train_cifar_mixer.py --device cuda                  # CIFAR-10, downloaded once
# python examples/train_cifar_mixer.py --data-dir ~/data/cifar        # a copy you already have
# python examples/train_cifar_mixer.py --resume auto                  # continue where it stopped
# python examples/train_cifar_mixer.py --dataset synthetic --epochs 5 # offline
# python examples/train_cifar_mixer.py --help                         # every option
# ```
#
# The course work reports 82.3 % on CIFAR-10 for its from-scratch Mixer (Table 3). Here is a
# smoke run of the script, on the synthetic set with a very small model and two batches:

# %%
script = Path("..") / "examples" / "train_cifar_mixer.py"
if script.exists():
    out_dir = run_dir / "example"
    command = [sys.executable, str(script), "--dataset", "synthetic", "--synthetic-size", "500",
               "--epochs", "1", "--limit-batches", "2", "--batch-size", "32", "--dim", "32",
               "--depth", "1", "--no-progress", "--out", str(out_dir)]
    print("$", " ".join(["python"] + command[1:]))
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    print(done.stdout or done.stderr)
    assert done.returncode == 0
    print("outputs:", sorted(p.name for p in out_dir.iterdir()))
else:
    print(f"{script} not found: run this notebook from the lessons/ folder of a tinymlp checkout")

shutil.rmtree(run_dir)                                            # the lesson's checkpoints were temporary
print(f"lesson 11 ran in {time.perf_counter() - lesson_start:.0f} s")
