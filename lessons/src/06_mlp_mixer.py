# Source of lessons/06_mlp_mixer.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 6: MLP-Mixer
#
# MLP-Mixer keeps the patch tokens of ViT (lesson 5) and drops attention. Each block mixes
# the $S \times C$ table of tokens twice with ordinary two-layer MLPs: once **across tokens**
# (for each channel, a function of the $S$ patch values) and once **across channels** (for
# each token, a function of its $C$ features). Nothing else: no attention, no convolution,
# no position encoding.
#
# **Objectives.** In this lesson:
#
# 1. token mixing vs channel mixing: the shapes, and who talks to whom;
# 2. the cost: linear in the number of tokens, against attention's quadratic cost, counted and timed;
# 3. training a small Mixer on the synthetic set (seconds), and a control without token mixing;
# 4. the learned token-mixing weights, seen as images.
#
# **Prerequisites:** lessons 3-5 (Linear, GELU, LayerNorm; patches as tokens).
#
# **Exercises:** 06.1 (a block's parameter count), 06.2 (the token-mixing block from Linear
# layers), 06.3 (its floating-point operations).
#
# **In tinymlp:** `tinymlp/models/mixer.py` (`MLP`, `MixerBlock`, `MLPMixer`, about 100 lines
# that read like the paper), built from `tinymlp/nn` layers; `tinymlp/plot.py` draws the weights.

# %%
import time

import numpy as np
import matplotlib.pyplot as plt

import tinymlp
from tinymlp import F, nn, no_grad, optim, tensor
from tinymlp.data import DataLoader, Normalize, SyntheticImages
from tinymlp.models import MLP, MixerBlock, MLPMixer, ViTBlock
from tinymlp.lessons import check, skipped   # the checks: tinymlp/lessons/checks/, one file per lesson

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Token mixing and channel mixing
#
# After the patch embedding an image is a table $X \in \mathbb R^{S\times C}$: $S$ tokens
# (patches), $C$ channels. One Mixer block is
#
# $$U_{:,c} = X_{:,c} + W_2\,\sigma\bigl(W_1\,\mathrm{LN}(X)_{:,c}\bigr) \quad c = 1..C
#   \qquad\text{(token mixing: an MLP } \mathbb R^S \to \mathbb R^S \text{ on every column)}$$
#
# $$Y_{s,:} = U_{s,:} + W_4\,\sigma\bigl(W_3\,\mathrm{LN}(U)_{s,:}\bigr) \quad s = 1..S
#   \qquad\text{(channel mixing: an MLP } \mathbb R^C \to \mathbb R^C \text{ on every row)}$$
#
# with $\sigma$ = GELU and LayerNorm over the channels of each token (lesson 4). The token
# MLP has hidden width $D_S$, the channel MLP $D_C$. The same token MLP serves every channel
# and the same channel MLP every token: that weight sharing is what keeps Mixer small.
#
# In code, every MLP runs along the *last* axis, so token mixing transposes
# $(B, S, C) \to (B, C, S)$, applies the MLP, and transposes back. In tinymlp a weight is
# stored as (in, out), so `token_mlp.fc1.weight` is $W_1^\top$, of shape $(S, D_S)$.

# %%
S, C, D_S, D_C = 16, 32, 24, 64
block = MixerBlock(num_tokens=S, dim=C, token_mlp_dim=D_S, channel_mlp_dim=D_C, rng=0)
for name, p in block.named_parameters():
    print(f"{name:24s} {tuple(p.shape)}")

# %% [markdown]
# **Exercise 06.1.** How many parameters does one block have? Two LayerNorms over $C$ (a
# weight and a bias each), the token MLP ($S\to D_S\to S$) and the channel MLP
# ($C\to D_C\to C$), each two `Linear`s with biases. Write the count as a formula.

# %%
def mixer_block_parameters(S, C, D_S, D_C):
    """The number of parameters of one Mixer block."""
    # BEGIN SOLUTION 06.1
    norms = 2 * (2 * C)
    token_mlp = S * D_S + D_S + D_S * S + S
    channel_mlp = C * D_C + D_C + D_C * C + C
    return norms + token_mlp + channel_mlp
    # END SOLUTION


if check("06.1", mixer_block_parameters):
    counted = sum(p.size for p in block.parameters())
    print(f"formula {mixer_block_parameters(S, C, D_S, D_C):,} == the block's {counted:,} parameters")
    assert mixer_block_parameters(S, C, D_S, D_C) == counted
