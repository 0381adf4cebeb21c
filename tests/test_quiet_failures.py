"""Failures that must never be quiet or raw, each kind closed as a class, each with one sentence:

- counts given as floats or booleans (a batch size of 2.9) are refused, not truncated;
- arguments outside their range (a probability of 1.5, a negative pad) are refused;
- loaders that give no batches are refused, not trained on into a NaN history;
- token ids outside the vocabulary are refused by ``decode``, not read from its end;
- an emoji sequence is one symbol for the tokenizer;
- an ``.npz`` array whose header declares more bytes than the file holds, or Python objects,
  is named with its file (no raw MemoryError, no "truncated" for an object array);
- weight files of a wrong layout are one InteropError naming the file and the array;
- the engine's side: a tensor made from tensors that require grad, ``float(t)``, an integer
  too large for int64, ``no_grad`` as a bare decorator and on a generator, fractional step
  counts in a schedule, an index or class ids changed in place before backward.
"""

import io
import zipfile

import numpy as np
import pytest

import tinymlp
from tinymlp import checkpoint, interop, models, optim
from tinymlp.checkpoint import CheckpointError
from tinymlp.data import (
    CutMix, DataLoader, DatasetError, HorizontalFlip, ImageDataset, MaskedLMLoader, Mixup, OrderTask, RandomCrop,
    Resize, SyntheticImages, TokenDataset, TokenLoader, Tokenizer, load_npz,
)
from tinymlp.data.tokenizer import split_words
from tinymlp.interop import InteropError
from tinymlp.train import evaluate, fit


def tiny_images(n=8):
    rng = np.random.default_rng(0)
    return ImageDataset(rng.integers(0, 255, (n, 3, 8, 8), dtype=np.uint8), np.arange(n) % 2, ("a", "b"))


def tiny_model():
    return models.create("mixer_cifar", image_size=8, patch_size=4, num_classes=2, dim=8, depth=1,
                         token_mlp_dim=4, channel_mlp_dim=8)


# ---------------------------------------------------------------------- counts are whole numbers
@pytest.mark.parametrize("make", [
    lambda: DataLoader(tiny_images(), 2.9),
    lambda: DataLoader(tiny_images(), True),
    lambda: DataLoader(tiny_images(), 3.0),
    lambda: TokenLoader(TokenDataset(np.zeros((4, 5)), np.zeros(4), ("a", "b")), 1.5),
    lambda: SyntheticImages(2.7),
    lambda: SyntheticImages(False),
    lambda: RandomCrop(2.5),
    lambda: Resize(7.5),
    lambda: OrderTask(10.5),
    lambda: Tokenizer.train(["a b"], vocab_size=20.5),
    lambda: Tokenizer.train(["a b"], vocab_size=50).encode("a", max_len=8.0),
    lambda: fit(tiny_model(), optim.SGD(tiny_model().parameters(), lr=0.1), DataLoader(tiny_images(), 4), epochs=1.5),
    lambda: evaluate(tiny_model(), DataLoader(tiny_images(), 4), limit_batches=True),
], ids=["loader-float", "loader-bool", "loader-whole-float", "tokens", "synthetic-float", "synthetic-bool", "crop",
        "resize", "order-task", "vocab", "max-len", "fit-epochs", "evaluate-limit"])
def test_a_count_given_as_a_float_or_a_boolean_is_refused(make):
    with pytest.raises(TypeError, match="must be a whole number"):
        make()


# ---------------------------------------------------------------------- arguments in their range
@pytest.mark.parametrize("make,words", [
    (lambda: MaskedLMLoader(TokenDataset(np.zeros((4, 5)), np.zeros(4), ()), 2, mask_prob=1.5),
     "mask_prob must be in (0, 1]"),
    (lambda: MaskedLMLoader(TokenDataset(np.zeros((4, 5)), np.zeros(4), ()), 2, mask_prob=0),
     "mask_prob must be in (0, 1]"),
    (lambda: HorizontalFlip(p=-0.1), "p must be in [0, 1]"),
    (lambda: Mixup(0, 10), "alpha must be in (0, inf)"),
    (lambda: CutMix(-1, 10), "alpha must be in (0, inf)"),
    (lambda: RandomCrop(-1), "pad must be at least 0"),
    (lambda: SyntheticImages(10, noise=2.0), "noise must be in [0, 1]"),
    (lambda: DataLoader(tiny_images(), 0), "batch_size must be at least 1"),
    (lambda: fit(tiny_model(), optim.SGD(tiny_model().parameters(), lr=0.1), DataLoader(tiny_images(), 4), clip=-1),
     "clip (the largest gradient norm) must be in [0, inf)"),
], ids=["mask-high", "mask-zero", "flip", "mixup", "cutmix", "pad", "noise", "batch", "clip"])
def test_an_argument_outside_its_range_is_refused(make, words):
    with pytest.raises(ValueError) as err:
        make()
    assert words in str(err.value)


