# Source of lessons/09_gpu.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 9: the same code on a GPU
#
# Every op in tinymlp starts with `xp = array_module(x)`: the module that owns the array,
# NumPy for a CPU array, CuPy for a GPU array. CuPy copies NumPy's interface, so the forward
# and backward formulas of every `Function` are written once and run on both devices
# (Chainer's idea). Choosing the device is a matter of where the arrays live:
#
# | what | how |
# |---|---|
# | a tensor | `tinymlp.tensor(data, device="cuda")`, `t.to("cuda")`, `t.cpu()` |
# | a model | `model.to("cuda")` (in place; build the optimizer *after* it) |
# | the data | `DataLoader(..., device="cuda")`: batches travel as uint8, then convert on the GPU |
# | training | `fit(model, ...)` trains wherever the model's parameters are |
#
# This notebook runs everywhere: where no GPU is usable it says why and what to install
# instead of failing, and it still shows the CPU side of every comparison.
#
# **Objectives.** Run a model on a GPU by moving where its arrays live; read `doctor`'s
# report; time the same training step on both devices and explain the difference; explain why
# a small GPU step waits for Python, and what capturing it into a CUDA graph changes.
#
# **Prerequisites:** lesson 6 or 7 (a model and its training loop). No exercises: this lesson
# is a demonstration that adapts to the machine it runs on.
#
# **In tinymlp:** `tinymlp/backend.py` (device names, `array_module`, `to_device`,
# `cuda_available`, `CudaUnavailableError`), `Tensor.to` in `tinymlp/tensor.py`, `Module.to` in
# `tinymlp/nn/module.py`, `tinymlp/train.py` (why the loop reads its metrics only every
# `sync_every` batches), and `tinymlp/fast/capture.py` (the step captured into a CUDA graph),
# with `tinymlp/fast/scalars.py` (what must change between replays) and `tinymlp/fast/cublas.py`
# (matrix products a graph can hold).

# %%
import os
import pathlib
import re
import subprocess
import sys
import time

import matplotlib.pyplot as plt
import numpy as np

import tinymlp
from tinymlp import F
from tinymlp.backend import array_module
from tinymlp.models import create
from tinymlp.optim import AdamW

lesson_start = time.perf_counter()

# %% [markdown]
# ## 1. What can this machine run?
#
# `python -m tinymlp doctor` reports the NumPy and BLAS in use, whether CuPy imports, which
# GPUs it sees, and runs a tiny forward and backward pass on each device. Run it first
# whenever a GPU does not do what you expect.

# %%
report = subprocess.run([sys.executable, "-m", "tinymlp", "doctor"], capture_output=True, text=True, check=False)
print(report.stdout or report.stderr)

GPU = tinymlp.cuda_available()
DEVICE = "cuda" if GPU else "cpu"
print("tinymlp.cuda_available():", GPU, "-> this notebook uses", DEVICE)
if not GPU:
    print("No usable GPU here: every GPU cell below explains what it would do and runs the CPU part.\n"
          "To use an NVIDIA GPU, install CuPy for your CUDA version:", tinymlp.backend.INSTALL_CUPY,
          "\nthen check with: python -m tinymlp doctor")

# %% [markdown]
# Asking for a device that cannot be used is an error that says what is missing, raised the
# moment you ask, not a crash deep inside an op:

# %%
try:
    t = tinymlp.tensor([1.0, 2.0, 3.0], device="cuda")
    print("a tensor on", t.device, "held by", type(t.data).__module__)
except tinymlp.CudaUnavailableError as err:
    print("CudaUnavailableError:", err)

# %% [markdown]
# ## 2. One code path
#
# The same `Function` serves both devices because it asks the array for its module. Here is
# a small computation through the public API on `DEVICE`: the data is a NumPy array on the
# CPU or a CuPy array on the GPU, and the gradient lands on the same device.

# %%
rng = np.random.default_rng(0)
a = rng.standard_normal((8, 16))
x = tinymlp.tensor(a, device=DEVICE, dtype="float64", requires_grad=True)
y = F.gelu(x @ x.transpose(1, 0)).sum()
y.backward()

print("x lives on", x.device, "as a", type(x.data).__module__ + "." + type(x.data).__name__)
print("xp for x.data is", array_module(x.data).__name__, "| grad on the same device:",
      type(x.grad).__module__)

