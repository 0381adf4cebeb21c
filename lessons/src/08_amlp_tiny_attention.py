# Source of lessons/08_amlp_tiny_attention.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 8: aMLP, a tiny attention where a fixed $W$ cannot route
#
# In a gMLP block token $i$ reads token $j$ with weight $W_{ij}$, and after training $W$ is a
# fixed matrix: the same for every input. It routes by **position** ("token 5 reads token 3"),
# never by **content** ("token 5 reads whichever token carries the same key as itself").
# The course work (section 3.4) notes that gMLP falls behind BERT on MNLI, where a model
# must relate words of two sentences wherever they sit, and follows the gMLP paper in adding
# a *tiny* single-head attention to the gate; the result is called **aMLP**:
#
# $$s(Z) = Z_1 \odot \bigl(W\,\mathrm{LN}(Z_2) + b + \mathrm{TinyAttn}(\hat X)\bigr), \qquad
#   \mathrm{TinyAttn}(\hat X) = \mathrm{softmax}\!\Bigl(\frac{Q K^\top}{\sqrt{d_{attn}}}\Bigr) V\, W_o ,$$
#
# with $[Q, K, V] = \hat X W_{qkv}$ computed from the block's normalised input $\hat X$ and
# $d_{attn} = 64$ in the paper (one head). The attention weight $A_{ij}$ now depends on what
# tokens $i$ and $j$ contain. Table 9 of the course work: aMLP 77.1 vs gMLP 75.5 on MNLI-m.
#
# **Objectives.** In this lesson we build a task that needs content-based routing, train a gMLP and an
# aMLP on it, and look inside the attention to see the routing happen.
#
# **Prerequisites:** lessons 5 (attention) and 7 (gMLP and the SGU).
#
# **Exercises:** 08.1 (the attention weights from queries and keys, to look inside the trained
# model), 08.2 (tiny attention's parameter count).
#
# **In tinymlp:** `tinymlp/nn/attention.py` (`TinyAttention`: one `Linear` to $[Q,K,V]$, the fused
# `F.attention`, one `Linear` out), `tinymlp/models/gmlp.py` (`GMLPBlock(attn_dim=...)` feeds the
# attention into the SGU's `gate_residual`), `tinymlp/ops/gating.py` (where the gate adds it).

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import tinymlp
from tinymlp import F, nn
from tinymlp.models import GMLPBlock
from tinymlp.optim import AdamW
from tinymlp.lessons import check, skipped   # the checks: tinymlp/lessons/checks/, one file per lesson

lesson_start = time.perf_counter()

# %% [markdown]
# ## 1. A task that needs routing by content: find the partner
#
# A sequence has $S = 16$ tokens in two halves of 8. Every token carries a **key**, a unit
# vector from a fixed code book of 64; all keys in a sequence are different except one pair:
#
# - the **query**, at a random position in the first half, is flagged by an extra feature;
# - its **partner**, at a random position in the second half, has the same key as the query.
#
# The tokens of the second half also carry a **value**, one of 4 classes (one-hot), and the
# label of the sequence is the partner's value. To rule out a shortcut, each class appears
# exactly twice in the second half, so counting values says nothing: the only way to the
# label is to compare the query's key with all eight keys of the second half and read the
# value where they match. Since the partner can be anywhere, no fixed weight $W_{ij}$ knows
# where to read. The data is a few lines of NumPy, and fresh sequences are drawn for every
# batch, so there is nothing to memorise.

# %%
S, HALF, NUM_KEYS, KEY_DIM, CLASSES = 16, 8, 64, 8, 4
FEATURES = KEY_DIM + CLASSES + 1                      # [key | value one-hot | query flag]
CODE_BOOK = np.random.default_rng(123).standard_normal((NUM_KEYS, KEY_DIM)).astype(np.float32)
CODE_BOOK /= np.linalg.norm(CODE_BOOK, axis=1, keepdims=True)

