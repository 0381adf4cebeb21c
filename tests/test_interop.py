"""tinymlp.interop: timm and official JAX weights in, timm-layout weights out, no pickle.

Offline and without PyTorch: the test writes its own checkpoints in timm's layout and in the
official Flax layout (names and shapes as the issue and the libraries' code state them), and
checks the converted models against plain NumPy forward passes written here in the *source's*
layout (conv stem, (out, in) Linear weights, [q | k | v] x heads), in float64. Where torch and
timm are importable, the same models are also compared with timm's own (float32 logits within
1e-5 relative; ``to_timm`` loads with ``strict=True``).
"""

import math
import pickle
import zipfile

import numpy as np
import pytest

import tinymlp
from tinymlp import interop, models
from tinymlp.data.transforms import Resize, resize
from tinymlp.interop import InteropError, PickleRefusedError

RNG = np.random.default_rng(0)
B, CIN, IMAGE, P = 2, 3, 16, 4          # 4 x 4 patches of 4 x 4 pixels: S = 16 tokens
S = (IMAGE // P) ** 2
D, DEPTH, K = 16, 2, 5


# ---------------------------------------------------------------------- reference forward passes (timm layout)
_erf = np.vectorize(math.erf)


def gelu(x, form):
    if form == "exact":
        return 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def dense(x, sd, name):                        # torch Linear: y = x W^T + b, W (out, in)
    return x @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]


def mlp(x, sd, name, form):
    return dense(gelu(dense(x, sd, f"{name}.fc1"), form), sd, f"{name}.fc2")