# the same computation on the CPU, as the reference
x_cpu = tinymlp.tensor(a, dtype="float64", requires_grad=True)
F.gelu(x_cpu @ x_cpu.transpose(1, 0)).sum().backward()
grad = x.grad if not GPU else x.grad.get()           # CuPy arrays come home with .get()
assert np.allclose(grad, x_cpu.grad, rtol=1e-10, atol=1e-12)
print("gradients agree with the CPU to 1e-10")

# %% [markdown]
# ## 3. The same model, the same numbers
#
# A model is moved with `model.to(device)`: every parameter's array is replaced by a copy on
# the device (the `Parameter` objects stay the same). Weights travel between devices as plain
# NumPy arrays through `state_dict()` / `load_state_dict()`. A Mixer and its copy on the GPU
# must give the same logits up to float32 rounding: the GPU sums in a different order, so
# expect differences around $10^{-6}$, not zero. (Every tinymlp model starts with a zero
# classifier head, whose logits are all 0 whatever the device; we give the head random
# weights first so that the comparison means something.)

# %%
images = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
cpu_model = create("mixer_cifar", depth=2, seed=0)
cpu_model.head.weight.data[...] = 0.1 * rng.standard_normal(cpu_model.head.weight.shape)
with tinymlp.no_grad():
    cpu_logits = cpu_model(tinymlp.tensor(images)).numpy()

if GPU:
    gpu_model = create("mixer_cifar", depth=2, seed=1)           # other weights ...
    gpu_model.load_state_dict(cpu_model.state_dict())            # ... replaced by the CPU model's
    gpu_model.to("cuda")
    with tinymlp.no_grad():
        gpu_logits = gpu_model(tinymlp.tensor(images, device="cuda")).numpy()   # .numpy() copies to the host
    print("largest |cpu - gpu| logit difference:", np.abs(cpu_logits - gpu_logits).max())
    assert np.allclose(cpu_logits, gpu_logits, rtol=1e-3, atol=1e-4)
else:
    print("CPU logits of the first image:", np.round(cpu_logits[0], 4))
    print("(no GPU: a copy moved with .to('cuda') would print the same numbers up to ~1e-6)")

# %% [markdown]
# ## 4. Timing a training step
#
# One training step of the course work's CIFAR Mixer (`mixer_cifar`: 4.5M parameters,
# 64 tokens of 256 channels, 8 blocks) on a batch of 64 images. Two things matter when timing
# on a GPU:
#
# - **asynchrony**: CuPy queues kernels and returns at once; the host only waits when it
#   needs a value. So the clock must stop after something that waits for the GPU:
#   `loss.item()` does (it copies one number to the host). The training loop in
#   `tinymlp/train.py` avoids such waits: it accumulates its metrics on the device and
#   reads them every `sync_every` batches;
# - **warm-up**: the first steps compile CuPy's kernels and set up cuBLAS. They are run
#   before the clock starts.

# %%
def seconds_per_step(device, batch=64, warmup=1, steps=2):
    model = create("mixer_cifar", seed=0).to(device)
    optimizer = AdamW(model.parameters(), lr=1e-3)       # after .to(device)
    x = tinymlp.tensor(rng.standard_normal((batch, 3, 32, 32)), device=device)
    y = tinymlp.tensor(rng.integers(0, 10, size=batch), device=device)

    def step():
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(warmup):
        step().item()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.item()                                          # wait for the device to finish
    return (time.perf_counter() - start) / steps

timings = {"cpu": seconds_per_step("cpu")}
if GPU:
    timings["cuda"] = seconds_per_step("cuda", warmup=3, steps=20)
for device, sec in timings.items():
    print(f"{device:>4}: {1000 * sec:8.1f} ms per step, {64 / sec:8.0f} images/s, "
          f"one CIFAR-10 epoch (50,000 images) in {50_000 * sec / 64 / 60:.1f} min")

fig, ax = plt.subplots(figsize=(6, 3))
names = list(timings)
ax.bar(names, [1000 * timings[n] for n in names], color=["C0", "C2"][:len(names)])
ax.set_ylabel("ms per training step (batch 64)")
ax.set_title("mixer_cifar: one AdamW step", fontsize=10)
if GPU:
    ax.text(1, 1000 * timings["cuda"], f"{timings['cpu'] / timings['cuda']:.0f}x faster", ha="center", va="bottom")
