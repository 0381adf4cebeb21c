"""The optimizers' updates over flat buffers: a few passes over all parameters at once.

The reference optimizers (tinymlp/optim.py) update one parameter at a time, each line of the
paper one array expression: ~10 temporaries per parameter, a Python loop over ~100 of them. Here
each group's state (Adam's moments, SGD's momentum) lives in ONE flat array per name, the
gradients are gathered into another with one ``concatenate``, the update is a few in-place
ufuncs over all parameters at once (on the CPU in cache-sized pieces), and each parameter takes
its slice with one in-place subtraction. Nothing is allocated after the first step.

The per-parameter state arrays become *views* of the flat buffers, so the reference ``update``
and ``state_dict`` read and write the same numbers (switching tiers mid-training is exact).
Hyperparameters enter as Python floats, which NumPy treats as "weak": float32 stays float32.

``optimizer.step()`` and ``optim.clip_grad_norm`` (on CUDA) find ``FlatStep.step`` (or a
subclass's) and ``clip_grad_norm`` below in the dispatch table. ``FlatStep``: the array code
above (NumPy or CuPy); ``CompiledFlatStep``: a whole Adam(W) step compiled (numba,
``kernels/optim_numba.py``); ``CudaFlatStep``: a whole Adam(W) step in one kernel
(``kernels/optim_cuda.py``), its scalars on the device, the one step a CUDA graph can capture
(the others refuse capture, which would freeze their learning rate).
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import array_module
from . import compiled, cuda, scalars
from .flat import FlatGroup
from .kernels import optim_cuda, optim_numba

__all__ = ["CAPTURED", "CompiledFlatStep", "CudaFlatStep", "FlatGroup", "FlatStep", "clip_grad_norm"]

CHUNK = 1 << 16
"""Values per piece of the CPU update (256 KiB of float32): its passes then run in the cache."""


class FlatStep:
    """``optimizer.step()`` over flat buffers: the array code (NumPy or CuPy). Subclasses replace
    steps with kernels (None or False where they do not take the arrays): ``direction`` (over
    whole buffers), ``apply_update`` (p <- p * decay - u), ``whole_step`` (a whole Adam(W) step)."""

    @staticmethod
    def direction(kind, flat_state):
        """A function computing the ``kind`` optimizer's update over a whole flat buffer in one
        piece, or None: the array code (``DIRECTIONS``) runs in cache-sized pieces."""
        return None

    @staticmethod
    def apply_update(p, u, decay):
        """p <- p * decay - u in one pass; False where there is no kernel for it."""
        return False

    @staticmethod
    def whole_step(optimizer, group, fs, params, t, decay):
        """The whole step of an Adam(W) group (moments, direction, every parameter) in one
        pass; False where there is no kernel for it (``CAPTURED``: recorded for a CUDA graph)."""
        return False

    @staticmethod
    def gather(grads, out):
        """out <- the gradients, flattened one after the other."""
        array_module(out).concatenate([g.reshape(-1) for g in grads], out=out)

    @staticmethod
    def refuse_capture(what):     # a RuntimeError where a CUDA graph is being captured
        pass

    @classmethod
    def step(cls, optimizer):
        """``optimizer.step()`` over flat buffers (the fast tier's version of it)."""
        groups = optimizer.param_groups
        if optimizer.flat_state is None or len(optimizer.flat_state) != len(groups):
            optimizer.flat_state = [None] * len(groups)
        decoupled = getattr(optimizer, "decoupled_weight_decay", False)
        for gi, group in enumerate(groups):
            params = group["params"]
            live = [i for i, p in enumerate(params) if p.grad is not None]
            if not live:
                continue
            if not FlatGroup.uniform(params):   # mixed dtypes or devices: the reference, one by one
                cls.refuse_capture("parameters of mixed dtypes or devices")
                for i in live:
                    state = optimizer.param_state(gi, i)
                    state["step"] += 1
                    optimizer.update(params[i].data, params[i].grad, state, group)
                continue
            fs = optimizer.flat_state[gi]
            if fs is None or not fs.fits(optimizer, gi):
                for i in range(len(params)):
                    optimizer.param_state(gi, i)       # moves state that followed a model.to(...)
                if optimizer.flat_state is None:       # (which drops the stale flat buffers)
                    optimizer.flat_state = [None] * len(groups)
                fs = optimizer.flat_state[gi] = FlatGroup(optimizer, gi)
            states = optimizer.state[gi]
            xp = array_module(fs.grad)
            lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
            decay = 1.0 - lr * wd if wd and decoupled else 1.0
            one_pass = cls.direction(optimizer.fast_kind, fs)

            steps = [states[i]["step"] for i in range(len(params))]
            whole = len(live) == len(params) and steps.count(steps[0]) == len(params)
            if whole:
                # the usual case: all parameters at the same step, so the update runs over the
                # whole flat buffers (on the CPU in cache-sized pieces, on a GPU in one piece)
                cls.gather([p.grad for p in params], fs.grad)
                t, n = steps[0] + 1, fs.grad.size
                chunk = CHUNK if xp is np and one_pass is None else n
                pieces = [(slice(a, a + chunk), t) for a in range(0, n, chunk)]
            else:  # some gradients missing, or parameters at different steps: one piece each
                for i in live:
                    fs.view(fs.grad, i)[...] = params[i].grad
                pieces = [(slice(fs.starts[i], fs.stops[i]), steps[i] + 1) for i in live]

            if wd and not decoupled:  # L2 penalty: g <- g + wd * p
                for i in live:
                    scratch = fs.view(fs.work, i)
                    xp.multiply(params[i].data, wd, out=scratch)
                    g = fs.view(fs.grad, i)
                    g += scratch

            done = optimizer.fast_kind == "adam" and whole and cls.whole_step(optimizer, group, fs, params,
                                                                              pieces[0][1], decay)
            if done:
                if done is not CAPTURED:      # (a captured step counts its steps at each replay)
                    for i in live:
                        states[i]["step"] += 1
                continue

            cls.refuse_capture(f"{type(optimizer).__name__}'s step" + ("" if whole else " over some parameters"))
            run = one_pass if one_pass is not None else DIRECTIONS[optimizer.fast_kind]
            for where, t in pieces:
                bufs = {name: buf[where] for name, buf in fs.bufs.items()}
                run(group, fs.grad[where], bufs, fs.work[where], t)

            for i in live:
                p = params[i].data
                if not cls.apply_update(p, fs.view(fs.work, i), decay):
                    if wd and decoupled:  # AdamW: p <- p - lr * wd * p
                        p *= 1.0 - lr * wd
                    p -= fs.view(fs.work, i)
                states[i]["step"] += 1


class CompiledFlatStep(FlatStep):
    """The flat step with a whole Adam(W) step, or Adam's direction and each parameter's update, as
    compiled passes."""

    @staticmethod
    def direction(kind, flat_state):
        plain = all(type(b) is np.ndarray for b in (flat_state.grad, flat_state.work, *flat_state.bufs.values()))
        if kind == "adam" and compiled.is_enabled() and plain and flat_state.dtype.kind == "f":
            return _compiled_adam_direction
        return None

    apply_update = staticmethod(optim_numba.apply_update)

    @staticmethod
    def whole_step(optimizer, group, fs, params, t, decay):
        return optim_numba.adam_step([p.data for p in params], fs.starts, fs.grad, fs.bufs["exp_avg"],
                                     fs.bufs["exp_avg_sq"], fs.work, group, t, decay)


def _compiled_adam_direction(group, g, bufs, out, t):
    """Adam's direction in one compiled pass, or by the array code where the kernel failed."""
    if not optim_numba.adam_direction(group, g, bufs, out, t):
        adam_direction(group, g, bufs, out, t)


CAPTURED = "captured"   # whole_step recorded the step for a CUDA graph: its counts advance at each replay


class CudaFlatStep(FlatStep):
    """The flat step with a whole Adam(W) step as one kernel over every parameter, its scalars
    read from device memory (uploaded each step, or before each replay of a captured step)."""

    @staticmethod
    def gather(grads, out):
        if not (optim_cuda.multi_tensor_ok([out, *grads]) and out.size == sum(g.size for g in grads)):
            return FlatStep.gather(grads, out)
        optim_cuda.gather(grads, out)

    @staticmethod
    def refuse_capture(what):
        if cuda.capturing():
            raise RuntimeError(f"optimizer.step() cannot be captured into a CUDA graph: {what} takes its lr and "
                               "step count on the host (replays would repeat the first); Adam(W)'s whole step can")

    @staticmethod
    def whole_step(optimizer, group, fs, params, t, decay):
        if not optim_cuda.multi_tensor_ok([fs.grad] + [p.data for p in params]):
            return False
        if getattr(fs, "scalars", None) is None:
            fs.scalars = scalars.StepScalars(array_module(fs.grad), fs.dtype, len(optim_cuda.ADAM_SCALARS))
        if captured := cuda.capturing():
            gi = optimizer.param_groups.index(group)
            scalars.current().record(lambda: optim_cuda.advance_adam(optimizer, gi, fs.scalars))
        else:
            fs.scalars.upload(optim_cuda.adam_values(group, t, decay))
        optim_cuda.adam_step([p.data for p in params], fs.grad, fs.bufs["exp_avg"], fs.bufs["exp_avg_sq"],
                             fs.scalars.device)
        return CAPTURED if captured else True


def clip_grad_norm(grads, max_norm, sync):
    """``optim.clip_grad_norm`` on a GPU in three launches (the joint norm and factor on the device,
    then every gradient scaled), or None where the kernels do not apply: the caller's code runs."""
    if array_module(grads[0]) is np or not optim_cuda.multi_tensor_ok(grads):
        return None
    total, scale = optim_cuda.clip_by_norm(grads, max_norm)
    if sync:  # the decision on the host, as the reference takes it
        norm = float(total)
        if math.isfinite(norm) and norm > max_norm:
            optim_cuda.scale_all(grads, scale)
        return norm
    optim_cuda.scale_all(grads, scale)
    return total


def sgd_direction(group, g, bufs, out, t):
    """out <- lr * d, the SGD step direction (see ``optim.SGD``), in place."""
    xp = array_module(g)
    lr, mu = float(group["lr"]), float(group["momentum"])
    if not mu:
        return xp.multiply(g, lr, out=out)
    b = bufs["momentum_buffer"]
    b *= mu
    b += g  # a zero buffer makes the first step b = g, as PyTorch's
    if group["nesterov"]:
        xp.multiply(b, mu, out=out)
        out += g
        out *= lr
    else:
        xp.multiply(b, lr, out=out)


def adam_direction(group, g, bufs, out, t):
    """out <- lr m_hat / (sqrt(v_hat) + eps), updating m and v in place (see ``optim.Adam``), in the
    paper's cheaper order (its section 2): with c1 = 1 - b1^t, c2 = 1 - b2^t, that is
    (lr sqrt(c2) / c1) * m / (sqrt(v) + eps sqrt(c2))."""
    xp = array_module(g)
    b1, b2 = (float(b) for b in group["betas"])
    m, v = bufs["exp_avg"], bufs["exp_avg_sq"]
    xp.multiply(g, 1.0 - b1, out=out)  # m <- b1 m + (1 - b1) g
    m *= b1
    m += out
    xp.multiply(g, g, out=out)  # v <- b2 v + (1 - b2) g^2
    out *= 1.0 - b2
    v *= b2
    v += out
    c1, root_c2 = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
    xp.sqrt(v, out=out)
    out += float(group["eps"]) * root_c2
    xp.divide(m, out, out=out)
    out *= float(group["lr"]) * root_c2 / c1


DIRECTIONS = {"sgd": sgd_direction, "adam": adam_direction}