def conv_stem(images, w, b):                   # Conv2d(kernel = stride = P), tokens in row-major order
    n, cin, h, wd = images.shape
    c, _, p, _ = w.shape
    x = images.reshape(n, cin, h // p, p, wd // p, p)
    return (np.einsum("bchpwq,ocpq->bhwo", x, w) + b).reshape(n, -1, c)


def ref_mixer(sd, images, form="exact", eps=1e-6):
    x = conv_stem(images, sd["stem.proj.weight"], sd["stem.proj.bias"])
    for i in range(DEPTH):
        b = f"blocks.{i}."
        y = layer_norm(x, sd[b + "norm1.weight"], sd[b + "norm1.bias"], eps)
        x = x + mlp(y.transpose(0, 2, 1), sd, b + "mlp_tokens", form).transpose(0, 2, 1)
        x = x + mlp(layer_norm(x, sd[b + "norm2.weight"], sd[b + "norm2.bias"], eps), sd, b + "mlp_channels", form)
    return dense(layer_norm(x, sd["norm.weight"], sd["norm.bias"], eps).mean(1), sd, "head")


def ref_gmlp(sd, images, form="exact", eps=1e-6, gate_eps=1e-5):
    x = conv_stem(images, sd["stem.proj.weight"], sd["stem.proj.bias"])
    for i in range(DEPTH):
        b = f"blocks.{i}.mlp_channels."
        y = layer_norm(x, sd[f"blocks.{i}.norm.weight"], sd[f"blocks.{i}.norm.bias"], eps)
        z = gelu(dense(y, sd, b + "fc1"), form)
        u, v = np.split(z, 2, axis=-1)                       # u: bypass, v: gate
        v = layer_norm(v, sd[b + "gate.norm.weight"], sd[b + "gate.norm.bias"], gate_eps)
        v = np.einsum("ij,bjc->bic", sd[b + "gate.proj.weight"], v) + sd[b + "gate.proj.bias"][:, None]
        x = x + dense(u * v, sd, b + "fc2")
    return dense(layer_norm(x, sd["norm.weight"], sd["norm.bias"], eps).mean(1), sd, "head")


def ref_vit(sd, images, heads, form="exact", eps=1e-6):
    x = conv_stem(images, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"])
    n, t, c = x.shape
    x = np.concatenate([np.broadcast_to(sd["cls_token"], (n, 1, c)), x], axis=1) + sd["pos_embed"]
    d = c // heads
    for i in range(DEPTH):
        b = f"blocks.{i}."
        y = layer_norm(x, sd[b + "norm1.weight"], sd[b + "norm1.bias"], eps)
        qkv = dense(y, sd, b + "attn.qkv").reshape(n, t + 1, 3, heads, d).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        a = (p @ v).transpose(0, 2, 1, 3).reshape(n, t + 1, c)
        x = x + dense(a, sd, b + "attn.proj")
        x = x + mlp(layer_norm(x, sd[b + "norm2.weight"], sd[b + "norm2.bias"], eps), sd, b + "mlp", form)
    return dense(layer_norm(x, sd["norm.weight"], sd["norm.bias"], eps)[:, 0], sd, "head")


# ---------------------------------------------------------------------- checkpoints in timm's layout
def _rand(shape, scale=0.3, around=0.0):
    # float32-representable values: loading into a float32 model is then exact, and the model,
    # cast to float64, can be compared with the float64 reference to round-off
    return (around + scale * RNG.standard_normal(shape)).astype(np.float32).astype(np.float64)


def _norm(sd, name, dim):
    sd[f"{name}.weight"], sd[f"{name}.bias"] = _rand(dim, 0.1, 1.0), _rand(dim, 0.1)


def _linear(sd, name, d_in, d_out):
    sd[f"{name}.weight"], sd[f"{name}.bias"] = _rand((d_out, d_in), 1 / math.sqrt(d_in)), _rand(d_out, 0.1)


def timm_state(family, heads=2):
    """A random state dict with the names and shapes of timm's MlpMixer / gMLP / VisionTransformer."""
    sd = {}
    stem = "patch_embed.proj" if family == "vit" else "stem.proj"
    sd[f"{stem}.weight"], sd[f"{stem}.bias"] = _rand((D, CIN, P, P), 0.2), _rand(D, 0.1)
    if family == "vit":
        sd["cls_token"], sd["pos_embed"] = _rand((1, 1, D)), _rand((1, S + 1, D))
    for i in range(DEPTH):
        b = f"blocks.{i}."
        if family == "mixer":
            _norm(sd, b + "norm1", D)
            _linear(sd, b + "mlp_tokens.fc1", S, 8)             # D_S = 8
            _linear(sd, b + "mlp_tokens.fc2", 8, S)
            _norm(sd, b + "norm2", D)
            _linear(sd, b + "mlp_channels.fc1", D, 4 * D)
            _linear(sd, b + "mlp_channels.fc2", 4 * D, D)
        elif family == "gmlp":
            _norm(sd, b + "norm", D)
            _linear(sd, b + "mlp_channels.fc1", D, 6 * D)
            _norm(sd, b + "mlp_channels.gate.norm", 3 * D)
            _linear(sd, b + "mlp_channels.gate.proj", S, S)     # (out_token, in_token)
            _linear(sd, b + "mlp_channels.fc2", 3 * D, D)
        else:
            _norm(sd, b + "norm1", D)
            _linear(sd, b + "attn.qkv", D, 3 * D)
            _linear(sd, b + "attn.proj", D, D)
            _norm(sd, b + "norm2", D)
            _linear(sd, b + "mlp.fc1", D, 4 * D)
            _linear(sd, b + "mlp.fc2", 4 * D, D)
    _norm(sd, "norm", D)
    _linear(sd, "head", D, K)
    return sd


def reference(family, sd, images, form="exact"):
    if family == "mixer":
        return ref_mixer(sd, images, form)
    if family == "gmlp":
        return ref_gmlp(sd, images, form)
    return ref_vit(sd, images, heads=2, form=form)


def logits(model, images, dtype=np.float64):
    model.to(dtype=dtype)
    with tinymlp.no_grad():
        return model(tinymlp.Tensor(images.astype(dtype), dtype=dtype)).data


IMAGES = RNG.standard_normal((B, CIN, IMAGE, IMAGE))
FAMILIES = ["mixer", "gmlp", "vit"]
CLASSES = {"mixer": models.MLPMixer, "gmlp": models.GMLP, "vit": models.ViT}


def small_model(family, **kw):
    common = dict(image_size=IMAGE, patch_size=P, in_channels=CIN, num_classes=K, dim=D, depth=DEPTH, **kw)
    if family == "mixer":
        model = models.MLPMixer(token_mlp_dim=8, channel_mlp_dim=4 * D, **common)
    elif family == "gmlp":
        model = models.GMLP(ffn_dim=6 * D, **common)
    else:
        model = models.ViT(heads=2, mlp_dim=4 * D, **common)
    for _, p in model.named_parameters():       # move away from the init (zero head, unit norms)
        p.data[...] += RNG.standard_normal(p.shape).astype(p.dtype) * 0.1
    return model


# ---------------------------------------------------------------------- timm layout in
@pytest.mark.parametrize("family", FAMILIES)
def test_from_timm_reproduces_the_source_forward_pass(family):
    sd = timm_state(family)
    model = interop.from_timm(sd, heads=2 if family == "vit" else None)
    assert isinstance(model, CLASSES[family]) and model.config["gelu"] == "exact"
    c = model.config
    assert (c["image_size"], c["patch_size"], c["in_channels"], c["dim"], c["depth"], c["num_classes"]) == \
        (IMAGE, P, CIN, D, DEPTH, K)
    if family == "gmlp":
        assert (c["ffn_dim"], c["eps"], c["sgu_eps"]) == (6 * D, 1e-6, 1e-5)
    if family == "mixer":
        assert (c["token_mlp_dim"], c["channel_mlp_dim"]) == (8, 4 * D)
    ours, ref = logits(model, IMAGES), reference(family, sd, IMAGES)
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-10)


def test_the_mapping_facts():
    """The issue's facts, on the arrays themselves."""
    sd = timm_state("gmlp")
    model = interop.from_timm(sd)
    state = model.state_dict()
    w = sd["stem.proj.weight"]
    np.testing.assert_array_equal(state["patch_embed.proj.weight"], w.reshape(D, -1).T)
    np.testing.assert_array_equal(state["blocks.0.proj_in.weight"], sd["blocks.0.mlp_channels.fc1.weight"].T)
    np.testing.assert_array_equal(state["blocks.1.sgu.weight"], sd["blocks.1.mlp_channels.gate.proj.weight"])  # not .T
    np.testing.assert_array_equal(state["blocks.1.sgu.norm.bias"], sd["blocks.1.mlp_channels.gate.norm.bias"])
    np.testing.assert_array_equal(state["head.weight"], sd["head.weight"].T)
    sd = timm_state("vit")
    vit = interop.from_timm(sd, heads=2).state_dict()
    np.testing.assert_array_equal(vit["blocks.0.attn.out.weight"], sd["blocks.0.attn.proj.weight"].T)
    np.testing.assert_array_equal(vit["blocks.0.attn.qkv.weight"], sd["blocks.0.attn.qkv.weight"].T)


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_through_timm_layout_is_exact(family):
    model = small_model(family, gelu="tanh")
    back = interop.from_timm(interop.to_timm(model), heads=2 if family == "vit" else None, gelu="tanh",
                             **({"sgu_eps": model.config["sgu_eps"]} if family == "gmlp" else {}))
    assert type(back) is type(model)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k], v, err_msg=k)
    np.testing.assert_array_equal(logits(back, IMAGES, np.float32), logits(model, IMAGES, np.float32))