else:
    ax.text(0.5, 0.5, "no GPU here:\nsee section 1", transform=ax.transAxes, ha="left", color="grey")
plt.show()
assert all(t > 0 for t in timings.values())

# %% [markdown]
# On a CPU a step of this model takes around a second or more (more on a small, busy
# machine), so one epoch of CIFAR-10 takes a good part of an hour and the course work's
# from-scratch runs of tens of epochs a day. A modern GPU does the same step in milliseconds,
# which turns such a run into minutes. The GPU only pays off when it has enough work per kernel: with tiny models (like
# the ones in lessons 7 and 8) the launch overhead of each kernel dominates and the CPU can
# even win. Try `seconds_per_step` with `batch=8` and `batch=256` on both devices.
#
# ## 5. Training on the GPU
#
# Nothing in the training code names a device. With a GPU, the whole run of lesson 11 moves
# by changing two arguments:
#
# ```python
# model = create("mixer_cifar").to("cuda")                     # 1. the model, then the optimizer
# optimizer = AdamW(param_groups(model, 0.05), lr=1e-3)
# loader = DataLoader(train, 128, shuffle=True, transform=augment, device="cuda")   # 2. the batches
# history = fit(model, optimizer, loader, val_loader, epochs=50, scheduler=sched, clip=1.0)
# ```
#
# or from the command line: `python examples/train_cifar_mixer.py --device cuda`.
# Checkpoints are written from host copies of the arrays (`tinymlp.checkpoint.save`), so a run
# trained on a GPU can be loaded on a laptop without one.

# %%
if GPU:
    from tinymlp.data import DataLoader, SyntheticImages
    from tinymlp.train import fit

    data = SyntheticImages(512, seed=0)
    loader = DataLoader(data, 128, shuffle=True, device="cuda")
    model = create("mixer_cifar", depth=2, seed=0).to("cuda")
    history = fit(model, AdamW(model.parameters(), lr=1e-3), loader, epochs=1, progress=False)
    print(f"one epoch on the GPU: loss {history.train_loss[-1]:.3f}, "
          f"{history.images_per_sec[-1]:.0f} images/s after the first step, which took "
          f"{history.warmup_time[-1]:.1f} s (CuPy compiling its kernels)")
    print("how its steps ran:", history.graph[-1])      # section 6 explains this line
else:
    print("no GPU: skipped the one-epoch run on 'cuda' (lesson 11 trains on the CPU)")

# %% [markdown]
# ## 6. Why a small step waits for Python, and what a graph changes
#
# Every op you write in Python becomes, on a GPU, a *launch*: the host (the CPU running your
# Python) asks the driver to start a kernel. A launch costs the host roughly 10 to 30
# microseconds of Python, CuPy and driver code, whatever the size of the arrays. The kernel
# itself, at batch 128, often runs in less. So for a small step the GPU finishes each kernel
# and then *waits* for the host to issue the next one: the step takes as long as the Python
# that issues it, and a faster GPU changes nothing.
#
# How many launches is a step? We can count them without a GPU: tinymlp's test suite has a
# stand-in for CuPy (`tests/cupy_standin.py`: NumPy underneath, CuPy's rules on top) that counts
# every operation that would reach the device. `benchmarks/gpu_launches.py` runs one Mixer
# training step on it:

