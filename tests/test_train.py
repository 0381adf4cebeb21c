"""Tests of tinymlp.train (fit, evaluate, History) and tinymlp.plot.

- fit: the loss goes down, the History has every field, epochs resume, callbacks run,
  a NaN loss stops training with a clear error, no progress bar unless asked;
- the metrics are brought to the host every ``sync_every`` batches, never per batch;
- evaluate: the batch-weighted mean loss and the accuracy equal a plain NumPy computation
  over the whole set; soft targets count their most probable class;
- plots: PNG files for the curves, Mixer token-mixing weights and gMLP spatial weights;
- learning: the CIFAR Mixer configuration (reduced width and depth, see the test) learns
  the synthetic set well above chance in seconds.
"""

import json
import math

import numpy as np
import pytest

import tinymlp
from tinymlp import F, Tensor, plot, train
from tinymlp.data import DataLoader, ImageDataset, Normalize, SyntheticImages
from tinymlp.models import GMLP, MLPMixer, create
from tinymlp.optim import AdamW, WarmupLinear, param_groups
from tinymlp.train import History, evaluate, fit, format_epoch


# ---------------------------------------------------------------------- fixtures
def quadrant_images(n, seed):
    """4 classes: which quadrant of a noisy 8x8 image holds a bright square (needs token mixing)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 4
    images = rng.integers(0, 110, size=(n, 3, 8, 8))
    for k in range(4):
        r, c = divmod(k, 2)
        images[labels == k, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 140
    return ImageDataset(images.astype(np.uint8), labels, classes=("tl", "tr", "bl", "br"))


def tiny_mixer(num_classes=4, image_size=8, seed=0):
    return MLPMixer(image_size=image_size, patch_size=4, in_channels=3, num_classes=num_classes, dim=16,
                    depth=1, token_mlp_dim=8, channel_mlp_dim=32, seed=seed)


def tiny_gmlp(**kwargs):
    return GMLP(image_size=16, patch_size=4, in_channels=3, num_classes=4, dim=8, depth=2, ffn_dim=16, **kwargs)


def loaders(n_train=120, n_val=50, batch=12):
    train_set, val_set = quadrant_images(n_train, 0), quadrant_images(n_val, 1)
    norm = Normalize(train_set.mean, train_set.std)
    return (DataLoader(train_set, batch, shuffle=True, rng=0, transform=norm),
            DataLoader(val_set, 16, transform=norm))


def optimizer(model, lr=1e-2):
    return AdamW(param_groups(model, 0.0), lr=lr)


# ---------------------------------------------------------------------- fit
def test_fit_lowers_the_loss_and_records_every_field(capsys):
    train_loader, val_loader = loaders()
    model = tiny_mixer()
    opt = optimizer(model)
    sched = WarmupLinear(opt, warmup_steps=5, total_steps=4 * len(train_loader))
    history = fit(model, opt, train_loader, val_loader, epochs=4, scheduler=sched, clip=1.0, progress=False)

    assert isinstance(history, History) and len(history) == 4
    assert history.epoch == [1, 2, 3, 4]
    assert history.steps == [10, 20, 30, 40]
    assert history.train_loss[0] == pytest.approx(math.log(4), abs=0.1)    # zero head: starts at ln K
    assert history.train_loss[-1] < 0.7 * history.train_loss[0]
    assert history.val_loss[-1] < history.val_loss[0]
    assert history.val_acc[-1] > 0.5
    for name in ("train_loss", "train_acc", "val_loss", "val_acc", "lr", "epoch_time", "images_per_sec"):
        values = getattr(history, name)
        assert len(values) == 4 and all(isinstance(v, float) and math.isfinite(v) for v in values), name
    assert all(0 <= a <= 1 for a in history.train_acc + history.val_acc)
    assert all(t > 0 for t in history.epoch_time) and all(s > 0 for s in history.images_per_sec)
    assert history.lr[0] > history.lr[-1] > 0                              # linear decay, last step
    assert sched.step_count == 40
    assert model.training                                                  # evaluate restored train mode
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""                       # progress=False: silent


def test_fit_without_validation_and_with_limit_batches():
    train_loader, _ = loaders()
    model = tiny_mixer()
    history = fit(model, optimizer(model), train_loader, epochs=2, limit_batches=3, progress=False)
    assert history.steps == [3, 6]
    assert history.val_loss == [None, None] and history.val_acc == [None, None]
    assert "val" not in format_epoch(history)


def test_fit_takes_plain_array_batches_and_refuses_a_model_elsewhere():
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(6, 3, 8, 8)).astype(np.float32), np.arange(6) % 4) for _ in range(3)]
    model = tiny_mixer()
    history = fit(model, optimizer(model), batches, epochs=1, progress=False)   # a list: no len() needed
    assert history.steps == [3]
    with pytest.raises(ValueError, match=r"model.to\('cuda'\)"):
        fit(model, optimizer(model), batches, device="cuda", progress=False)


def test_progress_bars_show_epochs_loss_accuracy_and_lr(capsys):
    train_loader, val_loader = loaders(n_train=48)
    model = tiny_mixer()
    fit(model, optimizer(model), train_loader, val_loader, epochs=1, progress=True, sync_every=2)
    captured = capsys.readouterr()
    err = captured.err                                                      # the bars go to stderr
    assert "epochs" in err and "epoch 1/1" in err
    assert "loss=" in err and "acc=" in err and "lr=" in err
    assert captured.out.startswith("epoch 1/1: train loss")                # the epoch's line: stdout


def test_progress_none_means_only_on_a_terminal(capsys):
    train_loader, _ = loaders(n_train=24)
    model = tiny_mixer()
    fit(model, optimizer(model), train_loader, epochs=1)                    # pytest's stderr: no tty
    assert capsys.readouterr().err == ""


def test_resuming_appends_to_the_history_and_calls_back():
    train_loader, val_loader = loaders(n_train=36)
    model = tiny_mixer()
    opt = optimizer(model)
    seen = []
    history = fit(model, opt, train_loader, val_loader, epochs=2, progress=False,
                  callbacks=[lambda epoch, h: seen.append((epoch, len(h)))])
    assert seen == [(1, 1), (2, 2)]
    restored = History.from_dict(json.loads(json.dumps(history.to_dict())))
    history = fit(model, opt, train_loader, val_loader, epochs=4, start_epoch=2, history=restored,
                  progress=False, callbacks=[lambda epoch, h: seen.append((epoch, len(h)))])
    assert seen[2:] == [(3, 3), (4, 4)]
    assert history is restored and history.epoch == [1, 2, 3, 4] and history.steps == [3, 6, 9, 12]
    # nothing left to do: no epoch runs
    assert len(fit(model, opt, train_loader, epochs=4, start_epoch=4, history=history, progress=False)) == 4


def test_a_nan_loss_stops_training_with_a_clear_error():
    train_loader, _ = loaders(n_train=48)
    model = tiny_mixer()

    def poisoned(logits, target):
        return F.cross_entropy(logits, target) * float("nan")

    with pytest.raises(FloatingPointError, match="loss became nan.*epoch 1"):
        fit(model, optimizer(model), train_loader, epochs=1, loss_fn=poisoned, progress=False)


@pytest.mark.parametrize("sync_every,expected", [(4, 3), (1, 12), (100, 1)])
def test_metrics_reach_the_host_only_every_few_batches(monkeypatch, sync_every, expected):
    """11 batches with a read every 4: after batches 4 and 8, and at the end of the epoch."""
    calls = []
    real = train._to_host
    monkeypatch.setattr(train, "_to_host", lambda *a: calls.append(len(a)) or real(*a))

    def no_item(self):
        raise AssertionError("the training loop called Tensor.item() (a host sync)")

    monkeypatch.setattr(Tensor, "item", no_item)
    real_clip = train.clip_grad_norm

    def clip_on_device(params, max_norm, sync=True):
        assert sync is False, "clipping inside the loop must not read the norm back to the host"
        return real_clip(params, max_norm, sync=sync)

    monkeypatch.setattr(train, "clip_grad_norm", clip_on_device)
    train_loader, val_loader = loaders(n_train=132)                         # 11 batches of 12
    model = tiny_mixer()
    history = fit(model, optimizer(model), train_loader, epochs=1, progress=True, sync_every=sync_every,
                  clip=1.0)
    assert len(calls) == expected and set(calls) == {2}                     # loss and accuracy together
    assert math.isfinite(history.train_loss[0])
    calls.clear()
    evaluate(model, val_loader)                                             # 4 batches, one read
    assert len(calls) == 1


# ---------------------------------------------------------------------- evaluate
def _reference(model, dataset, norm):
    """Loss and accuracy over the whole set in one forward pass, with a NumPy log-softmax."""
    x, y = DataLoader(dataset, len(dataset), transform=norm).__iter__().__next__()
    logits = model(x).data.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    labels = y.data
    return -log_p[np.arange(len(labels)), labels].mean(), (logits.argmax(axis=1) == labels).mean()


def test_evaluate_equals_the_mean_over_all_images():
    dataset = quadrant_images(30, 3)
    norm = Normalize(dataset.mean, dataset.std)
    model = tiny_mixer(seed=4)
    rng = np.random.default_rng(5)
    for p in model.parameters():                                            # non-trivial predictions
        p.data[...] = rng.normal(scale=0.5, size=p.shape)
    expected_loss, expected_acc = _reference(model, dataset, norm)
    assert 0 < expected_acc < 1
    model.train()
    loss, acc = evaluate(model, DataLoader(dataset, 7, transform=norm))     # batches 7,7,7,7,2: weighted
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert acc == pytest.approx(expected_acc, abs=1e-12)
    assert model.training and all(p.grad is None for p in model.parameters())

    loss2, acc2 = evaluate(model, DataLoader(dataset, 7, transform=norm), limit_batches=2)
    sub = ImageDataset(dataset.images[:14], dataset.labels[:14], dataset.classes, dataset.mean, dataset.std)
    assert (loss2, acc2) == pytest.approx(_reference(model, sub, norm), rel=1e-5)


def test_evaluate_builds_no_graph_and_uses_eval_mode():
    class Probe(tinymlp.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = tiny_mixer()
            self.seen = []

        def forward(self, x):
            self.seen.append((tinymlp.is_grad_enabled(), self.training))
            return self.inner(x)

    model = Probe()
    evaluate(model, loaders()[1])
    assert model.seen and set(model.seen) == {(False, False)}


def test_soft_targets_count_their_most_probable_class():
    dataset = quadrant_images(24, 6)
    norm = Normalize(dataset.mean, dataset.std)

    def soften(images, labels, rng):                                        # 0.7 on the class, 0.1 elsewhere
        soft = np.full((len(labels), 4), 0.1, dtype=np.float32)
        soft[np.arange(len(labels)), labels] = 0.7
        return norm(images, labels, rng)[0], soft

    model = tiny_mixer(seed=1)
    rng = np.random.default_rng(2)
    for p in model.parameters():
        p.data[...] = rng.normal(scale=0.5, size=p.shape)
    _, hard_acc = evaluate(model, DataLoader(dataset, 8, transform=norm))
    soft_loss, soft_acc = evaluate(model, DataLoader(dataset, 8, transform=soften))
    assert soft_acc == pytest.approx(hard_acc) and math.isfinite(soft_loss)


# ---------------------------------------------------------------------- History
def test_history_round_trips_through_json():
    h = History()
    h.append(epoch=1, train_loss=np.float32(2.0), train_acc=0.25, val_loss=None, val_acc=None, lr=1e-3,
             epoch_time=1.5, images_per_sec=np.float64(100.0), steps=np.int64(10))
    h.append(epoch=2, train_loss=1.0, train_acc=0.5, val_loss=1.1, val_acc=0.45, lr=5e-4,
             epoch_time=1.4, images_per_sec=110.0, steps=20)
    d = json.loads(json.dumps(h.to_dict()))
    assert History.from_dict(d) == h
    assert d["train_loss"] == [2.0, 1.0] and d["val_acc"] == [None, 0.45] and d["steps"] == [10, 20]
    assert h.last()["epoch"] == 2
    assert "epoch 2/5: train loss 1.0000 acc 50.00% | val loss 1.1000 acc 45.00%" in format_epoch(h, 5)
    with pytest.raises(ValueError, match="missing fields"):
        History.from_dict({"epoch": [1]})
    with pytest.raises(ValueError, match="different lengths"):
        History.from_dict({**d, "lr": [1e-3]})
    with pytest.raises(ValueError, match="exactly the fields"):
        h.append(epoch=3)
    with pytest.raises(IndexError):
        History().last()


# ---------------------------------------------------------------------- plots
def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def _no_open_pyplot_figures():
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    return plt is None or not plt.get_fignums()


def test_training_curves_png(tmp_path):
    h = History()
    for e in range(1, 4):
        h.append(epoch=e, train_loss=2.0 / e, train_acc=0.2 * e, val_loss=2.1 / e, val_acc=0.18 * e,
                 lr=1e-3, epoch_time=1.0, images_per_sec=10.0, steps=5 * e)
    fig = plot.training_curves(h, tmp_path / "curves.png", title="t")
    assert _is_png(tmp_path / "curves.png")
    loss_ax, acc_ax = fig.axes
    assert [len(line.get_xdata()) for line in loss_ax.lines] == [3, 3]     # train and validation
    assert acc_ax.lines[1].get_ydata()[-1] == pytest.approx(54.0)          # accuracy in percent
    plot.training_curves(h.to_dict(), tmp_path / "sub" / "again.png")      # a dict; folders created
    assert _is_png(tmp_path / "sub" / "again.png") and _no_open_pyplot_figures()


def test_token_mixing_weights_png(tmp_path):
    model = tiny_mixer(image_size=16)                                       # 4x4 grid, 8 hidden units
    fig = plot.token_mixing_weights(model, tmp_path / "tm.png")
    assert _is_png(tmp_path / "tm.png")
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (3 * 5 - 1, 3 * 5 - 1)                           # 8 tiles of 4x4, 3 columns, 1px gaps
    w = model.blocks[0].token_mlp.fc1.weight.data                           # (16 tokens, 8 units)
    unit5 = w[:, 5].reshape(4, 4)
    np.testing.assert_allclose(image[5:9, 10:14], unit5 / np.abs(unit5).max(), rtol=1e-6)
    plot.token_mixing_weights(w, tmp_path / "raw.png", max_units=4)        # the weight alone
    assert _is_png(tmp_path / "raw.png") and _no_open_pyplot_figures()


@pytest.mark.parametrize("kwargs", [{}, {"toeplitz": "2d"}, {"attn_dim": 4, "toeplitz": "1d"}])
def test_spatial_weights_png(tmp_path, kwargs):
    model = tiny_gmlp(**kwargs)
    rng = np.random.default_rng(0)
    for block in model.blocks:                                              # make the weights visible
        for name, p in block.sgu.named_parameters():
            if "weight" in name and "norm" not in name:
                p.data[...] = rng.normal(size=p.shape)
    fig = plot.spatial_weights(model, tmp_path / "sw.png")
    assert _is_png(tmp_path / "sw.png")
    assert len(fig.axes) == 4                                               # 2 blocks x (matrix, centre row)
    w1 = model.blocks[1].sgu.spatial_weight().data
    np.testing.assert_allclose(fig.axes[1].images[0].get_array(), w1, rtol=1e-6)
    centre = 2 * 4 + 2
    np.testing.assert_allclose(fig.axes[3].images[0].get_array(), w1[centre].reshape(4, 4), rtol=1e-6)
    assert _no_open_pyplot_figures()


def test_spatial_weights_of_arrays_and_wrong_models(tmp_path):
    fig = plot.spatial_weights(np.eye(6), tmp_path / "eye.png")             # 6 tokens: no square grid
    assert _is_png(tmp_path / "eye.png") and len(fig.axes) == 1
    plot.spatial_weights(np.zeros((3, 9, 9)), tmp_path / "stack.png")       # 3 blocks on a 3x3 grid
    assert _is_png(tmp_path / "stack.png")
    with pytest.raises(TypeError, match="token_mixing_weights"):
        plot.spatial_weights(tiny_mixer())


# ---------------------------------------------------------------------- learning
@pytest.mark.slow
def test_cifar_mixer_configuration_learns_the_synthetic_set():
    """The mixer_cifar preset's layout (32x32 images, 4x4 patches, 64 tokens, D_S = C, D_C = 4C)
    at reduced width and depth (C = 64, 2 blocks instead of 256 and 8) to fit a CPU budget of
    about 10 seconds, trained with the examples' recipe (AdamW, warmup then linear decay, clip 1).
    It reaches about 0.77 on seeds 0-2 (chance: 0.1); the task needs token mixing (the class is
    where two markers sit relative to each other)."""
    train_set, test_set = SyntheticImages(3000, seed=0), SyntheticImages(500, seed=0, train=False)
    norm = Normalize(train_set.mean, train_set.std)
    train_loader = DataLoader(train_set, 50, shuffle=True, drop_last=True, rng=0, transform=norm)
    model = create("mixer_cifar", dim=64, depth=2, token_mlp_dim=64, channel_mlp_dim=256)
    epochs = 5
    opt = AdamW(param_groups(model, 0.05), lr=3e-3)
    sched = WarmupLinear(opt, warmup_steps=len(train_loader) // 2, total_steps=epochs * len(train_loader))
    history = fit(model, opt, train_loader, epochs=epochs, scheduler=sched, clip=1.0, progress=False)
    _, accuracy = evaluate(model, DataLoader(test_set, 250, transform=norm))
    assert accuracy > 0.5, (accuracy, history.to_dict())


def test_a_nan_validation_loss_is_warned_about():
    train_loader, val_loader = loaders(n_train=24, n_val=16)
    poisoned = DataLoader(val_loader.dataset, 16, transform=lambda x, y, rng: (x * np.float32("nan"), y))
    model = tiny_mixer()
    with pytest.warns(RuntimeWarning, match=r"epoch 1: the val loss is nan while the training loss is"):
        history = fit(model, optimizer(model), train_loader, poisoned, epochs=1, progress=False)
    assert math.isnan(history.val_loss[-1])
