"""Fine-tune a pretrained MLP-Mixer, gMLP or ViT (timm or official JAX weights) on CIFAR.

    python examples/finetune.py --pretrained mixer_b16_224.safetensors --device cuda            # CIFAR-10
    python examples/finetune.py --pretrained Mixer-B_16.npz --dataset cifar100 --device cuda    # official .npz
    python examples/finetune.py --pretrained vit_base_patch16_224.safetensors --heads 12 --image-size 384
    python examples/finetune.py --resume auto --out runs/finetune_mixer_b16_224                  # continue

The pretrained weights come from a .safetensors or .npz file in timm's layout (names such as
stem.proj.weight), in the official google-research/vision_transformer layout (names such as
MixerBlock_0/token_mixing/Dense_0/kernel), or from a training checkpoint of these scripts
(checkpoint.npz or best.npz of a run); the architecture and its sizes are read from the
file (a ViT from timm also needs --heads, or its timm name in the file name). A pickled .pth or
.bin is refused with the one-line command that converts it to .safetensors.

What the script does to the pretrained model:

- the head is replaced by a zero-initialised one for the dataset's class count (every class
  starts at logit 0), as the papers' fine-tuning does;
- the 32 x 32 CIFAR images are resized bilinearly on the device to --image-size (after the
  crop and flip augmentation), and normalised the way the model was pre-trained (--normalize);
- a ViT at another resolution gets its position embedding resampled to the new patch grid.
  MLP-Mixer's token-mixing and gMLP's spatial weights have one entry per token position, so
  those models fine-tune at their pretraining resolution (usually 224).

The recipe (defaults) is the papers' fine-tuning one (MLP-Mixer and ViT papers; the official
vision_transformer configs): SGD with momentum 0.9, no weight decay, gradient clipping at global
norm 1, a short linear warmup, then cosine decay. Their runs are 10,000 steps of batch 512
(about 100 CIFAR epochs) at lr 0.03 (swept over 0.001-0.03); the defaults here are a shorter
run at batch 128 and lr 0.01. Everything else (flags, outputs, checkpoints, --resume) is
shared with the CIFAR training scripts: see examples/image_recipe.py.
"""

import sys
from pathlib import Path

from cli import UsageError, make_parser
from image_recipe import main
from run_files import model_class

from tinymlp import checkpoint, interop, models

NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "synthetic": 10}


def build_parser():
    parser = make_parser(__doc__.splitlines()[0])
    g = parser.add_argument_group("pretrained model")
    g.add_argument("--pretrained", metavar="PATH", default=None,
                   help="weights to start from: .safetensors or .npz, timm or official JAX layout, or a "
                        "tinymlp run's checkpoint.npz/best.npz (needed for a new run; a resumed run reads "
                        "everything from its checkpoint)")
    g.add_argument("--heads", type=int, default=None,
                   help="attention heads of a ViT in timm's layout (not stored in its weights)")
    g.add_argument("--image-size", type=int, default=None, metavar="PIXELS",
                   help="fine-tuning resolution; images are resized to it on the device (default: the "
                        "pretrained model's). Mixer and gMLP fine-tune at their pretraining resolution "
                        "(their token-mixing / spatial weights are tied to the token count); a ViT may "
                        "change it (its position embedding is interpolated)")
    g.add_argument("--normalize", choices=["auto", "inception", "imagenet", "none", "dataset"], default="auto",
                   help="input normalisation, as the weights were pre-trained: 'inception' maps pixels to "
                        "[-1, 1] (the JAX Mixer and ViT, and timm's goog/augreg Mixer, gMLP and ViT weights), "
                        "'imagenet' uses ImageNet's mean and std (e.g. DeiT), 'none' keeps [0, 1] (timm's "
                        "miil Mixer), 'dataset' the CIFAR statistics; auto: 'dataset' for a file written by "
                        "tinymlp's save_timm, 'inception' otherwise")
    parser.set_defaults(optimizer="sgd", schedule="cosine", lr=0.01, weight_decay=0.0, epochs=10)
    parser.description = (__doc__.splitlines()[0] + " Mixer and gMLP fine-tune at their pretraining "
                          "resolution; a ViT may change it.")
    for action in parser._actions:
        if action.dest == "weight_decay":
            action.help = "weight decay (AdamW: decoupled; SGD: an L2 term); biases and norms are exempt"
    return parser