else:
    skipped("06.1", "your count against the block's parameters")

# %% [markdown]
# **Exercise 06.2.** The token-mixing half of a block, from `nn.Linear` layers: normalise
# over the channels, transpose $(B, S, C) \to (B, C, S)$ so that the token MLP runs along the
# last axis, `fc1`, GELU, `fc2`, transpose back, and add the residual:
# $U = X + \bigl(\mathrm{GELU}(\mathrm{LN}(X)^\top W_1 + b_1)\,W_2 + b_2\bigr)^\top$ per sample.
# (`F.gelu`, `x.transpose(0, 2, 1)`.)

# %%
class TokenMixing(nn.Module):
    """x + T(MLP_S(T(LN(x)))) on tokens x of shape (B, S, C), T the transpose of the last two axes."""

    def __init__(self, num_tokens, dim, hidden, rng=None):
        super().__init__()
        rng = np.random.default_rng(rng)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(num_tokens, hidden, rng=rng)     # weight (S, D_S)
        self.fc2 = nn.Linear(hidden, num_tokens, rng=rng)     # weight (D_S, S)

    def forward(self, x):
        # BEGIN SOLUTION 06.2
        h = self.norm(x).transpose(0, 2, 1)                   # (B, C, S): tokens on the last axis
        h = self.fc2(F.gelu(self.fc1(h)))                     # the token MLP, shared by channels
        return x + h.transpose(0, 2, 1)                       # back to (B, S, C), plus the residual
        # END SOLUTION


token_mixing_done = check("06.2", TokenMixing)

# %% [markdown]
# The library's block has the same pieces under the names `norm1` and `token_mlp`
# (`token_mlp.fc1.weight` is $(S, D_S)$); it is the first line of `MixerBlock.forward`.
# Copy its weights into yours and compare:

# %%
def token_mixing(h):
    """The library block's token MLP along the token axis of h (B, S, C)."""
    return block.token_mlp(h.transpose(0, 2, 1)).transpose(0, 2, 1)


x = tensor(rng.normal(size=(2, S, C)))                       # (batch, tokens, channels)
mixed = token_mixing(block.norm1(x))
print("x", x.shape, "-> token mixing -> ", mixed.shape, "-> block ->", block(x).shape)
if token_mixing_done:
    mine = TokenMixing(S, C, D_S)
    for mine_p, theirs in [(mine.norm.weight, block.norm1.weight), (mine.norm.bias, block.norm1.bias),
                           (mine.fc1.weight, block.token_mlp.fc1.weight), (mine.fc1.bias, block.token_mlp.fc1.bias),
                           (mine.fc2.weight, block.token_mlp.fc2.weight), (mine.fc2.bias, block.token_mlp.fc2.bias)]:
        mine_p.data[...] = theirs.data
    with no_grad():
        assert np.allclose(mine(x).numpy(), (x + mixed).numpy(), atol=1e-5)
    print("TokenMixing == the library block's token-mixing half")
else:
    skipped("06.2", "your TokenMixing against the library block's token-mixing half")

# %% [markdown]
# ### Who talks to whom
#
# Perturb the input and see which outputs move:
#
# - the **channel MLP** alone, with token 5 perturbed: only row 5 changes. Tokens never see
#   each other; this is a $1\times1$ convolution over the patch grid.
# - the **token MLP** alone, with channel 3 perturbed: only column 3 changes. Channels never
#   see each other; this is a convolution with a kernel as large as the whole image, shared
#   by all channels.
# - the **whole block**, with token 5 perturbed: everything changes. Alternating the two
#   kinds of mixing lets information flow between any token and any channel.

# %%
def change(fn, x, x_perturbed):
    with no_grad():
        return np.abs(fn(tensor(x_perturbed)).numpy() - fn(tensor(x)).numpy())[0]


x_np = rng.normal(size=(1, S, C))
tok5, ch3 = x_np.copy(), x_np.copy()
tok5[0, 5, :] += rng.normal(size=C)
ch3[0, :, 3] += rng.normal(size=S)

panels = {
    "channel MLP, token 5 perturbed": change(block.channel_mlp, x_np, tok5),
    "token mixing, channel 3 perturbed": change(token_mixing, x_np, ch3),
    "whole block, token 5 perturbed": change(block, x_np, tok5),
}
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
for ax, (title, delta) in zip(axes, panels.items()):
    ax.imshow(delta > 1e-6, cmap="Greys", vmin=0, vmax=1)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("channel")
    ax.set_ylabel("token")