@pytest.mark.parametrize("family", FAMILIES)
def test_to_timm_names_and_shapes_are_timms(family):
    expected = timm_state(family)
    got = interop.to_timm(small_model(family))
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in expected.items()}
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in got.values())


def test_toeplitz_gmlp_exports_its_dense_spatial_weights():
    model = small_model("gmlp", toeplitz="2d")
    back = interop.from_timm(interop.to_timm(model), gelu=model.config["gelu"], sgu_eps=model.config["sgu_eps"])
    assert back.config["toeplitz"] is None
    np.testing.assert_allclose(logits(back, IMAGES), logits(model, IMAGES), rtol=1e-6, atol=1e-6)


def test_timm_has_no_amlp_and_to_timm_says_so():
    with pytest.raises(InteropError, match="tiny attention"):
        interop.to_timm(small_model("gmlp", attn_dim=8))


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_save_timm_round_trip_keeps_the_config(tmp_path, suffix):
    if suffix == ".safetensors":
        pytest.importorskip("safetensors")
    model = small_model("vit", gelu="tanh", eps=1e-5)
    path = tmp_path / f"vit{suffix}"
    interop.save_timm(model, path)
    assert interop.weights_source(path) == "tinymlp"
    back = interop.from_timm(path)                # heads, gelu and eps come from the file's header
    assert (back.config["heads"], back.config["gelu"], back.config["eps"]) == (2, "tanh", 1e-5)
    np.testing.assert_array_equal(logits(back, IMAGES, np.float32), logits(model, IMAGES, np.float32))
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as npz:   # an ordinary npz a PyTorch user can read
            assert set(npz.files) - {"__tinymlp_meta__"} == set(interop.to_timm(model))