class Pretrained:
    """Reads the pretrained file once (in ``spec``, before the data), builds the model later."""

    def __init__(self):
        self.model = None

    def spec(self, args):
        """The run's name, weight plot and input pipeline, from the pretrained file (or the checkpoint)."""
        if args.pretrained is None:
            if args.resume is None:
                raise UsageError("--pretrained PATH is needed for a new run (or --resume a fine-tuning run)")
            return "finetune", {}, _plot_for(_resumed_class(args)), "weights.png"
        path = Path(args.pretrained)
        if not path.is_file():
            raise UsageError(f"--pretrained {path}: no such file")
        try:
            source = interop.weights_source(path)
            if args.resume is None or not _resumable(args):
                if source == "checkpoint":       # a run of these scripts: its model, as tinymlp.predict builds it
                    self.model = _checkpoint_model(path)
                else:
                    self.model = interop.load_pretrained(path, heads=args.heads,
                                                         num_classes=NUM_CLASSES.get(args.dataset))
        except (interop.InteropError, ImportError, checkpoint.CheckpointError) as err:
            raise UsageError(f"--pretrained {path}: {str(err).removeprefix(f'{path}: ')}") from None
        if self.model is not None:
            size = self.model.config["image_size"]
            if args.image_size is None:
                args.image_size = size if isinstance(size, int) else size[0]
            if args.image_size != size and not isinstance(self.model, models.ViT):
                raise UsageError(
                    f"--image-size {args.image_size}: {type(self.model).__name__} was pre-trained at {size} and "
                    "its token-mixing / spatial weights are tied to that token count: fine-tune it at "
                    f"--image-size {size}")
            patch = self.model.config["patch_size"]
            patch = patch if isinstance(patch, int) else patch[0]
            if args.image_size % patch:
                raise UsageError(f"--image-size {args.image_size}: not a multiple of the model's patch size {patch}")
            if args.normalize == "auto":
                args.normalize = _normalization_of(source)
            cls = type(self.model)
        else:
            cls = _resumed_class(args)
        return f"finetune_{path.stem}", {}, _plot_for(cls), "weights.png"

    def build(self, args, num_classes):
        model = self.model
        if model is None:
            raise UsageError("--pretrained PATH is needed for a new run")
        if num_classes != model.config["num_classes"]:
            interop.replace_head(model, num_classes)
        new_head = not model.head.weight.data.any()      # load_pretrained zeroes a head of another class count
        model = interop.change_image_size(model, args.image_size)
        print(f"pretrained: {args.pretrained} ({type(model).__name__}, {model.config['image_size']} px, "
              f"{'a new zero head' if new_head else 'its own head'} for {num_classes} classes, "
              f"normalize {args.normalize})")
        return model


def _normalization_of(source):
    # a tinymlp model (a training checkpoint, or written with save_timm) saw its dataset's statistics; the
    # JAX Mixer and ViT, and timm's mixer_*.goog_*, gmlp_s16_224.ra3 and vit_*.augreg/orig, saw [-1, 1]
    return "dataset" if source in ("tinymlp", "checkpoint") else "inception"


def _checkpoint_model(path):
    """The image model of a training checkpoint of these scripts (checkpoint.npz, best.npz)."""
    from tinymlp.predict import load_model

    model, meta = load_model(path)
    if isinstance(model, models.TextGMLP):
        raise UsageError(f"--pretrained {path}: a text model; fine-tune it with examples/train_text_gmlp.py "
                         f"--pretrained {path} (a masked-LM checkpoint) or continue its run with --resume")
    print(f"note: --pretrained {path} is a tinymlp training checkpoint ({type(model).__name__}, epoch "
          f"{meta.get('epoch')} on {meta.get('dataset')}): its weights are the start, the head is new")
    return model


def _resume_file(args):
    if args.resume is None:
        return None
    if args.resume == "auto":   # the folder image_recipe.run resumes from
        out = args.out or (Path("runs") / f"finetune_{Path(args.pretrained).stem}" if args.pretrained else None)
        path = Path(out) / "checkpoint.npz" if out else None
    else:
        path = Path(args.resume)
    return path if path is not None and path.is_file() else None


def _resumable(args):
    return _resume_file(args) is not None


def _resumed_class(args):
    path = _resume_file(args)
    if path is None:
        return None
    try:
        name = checkpoint.read_meta(path).get("model_class")
    except Exception:
        return None              # the shared code reports an unreadable checkpoint
    try:
        return model_class(name) if name else None     # only a class of tinymlp.models, never another name
    except checkpoint.CheckpointError:
        return None


def _plot_for(cls):
    """The weight plot of a model class (None for ViT, which has no mixing weights to show)."""
    from tinymlp.plot import spatial_weights, token_mixing_weights

    if cls is None:
        def plot(model, path):
            if isinstance(model, models.MLPMixer):
                token_mixing_weights(model, path)
            elif isinstance(model, models.GMLP):
                spatial_weights(model, path)
        return plot
    if issubclass(cls, models.MLPMixer):
        return token_mixing_weights
    if issubclass(cls, models.GMLP):
        return spatial_weights
    return None


if __name__ == "__main__":
    pretrained = Pretrained()
    sys.exit(main(build_parser(), pretrained.spec, build_model=pretrained.build))
