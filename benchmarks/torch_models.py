"""The tinymlp models re-written in PyTorch (eager), for speed comparisons and a parity check.

Same architectures, same parameter names and shapes (up to the orientation of Linear weights),
same formulas as ``tinymlp.models``:

- ``MLPMixer``: patch embedding (a Linear on each flattened P x P patch, (c, p1, p2) order),
  blocks ``x + T(MLP_S(T(LN(x))))`` then ``x + MLP_C(LN(x))``, LayerNorm, mean over tokens, head;
- ``GMLP`` / ``AMLP``: blocks ``x + proj_out(SGU(GELU(proj_in(LN(x)))))``, the split SGU
  ``z1 * (W LN(z2) + b[:, None] (+ TinyAttn(LN(x))))``, dense W (optionally causal);

GELU is the tanh form (``nn.GELU(approximate="tanh")``) and every LayerNorm uses the model's
eps, as in tinymlp. Only what the benchmarks need is here: the split SGU with a dense spatial
weight (no Toeplitz, no other variants), no dropout.

    torch_model = torch_like(tiny_model)          # same architecture, PyTorch's own init
    copy_weights(torch_model, tiny_model)         # same weights: tinymlp Linear (in, out) -> torch (out, in)

Run ``python benchmarks/torch_models.py --check`` to compare logits and gradients of tiny
models on the CPU (float64 and float32).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = ["AMLP", "GMLP", "MLPMixer", "copy_weights", "grads_like_tinymlp", "torch_like"]


class PatchEmbedding(nn.Module):
    """(B, C, H, W) -> (B, S, dim): row-major P x P patches, each flattened in (c, p1, p2) order, then ``.proj``."""

    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__()
        self.patch_size = patch_size
        self.grid = (image_size // patch_size, image_size // patch_size)
        self.num_patches = self.grid[0] * self.grid[1]
        self.proj = nn.Linear(in_channels * patch_size * patch_size, dim)

    def forward(self, images):
        b, c = images.shape[:2]
        (gh, gw), p = self.grid, self.patch_size
        x = images.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)   # (B, gh, gw, C, p, p)
        return self.proj(x.reshape(b, gh * gw, c * p * p))


class MLP(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MixerBlock(nn.Module):
    def __init__(self, num_tokens, dim, token_mlp_dim, channel_mlp_dim, eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.token_mlp = MLP(num_tokens, token_mlp_dim)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.channel_mlp = MLP(dim, channel_mlp_dim)

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, token_mlp_dim,
                 channel_mlp_dim, eps=1e-6, **_):
        super().__init__()
        self.patch_embed = PatchEmbedding(image_size, patch_size, in_channels, dim)
        self.blocks = nn.Sequential(*[
            MixerBlock(self.patch_embed.num_patches, dim, token_mlp_dim, channel_mlp_dim, eps) for _ in range(depth)
        ])
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images):
        x = self.blocks(self.patch_embed(images))
        return self.head(self.norm(x).mean(dim=1))


class TinyAttention(nn.Module):
    """Single-head attention: softmax(q k^T / sqrt(d)) v, projected (the explicit form, as tinymlp computes it)."""

    def __init__(self, dim_in, dim_out, attn_dim):
        super().__init__()
        self.attn_dim = attn_dim
        self.qkv = nn.Linear(dim_in, 3 * attn_dim, bias=False)
        self.out = nn.Linear(attn_dim, dim_out)

    def forward(self, x, causal=False):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.attn_dim)
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=s.device).tril(), float("-inf"))
        return self.out(torch.softmax(s, dim=-1) @ v)


class SpatialGatingUnit(nn.Module):
    """Split SGU: z1 * (W_eff LN(z2) + b[:, None] (+ gate_residual)); W_eff = W or tril(W)."""

    def __init__(self, seq_len, dim, causal, eps):
        super().__init__()
        self.causal = causal
        self.norm = nn.LayerNorm(dim // 2, eps=eps)
        self.weight = nn.Parameter(torch.empty(seq_len, seq_len).uniform_(-1e-3 / seq_len, 1e-3 / seq_len))
        self.bias = nn.Parameter(torch.ones(seq_len))

    def forward(self, z, gate_residual=None):
        z1, z2 = z.chunk(2, dim=-1)
        w = self.weight.tril() if self.causal else self.weight
        f = torch.matmul(w, self.norm(z2)) + self.bias[:, None]     # (S, S) @ (B, S, e)
        if gate_residual is not None:
            f = f + gate_residual
        return z1 * f


class GMLPBlock(nn.Module):
    def __init__(self, seq_len, dim, ffn_dim, attn_dim, causal, eps):
        super().__init__()
        self.causal = causal
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.proj_in = nn.Linear(dim, ffn_dim)
        self.act = nn.GELU(approximate="tanh")
        self.sgu = SpatialGatingUnit(seq_len, ffn_dim, causal, eps)
        self.proj_out = nn.Linear(ffn_dim // 2, dim)
        self.attn = TinyAttention(dim, ffn_dim // 2, attn_dim) if attn_dim else None

    def forward(self, x):
        h = self.norm(x)
        residual = self.attn(h, causal=self.causal) if self.attn is not None else None
        return x + self.proj_out(self.sgu(self.act(self.proj_in(h)), residual))


class GMLP(nn.Module):
    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, ffn_dim, attn_dim=None,
                 sgu_variant="split", toeplitz=None, causal=False, eps=1e-6, **_):
        super().__init__()
        if sgu_variant != "split" or toeplitz:
            raise NotImplementedError("the PyTorch gMLP here has the split SGU with a dense spatial weight only")
        self.patch_embed = PatchEmbedding(image_size, patch_size, in_channels, dim)
        seq_len = self.patch_embed.num_patches
        self.blocks = nn.Sequential(*[GMLPBlock(seq_len, dim, ffn_dim, attn_dim, causal, eps) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images):
        x = self.blocks(self.patch_embed(images))
        return self.head(self.norm(x).mean(dim=1))


class AMLP(GMLP):
    def __init__(self, *args, attn_dim=64, **kwargs):
        super().__init__(*args, attn_dim=attn_dim, **kwargs)


_CLASSES = {"MLPMixer": MLPMixer, "GMLP": GMLP, "AMLP": AMLP}


def torch_like(model):
    """A PyTorch model with the architecture of the tinymlp ``model`` (from its ``.config``)."""
    name = type(model).__name__
    if name not in _CLASSES:
        raise TypeError(f"no PyTorch twin for {name}; available: {', '.join(_CLASSES)}")
    return _CLASSES[name](**model.config)


def _linear_weights(torch_model):
    return {f"{name}.weight" for name, m in torch_model.named_modules() if isinstance(m, nn.Linear)}


def copy_weights(torch_model, model):
    """Load the tinymlp ``model``'s parameters into ``torch_model`` (in place; same names).

    tinymlp's Linear weight is (in, out) for ``x @ W``; torch's is (out, in) for ``x @ W.T``:
    those are transposed, every other tensor (LayerNorm, the SGU's (S, S) W and bias) is copied.
    """
    transposed = _linear_weights(torch_model)
    reference = torch_model.state_dict()
    state = {}
    for name, array in model.state_dict().items():
        value = torch.from_numpy(np.ascontiguousarray(array.T if name in transposed else array))
        state[name] = value.to(dtype=reference[name].dtype, device=reference[name].device)
    torch_model.load_state_dict(state, strict=True)
    return torch_model


def grads_like_tinymlp(torch_model):
    """name -> gradient as a NumPy array in tinymlp's orientation (Linear weights transposed back)."""
    transposed = _linear_weights(torch_model)
    out = {}
    for name, p in torch_model.named_parameters():
        g = p.grad.detach().cpu().numpy()
        out[name] = g.T if name in transposed else g
    return out


# ----------------------------------------------------------------------------- parity check
def _tiny_models():
    from tinymlp.models import AMLP as TAMLP, GMLP as TGMLP, MLPMixer as TMixer

    common = dict(image_size=8, patch_size=2, in_channels=3, num_classes=5, seed=1)   # 16 tokens
    return {
        "MLPMixer": TMixer(dim=12, depth=2, token_mlp_dim=6, channel_mlp_dim=20, **common),
        "GMLP": TGMLP(dim=12, depth=2, ffn_dim=24, **common),
        "AMLP": TAMLP(dim=12, depth=2, ffn_dim=24, attn_dim=8, **common),
    }


def _rel(a, b):
    """max |a - b| / max |b|: a normwise relative difference (b the reference)."""
    scale = float(np.abs(b).max()) or 1.0
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max()) / scale