# ---------------------------------------------------------------------- empty loaders
def test_a_loader_without_batches_is_refused_before_training_and_no_callback_runs():
    model = tiny_model()
    opt = optim.SGD(model.parameters(), lr=0.1)
    ran = []
    empty = DataLoader(tiny_images(3), 4, drop_last=True)
    with pytest.raises(ValueError, match=r"train_loader gives no batches \(3 examples, batch_size 4 and drop_last"):
        fit(model, opt, empty, epochs=2, callbacks=[lambda *a: ran.append(a)])
    with pytest.raises(ValueError, match="val_loader gives no batches"):
        fit(model, opt, DataLoader(tiny_images(), 4), DataLoader(tiny_images(3), 4, drop_last=True), epochs=1,
            callbacks=[lambda *a: ran.append(a)])
    with pytest.raises(ValueError, match="evaluate: loader gives no batches"):
        evaluate(model, empty)
    assert ran == []


def test_a_loader_without_len_that_gives_no_batches_is_refused_after_its_epoch():
    model = tiny_model()
    ran = []
    with pytest.raises(ValueError, match="gave no batches in epoch 1"):
        fit(model, optim.SGD(model.parameters(), lr=0.1), (b for b in ()), epochs=1,
            callbacks=[lambda *a: ran.append(a)])
    assert ran == []


# ---------------------------------------------------------------------- the tokenizer
def test_decode_refuses_ids_outside_the_vocabulary_instead_of_wrapping():
    tok = Tokenizer.train(["a film", "a movie"], vocab_size=30)
    assert tok.decode([tok.cls_id, tok.ids["a"], tok.sep_id]) == "a"
    for bad in (-1, len(tok), 10**6):
        with pytest.raises(ValueError, match=f"id {bad} is outside this tokenizer's vocabulary of {len(tok)}"):
            tok.decode([tok.ids["a"], bad])
    with pytest.raises(TypeError, match="whole numbers"):
        tok.decode([1.5])
    assert tok.decode(np.array([tok.ids["a"]])) == "a"


@pytest.mark.parametrize("text,symbol", [
    ("good 👍🏽 film", "👍🏽"),                                   # skin tone modifier
    ("we 👨‍👩‍👧 went", "👨\u200d👩\u200d👧"),                       # zero-width joiners
    ("love ❤️ it", "❤️"),                                       # variation selector
    ("from 🇫🇷 today", "🇫🇷"),                                    # a flag: two regional indicators
])
def test_an_emoji_sequence_is_one_symbol(text, symbol):
    words = split_words(text, lowercase=True)
    assert symbol in words and len(words) == 3
    tok = Tokenizer.train([text] * 3, vocab_size=60)
    assert tok.decode(tok.encode(text)[0]) == text.lower()


def test_flags_next_to_each_other_stay_two_flags():
    assert split_words("🇫🇷🇩🇪", lowercase=True) == ["🇫🇷", "🇩🇪"]


# ---------------------------------------------------------------------- npz arrays checked before loading
def forged(path, target, member, shape=(10**7, 10**6)):
    """A copy of the .npz ``path`` whose ``member`` declares ``shape`` (its bytes unchanged)."""
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(target, "w") as out:
        for name in z.namelist():
            data = z.read(name)
            if name == member + ".npy":
                header = io.BytesIO()
                np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
                data = header.getvalue() + data[len(header.getvalue()):]
            out.writestr(name, data)
    return target