plt.suptitle("Which outputs change (black)")
plt.show()

changed = {k: v > 1e-6 for k, v in panels.items()}
assert changed["channel MLP, token 5 perturbed"].any(axis=1).nonzero()[0].tolist() == [5]
assert changed["token mixing, channel 3 perturbed"].any(axis=0).nonzero()[0].tolist() == [3]
assert changed["whole block, token 5 perturbed"].all()

# %% [markdown]
# ## 2. Cost: linear in the number of tokens
#
# Count the multiply-adds of one block per image (a multiply-add is 2 floating-point
# operations). Token mixing applies an $S \to D_S \to S$ MLP to each of the $C$ columns, channel
# mixing a $C \to D_C \to C$ MLP to each of the $S$ rows:
#
# $$\text{Mixer block:}\quad 4\,S\,D_S\,C \;+\; 4\,S\,C\,D_C .$$
#
# A Transformer block has the same channel MLP, and instead of token mixing, multi-head
# self-attention: the projections to $q, k, v$ and back ($8\,S\,C^2$), plus the score
# matrix $QK^\top$ and the product $PV$, each $2\,S^2 C$:
#
# $$\text{Transformer block:}\quad 8\,S\,C^2 + 4\,S^2 C \;+\; 4\,S\,C\,D_C .$$
#
# With the hidden width $D_S$ fixed, the Mixer block costs $O(S)$; attention costs $O(S^2)$.
# The price Mixer pays: the token MLP's weights have a row per position ($S \times D_S$),
# so a Mixer is built for one number of tokens (one image resolution and patch size), while
# the same attention block accepts any $S$.
#
# **Exercise 06.3.** Write the Mixer block's count, $4\,S\,D_S\,C + 4\,S\,C\,D_C$, as a function
# of its four sizes, and make sure you can say where each term comes from.
#
# *Predict, then run:* doubling $S$ from 1024 to 2048, by what factor does each block's forward
# time grow?

# %%
def mixer_block_flops(S, C, D_S, D_C):
    """Floating-point operations of one Mixer block's forward pass, for one image."""
    # BEGIN SOLUTION 06.3
    token_mixing = 2 * (S * D_S * C) * 2       # two matrix products of S x D_S multiply-adds, per channel
    channel_mixing = 2 * (C * D_C * S) * 2     # two matrix products of C x D_C multiply-adds, per token
    return token_mixing + channel_mixing
    # END SOLUTION


check("06.3", mixer_block_flops)

# %% [markdown]
# Measure it: one Mixer block and one Transformer block (`tinymlp.models.ViTBlock`, 4 heads),
# both with $C = 64$ and $D_C = 256$ (and $D_S = 64$), forward pass on 4 sequences of $S$
# tokens, best of three runs. (On a busy machine timings are noisy; the shape of the curves
# is what matters.)

# %%
C, D_S, D_C, batch = 64, 64, 256, 4
lengths = [64, 128, 256, 512, 1024, 2048]


def best_time(fn, x, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        with no_grad():
            fn(x)
        best = min(best, time.perf_counter() - start)
    return best


times = {"Mixer block": [], "Transformer block": []}
flops = {"Mixer block": [], "Transformer block": []}
attention_block = ViTBlock(dim=C, heads=4, mlp_dim=D_C, rng=0)      # one block serves every S
for n in lengths:
    xs = tensor(rng.normal(size=(batch, n, C)))
    mixer_block = MixerBlock(num_tokens=n, dim=C, token_mlp_dim=D_S, channel_mlp_dim=D_C, rng=0)
    times["Mixer block"].append(best_time(mixer_block, xs))
    times["Transformer block"].append(best_time(attention_block, xs))
    flops["Mixer block"].append(batch * (4 * n * D_S * C + 4 * n * C * D_C))
    flops["Transformer block"].append(batch * (8 * n * C * C + 4 * n * n * C + 4 * n * C * D_C))
    print(f"S = {n:5d}:  Mixer {1e3 * times['Mixer block'][-1]:7.1f} ms   "
          f"Transformer {1e3 * times['Transformer block'][-1]:7.1f} ms")

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4))
for name in times:
    ax0.loglog(lengths, flops[name], "o-", label=name)
    ax1.loglog(lengths, 1e3 * np.array(times[name]), "o-", label=name)
