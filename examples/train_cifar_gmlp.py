"""Train the CIFAR gMLP (or aMLP, with --attn-dim 64) from scratch.

    python examples/train_cifar_gmlp.py --device cuda                   # gMLP on CIFAR-10
    python examples/train_cifar_gmlp.py --device cuda --attn-dim 64     # aMLP: + tiny attention
    python examples/train_cifar_gmlp.py --toeplitz 2d                   # shift-invariant spatial weights
    python examples/train_cifar_gmlp.py --dataset synthetic --epochs 5  # offline, no download

The models are the "gmlp_cifar" and "amlp_cifar" presets: 4 x 4 patches (S = 64 tokens),
gMLP-Ti's widths (d_model 128, d_ffn 768) at depth 8, and for aMLP a single-head attention
of width 64. The training recipe and where its defaults come from: examples/image_recipe.py.
Outputs go to --out (default runs/gmlp_cifar or runs/amlp_cifar, with a suffix for
non-default variants): checkpoint.npz, metrics.json, curves.png and spatial_weights.png
(each block's S x S spatial gating matrix, and the centre token's row on the patch grid).
"""

import sys

from cli import make_parser, model_args
from image_recipe import main


def build_parser():
    parser = make_parser(__doc__.splitlines()[0])
    g = model_args(parser)
    g.add_argument("--attn-dim", type=int, default=0,
                   help="width of aMLP's tiny attention (64 in the paper); 0: plain gMLP")
    g.add_argument("--toeplitz", choices=["none", "1d", "2d"], default="none",
                   help="spatial weights: dense, Toeplitz over the token index, or over the patch grid")
    g.add_argument("--sgu-variant", choices=["split", "linear", "additive", "multiplicative"], default="split",
                   help="the spatial gating unit's form (the gMLP paper's ablation; split is gMLP's)")
    g.add_argument("--dim", type=int, default=None, help="d_model (preset: 128)")
    g.add_argument("--depth", type=int, default=None, help="blocks (preset: 8)")
    g.add_argument("--ffn-dim", type=int, default=None, help="d_ffn (preset: 768)")
    return parser


def model_spec(args):
    from tinymlp.plot import spatial_weights

    if args.attn_dim < 0:
        raise SystemExit("error: --attn-dim must be 0 (gMLP) or positive (aMLP)")
    preset = "amlp_cifar" if args.attn_dim else "gmlp_cifar"
    overrides = {k: getattr(args, k) for k in ("dim", "depth", "ffn_dim") if getattr(args, k) is not None}
    if args.attn_dim:
        overrides["attn_dim"] = args.attn_dim
    if args.toeplitz != "none":
        overrides["toeplitz"] = args.toeplitz
    if args.sgu_variant != "split":
        overrides["sgu_variant"] = args.sgu_variant
    return preset, overrides, spatial_weights, "spatial_weights.png"


if __name__ == "__main__":
    sys.exit(main(build_parser(), model_spec))