def check():
    """Logits and gradients of tinymlp and PyTorch, same weights and input, CPU; prints max rel diffs."""
    import tinymlp
    import tinymlp.functional as TF

    rng = np.random.default_rng(0)
    images = rng.random((4, 3, 8, 8))
    labels = np.array([0, 1, 4, 2])
    worst = 0.0
    for dtype, tdtype in ((np.float64, torch.float64), (np.float32, torch.float32)):
        for name, model in _tiny_models().items():
            # non-trivial weights everywhere: the zero head would hide most of the gradients
            noise = np.random.default_rng(1)
            model.load_state_dict({k: v + 0.1 * noise.standard_normal(v.shape) for k, v in model.state_dict().items()})
            model.to(dtype=dtype)
            twin = copy_weights(torch_like(model).to(tdtype), model)

            model.zero_grad()
            logits = model(tinymlp.tensor(images, dtype=dtype))
            TF.cross_entropy(logits, labels).backward()
            grads = {k: p.grad for k, p in model.named_parameters()}

            t_logits = twin(torch.from_numpy(images).to(tdtype))
            nn.functional.cross_entropy(t_logits, torch.from_numpy(labels)).backward()
            t_grads = grads_like_tinymlp(twin)

            d_logits = _rel(logits.numpy(), t_logits.detach().numpy())
            # token_mlp.fc2.bias has a zero gradient in exact arithmetic (mixer.py says why): both
            # sides hold rounding noise there, compared to the largest gradient of the model
            overall = max(float(np.abs(g).max()) for g in t_grads.values())
            d_grads = max(
                float(np.abs(grads[k] - t_grads[k]).max()) / overall if k.endswith("token_mlp.fc2.bias")
                else _rel(grads[k], t_grads[k])
                for k in grads
            )
            tol = 1e-10 if dtype == np.float64 else 1e-4
            ok = d_logits <= tol and d_grads <= tol and set(grads) == set(t_grads)
            worst = max(worst, d_logits / tol, d_grads / tol)
            print(f"{name:9s} {np.dtype(dtype).name:8s} logits max rel diff {d_logits:.2e}   "
                  f"grads max rel diff {d_grads:.2e}   ({len(grads)} tensors)   {'ok' if ok else 'MISMATCH'}")
    return 0 if worst <= 1 else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare logits and gradients with tinymlp on the CPU")
    args = parser.parse_args(argv)
    if not args.check:
        parser.print_help()
        return 0
    return check()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
    sys.exit(main())
