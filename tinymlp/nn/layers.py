"""Basic layers: Linear, LayerNorm, GELU, Dropout, Identity, containers, PatchEmbedding.

Each layer owns its parameters and calls one fused op from ``tinymlp.functional``; the
forward formula and the derivation of the backward pass live with that op in ``tinymlp/ops``.
"""

from __future__ import annotations

from .. import functional as F
from ..tensor import Tensor
from . import init
from .module import Module, Parameter

__all__ = ["Dropout", "GELU", "Identity", "LayerNorm", "Linear", "ModuleList", "PatchEmbedding", "Sequential"]


def _pair(v, what):
    pair = (v, v) if isinstance(v, int) else tuple(v)
    if len(pair) != 2 or any(int(n) <= 0 for n in pair):
        raise ValueError(f"{what} must be a positive int or a pair of them, got {v!r}")
    return int(pair[0]), int(pair[1])


class Linear(Module):
    """y = x W + b over the last axis, with W of shape (in_features, out_features).

    To apply it along another axis, move that axis last: ``layer(x.swapaxes(1, 2))`` is
    MLP-Mixer's token mixing (the fast tier reads the transposed view without copying it).

    Init (as Flax's Dense and the official MLP-Mixer): W ~ LeCun normal, a normal truncated
    at 2 stds with variance 1/in_features, so activations keep their scale; b = 0.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, rng=None):
        super().__init__()
        rng = init.as_rng(rng)
        self.in_features, self.out_features = int(in_features), int(out_features)
        if self.in_features < 1 or self.out_features < 1:
            raise ValueError(f"Linear: in_features and out_features must be >= 1, got "
                             f"{in_features!r} and {out_features!r}")
        self.weight = Parameter(init.lecun_normal((self.in_features, self.out_features), rng))
        self.bias = Parameter(init.zeros((self.out_features,))) if bias else None

    def forward(self, x):
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"{self._describe()}: expected input with last axis {self.in_features}, "
                f"got shape {tuple(x.shape)}"
            )
        return F.linear(x, self.weight, self.bias)

    def _describe(self):
        return f"Linear({self.in_features} -> {self.out_features})"

    def extra_repr(self):
        return f"{self.in_features} -> {self.out_features}" + ("" if self.bias is not None else ", bias=False")


class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis (width ``dim``).

    weight = 1, bias = 0 at init. ``rng`` is accepted (and unused) so that every layer can be
    built the same way.
    """

    def __init__(self, dim: int, eps: float = 1e-5, rng=None):
        super().__init__()
        self.dim, self.eps = int(dim), float(eps)
        self.weight = Parameter(init.ones((self.dim,)))
        self.bias = Parameter(init.zeros((self.dim,)))

    def forward(self, x):
        if x.shape[-1] != self.dim:
            raise ValueError(f"LayerNorm({self.dim}): expected input with last axis {self.dim}, "
                             f"got shape {tuple(x.shape)}")
        return F.layer_norm(x, self.weight, self.bias, eps=self.eps)

    def extra_repr(self):
        return f"{self.dim}, eps={self.eps:g}"


class GELU(Module):
    """GELU; ``approximate=True`` is the tanh form 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
    used by the official MLP-Mixer (Flax's default), False the exact x * Phi(x)."""

    def __init__(self, approximate: bool = True):
        super().__init__()
        self.approximate = bool(approximate)

    def forward(self, x):
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self):
        return "" if self.approximate else "approximate=False"


class Dropout(Module):
    """Zero each element with probability ``p`` while training, scaling the rest by 1/(1-p);
    the identity in eval mode. The mask comes from this layer's own seeded Generator."""

    def __init__(self, p: float = 0.5, rng=None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = float(p)
        self.rng = init.as_rng(rng)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(x, self.p, training=True, rng=self.rng)

    def extra_repr(self):
        return f"p={self.p:g}"


class Identity(Module):
    """Returns its input (a placeholder where a layer is optional)."""

    def forward(self, x):
        return x


class ModuleList(Module):
    """A list of modules registered under the names "0", "1", ...: indexable, iterable."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self)), module)
        return self

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        items = list(self._modules.values())
        if isinstance(index, slice):
            return type(self)(items[index])
        return items[index]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward: iterate over it in the parent's forward")


class Sequential(ModuleList):
    """Applies its modules in order: ``Sequential(a, b, c)(x) == c(b(a(x)))``."""

    def __init__(self, *modules: Module):
        super().__init__(modules)

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x

    def __getitem__(self, index):
        items = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*items[index])
        return items[index]


class PatchEmbedding(Module):
    """Cut images (B, C, H, W) into P x P patches and project each to ``dim``: (B, S, dim).

    Patches are taken in row-major order (token t = r * grid_w + c); each patch is flattened
    in (c, p1, p2) order (as PyTorch's conv weights and lucidrains' gMLP; ``F.patchify``), then
    ``.proj`` (a Linear of C*P*P -> dim) is applied: a conv with kernel = stride = P, done as
    one rearrangement and one matmul.
    """

    def __init__(self, image_size, patch_size, in_channels: int, dim: int, rng=None):
        super().__init__()
        rng = init.as_rng(rng)
        self.image_size = _pair(image_size, "PatchEmbedding: image_size")
        self.patch_size = _pair(patch_size, "PatchEmbedding: patch_size")
        (h, w), (ph, pw) = self.image_size, self.patch_size
        if h % ph or w % pw:
            raise ValueError(
                f"PatchEmbedding: image size {h}x{w} is not divisible by patch size {ph}x{pw}"
            )
        self.in_channels, self.dim = int(in_channels), int(dim)
        self.grid = (h // ph, w // pw)
        self.num_patches = self.grid[0] * self.grid[1]
        self.proj = Linear(self.in_channels * ph * pw, self.dim, rng=rng)

    def forward(self, images):
        if not isinstance(images, Tensor):
            images = Tensor(images)
        expected = (self.in_channels, *self.image_size)
        if images.ndim != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"PatchEmbedding: expected images of shape (B, {expected[0]}, {expected[1]}, {expected[2]}) "
                f"(NCHW), got {tuple(images.shape)}"
            )
        if images.shape[0] == 0:
            raise ValueError("PatchEmbedding: got an empty batch (0 images)")
        x = F.patchify(images, self.patch_size)            # (B, S, C*P*P): one row per patch
        return self.proj(x)                                # (B, S, dim)

    def extra_repr(self):
        (h, w), (ph, pw) = self.image_size, self.patch_size
        return f"{self.in_channels}x{h}x{w} -> {self.num_patches} patches of {ph}x{pw} -> {self.dim}"