def test_safetensors_file_written_by_hand_is_read(tmp_path):
    pytest.importorskip("safetensors")
    sd = {k: v.astype(np.float32) for k, v in timm_state("mixer").items()}
    interop.save_safetensors(tmp_path / "m.safetensors", sd)
    arrays = interop.load_safetensors(tmp_path / "m.safetensors")
    assert set(arrays) == set(sd) and all(np.array_equal(arrays[k], sd[k]) for k in sd)
    assert interop.weights_source(tmp_path / "m.safetensors") == "timm"
    model = interop.from_timm(tmp_path / "m.safetensors")
    np.testing.assert_allclose(logits(model, IMAGES), reference("mixer", sd, IMAGES), rtol=1e-10, atol=1e-10)


def test_new_head_is_zero_and_keeps_the_body():
    sd = timm_state("mixer")
    model = interop.from_timm(sd, num_classes=3)
    assert model.config["num_classes"] == 3
    assert not model.head.weight.data.any() and not model.head.bias.data.any()
    np.testing.assert_array_equal(model.state_dict()["blocks.1.norm2.weight"], sd["blocks.1.norm2.weight"])
    assert np.all(logits(model, IMAGES) == 0)
    same = interop.from_timm(sd, num_classes=K)          # the same count: the checkpoint's head stays
    np.testing.assert_array_equal(same.state_dict()["head.weight"], sd["head.weight"].T)


def test_a_headless_checkpoint_needs_a_class_count():
    sd = timm_state("vit")                                # timm's num_classes=0 models have no head.*
    del sd["head.weight"], sd["head.bias"]
    with pytest.raises(InteropError, match="num_classes"):
        interop.from_timm(sd, heads=2)
    model = interop.from_timm(sd, heads=2, num_classes=4)
    assert model.config["num_classes"] == 4 and not model.head.weight.data.any()


def test_replace_head_in_place():
    model = small_model("gmlp")
    body = model.state_dict()["blocks.0.sgu.weight"]
    assert interop.replace_head(model, 7) is model
    assert model.config["num_classes"] == 7 and model.head.weight.shape == (D, 7)
    assert not model.head.weight.data.any()
    np.testing.assert_array_equal(model.state_dict()["blocks.0.sgu.weight"], body)


# ---------------------------------------------------------------------- what is refused, and how
def test_vit_heads_are_asked_for_or_read_from_the_arch_name():
    sd = timm_state("vit")
    with pytest.raises(InteropError, match="heads"):
        interop.from_timm(sd)
    assert interop.from_timm(sd, arch="vit_medium_patch16_gap_256").config["heads"] == 8
    with pytest.raises(ValueError, match="divisible"):   # 16 channels do not split into 3 heads
        interop.from_timm(sd, heads=3)


def test_unknown_names_and_extra_parts_are_refused():
    with pytest.raises(InteropError, match="cannot tell the architecture"):
        interop.from_timm({"conv1.weight": np.zeros((4, 3, 3, 3))})
    sd = timm_state("vit")
    sd["blocks.0.ls1.gamma"] = np.ones(D)                # layer scale: no tinymlp counterpart
    with pytest.raises(InteropError, match="unexpected 1: blocks.0.ls1.gamma"):
        interop.from_timm(sd, heads=2)
    sd = timm_state("mixer")
    del sd["blocks.1.mlp_channels.fc2.bias"]
    with pytest.raises(InteropError, match="missing 1: blocks.1.mlp_channels.fc2.bias"):
        interop.from_timm(sd)


def test_pickled_files_are_refused_with_the_conversion_command(tmp_path):
    path = tmp_path / "model.pth"
    path.write_bytes(pickle.dumps({"not": "loaded"}))    # written here, never unpickled by tinymlp
    with pytest.raises(PickleRefusedError) as err:
        interop.from_timm(path)
    message = str(err.value)
    assert "never unpickles" in message and "safetensors.torch import save_file" in message
    assert "weights_only=True" in message and "model.safetensors" in message
    # torch.save's zip format, whatever the file is called
    zipped = tmp_path / "sneaky.npz"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"x": 1}))
    with pytest.raises(PickleRefusedError):
        interop.read_weights(zipped)
    with pytest.raises(PickleRefusedError):
        interop.weights_source(zipped)
    blank = tmp_path / "weights.bin"
    blank.write_bytes(b"\x00" * 32)
    with pytest.raises(PickleRefusedError):
        interop.read_weights(blank)