ref = np.array(lengths, dtype=float)
ax1.loglog(ref, 1e3 * times["Mixer block"][2] * ref / ref[2], "k:", lw=1, label="slope 1 (linear)")
ax1.loglog(ref, 1e3 * times["Transformer block"][-1] * (ref / ref[-1]) ** 2, "k--", lw=1, label="slope 2 (quadratic)")
ax0.set_title("floating-point operations (counted)")
ax1.set_title("forward time (measured)")
ax1.set_ylabel("ms")
for ax in (ax0, ax1):
    ax.set_xlabel("number of tokens S")
    ax.legend()
plt.show()

# per doubling of S the counts grow 2x (Mixer) and more than 3x (attention, tending to 4x)
assert flops["Mixer block"][-1] / flops["Mixer block"][-2] == 2
assert flops["Transformer block"][-1] / flops["Transformer block"][-2] > 3

# %% [markdown]
# ## 3. Training a small Mixer
#
# The synthetic set (`tinymlp.data.SyntheticImages`, met in lesson 5) has ten classes that
# differ only in where a blue square sits relative to a red cross. The colours and shapes of
# every image are alike: to classify, a model has to relate two patches. With $8\times8$
# patches each cell of the image's $4\times4$ grid is one token.
#
# The training loop is the one of lesson 2 with three additions: a `DataLoader` that
# shuffles and normalises batches, AdamW with weight decay on the weight matrices only
# (`optim.param_groups`), and a learning rate that warms up and then decays along a cosine
# (`optim.WarmupCosine`). (`tinymlp.train` wraps the same loop with progress bars and
# metrics; lesson 11 uses it.)

# %%
train_set = SyntheticImages(num_images=5000, seed=0)
test_set = SyntheticImages(num_images=1000, seed=0, train=False)
normalize = Normalize(train_set.mean, train_set.std)
print(train_set, "|", test_set)


def evaluate(model):
    correct = 0
    with no_grad():
        for images, labels in DataLoader(test_set, batch_size=500, transform=normalize):
            correct += int((model(images).argmax(axis=1).numpy() == labels.numpy()).sum())
    return correct / len(test_set)


def train(model, epochs, lr=5e-3, batch_size=64):
    loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, rng=0, transform=normalize)
    opt = optim.AdamW(optim.param_groups(model, weight_decay=0.01), lr=lr)
    schedule = optim.WarmupCosine(opt, warmup_steps=20, total_steps=epochs * len(loader))
    losses, accuracies = [], []
    start = time.perf_counter()
    for epoch in range(epochs):
        for images, labels in loader:
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            losses.append(loss.item())
        accuracies.append(evaluate(model))
        print(f"epoch {epoch + 1}: loss {np.mean(losses[-len(loader):]):.3f}, "
              f"test accuracy {accuracies[-1]:.1%}  ({time.perf_counter() - start:.1f} s)")
    return losses, accuracies


mixer = MLPMixer(image_size=32, patch_size=8, in_channels=3, num_classes=10,
                 dim=32, depth=2, token_mlp_dim=32, channel_mlp_dim=64, seed=0)
initial_token_weights = mixer.blocks[0].token_mlp.fc1.weight.numpy().copy()
print(f"MLPMixer with {mixer.num_parameters():,} parameters")
mixer_losses, mixer_acc = train(mixer, epochs=6)

# %% [markdown]
# ### A control: the same model without token mixing
#
# Replace every Mixer block by its channel-mixing half only. Each token is then processed
# on its own, and the classifier sees the average of the tokens: it knows *which* patches
# the image contains but not *where* they are. On this data set that is worthless.