def test_a_checkpoint_array_that_declares_a_huge_shape_is_named_without_allocating(tmp_path):
    model = tiny_model()
    checkpoint.save(tmp_path / "c.npz", model)
    bad = forged(tmp_path / "c.npz", tmp_path / "bad.npz", "model/head.bias")
    for read in (lambda: checkpoint.read_meta(bad), lambda: checkpoint.load(bad, model)):
        with pytest.raises(CheckpointError) as err:
            read()
        assert str(bad) in str(err.value)
        assert "'model/head.bias' declares the shape (10000000, 1000000)" in str(err.value)
        assert "damaged or truncated" in str(err.value)


def test_an_npz_of_images_that_declares_a_huge_shape_or_holds_objects_is_named(tmp_path):
    x = np.zeros((4, 8, 8, 3), np.uint8)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=np.arange(4) % 2, x_test=x, y_test=np.arange(4) % 2)
    bad = forged(tmp_path / "d.npz", tmp_path / "bad.npz", "x_test")
    with pytest.raises(DatasetError, match=r"bad.npz: the array 'x_test' declares the shape"):
        load_npz(bad)
    np.savez(tmp_path / "obj.npz", x_train=np.array([{"a": 1}], dtype=object))
    for read, error in ((load_npz, DatasetError), (interop.load_pretrained, InteropError),
                        (checkpoint.read_meta, CheckpointError)):
        with pytest.raises(error) as err:
            read(tmp_path / "obj.npz")
        assert "holds Python objects" in str(err.value) and "truncated" not in str(err.value)


# ---------------------------------------------------------------------- weight files of a wrong layout
@pytest.fixture
def mixer_weights():
    return interop.to_timm(tiny_model())


def test_a_two_dimensional_stem_weight_is_named(tmp_path, mixer_weights):
    mixer_weights["stem.proj.weight"] = mixer_weights["stem.proj.weight"].reshape(8, -1)
    np.savez(tmp_path / "w.npz", **mixer_weights)
    with pytest.raises(InteropError, match=r"w.npz: 'stem.proj.weight' has shape \(8, 48\); expected a conv kernel"):
        interop.load_pretrained(tmp_path / "w.npz")


def test_a_jax_file_missing_a_key_names_the_file_and_the_key(tmp_path):
    np.savez(tmp_path / "jax.npz", **{"stem/kernel": np.zeros((4, 4, 3, 8), np.float32)})
    with pytest.raises(InteropError, match="jax.npz: no blocks found"):
        interop.load_pretrained(tmp_path / "jax.npz", num_classes=2)
    arrays = {"stem/kernel": np.zeros((4, 4, 3, 8), np.float32),
              "MixerBlock_0/token_mixing/Dense_0/kernel": np.zeros((4, 4), np.float32)}
    np.savez(tmp_path / "jax.npz", **arrays)
    with pytest.raises(InteropError, match="jax.npz: the weights have no 'MixerBlock_0/channel_mixing/Dense_0/kernel'"):
        interop.load_pretrained(tmp_path / "jax.npz", num_classes=2)


def test_weights_of_mismatched_shapes_are_one_interop_error(tmp_path, mixer_weights):
    mixer_weights["blocks.0.mlp_channels.fc2.weight"] = np.zeros((8, 5), np.float32)
    with pytest.raises(InteropError, match="the weights do not fit one timm mixer model"):
        interop.from_timm(mixer_weights)


def test_a_truncated_safetensors_file_is_named_by_weights_source(tmp_path):
    pytest.importorskip("safetensors")
    interop.save_timm(tiny_model(), tmp_path / "w.safetensors")
    raw = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:len(raw) - 40])
    with pytest.raises(InteropError, match="cut.safetensors is truncated"):
        interop.weights_source(tmp_path / "cut.safetensors")


def test_a_training_checkpoint_is_told_apart_from_a_weights_file(tmp_path):
    checkpoint.save(tmp_path / "c.npz", tiny_model())
    assert interop.weights_source(tmp_path / "c.npz") == "checkpoint"
    with pytest.raises(InteropError, match=r"a tinymlp training checkpoint .*tinymlp.predict.load_model"):
        interop.load_pretrained(tmp_path / "c.npz")