# %%
ROOT = pathlib.Path(tinymlp.__file__).resolve().parents[1]
counter = ROOT / "benchmarks" / "gpu_launches.py"
counts = None
if counter.is_file():
    done = subprocess.run([sys.executable, str(counter), "--graph", "--models", "mixer_cifar", "--batch-size", "4"],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(done.stdout or done.stderr)
    eager = re.search(r"tinymlp\s+(\d+) device operations a step", done.stdout)
    replay = re.search(r"host operations per replayed step: (\d+)", done.stdout)
    if eager and replay:
        counts = {"eager step": int(eager.group(1)), "replayed graph": int(replay.group(1))}
else:
    print("benchmarks/gpu_launches.py is not here (tinymlp installed without its repository): "
          "clone the repository to count the launches")
print(counts)

# %% [markdown]
# Some 370 launches for one step of an 8-block Mixer: at ~15 microseconds each, about 5 ms of
# host time per step, whatever the GPU. PyTorch's eager mode issues about as many (its step has
# ~300 ATen operators) and waits the same way; its answer, like tinymlp's, is a **CUDA graph**.
#
# A CUDA graph is a recording of kernels. The step's Python runs once while the stream is being
# *captured*: every kernel it launches is recorded, with its arguments and the memory addresses
# it reads and writes, and nothing is computed. After that, one call (`graph.launch()`) replays
# the whole step on the GPU: the host issues 4 operations instead of 370. That works only if
# every replay may reuse exactly what was recorded, which is why `tinymlp/fast/capture.py`
# insists on:
#
# - **fixed shapes and fixed memory**: the batch is copied into input buffers of the graph's own
#   before each replay, and everything the step allocates comes from a memory pool kept for the
#   graph (the last, smaller batch of an epoch runs eagerly: another shape);
# - **nothing that needs the host during the step**: no `loss.item()`, no upload, no CuPy matrix
#   product (CuPy refuses cuBLAS during capture; `tinymlp/fast/cublas.py` calls cuBLAS itself);
# - **the numbers that change every step on the device**: the learning rate of a schedule,
#   Adam's bias corrections and the dropout seeds are read from a small device buffer that the
#   host fills before each replay (`tinymlp/fast/scalars.py`). Frozen into the graph as kernel
#   arguments, every replay would repeat the first step's learning rate. Because the same values
#   reach the same kernels, a replayed step equals the eager step bit for bit.
#
# `fit` does all this for you on CUDA (two eager warm-up steps, then the capture; `graph=False`
# or the example scripts' `--no-graph` turn it off), and the epoch line says how many steps
# were replayed. Here are the two counts side by side, and, with a GPU, the two timings:

# %%
def step_times(batch, steps=20):
    """(eager, graph) seconds per Mixer training step on the GPU at ``batch``."""
    from tinymlp.fast.capture import CapturedStep

    model = create("mixer_cifar", seed=0).to("cuda")
    optimizer = AdamW(model.parameters(), lr=1e-3)
    x = tinymlp.tensor(rng.standard_normal((batch, 3, 32, 32)), device="cuda")
    y = tinymlp.tensor(rng.integers(0, 10, size=batch), device="cuda")

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    graphed = CapturedStep(step, model.parameters(), lambda: tuple(optimizer.flat_state or ()))
    times = []
    for run in (step, graphed):
        for _ in range(3):                               # warm-up (and, for the graph, the capture)
            run(x, y).item()
        start = time.perf_counter()
        for _ in range(steps):
            loss = run(x, y)
        loss.item()                                      # wait for the GPU
        times.append((time.perf_counter() - start) / steps)
    return times


fig, axes = plt.subplots(1, 2, figsize=(9, 3))
if counts:
    axes[0].bar(list(counts), list(counts.values()), color=["C0", "C2"])
    axes[0].set_yscale("log")
    axes[0].set_ylabel("operations the host issues")
    axes[0].set_title("one mixer_cifar training step", fontsize=10)
if GPU:
    batches = [16, 128, 512]
    measured = [step_times(b) for b in batches]
    for b, (eager_s, graph_s) in zip(batches, measured):
        print(f"batch {b:3d}: eager {1000 * eager_s:6.2f} ms, graph {1000 * graph_s:6.2f} ms per step "
              f"({eager_s / graph_s:.1f}x)")
    axes[1].plot(batches, [1000 * e for e, _ in measured], "o-", label="eager")
    axes[1].plot(batches, [1000 * g for _, g in measured], "o-", label="CUDA graph")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("batch size")
    axes[1].set_ylabel("ms per step")
    axes[1].legend()
else:
    axes[1].text(0.5, 0.5, "no GPU here: with one, this plots\nms per step, eager against the graph,\n"
                 "for batches 16, 128 and 512", transform=axes[1].transAxes, ha="center", va="center", color="grey")
    axes[1].set_axis_off()
plt.show()

# %% [markdown]
# What to expect on a GPU: at batch 16 the eager step is almost all Python and the graph is
# several times faster; at batch 128 the graph removes the host's share and leaves the GPU's
# own work; at batch 512 the GPU is busy anyway and the two come close. The graph changes who
# waits for whom, not the arithmetic: the same kernels run, on the same numbers.

# %%
print(f"lesson 9 ran in {time.perf_counter() - lesson_start:.0f} s")