# %%
class ChannelOnly(nn.Module):
    """Patch embedding, then pre-LN residual channel MLPs only, mean over tokens, linear head."""

    def __init__(self, dim=32, depth=2, hidden=64, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.patch_embed = nn.PatchEmbedding(32, 8, 3, dim, rng=rng)
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(depth)])
        self.mlps = nn.ModuleList([MLP(dim, hidden, rng=rng) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10, rng=rng)

    def forward(self, images):
        x = self.patch_embed(images)
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return self.head(self.norm(x).mean(axis=1))


control_losses, control_acc = train(ChannelOnly(), epochs=3)

# %%
steps_per_epoch = len(mixer_losses) // len(mixer_acc)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4))
ax0.plot(mixer_losses, lw=0.8, label="MLP-Mixer")
ax0.plot(control_losses, lw=0.8, label="channel mixing only")
ax0.axhline(np.log(10), color="0.6", ls="--", label="ln 10 (chance)")
ax0.set_xlabel("step")
ax0.set_ylabel("training loss")
ax0.legend()
ax1.plot(np.arange(1, len(mixer_acc) + 1), mixer_acc, "o-", label="MLP-Mixer")
ax1.plot(np.arange(1, len(control_acc) + 1), control_acc, "o-", label="channel mixing only")
ax1.axhline(0.1, color="0.6", ls="--", label="chance")
ax1.set_xlabel("epoch")
ax1.set_ylabel("test accuracy")
ax1.set_ylim(0, 1.02)
ax1.legend()
plt.show()
print(f"Mixer: {mixer_acc[-1]:.1%}   without token mixing: {control_acc[-1]:.1%}   chance: 10%")
assert mixer_acc[-1] > 0.8 and control_acc[-1] < 0.3

# %% [markdown]
# ## 4. The learned token-mixing weights
#
# Column $j$ of `token_mlp.fc1.weight` $(S, D_S)$ holds the $S$ weights with which hidden
# unit $j$ reads one channel across the image: one number per patch. Put those numbers back on
# the $4 \times 4$ patch grid and each unit becomes a small picture (red positive, blue
# negative, each scaled to its largest magnitude).
#
# Six short epochs move the weights by about half their initial size, so the trained units
# still resemble their random start. The structure is in the *change* (bottom rows): many units
# turned into contrasts between rows or between columns of the grid, one side against the
# other, which is what "is the square left or right of the cross, above or below it" needs.
# (On natural images, in the MLP-Mixer paper, trained units look like local blobs and stripes,
# learned without any notion of locality built in.)

# %%
trained_token_weights = mixer.blocks[0].token_mlp.fc1.weight.numpy()
change_of_weights = trained_token_weights - initial_token_weights
grid_h, grid_w = mixer.patch_embed.grid
rows = [("init", initial_token_weights), ("trained", trained_token_weights), ("change", change_of_weights)]
fig, axes = plt.subplots(3, 16, figsize=(14, 3.4))
for r, (label, weights) in enumerate(rows):
    for unit in range(16):
        ax = axes[r, unit]
        tile = weights[:, unit].reshape(grid_h, grid_w)      # one weight per patch, on the patch grid
        vmax = np.abs(tile).max()
        ax.imshow(tile, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[r, 0].set_ylabel(label)
fig.suptitle("Block 0, token-mixing units 0-15 on the 4x4 patch grid")
plt.show()
print("size of the change / size at init: "
      f"{np.linalg.norm(change_of_weights) / np.linalg.norm(initial_token_weights):.2f}")

# %% [markdown]
# "Rows against rows, columns against columns" can be measured. Fit each centred tile $T$
# with the best *additive* pattern $a_i + b_j$ (a value per grid row plus a value per grid
# column: the row and column means) and ask what share of $\|T\|^2$ it explains. For random
# tiles it is 0.4 on average ($6/15$: 6 of the 15 free directions of a centred
# $4\times 4$ tile); the change made by training is clearly more row-and-column shaped:

# %%
def row_column_share(weights):
    tiles = weights.T.reshape(-1, grid_h, grid_w)
    tiles = tiles - tiles.mean(axis=(1, 2), keepdims=True)
    additive = tiles.mean(axis=2, keepdims=True) + tiles.mean(axis=1, keepdims=True)
    return (additive**2).sum() / (tiles**2).sum()


for label, weights in rows:
    print(f"{label:8s} share explained by row + column patterns: {row_column_share(weights):.2f}")
assert row_column_share(change_of_weights) > 0.55

# %% [markdown]
# `tinymlp.plot.token_mixing_weights` draws the same pictures for any Mixer (and saves them
# with `path=...`), here all 32 units of the first block:

# %%
from tinymlp import plot

plot.token_mixing_weights(mixer, block=0)

# %% [markdown]
# ## What to remember
#
# - A Mixer block alternates an MLP over tokens (shared by all channels) and an MLP over
#   channels (shared by all tokens); the pair connects every token with every channel.
# - Its cost grows linearly with the number of tokens, attention's quadratically; in exchange
#   the token MLP is tied to one sequence length.
# - Token mixing is what relates patches: without it the model is at chance on a task about
#   positions. Its weights, drawn on the patch grid, show the spatial patterns it learns.
#
# **Next:** lesson 7, gMLP: mixing tokens with a *gate* instead of an MLP.