@pytest.mark.parametrize("name", ["w.npz", "w.safetensors"])
def test_save_timm_to_a_folder_is_refused_and_leaves_nothing(tmp_path, name):
    if name.endswith("safetensors"):
        pytest.importorskip("safetensors")
    (tmp_path / name).mkdir()
    with pytest.raises(IsADirectoryError, match=f"save_timm: .*{name} is a folder"):
        interop.save_timm(tiny_model(), tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name] and not any((tmp_path / name).iterdir())


# --------------------------------------------------------------------------- the engine's side
def test_a_tensor_made_from_tensors_that_require_grad_is_refused_not_cut_off_the_graph():
    a, b = tinymlp.tensor([1.0], requires_grad=True), tinymlp.tensor([2.0], requires_grad=True)
    with pytest.raises(TypeError, match=r"cut them off the graph.*tinymlp\.stack"):
        tinymlp.tensor([a, b])
    with pytest.raises(TypeError, match="require grad"):
        tinymlp.tensor([[a], [b]])
    assert tinymlp.tensor([a.detach(), b.detach()]).shape == (2, 1)      # constants: said so


def test_float_int_and_index_of_a_one_element_tensor_and_a_clear_error_otherwise():
    assert float(tinymlp.tensor([2.5])) == 2.5 and int(tinymlp.tensor(3)) == 3
    assert list(range(tinymlp.tensor(3))) == [0, 1, 2]
    with pytest.raises(TypeError, match=r"float\(\) needs a tensor with one element, got shape \(2,\)"):
        float(tinymlp.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="only an integer tensor can be used as an index"):
        range(tinymlp.tensor(2.0))


def test_an_integer_too_large_for_int64_is_named():
    with pytest.raises(OverflowError, match="does not fit int64"):
        tinymlp.tensor(2**70)
    with pytest.raises(OverflowError, match="does not fit int64"):
        tinymlp.tensor([1, 2**70])


def test_no_grad_as_a_bare_decorator_and_on_a_generator():
    x = tinymlp.tensor([1.0], requires_grad=True)

    @tinymlp.no_grad
    def double(t):
        return t * 2

    assert double(x).requires_grad is False and tinymlp.is_grad_enabled()

    @tinymlp.no_grad()
    def steps(t):
        yield t * 2
        yield t * 3                                # resumed later: still without a graph

    assert [s.requires_grad for s in steps(x)] == [False, False] and tinymlp.is_grad_enabled()
    with pytest.raises(TypeError, match="takes no arguments"):
        tinymlp.no_grad(5)