def test_missing_safetensors_package_is_a_clear_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_safetensors(name, *args, **kwargs):
        if name.startswith("safetensors"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_safetensors)
    with pytest.raises(ImportError, match="pip install safetensors"):
        interop.save_safetensors(tmp_path / "x.safetensors", {"a": np.zeros(2)})


# ---------------------------------------------------------------------- official JAX (Flax) checkpoints
def to_flax(family, sd, heads=2):
    """The official vision_transformer names and layouts of a timm-layout state dict."""
    def kernel(name):
        return sd[f"{name}.weight"].T                    # Flax Dense: (in, out)

    def norm(name, flax):
        return {f"{flax}/scale": sd[f"{name}.weight"], f"{flax}/bias": sd[f"{name}.bias"]}

    def dense(name, flax):
        return {f"{flax}/kernel": kernel(name), f"{flax}/bias": sd[f"{name}.bias"]}

    out = {}
    if family == "mixer":
        out["stem/kernel"] = sd["stem.proj.weight"].transpose(2, 3, 1, 0)     # HWIO
        out["stem/bias"] = sd["stem.proj.bias"]
        for i in range(DEPTH):
            b, j = f"blocks.{i}.", f"MixerBlock_{i}/"
            out.update(norm(b + "norm1", j + "LayerNorm_0"), **norm(b + "norm2", j + "LayerNorm_1"))
            for ours, theirs in (("mlp_tokens", "token_mixing"), ("mlp_channels", "channel_mixing")):
                out.update(dense(f"{b}{ours}.fc1", f"{j}{theirs}/Dense_0"),
                           **dense(f"{b}{ours}.fc2", f"{j}{theirs}/Dense_1"))
        out.update(norm("norm", "pre_head_layer_norm"))
    else:
        out["embedding/kernel"] = sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0)
        out["embedding/bias"] = sd["patch_embed.proj.bias"]
        out["cls"] = sd["cls_token"]
        out["Transformer/posembed_input/pos_embedding"] = sd["pos_embed"]
        d = D // heads
        for i in range(DEPTH):
            b, j = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
            a = j + "MultiHeadDotProductAttention_1/"
            out.update(norm(b + "norm1", j + "LayerNorm_0"), **norm(b + "norm2", j + "LayerNorm_2"))
            w, bias = sd[b + "attn.qkv.weight"], sd[b + "attn.qkv.bias"]
            for n, name in enumerate(("query", "key", "value")):
                out[f"{a}{name}/kernel"] = w[n * D:(n + 1) * D].T.reshape(D, heads, d)     # (D, h, d)
                out[f"{a}{name}/bias"] = bias[n * D:(n + 1) * D].reshape(heads, d)
            out[f"{a}out/kernel"] = sd[b + "attn.proj.weight"].T.reshape(heads, d, D)    # (h, d, D)
            out[f"{a}out/bias"] = sd[b + "attn.proj.bias"]
            out.update(dense(b + "mlp.fc1", j + "MlpBlock_3/Dense_0"), **dense(b + "mlp.fc2", j + "MlpBlock_3/Dense_1"))
        out.update(norm("norm", "Transformer/encoder_norm"))
    out.update(dense("head", "head"))
    return out


@pytest.mark.parametrize("family", ["mixer", "vit"])
def test_from_jax_npz_official_layout(tmp_path, family):
    sd = timm_state(family)
    path = tmp_path / f"{family}.npz"
    np.savez(path, **to_flax(family, sd))
    assert interop.weights_source(path) == "jax"
    model = interop.from_jax_npz(path)                   # ViT heads read from the query kernel
    assert model.config["gelu"] == "tanh" and model.config["num_classes"] == K
    np.testing.assert_allclose(logits(model, IMAGES), reference(family, sd, IMAGES, form="tanh"),
                               rtol=1e-10, atol=1e-10)
    same = interop.load_pretrained(path)                 # the either-source entry point agrees
    np.testing.assert_array_equal(logits(same, IMAGES), logits(model, IMAGES))


def test_from_jax_npz_prefixes_pre_logits_and_new_heads(tmp_path):
    sd = timm_state("vit")
    flax = {f"opt/target/{k}": v for k, v in to_flax("vit", sd).items()}    # the older checkpoints' prefix
    flax["opt/target/pre_logits/kernel"] = np.zeros((D, D))
    flax["opt/target/pre_logits/bias"] = np.zeros(D)
    path = tmp_path / "vit21k.npz"
    np.savez(path, **flax)
    with pytest.raises(InteropError, match="pre_logits"):
        interop.from_jax_npz(path)
    model = interop.from_jax_npz(path, num_classes=10)   # dropped with the head, as the official fine-tuning does
    assert model.config["num_classes"] == 10 and not model.head.weight.data.any()
    np.testing.assert_array_equal(model.state_dict()["pos_embed"], sd["pos_embed"])


