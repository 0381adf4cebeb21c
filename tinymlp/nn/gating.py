"""The spatial gating unit of gMLP (and of aMLP, through ``gate_residual``)."""

from __future__ import annotations

import math

from .. import functional as F
from ..ops.gating import VARIANTS
from . import init
from .layers import LayerNorm
from .module import Module, Parameter

__all__ = ["SpatialGatingUnit"]


class SpatialGatingUnit(Module):
    """s(z) = z1 * (W_eff @ LN(z2) + b): mixes the ``seq_len`` tokens with one (S, S) matrix.

    ``dim`` is the width of the input ``z``: 2e for ``variant="split"`` (z1 = first half, the
    bypass; z2 = second half, the gate), e for the other variants ("linear": f(z), "additive":
    z + f(z), "multiplicative": z * f(z)). The output has width e.

    Spatial weights:

    * dense (``toeplitz=None``): ``.weight`` (S, S), initialised near zero, U(-1e-3/S, 1e-3/S);
    * ``toeplitz="1d"``: ``.toeplitz_weight`` (2S - 1,), W[i, j] = w[i - j + S - 1];
    * ``toeplitz="2d"``: ``.toeplitz_weight`` (2gh - 1, 2gw - 1) for tokens on a gh x gw grid in
      row-major order (``grid``; default a square sqrt(S) x sqrt(S) grid): shift-invariant in
      both image directions. Toeplitz weights start at zero.

    ``.bias`` (S,) starts at one, so f(z2) = 1 and s(z) = z1 at initialisation (the gMLP
    paper's advice for stable training). ``.norm`` is the LayerNorm of the gated half (its
    parameters are used inside the fused op). ``causal=True`` keeps only W[i, j] with j <= i.
    ``sgu(z)`` maps z (B, S, dim) to (B, S, e).
    """

    def __init__(self, seq_len: int, dim: int, variant: str = "split", toeplitz=None, causal: bool = False,
                 grid=None, eps: float = 1e-5, rng=None):
        super().__init__()
        rng = init.as_rng(rng)
        if variant not in VARIANTS:
            raise ValueError(f"SpatialGatingUnit: unknown variant {variant!r}, expected one of {VARIANTS}")
        if variant == "split" and dim % 2:
            raise ValueError(f'SpatialGatingUnit: variant "split" needs an even dim (z = [z1, z2]), got {dim}')
        if toeplitz is False:
            toeplitz = None
        if toeplitz not in (None, "1d", "2d"):
            raise ValueError(f"SpatialGatingUnit: toeplitz must be None, '1d' or '2d', got {toeplitz!r}")
        self.seq_len, self.dim, self.variant = int(seq_len), int(dim), variant
        self.toeplitz, self.causal, self.eps = toeplitz, bool(causal), float(eps)
        self.gate_dim = self.dim // 2 if variant == "split" else self.dim
        S = self.seq_len

        self.norm = LayerNorm(self.gate_dim, eps=eps)
        if toeplitz is None:
            self.weight = Parameter(init.uniform((S, S), rng, low=-1e-3 / S, high=1e-3 / S))
        elif toeplitz == "1d":
            self.toeplitz_weight = Parameter(init.zeros((2 * S - 1,)))
        else:
            self.grid = self._grid(grid)
            gh, gw = self.grid
            self.toeplitz_weight = Parameter(init.zeros((2 * gh - 1, 2 * gw - 1)))
        self.bias = Parameter(init.ones((S,)))

    def _grid(self, grid):
        S = self.seq_len
        if grid is None:
            side = math.isqrt(S)
            if side * side != S:
                raise ValueError(
                    f"SpatialGatingUnit: toeplitz='2d' needs a grid; {S} tokens is not a square "
                    "number, so pass grid=(grid_h, grid_w)"
                )
            return side, side
        gh, gw = (int(n) for n in grid)
        if gh * gw != S:
            raise ValueError(f"SpatialGatingUnit: grid {gh}x{gw} has {gh * gw} cells for seq_len={S}")
        return gh, gw

    def spatial_weight(self):
        """The (S, S) token-mixing matrix W (built from the Toeplitz parameters if there are any)."""
        if self.toeplitz is None:
            return self.weight
        if self.toeplitz == "1d":
            return F.toeplitz_1d(self.toeplitz_weight, self.seq_len)
        return F.toeplitz_2d(self.toeplitz_weight, *self.grid)

    def forward(self, z, gate_residual=None):
        if z.ndim != 3 or z.shape[1] != self.seq_len or z.shape[2] != self.dim:
            raise ValueError(
                f"SpatialGatingUnit(seq_len={self.seq_len}, dim={self.dim}): expected z of shape "
                f"(B, {self.seq_len}, {self.dim}), got {tuple(z.shape)}"
            )
        return F.spatial_gating(
            z, self.spatial_weight(), self.bias, self.norm.weight, self.norm.bias, eps=self.eps,
            gate_residual=gate_residual, causal=self.causal, variant=self.variant,
        )

    def extra_repr(self):
        parts = [f"seq_len={self.seq_len}", f"dim={self.dim}"]
        if self.variant != "split":
            parts.append(f"variant={self.variant!r}")
        if self.toeplitz == "1d":
            parts.append("toeplitz='1d'")
        elif self.toeplitz == "2d":
            parts.append(f"toeplitz='2d', grid={self.grid[0]}x{self.grid[1]}")
        if self.causal:
            parts.append("causal")
        return ", ".join(parts)