def test_schedules_refuse_fractional_step_counts_and_negative_steps():
    from tinymlp import optim
    opt = optim.SGD([tinymlp.tensor([1.0], requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match=r"total_steps=2\.7 is not a whole number of steps"):
        optim.WarmupCosine(opt, warmup_steps=1, total_steps=2.7)
    with pytest.raises(ValueError, match="warmup_steps=True"):
        optim.WarmupLinear(opt, warmup_steps=True, total_steps=10)
    with pytest.raises(ValueError, match="step must be a step count"):
        optim.WarmupCosine(opt, 1, 10).get_lr(-3)


def test_an_index_or_class_ids_changed_in_place_before_backward_are_refused():
    """Integer arrays an op was given as they are (an index, class ids) are checked like saved inputs."""
    x = tinymlp.tensor(np.arange(6.0), requires_grad=True)
    index = np.array([0, 2, 2])
    y = x[index]
    index[:] = 5
    with pytest.raises(RuntimeError, match=r"GetItem: .*index.* was changed in place after forward"):
        y.sum().backward()
    logits = tinymlp.tensor(np.zeros((2, 3)), requires_grad=True)
    labels = np.array([0, 1])
    loss = tinymlp.functional.cross_entropy(logits, labels)
    labels[0] = 2
    with pytest.raises(RuntimeError, match="was changed in place after forward"):
        loss.backward()


# --------------------------------------------------------------------------- the last open cases
FAR = np.array([-np.inf, -1e30, -40.0, 40.0, 1e30, np.inf], np.float32)
LIMIT = np.maximum(FAR, 0)                    # GELU(x) -> 0 on the left, x on the right


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("tier", ["reference", "fast"])
@pytest.mark.parametrize("approximate", [True, False], ids=["tanh", "erf"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu_far_out_is_its_limit_not_nan(tier, approximate, dtype, device):
    from tinymlp import functional as F
    from tinymlp import fast
    from tinymlp.backend import to_device

    x = tinymlp.tensor(FAR, requires_grad=True, dtype=dtype, device=device)
    with fast.disabled() if tier == "reference" else fast.enabled():
        y = F.gelu(x, approximate=approximate)
        y.backward(tinymlp.tensor(np.ones(len(FAR)), dtype=dtype, device=device))
    np.testing.assert_array_equal(y.numpy(), LIMIT.astype(dtype))
    np.testing.assert_array_equal(to_device(x.grad, "cpu"), np.array([0, 0, 0, 1, 1, 1], dtype))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_the_fast_gelu_kernels_far_out():
    from tinymlp.fast import activation

    for kernel in (activation.gelu_tanh_into, activation._gelu_erf_into):
        y, d = np.empty_like(FAR), np.empty_like(FAR)
        kernel(FAR.copy(), y, d)
        np.testing.assert_array_equal(y, LIMIT)
        np.testing.assert_array_equal(d, [0, 0, 0, 1, 1, 1])
    numba = pytest.importorskip("numba")  # noqa: F841
    from tinymlp.fast.kernels import activation_numba

    for dtype in (np.float32, np.float64):
        x = FAR.astype(dtype)
        for want in (True, False):
            y, d = activation_numba.gelu_tanh(x, want_derivative=want)
            np.testing.assert_array_equal(y, LIMIT.astype(dtype))
            if want:
                np.testing.assert_array_equal(d, [0, 0, 0, 1, 1, 1])
        y, d = activation_numba.gelu_tanh_bias(x.reshape(2, 3), np.zeros(3, dtype))
        np.testing.assert_array_equal(y.ravel(), LIMIT.astype(dtype))


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("name,value", [("lr", float("nan")), ("lr", float("inf")), ("lr", -1.0),
                                        ("weight_decay", float("nan"))])
def test_a_hyperparameter_set_after_construction_is_checked_at_step(kind, name, value):
    model = tiny_model()
    opt = optim.SGD(model.parameters(), lr=0.1) if kind == "sgd" else optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = np.ones_like(p.data)
    before = [p.data.copy() for p in model.parameters()]
    opt.param_groups[0][name] = value
    with pytest.raises(ValueError, match=rf"\.step \(param_groups\[0\]\): {name}={value!r}"):
        opt.step()
    assert all(np.array_equal(b, p.data) for b, p in zip(before, model.parameters()))     # nothing applied


def test_tokenizer_train_and_encode_batch_refuse_one_string():
    with pytest.raises(TypeError, match=r"Tokenizer.train: texts is one string; give an iterable of texts"):
        Tokenizer.train("a fine film, a dull film", vocab_size=40)
    with pytest.raises(TypeError, match=r"Tokenizer.train: texts\[1\] is a int, not a string"):
        Tokenizer.train(["a film", 3], vocab_size=40)
    tok = Tokenizer.train(["a fine film", "a dull film"] * 3, vocab_size=40)
    with pytest.raises(TypeError, match=r"encode_batch: texts is one string"):
        tok.encode_batch("a fine film")


def test_encode_batch_without_max_len_pads_to_the_longest():
    tok = Tokenizer.train(["a fine film", "a dull film with a thin plot"] * 3, vocab_size=60)
    ids, segments = tok.encode_batch(["a film", "a dull film with a thin plot"], max_len=None)
    long_ids, _ = tok.encode("a dull film with a thin plot", max_len=None)
    short_ids, _ = tok.encode("a film", max_len=None)
    assert ids.shape == segments.shape == (2, len(long_ids)) and ids[1].tolist() == long_ids
    assert ids[0].tolist() == short_ids + [tok.pad_id] * (len(long_ids) - len(short_ids))
    assert tok.encode_batch([], max_len=None)[0].shape == (0, 0)


def test_a_tensor_made_from_a_tensor_that_requires_grad_is_refused():
    t = tinymlp.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(TypeError, match=r"tensor\(\): the data is or holds tensors that require grad.*detach"):
        tinymlp.tensor(t * 2)
    assert tinymlp.tensor(t.detach()).tolist() == [1.0, 2.0]