# ---------------------------------------------------------------------- resolution
def _loop_bilinear(image, h, w):
    """Bilinear resize of one (H, W) plane, one output pixel at a time (half-pixel centres)."""
    H, W = image.shape
    out = np.zeros((h, w))
    for i in range(h):
        y = min(max((i + 0.5) * H / h - 0.5, 0), H - 1)
        y0 = int(y)
        y1, ty = min(y0 + 1, H - 1), y - y0
        for j in range(w):
            x = min(max((j + 0.5) * W / w - 0.5, 0), W - 1)
            x0 = int(x)
            x1, tx = min(x0 + 1, W - 1), x - x0
            out[i, j] = ((1 - ty) * ((1 - tx) * image[y0, x0] + tx * image[y0, x1])
                         + ty * ((1 - tx) * image[y1, x0] + tx * image[y1, x1]))
    return out


@pytest.mark.parametrize("size", [(14, 20), (3, 4), (7, 9), 12])
def test_resize_is_bilinear(size, device):
    images = RNG.standard_normal((2, 3, 7, 9))
    out = resize(tinymlp.backend.to_device(images, device), size)
    h, w = (size, size) if isinstance(size, int) else size
    assert out.shape == (2, 3, h, w) and tinymlp.backend.device_of(out) == device
    expected = np.stack([np.stack([_loop_bilinear(c, h, w) for c in im]) for im in images])
    np.testing.assert_allclose(tinymlp.backend.to_device(out, "cpu"), expected, rtol=1e-12, atol=1e-12)
    images32 = images.astype(np.float32)
    assert resize(images32, size).dtype == np.float32
    assert Resize(size)(images32, None, None)[0].shape == (2, 3, h, w)


def test_resize_matches_torch():
    torch = pytest.importorskip("torch")
    images = RNG.standard_normal((2, 3, 32, 32))
    for size in [(224, 224), (48, 40), (16, 16)]:
        ref = torch.nn.functional.interpolate(torch.from_numpy(images), size=size, mode="bilinear",
                                              align_corners=False).numpy()
        np.testing.assert_allclose(resize(images, size), ref, rtol=1e-12, atol=1e-12)


def test_vit_changes_resolution_by_resampling_its_position_embedding():
    model = small_model("vit")
    bigger = interop.change_image_size(model, 2 * IMAGE)
    assert bigger.config["image_size"] == 2 * IMAGE and bigger.patch_embed.num_patches == 4 * S
    pos, new = model.state_dict()["pos_embed"], bigger.state_dict()["pos_embed"]
    np.testing.assert_array_equal(new[:, 0], pos[:, 0])                      # the class token's entry
    grid = pos[0, 1:].reshape(4, 4, D).transpose(2, 0, 1)
    np.testing.assert_allclose(new[0, 1:].reshape(8, 8, D).transpose(2, 0, 1), resize(grid.astype(np.float64), 8),
                               rtol=1e-6, atol=1e-6)
    for k, v in model.state_dict().items():
        if k != "pos_embed":
            np.testing.assert_array_equal(bigger.state_dict()[k], v)
    assert logits(bigger, RNG.standard_normal((1, CIN, 2 * IMAGE, 2 * IMAGE))).shape == (1, K)
    assert interop.change_image_size(model, IMAGE) is model
    np.testing.assert_array_equal(interop.resize_pos_embed(pos, (4, 4), (4, 4)), pos)


@pytest.mark.parametrize("family", ["mixer", "gmlp"])
def test_mixer_and_gmlp_keep_their_pretraining_resolution(family):
    with pytest.raises(InteropError, match="pretraining resolution"):
        interop.change_image_size(small_model(family), 2 * IMAGE)