def partner_task(rng, batch):
    # Sequences (batch, S, FEATURES), labels (batch,), and where the query and partner are.
    rows = np.arange(batch)
    keys = np.argsort(rng.random((batch, NUM_KEYS)), axis=1)[:, :S]      # S different keys
    query = rng.integers(0, HALF, size=batch)
    partner = HALF + rng.integers(0, HALF, size=batch)
    keys[rows, partner] = keys[rows, query]                                # the one repeated key
    values = rng.permuted(np.tile(np.arange(CLASSES), (batch, HALF // CLASSES)), axis=1)

    x = np.zeros((batch, S, FEATURES), dtype=np.float32)
    x[:, :, :KEY_DIM] = CODE_BOOK[keys]
    x[:, HALF:, KEY_DIM:KEY_DIM + CLASSES] = np.eye(CLASSES, dtype=np.float32)[values]
    x[rows, query, -1] = 1.0
    return x, values[rows, partner - HALF], query, partner

x_test, y_test, q_test, p_test = partner_task(np.random.default_rng(99), 500)
print("test set:", x_test.shape, "labels per class:", np.bincount(y_test))

fig, ax = plt.subplots(figsize=(8, 3))
ax.imshow(x_test[0].T, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
ax.axhline(KEY_DIM - 0.5, color="k", lw=0.8)
ax.axhline(KEY_DIM + CLASSES - 0.5, color="k", lw=0.8)
ax.axvline(HALF - 0.5, color="k", lw=1.5)
for pos, name in ((q_test[0], "query"), (p_test[0], "partner")):
    ax.add_patch(plt.Rectangle((pos - 0.5, -0.5), 1, KEY_DIM, fill=False, ec="gold", lw=2.5))
    ax.text(pos, -0.7, name, ha="center", va="bottom", fontsize=8)
ax.set_yticks([KEY_DIM / 2 - 0.5, KEY_DIM + CLASSES / 2 - 0.5, FEATURES - 1], ["key", "value", "flag"])
ax.set_xlabel("token")
ax.set_title(f"one sequence (label = the partner's value = {y_test[0]})", fontsize=10, pad=16)
plt.show()

# the shortcut is gone: the most frequent value of the second half says nothing
assert np.all(np.bincount(x_test[:, HALF:, KEY_DIM:KEY_DIM + CLASSES].argmax(-1).ravel()) == 500 * 2)
assert np.allclose(x_test[np.arange(500), q_test, :KEY_DIM], x_test[np.arange(500), p_test, :KEY_DIM])

# %% [markdown]
# ## 2. Two models from the same blocks
#
# `tinymlp.models.GMLP` takes images; for sequences we assemble the same parts by hand: a
# `Linear` embedding of each token, two `GMLPBlock`s, a `LayerNorm`, the mean over tokens
# and a `Linear` classifier. `GMLPBlock(..., attn_dim=16)` is an aMLP block: its
# `TinyAttention` reads the normalised block input and is added inside the gate. We also
# train a **wider** gMLP with more parameters than the aMLP, to make sure that what we see is
# about the kind of mixing and not about size.

# %%
class SequenceClassifier(nn.Module):
    def __init__(self, dim=32, depth=2, attn_dim=None, seed=0):
        super().__init__()
        g = np.random.default_rng(seed)
        self.embed = nn.Linear(FEATURES, dim, rng=g)
        self.blocks = nn.Sequential(*[GMLPBlock(S, dim, 4 * dim, attn_dim=attn_dim, rng=g)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, CLASSES, rng=g)

    def forward(self, x):                              # x: (B, S, FEATURES)
        h = self.blocks(self.embed(x))
        return self.head(self.norm(h).mean(axis=1))   # mean over tokens: (B, CLASSES)

MODELS = {
    "gMLP": lambda: SequenceClassifier(dim=32),
    "gMLP, wider": lambda: SequenceClassifier(dim=40),
    "aMLP": lambda: SequenceClassifier(dim=32, attn_dim=16),
}
for name, make in MODELS.items():
    print(f"{name:>12}: {make().num_parameters():,} parameters")
print(SequenceClassifier(attn_dim=16).blocks[0])

# %% [markdown]
# ## 3. Training
#
# Same optimiser, same learning rate, same 400 steps of 64 fresh sequences for all three;
# every 25 steps we measure the accuracy on the 500 test sequences (chance: 25 %).

# %%
def accuracy(model, x, y):
    with tinymlp.no_grad():
        return float((model(tinymlp.tensor(x)).numpy().argmax(-1) == y).mean())

def train(model, steps=400, every=25, seed=0):
    optimizer = AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    curve = {"step": [0], "loss": [np.log(CLASSES)], "acc": [accuracy(model, x_test, y_test)]}
    losses = []
    for step in range(1, steps + 1):
        x, y, _, _ = partner_task(rng, 64)
        loss = F.cross_entropy(model(tinymlp.tensor(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % every == 0:
            curve["step"].append(step)
            curve["loss"].append(np.mean(losses[-every:]))
            curve["acc"].append(accuracy(model, x_test, y_test))
    return curve

curves, models = {}, {}
for name, make in MODELS.items():
    start = time.perf_counter()
    models[name] = make()
    curves[name] = train(models[name])
    print(f"{name:>12}: test accuracy {curves[name]['acc'][-1]:.3f}  ({time.perf_counter() - start:.1f} s)")

fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.4))
for name, c in curves.items():
    ax_loss.plot(c["step"], c["loss"], label=name)
    ax_acc.plot(c["step"], 100 * np.array(c["acc"]), label=name)
ax_acc.axhline(100 / CLASSES, color="grey", ls="--", lw=1, label="chance")
ax_loss.set_ylabel("training loss")
ax_acc.set_ylabel("test accuracy (%)")
for ax in (ax_loss, ax_acc):
    ax.set_xlabel("step")
    ax.legend()
plt.tight_layout()
plt.show()

final = {name: c["acc"][-1] for name, c in curves.items()}
assert final["aMLP"] > 0.8, "the tiny attention solves the task"
assert final["gMLP"] < 0.4 and final["gMLP, wider"] < 0.4, "the fixed W does not (in this budget)"
assert final["aMLP"] - max(final["gMLP"], final["gMLP, wider"]) > 0.4

# %% [markdown]
# Both gMLPs stay at chance: their loss never leaves $\ln 4 \approx 1.39$. The aMLP sits
# there too for a while, then its loss drops to near zero within a few dozen steps: the
# moment its query and key projections line up so that equal keys give a large dot product.
# Strictly, a deep gMLP is not helpless (its gates multiply token features, and products are
# what comparing keys needs), but it would have to build the comparison out of position-wise
# pieces; here it finds nothing in 400 steps, and a wider one does no better.
#
# ## 4. Looking inside: where does the query look?
#
# Recompute the first block's attention weights from its parts,
# $A = \mathrm{softmax}(QK^\top/\sqrt{d_{attn}})$ with $[Q, K, V] = \mathrm{LN}(X)\,W_{qkv}$, exactly as
# `TinyAttention.forward` does before it multiplies by $V$.
#
# **Exercise 08.1.** Write `attention_weights(q, k)` for tinymlp tensors of shape
# $(B, S, d)$ with tinymlp operations (`@`, `.transpose(0, 2, 1)`, `F.softmax(..., axis=-1)`).
#
# *Predict, then run:* most rows of $A$ will look alike. Where will a token that is *not* the
# query put most of its weight?

# %%
def attention_weights(q, k):
    """A = softmax(q k^T / sqrt(d)) over the keys, for q and k of shape (B, S, d)."""
    # BEGIN SOLUTION 08.1
    return F.softmax((q @ k.transpose(0, 2, 1)) * (1 / np.sqrt(q.shape[-1])), axis=-1)
    # END SOLUTION


weights_done = check("08.1", attention_weights)

# %%
amlp = models["aMLP"]
block = amlp.blocks[0]
with tinymlp.no_grad():
    h = block.norm(amlp.embed(tinymlp.tensor(x_test)))
    q, k, v = tinymlp.split(block.attn.qkv(h), 3, axis=-1)
    A = attention_weights(q, k).numpy() if weights_done else None

rows = np.arange(len(x_test))
if A is None:
    skipped("08.1", "the attention maps of the trained aMLP (uniform weights stand in)")
    A = np.full((len(x_test), S, S), 1.0 / S)
looks_at_partner = np.mean(A[rows, q_test].argmax(-1) == p_test)
weight_on_partner = A[rows, q_test, p_test].mean()
print(f"the query's strongest attention is on its partner in {looks_at_partner:.1%} of the test sequences")
print(f"mean attention weight from query to partner: {weight_on_partner:.2f} (uniform would be {1 / S:.3f})")

fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
for ax, n in zip(axes, range(3)):
    ax.imshow(A[n], cmap="viridis", vmin=0, vmax=1)
    ax.plot(p_test[n], q_test[n], "rs", ms=9, mfc="none", mew=2)
    ax.set_title(f"sequence {n}: query {q_test[n]}, partner {p_test[n]}", fontsize=9)
    ax.set_xlabel("attends to token j")
    ax.set_ylabel("token i")
plt.tight_layout()
plt.show()

assert looks_at_partner > 0.8 or not weights_done

# %% [markdown]
# Most rows are close to the diagonal: a token's own key is the best match it can find, so it
# attends to itself. The query's row is the exception the task needs: the red square marks
# (query row, partner column), and the query puts nearly all its weight on its partner,
# wherever the partner is. That is the routing a fixed $W$ cannot do:
# the weight was *computed from the content* of the two tokens. What the query receives,
# $A V W_o$, is then mostly the partner's value, added to the gate of the query token.

# %% [markdown]
# **Exercise 08.2.** Count the parameters of one `TinyAttention(dim_in, dim_out, attn_dim)`:
# a `Linear` to $[Q, K, V]$ without bias ($d_\text{in}\to 3d_{attn}$) and a `Linear` out with
# bias ($d_{attn}\to d_\text{out}$).

# %%
def tiny_attention_parameters(dim_in, dim_out, attn_dim):
    """The number of parameters of one tiny attention."""
    # BEGIN SOLUTION 08.2
    return dim_in * 3 * attn_dim + attn_dim * dim_out + dim_out
    # END SOLUTION


if check("08.2", tiny_attention_parameters):
    attn = models["aMLP"].blocks[0].attn                  # dim 32 -> gate width 64, attn_dim 16
    counted = sum(p.size for p in attn.parameters())
    assert tiny_attention_parameters(32, 64, 16) == counted
    print(f"formula {tiny_attention_parameters(32, 64, 16):,} == the aMLP block's {counted:,}")
else:
    skipped("08.2", "your count against the aMLP block's parameters")

# %% [markdown]
# **Costs.** The tiny attention adds $d\cdot 3 d_{attn} + d_{attn}\cdot e + e$ parameters per block
# ($d$ the model width, $e$ the gate width) and $O(S^2 d_{attn})$ work, the same order as the SGU's
# own $O(S^2 e)$. One head is enough because the SGU still does the positional mixing;
# attention only has to add what position cannot express. How "tiny" it is depends on the
# width: $d_{attn} = 64$ next to BERT-sized widths is small, next to the CIFAR presets' $d = 128$ it is not:

# %%
from tinymlp.models import num_parameters

gmlp_count, amlp_count = num_parameters("gmlp_cifar"), num_parameters("amlp_cifar")
print(f"gmlp_cifar: {gmlp_count:,} parameters; amlp_cifar: {amlp_count:,} (+{amlp_count / gmlp_count - 1:.0%})")
print(f"our sequence models: gMLP {MODELS['gMLP']().num_parameters():,}, "
      f"aMLP {MODELS['aMLP']().num_parameters():,} parameters")

# %% [markdown]
# **Summary.** gMLP mixes tokens with weights fixed after training: perfect for "read the token
# two to the left", useless for "read the token that matches me". A single small attention head,
# added inside the gate, supplies the content-dependent routing, which is why aMLP closes the gap
# to Transformers on sentence-pair tasks like MNLI.

# %%
print(f"lesson 8 ran in {time.perf_counter() - lesson_start:.0f} s")
