"""Train the course work's CIFAR MLP-Mixer from scratch.

    python examples/train_cifar_mixer.py --device cuda              # CIFAR-10, downloaded once
    python examples/train_cifar_mixer.py --data-dir ~/data/cifar    # a copy you already have
    python examples/train_cifar_mixer.py --dataset synthetic --epochs 5   # offline, no download

The model is the "mixer_cifar" preset: 4 x 4 patches (S = 64 tokens), C = 256 channels,
token MLP D_S = 256, channel MLP D_C = 1024, 8 blocks (the course work's section 2.2).
The training recipe and where its defaults come from: examples/image_recipe.py. Outputs go to
--out (default runs/mixer_cifar): checkpoint.npz, metrics.json, curves.png and
token_mixing.png (the first block's token-mixing weights on the patch grid).
"""

import sys

from cli import make_parser, model_args
from image_recipe import main


def build_parser():
    parser = make_parser(__doc__.splitlines()[0])
    g = model_args(parser)
    g.add_argument("--dim", type=int, default=None, help="channels C (preset: 256)")
    g.add_argument("--depth", type=int, default=None, help="Mixer blocks (preset: 8)")
    g.add_argument("--token-mlp-dim", type=int, default=None, help="token MLP width D_S (preset: 256)")
    g.add_argument("--channel-mlp-dim", type=int, default=None, help="channel MLP width D_C (preset: 1024)")
    g.add_argument("--dropout", type=float, default=None, help="dropout in the MLPs (preset: 0)")
    return parser


def model_spec(args):
    from tinymlp.plot import token_mixing_weights

    names = ("dim", "depth", "token_mlp_dim", "channel_mlp_dim", "dropout")
    overrides = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    return "mixer_cifar", overrides, token_mixing_weights, "token_mixing.png"


if __name__ == "__main__":
    sys.exit(main(build_parser(), model_spec))
