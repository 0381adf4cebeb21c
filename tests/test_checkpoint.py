"""Tests of tinymlp.checkpoint: exact resume, atomic saves, clear mismatch errors, no pickle."""

import dataclasses
import json
import os

import numpy as np
import pytest

import tinymlp
from tinymlp import checkpoint
from tinymlp.checkpoint import CheckpointError, generator_state, load, read_meta, restore_generator, save
from tinymlp.nn import Module, Parameter, StateDictError
from tinymlp.optim import SGD, AdamW, WarmupLinear, clip_grad_norm, param_groups


class Affine(Module):
    def __init__(self, d_in, d_out, rng):
        super().__init__()
        self.weight = Parameter(rng.standard_normal((d_in, d_out)) / np.sqrt(d_in))
        self.bias = Parameter(np.zeros(d_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class Tiny(Module):
    """A two-layer net from primitive ops only: tanh(x W1 + b1) W2 + b2."""

    def __init__(self, d_in=4, hidden=8, d_out=3, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.body = Affine(d_in, hidden, rng)
        self.head = Affine(hidden, d_out, rng)

    def forward(self, x):
        return self.head(self.body(x).tanh())


def make_run(seed=0):
    model = Tiny(seed=seed)
    opt = AdamW(param_groups(model, weight_decay=0.1), lr=0.05)
    sched = WarmupLinear(opt, warmup_steps=2, total_steps=6)
    return model, opt, sched


def train(model, opt, sched, data_rng, steps):
    losses = []
    for _ in range(steps):
        x = data_rng.standard_normal((16, 4)).astype(np.float32)
        y = data_rng.standard_normal((16, 3)).astype(np.float32)
        diff = model(x) - y
        loss = (diff * diff).mean()
        opt.zero_grad()
        loss.backward()
        clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def params_of(model):
    return {k: v.copy() for k, v in model.state_dict().items()}


def test_resume_is_exact(tmp_path):
    model, opt, sched = make_run()
    straight = train(model, opt, sched, np.random.default_rng(123), 4)
    expected = params_of(model)

    model, opt, sched = make_run()
    data_rng = np.random.default_rng(123)
    first = train(model, opt, sched, data_rng, 2)
    path = tmp_path / "ckpt.npz"
    save(path, model, opt, sched, epoch=0, step=2, rng=data_rng, config={"hidden": 8})

    model, opt, sched = make_run(seed=7)  # fresh objects, different initial weights
    meta = load(path, model, opt, sched)
    assert meta["step"] == 2 and meta["config"] == {"hidden": 8} and sched.step_count == 2
    second = train(model, opt, sched, meta["rng"], 2)

    assert first + second == straight  # bitwise equal losses
    for k, v in params_of(model).items():
        assert np.array_equal(v, expected[k]), k
        assert v.dtype == np.float32


def test_file_is_plain_npz_without_pickle(tmp_path):
    model, opt, sched = make_run()
    train(model, opt, sched, np.random.default_rng(0), 1)
    path = tmp_path / "ckpt.npz"
    save(path, model, opt, sched, epoch=1)
    with np.load(path, allow_pickle=False) as npz:
        contents = {k: npz[k] for k in npz.files}  # every entry reads without pickle
    assert {"model/body.weight", "model/body.bias", "model/head.weight", "model/head.bias"} <= set(contents)
    assert "optim/state/0/exp_avg" in contents and all(a.dtype != object for a in contents.values())
    header = json.loads(contents["__header__"].tobytes())
    assert header["meta"] == {"epoch": 1} and header["model"] == "Tiny"
    np.testing.assert_array_equal(contents["model/head.weight"], model.head.weight.data)


@dataclasses.dataclass
class Config:
    depth: int = 2
    name: str = "tiny"


def test_metadata_round_trip(tmp_path):
    pcg = np.random.default_rng(5)
    pcg.standard_normal(3)
    mt = np.random.Generator(np.random.MT19937(9))
    meta = dict(epoch=3, lr=np.float32(0.5), config=Config(), shape=(2, 3), note=None,
                table=np.arange(6).reshape(2, 3), rng=pcg, mt=mt, nested={"a": [1, {"b": 2.5}]})
    path = tmp_path / "m.npz"
    save(path, Tiny(), **meta)
    got = read_meta(path)
    assert got["epoch"] == 3 and got["lr"] == 0.5 and got["note"] is None
    assert got["config"] == {"depth": 2, "name": "tiny"} and got["shape"] == [2, 3]
    assert got["nested"] == {"a": [1, {"b": 2.5}]}
    np.testing.assert_array_equal(got["table"], np.arange(6).reshape(2, 3))
    for name in ("rng", "mt"):  # the generators continue where the saved ones were
        assert np.array_equal(got[name].standard_normal(4), meta[name].standard_normal(4))


def test_generator_helpers():
    mt = np.random.Generator(np.random.MT19937(9))
    state = json.loads(json.dumps(generator_state(mt)))  # survives JSON
    other = np.random.Generator(np.random.MT19937(0))
    assert restore_generator(state, other) is other
    assert np.array_equal(other.integers(0, 1000, 5), mt.integers(0, 1000, 5))
    fresh = restore_generator(generator_state(np.random.default_rng(1)))
    assert np.array_equal(fresh.random(3), np.random.default_rng(1).random(3))


def test_crash_during_save_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.npz"
    model = Tiny()
    save(path, model, step=1)
    old = params_of(model)
    model.head.weight.data += 1.0

    def killed_midway(file, *args, **kwargs):
        file.write(b"PK\x03\x04" + b"\0" * 1000)  # half a zip file...
        raise KeyboardInterrupt("killed during save")  # ...then the process dies

    monkeypatch.setattr(checkpoint.np, "savez", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        save(path, model, step=2)
    monkeypatch.undo()

    assert os.listdir(tmp_path) == ["ckpt.npz"]  # no stray temporary file
    fresh = Tiny(seed=3)
    assert load(path, fresh) == {"step": 1}
    for k, v in params_of(fresh).items():
        assert np.array_equal(v, old[k])


def test_unsavable_metadata_is_refused_before_writing(tmp_path):
    path = tmp_path / "ckpt.npz"
    with pytest.raises(TypeError, match="meta/callback of type function"):
        save(path, Tiny(), callback=lambda: None)
    assert os.listdir(tmp_path) == []


class Wider(Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.body = Affine(4, 6, rng)  # 6 hidden units instead of 8
        self.head = Affine(6, 3, rng)
        self.extra = Affine(3, 3, rng)
        del self.body.bias


def test_loading_a_different_architecture_lists_the_mismatches(tmp_path):
    path = tmp_path / "ckpt.npz"
    save(path, Tiny())
    model = Wider()
    before = params_of(model)
    with pytest.raises(CheckpointError) as info:
        load(path, model)
    msg = str(info.value)
    assert "saved from Tiny" in msg and "does not fit this Wider" in msg
    assert "missing keys" in msg and "extra.weight" in msg and "extra.bias" in msg
    assert "unexpected keys" in msg and "body.bias" in msg
    assert "body.weight: checkpoint (4, 8), model (4, 6)" in msg
    assert "head.weight: checkpoint (8, 3), model (6, 3)" in msg
    assert set(info.value.missing) == {"extra.weight", "extra.bias"}
    assert isinstance(info.value, StateDictError)  # the error of Module.load_state_dict, too
    assert ("head.weight", (6, 3), (8, 3)) in info.value.mismatched
    for k, v in params_of(model).items():
        assert np.array_equal(v, before[k])  # nothing was loaded


def test_optimizer_mismatches(tmp_path):
    model, opt, sched = make_run()
    train(model, opt, sched, np.random.default_rng(0), 1)
    plain, full = tmp_path / "plain.npz", tmp_path / "full.npz"
    save(plain, model)
    save(full, model, opt, sched)

    fresh, opt2, sched2 = make_run(seed=1)
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load(plain, fresh, opt2)

    before = params_of(fresh)
    sgd = SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError, match="saved from AdamW"):
        load(full, fresh, sgd)
    for k, v in params_of(fresh).items():
        assert np.array_equal(v, before[k])  # checked before anything was changed

    with pytest.raises(CheckpointError, match="not a tinymlp checkpoint"):
        np.savez(tmp_path / "other.npz", a=np.zeros(2))
        load(tmp_path / "other.npz", fresh)


def test_save_on_device_load_on_cpu(tmp_path, device):
    model, opt, sched = make_run()
    model.to(device)
    opt = AdamW(model.parameters(), lr=0.01)
    out = model(tinymlp.tensor(np.ones((2, 4)), device=device))
    (out * out).mean().backward()
    opt.step()
    save(tmp_path / "c.npz", model, opt)
    cpu_model = Tiny(seed=4)
    cpu_opt = AdamW(cpu_model.parameters(), lr=0.01)
    load(tmp_path / "c.npz", cpu_model, cpu_opt)
    for (k, a), (_, b) in zip(model.state_dict().items(), cpu_model.state_dict().items()):
        assert np.array_equal(a, b), k