# ---------------------------------------------------------------------- against timm itself (when installed)
def _timm_net(family, act="exact"):
    torch = pytest.importorskip("torch")
    pytest.importorskip("timm")
    from timm.layers import GatedMlp
    from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock
    from timm.models.vision_transformer import VisionTransformer

    common = dict(num_classes=K, img_size=IMAGE, patch_size=P, in_chans=CIN)
    if family == "mixer":
        net = MlpMixer(embed_dim=D, num_blocks=DEPTH, mlp_ratio=(0.5, 4.0), **common)
    elif family == "gmlp":
        net = MlpMixer(embed_dim=D, num_blocks=DEPTH, mlp_ratio=6, block_layer=SpatialGatingBlock,
                       mlp_layer=GatedMlp, **common)
    else:
        net = VisionTransformer(embed_dim=D, depth=DEPTH, num_heads=2, mlp_ratio=4.0, **common)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():                  # random everywhere (timm zero-inits the head)
            p.normal_(0.0, 0.3)
    return torch, net.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_timm(family):
    torch, net = _timm_net(family)
    model = interop.from_timm(net.state_dict(), heads=2 if family == "vit" else None)
    x = IMAGES.astype(np.float32)
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    ours = logits(model, x, np.float32)
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("family", FAMILIES)
def test_to_timm_loads_strictly_into_timm(family):
    torch, net = _timm_net(family)
    model = small_model(family, gelu="exact", **({"sgu_eps": 1e-5} if family == "gmlp" else {}))
    net.load_state_dict({k: torch.from_numpy(v) for k, v in interop.to_timm(model).items()}, strict=True)
    x = IMAGES.astype(np.float32)
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    assert np.abs(logits(model, x, np.float32) - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("family", FAMILIES)
def test_create_timm_model_follows_the_models_options(family):
    torch, _ = _timm_net(family)
    model = small_model(family, gelu="tanh", eps=1e-5)     # tinymlp's defaults differ from timm's
    net = interop.create_timm_model(model)
    x = IMAGES.astype(np.float32)
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    assert np.abs(logits(model, x, np.float32) - ref).max() <= 1e-5 * np.abs(ref).max()


# ---------------------------------------------------------------------- values checked, files damaged
def test_from_timm_refuses_integer_and_nonfinite_weights_naming_them():
    sd = timm_state("mixer")
    quantized = dict(sd, **{"stem.proj.weight": np.round(sd["stem.proj.weight"] * 100).astype(np.int8)})
    with pytest.raises(InteropError, match=r"stem.proj.weight holds integers \(int8\).*dequantize"):
        interop.from_timm(quantized)
    broken = dict(sd, **{"head.bias": np.full_like(sd["head.bias"], np.inf)})
    with pytest.raises(InteropError, match="head.bias holds 5 NaN or infinite values"):
        interop.from_timm(broken)
    with pytest.raises(InteropError, match="complex"):
        interop.from_timm(dict(sd, **{"norm.weight": sd["norm.weight"].astype(np.complex64)}))


def _bf16_file(path, arrays):
    import json as _json
    import struct

    header, blobs, offset = {}, [], 0
    for name, value in arrays.items():
        bits = (np.asarray(value, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(np.shape(value)), "data_offsets": [offset, offset + len(bits)]}
        blobs.append(bits)
        offset += len(bits)
    text = _json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_bfloat16_safetensors_are_read_as_float32_with_a_note(tmp_path, capsys):
    pytest.importorskip("safetensors")
    sd = timm_state("mixer")
    exact = {k: (np.asarray(v, np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in sd.items()}
    _bf16_file(tmp_path / "w.safetensors", exact)
    model = interop.from_timm(tmp_path / "w.safetensors")
    assert "bfloat16 tensors converted to float32" in capsys.readouterr().err
    assert np.array_equal(model.head.bias.data, exact["head.bias"])
    assert np.array_equal(model.state_dict()["norm.weight"], exact["norm.weight"])


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
@pytest.mark.parametrize("keep", [0.5, 12])
def test_a_truncated_weights_file_is_one_sentence(tmp_path, suffix, keep):
    if suffix == ".safetensors":
        pytest.importorskip("safetensors")
    path = tmp_path / f"w{suffix}"
    interop.save_timm(small_model("mixer"), path)
    blob = path.read_bytes()
    path.write_bytes(blob[:int(len(blob) * keep) if keep < 1 else keep])
    with pytest.raises(InteropError, match=r"truncated") as info:
        interop.from_timm(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_create_timm_model_without_torch_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name.split(".")[0] in ("torch", "timm"):
            raise ImportError(f"No module named '{name}'", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(ImportError, match="needs torch and timm .*pip install torch timm"):
        interop.create_timm_model(small_model("mixer"))
