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


# ---------------------------------------------------------------------- loads are all or nothing
@pytest.mark.parametrize("bad,words", [
    (lambda v: v.astype(np.int8), r"holds integers \(int8\)"),
    (lambda v: v > 0, "holds booleans"),
    (lambda v: v.astype(np.complex64), "complex"),
    (lambda v: np.where(np.arange(v.size).reshape(v.shape) == 1, np.nan, v), "1 NaN or infinite value"),
    (lambda v: np.full(v.shape, 1e300), "beyond the largest float32"),
])
def test_a_bad_value_in_the_middle_leaves_the_model_untouched(bad, words):
    model = Tiny(seed=0)
    before = params_of(model)
    state = Tiny(seed=1).state_dict()
    names = list(state)
    middle = names[len(names) // 2]            # earlier keys would be copied first by a naive loop
    state[middle] = bad(state[middle])
    with pytest.raises(StateDictError, match=words) as info:
        model.load_state_dict(state)
    assert info.value.invalid[0][0] == middle and middle in str(info.value)
    for k, v in params_of(model).items():
        assert np.array_equal(v, before[k]), k


def test_float16_and_float64_values_are_cast_to_the_parameters_dtype():
    model, other = Tiny(seed=0), Tiny(seed=1)
    state = {k: v.astype(np.float16 if i % 2 else np.float64) for i, (k, v) in enumerate(other.state_dict().items())}
    model.load_state_dict(state)
    for k, v in params_of(model).items():
        assert v.dtype == np.float32 and np.array_equal(v, state[k].astype(np.float32)), k


def _rewrite(path, change):
    """Rewrite a checkpoint's header with ``change(header)``: a crafted or damaged file."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    header = json.loads(arrays["__header__"].tobytes().decode("utf-8"))
    change(header, arrays)
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _trained_run(tmp_path):
    model, opt, sched = make_run()
    train(model, opt, sched, np.random.default_rng(0), 2)
    path = tmp_path / "ckpt.npz"
    save(path, model, opt, sched, epoch=1)
    return path


def _set_lr(header, arrays):
    header["optim"]["param_groups"][0]["lr"] = float("nan")


def _set_beta(header, arrays):
    header["optim"]["param_groups"][1]["betas"] = [0.9, 1.5]


def _set_step(header, arrays):
    header["optim"]["state"]["0"]["step"] = -3


def _set_moment(header, arrays):
    name = header["optim"]["state"]["0"]["exp_avg_sq"]["__array__"]
    arrays[name] = -np.abs(arrays[name]) - 1


def _set_unknown(header, arrays):
    header["optim"]["param_groups"][0]["momentum_typo"] = 0.9


def _set_total(header, arrays):
    header["sched"]["total_steps"] = 0


def _set_warmup(header, arrays):
    header["sched"]["warmup_steps"] = "many"


def _set_weight(header, arrays):
    arrays["model/head.weight"] = arrays["model/head.weight"].astype(np.int8)


@pytest.mark.parametrize("change,words", [
    (_set_lr, "lr=nan is not a finite number"), (_set_beta, r"betas\[1\]=1.5 is out of range"),
    (_set_step, "step -3 is not an integer >= 0"), (_set_moment, "negative entries"),
    (_set_unknown, "'momentum_typo' .not a hyperparameter of AdamW"),
    (_set_total, "total_steps=0 is out of range"), (_set_warmup, "warmup_steps='many' is not an integer"),
    (_set_weight, "head.weight: holds integers"),
])
def test_a_damaged_optimizer_schedule_or_weight_changes_nothing(tmp_path, change, words):
    path = _trained_run(tmp_path)
    _rewrite(path, change)
    model, opt, sched = make_run(seed=5)
    before = params_of(model), opt.state_dict(), sched.state_dict(), [dict(g) for g in opt.param_groups]
    with pytest.raises(CheckpointError, match=words) as info:
        load(path, model, opt, sched)
    assert str(path) in str(info.value)
    after = params_of(model), opt.state_dict(), sched.state_dict(), [dict(g) for g in opt.param_groups]
    for k in before[0]:
        assert np.array_equal(before[0][k], after[0][k])
    assert before[1]["state"] == after[1]["state"] == {} and before[2] == after[2] and before[3] == after[3]


def test_a_crafted_generator_name_is_never_called(tmp_path):
    path = tmp_path / "ckpt.npz"
    model, opt, sched = make_run()
    save(path, model, rng=np.random.default_rng(0))

    def craft(header, arrays):
        header["meta"]["rng"]["__generator__"]["bit_generator"] = "seed"   # np.random.seed: a callable
    _rewrite(path, craft)
    state = np.random.get_state()[1].copy()
    with pytest.raises(CheckpointError, match="not the state of a NumPy bit generator"):
        read_meta(path)
    assert np.array_equal(np.random.get_state()[1], state)


# ---------------------------------------------------------------------- dropout's generator
class DropTiny(Tiny):
    def __init__(self, seed=0):
        super().__init__(seed=seed)
        self.drop = tinymlp.nn.Dropout(0.1, rng=np.random.default_rng(seed + 100))

    def forward(self, x):
        return self.head(self.drop(self.body(x).tanh()))


def test_resume_with_dropout_is_exact(tmp_path):
    def run(seed=0):
        model = DropTiny(seed)
        opt = AdamW(param_groups(model, weight_decay=0.1), lr=0.05)
        return model, opt, WarmupLinear(opt, warmup_steps=2, total_steps=6)

    model, opt, sched = run()
    straight = train(model, opt, sched, np.random.default_rng(123), 4)
    expected = params_of(model)

    model, opt, sched = run()
    data_rng = np.random.default_rng(123)
    first = train(model, opt, sched, data_rng, 2)
    save(tmp_path / "ckpt.npz", model, opt, sched, rng=data_rng)
    model, opt, sched = run(seed=7)               # a fresh process: another dropout generator
    meta = load(tmp_path / "ckpt.npz", model, opt, sched)
    second = train(model, opt, sched, meta["rng"], 2)
    assert first + second == straight
    for k, v in params_of(model).items():
        assert np.array_equal(v, expected[k]), k


def test_save_onto_a_folder_or_a_read_only_checkpoint_says_so_and_leaves_it(tmp_path):
    import stat

    from tinymlp.checkpoint import save
    from tinymlp.nn import Linear

    model = Linear(2, 2)
    (tmp_path / "run").mkdir()
    with pytest.raises(IsADirectoryError, match="checkpoint.save: .*is a folder"):
        save(tmp_path / "run", model)
    target = tmp_path / "ckpt.npz"
    save(target, model)
    before = target.read_bytes()
    target.chmod(stat.S_IRUSR)
    model.weight.data[...] = 7.0
    with pytest.raises(PermissionError, match="read-only"):
        save(target, model)
    assert target.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
