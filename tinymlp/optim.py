"""Optimizers (SGD, Adam, AdamW), learning-rate schedules and gradient clipping.

An optimizer holds *param groups*: dicts with a list of parameters under ``"params"`` and the
hyperparameters that apply to them (``lr``, ``weight_decay``, ...), as in PyTorch::

    opt = AdamW(param_groups(model, weight_decay=0.05), lr=1e-3)   # biases, norms: no decay
    sched = WarmupLinear(opt, warmup_steps=500, total_steps=10_000)
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        sched.step()

``step()`` is plain array code on ``param.data`` and ``param.grad`` (NumPy or CuPy, through
``xp``): it updates the parameters *in place*, builds no graph and never writes into a
gradient. Parameters whose ``.grad`` is None are skipped (their state does not advance).

Speed. The optimizer runs once per training step over every parameter, so it is written as a
few passes over whole buffers rather than a Python loop of small array expressions: each
group keeps its state (Adam's two moments, SGD's momentum) in one flat contiguous array, the
gradients are gathered into another flat array with one ``concatenate``, the update is a
handful of in-place ufuncs (``out=``, no temporaries) over all parameters at once (on the CPU
in cache-sized pieces), and each parameter then takes its slice of the result with one in-place
subtraction. Nothing is allocated after the first step. Hyperparameters enter as Python
floats, which NumPy treats as "weak" scalars: float32 stays float32.
"""

from __future__ import annotations

import math

import numpy as np

from .backend import array_module, device_of, to_device
from .tensor import Tensor

__all__ = [
    "SGD", "Adam", "AdamW", "Optimizer", "param_groups",
    "LRSchedule", "WarmupLinear", "WarmupCosine", "clip_grad_norm",
]

_CHUNK = 1 << 16
"""On the CPU the update walks the flat buffers in pieces of this many values (256 KiB of
float32 per buffer), so that its ten or so passes run in the cache instead of main memory."""


def _as_param_list(params, what="params"):
    """A list of Tensors from a Module (its parameters) or any iterable of Tensors."""
    if hasattr(params, "parameters") and callable(params.parameters):
        params = params.parameters()
    if isinstance(params, Tensor):
        params = [params]
    params = list(params)
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"{what}: expected Tensors (parameters), got {type(p).__name__}")
    return params


def param_groups(model, weight_decay, no_decay=("bias", "norm", "cls_token", "pos_embed")):
    """Two param groups: the weights, with ``weight_decay``, and the rest, without.

    Exempt from weight decay: every parameter with ``ndim <= 1`` (biases, LayerNorm scales and
    shifts, a 1-D Toeplitz filter) and every parameter whose dotted name contains one of the
    strings ``no_decay`` (by default also ViT's class token and position embedding). Shrinking
    a bias, a norm's gain or an embedding towards 0 regularises nothing useful, so the usual
    recipe (BERT, ViT, MLP-Mixer, as in timm) leaves them alone. ``model`` is a Module, a dict
    ``{name: param}`` or an iterable of ``(name, param)`` pairs. Empty groups are left out.
    """
    if hasattr(model, "named_parameters"):
        named = model.named_parameters()
    elif isinstance(model, dict):
        named = model.items()
    else:
        named = model
    if isinstance(no_decay, str):
        no_decay = (no_decay,)
    decay, exempt = [], []
    for name, p in named:
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or any(key in name for key in no_decay):
            exempt.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


class _FlatState:
    """One group's state: each named buffer is ONE flat array over all the group's parameters.

    Parameter ``i`` owns ``buf[starts[i]:stops[i]]`` (``view`` gives it in the parameter's
    shape). ``grad`` receives the gathered gradients and ``work`` the update; both are reused
    from step to step. ``steps[i]`` counts the updates parameter ``i`` has received.
    """

    def __init__(self, params, names):
        first = params[0].data
        self.device, self.dtype = device_of(first), first.dtype
        for p in params:
            if device_of(p.data) != self.device or p.data.dtype != self.dtype:
                raise ValueError(
                    "an optimizer param group must hold parameters of one dtype on one device; found "
                    f"{self.dtype} on {self.device} and {p.data.dtype} on {device_of(p.data)}: "
                    "put them in separate groups"
                )
        self.shapes = [p.shape for p in params]
        self.stops, end = [], 0
        for p in params:
            end += p.size
            self.stops.append(end)
        self.starts = [0] + self.stops[:-1]
        self.steps = [0] * len(params)
        xp = array_module(first)
        self.bufs = {}
        self.grad = xp.empty(end, dtype=self.dtype)
        self.work = xp.empty(end, dtype=self.dtype)
        self.ensure(names)

    def ensure(self, names):
        xp = array_module(self.grad)
        for name in names:
            if name not in self.bufs:
                self.bufs[name] = xp.zeros(self.grad.size, dtype=self.dtype)

    def view(self, flat, i):
        return flat[self.starts[i]:self.stops[i]].reshape(self.shapes[i])

    def follow(self, first):
        """Move/cast the buffers if the parameters moved (``model.to(...)`` after creation)."""
        device, dtype = device_of(first), first.dtype
        if device == self.device and dtype == self.dtype:
            return
        self.device, self.dtype = device, dtype

        def move(a):
            return to_device(a, device).astype(dtype, copy=False)

        self.bufs = {k: move(v) for k, v in self.bufs.items()}
        self.grad, self.work = move(self.grad), move(self.work)


class Optimizer:
    """Base class: param groups, the flat state, ``step``, ``zero_grad``, ``state_dict``.

    A subclass sets ``decoupled_weight_decay`` and defines ``_state_names(group)`` (the flat
    buffers it keeps) and ``_direction(group, g, bufs, out, t)``, which writes ``lr`` times the
    update direction into ``out`` (the step is then ``p -= out``). It works on any matching
    slices of the flat buffers: pieces of all of them in the usual case, or one parameter's
    slice at a time when parameters are at different steps (after a missing gradient).
    """

    decoupled_weight_decay = False

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        if hasattr(params, "parameters") and callable(params.parameters):
            params = params.parameters()
        if isinstance(params, Tensor):
            params = [params]
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty list of parameters")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        self.param_groups = []
        seen = set()
        for i, group in enumerate(params):
            if "params" not in group:
                raise ValueError(f"{type(self).__name__}: param group {i} has no 'params' entry")
            group = {**self.defaults, **group, "params": _as_param_list(group["params"], f"param group {i}")}
            for p in group["params"]:
                if id(p) in seen:
                    raise ValueError(f"{type(self).__name__}: a parameter appears twice (in param group {i})")
                seen.add(id(p))
            self._check_hyper(group)
            self.param_groups.append(group)
        self._state = [None] * len(self.param_groups)

    # ------------------------------------------------------------------ hyperparameters
    def _check_hyper(self, group):
        if group["lr"] < 0:
            raise ValueError(f"{type(self).__name__}: learning rate must be >= 0, got {group['lr']}")
        if group.get("weight_decay", 0.0) < 0:
            raise ValueError(f"{type(self).__name__}: weight_decay must be >= 0, got {group['weight_decay']}")

    @property
    def lr(self) -> float:
        """The learning rate of the first group (param_groups() makes groups that share it)."""
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value):
        for group in self.param_groups:
            group["lr"] = value

    def __repr__(self):
        keys = [k for k in self.defaults]
        lines = [f"{type(self).__name__}("]
        for i, g in enumerate(self.param_groups):
            n = sum(p.size for p in g["params"])
            opts = ", ".join(f"{k}={g[k]}" for k in keys)
            lines.append(f"  group {i}: {len(g['params'])} tensors, {n} values, {opts}")
        return "\n".join(lines) + "\n)"

    # ------------------------------------------------------------------ the step
    def zero_grad(self):
        """Forget every gradient (``grad = None``); the next backward allocates fresh ones."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def _group_state(self, gi) -> _FlatState:
        group = self.param_groups[gi]
        fs = self._state[gi]
        if fs is None:
            fs = self._state[gi] = _FlatState(group["params"], self._state_names(group))
        else:
            fs.follow(group["params"][0].data)
            fs.ensure(self._state_names(group))
        return fs

    def step(self):
        """Update every parameter that has a gradient, in place."""
        for gi, group in enumerate(self.param_groups):
            params = group["params"]
            live = [i for i, p in enumerate(params) if p.grad is not None]
            if not live:
                continue
            fs = self._group_state(gi)
            xp = array_module(fs.grad)
            lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))

            if len(live) == len(params) and fs.steps.count(fs.steps[0]) == len(params):
                # the usual case: all parameters at the same step, so the update runs over the
                # whole flat buffers (on the CPU in cache-sized pieces, on a GPU in one piece)
                xp.concatenate([p.grad.reshape(-1) for p in params], out=fs.grad)
                t, n = fs.steps[0] + 1, fs.grad.size
                chunk = _CHUNK if xp is np else n
                pieces = [(slice(a, a + chunk), t) for a in range(0, n, chunk)]
            else:  # some gradients missing, or parameters at different steps: one piece each
                for i in live:
                    fs.view(fs.grad, i)[...] = params[i].grad
                pieces = [(slice(fs.starts[i], fs.stops[i]), fs.steps[i] + 1) for i in live]

            if wd and not self.decoupled_weight_decay:  # L2 penalty: g <- g + wd * p
                for i in live:
                    scratch = fs.view(fs.work, i)
                    xp.multiply(params[i].data, wd, out=scratch)
                    g = fs.view(fs.grad, i)
                    g += scratch

            for where, t in pieces:
                bufs = {name: buf[where] for name, buf in fs.bufs.items()}
                self._direction(group, fs.grad[where], bufs, fs.work[where], t)

            for i in live:
                p = params[i].data
                if wd and self.decoupled_weight_decay:  # AdamW: p <- p - lr * wd * p
                    p *= 1.0 - lr * wd
                p -= fs.view(fs.work, i)
                fs.steps[i] += 1

    def _state_names(self, group):
        return ()

    def _direction(self, group, g, bufs, out, t):
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """``{"state": {index: {"step": int, name: array}}, "param_groups": [...]}``.

        As in PyTorch, parameters are numbered across the groups in order and groups list
        their indices under ``"params"``. Arrays are NumPy copies; only parameters that have
        been updated at least once have an entry. Everything is a plain number, list, string
        or array, so ``tinymlp.checkpoint`` stores it without pickle.
        """
        groups, state, index = [], {}, 0
        for gi, group in enumerate(self.param_groups):
            n = len(group["params"])
            saved = {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items() if k != "params"}
            groups.append({**saved, "params": list(range(index, index + n))})
            fs = self._state[gi]
            if fs is not None:
                for i in range(n):
                    if fs.steps[i]:
                        entry = {"step": fs.steps[i]}
                        for name, buf in fs.bufs.items():
                            entry[name] = to_device(fs.view(buf, i), "cpu").copy()
                        state[index + i] = entry
            index += n
        return {"state": state, "param_groups": groups}

    def _check_state_dict(self, state_dict):
        """Raise a ValueError listing what does not fit; return ``{index: (group, i)}``."""
        name = type(self).__name__
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"{name}.load_state_dict: the state has {len(groups)} param group(s), "
                f"this optimizer has {len(self.param_groups)}"
            )
        where, problems = {}, []
        for gi, (saved, group) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                problems.append(
                    f"group {gi}: {len(saved['params'])} parameters in the state, {len(group['params'])} here"
                )
                continue
            for i, index in enumerate(saved["params"]):
                where[int(index)] = (gi, i)
        for key, entry in state_dict["state"].items():
            if int(key) not in where:
                problems.append(f"state for parameter {key}, which no group lists")
                continue
            gi, i = where[int(key)]
            group = self.param_groups[gi]
            names = set(self._state_names({**group, **groups[gi], "params": None}))
            have = set(entry) - {"step"}
            if have != names:
                problems.append(f"parameter {key}: state has {sorted(have)}, {name} needs {sorted(names)}")
            shape = tuple(group["params"][i].shape)
            for n in sorted(have & names):
                if tuple(entry[n].shape) != shape:
                    problems.append(f"parameter {key}: {n} has shape {tuple(entry[n].shape)}, parameter {shape}")
        if problems:
            raise ValueError(f"{name}.load_state_dict: the state does not fit:\n  " + "\n  ".join(problems))
        return where

    def load_state_dict(self, state_dict):
        """Restore hyperparameters and state saved by ``state_dict()`` (nothing changes on error)."""
        where = self._check_state_dict(state_dict)
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if isinstance(v, list) else v
        self._state = [None] * len(self.param_groups)
        for key, entry in state_dict["state"].items():
            gi, i = where[int(key)]
            fs = self._group_state(gi)
            fs.steps[i] = int(entry["step"])
            for name, buf in fs.bufs.items():
                fs.view(buf, i)[...] = to_device(entry[name], fs.device)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, Nesterov momentum and weight decay.

    As in PyTorch (no dampening), with g the gradient and mu the momentum::

        g <- g + wd * p                         (weight decay as an L2 penalty)
        b <- mu * b + g                         (b = g at the first step)
        d <- g + mu * b  if nesterov  else  b   (d = g when mu = 0)
        p <- p - lr * d
    """

    def __init__(self, params, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
        if momentum < 0:
            raise ValueError(f"SGD: momentum must be >= 0, got {momentum}")
        if nesterov and momentum <= 0:
            raise ValueError("SGD: nesterov=True needs a momentum > 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay))

    def _state_names(self, group):
        return ("momentum_buffer",) if group["momentum"] else ()

    def _direction(self, group, g, bufs, out, t):
        xp = array_module(g)
        lr, mu = float(group["lr"]), float(group["momentum"])
        if not mu:
            xp.multiply(g, lr, out=out)
            return
        b = bufs["momentum_buffer"]
        b *= mu
        b += g  # a zero buffer makes the first step b = g, as PyTorch's
        if group["nesterov"]:
            xp.multiply(b, mu, out=out)
            out += g
            out *= lr
        else:
            xp.multiply(b, lr, out=out)


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015); ``weight_decay`` is an L2 penalty added to the gradient.

    With g the gradient at step t (counted from 1)::

        g <- g + wd * p
        m <- b1 * m + (1 - b1) * g              first moment
        v <- b2 * v + (1 - b2) * g^2            second moment
        p <- p - lr * m_hat / (sqrt(v_hat) + eps),   m_hat = m / (1 - b1^t),  v_hat = v / (1 - b2^t)

    The last line is computed in the paper's cheaper order (its section 2): with c1 = 1 - b1^t
    and c2 = 1 - b2^t it equals (lr sqrt(c2) / c1) * m / (sqrt(v) + eps sqrt(c2)), one pass
    fewer over the buffers.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"{type(self).__name__}: eps must be >= 0, got {eps}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def _state_names(self, group):
        return ("exp_avg", "exp_avg_sq")

    def _direction(self, group, g, bufs, out, t):
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
        xp.sqrt(v, out=out)  # out <- lr m_hat / (sqrt(v_hat) + eps)
        out += float(group["eps"]) * root_c2
        xp.divide(m, out, out=out)
        out *= float(group["lr"]) * root_c2 / c1


class AdamW(Adam):
    """Adam with *decoupled* weight decay (Loshchilov & Hutter, 2019), as in PyTorch.

    The decay shrinks the weights directly, ``p <- p - lr * wd * p``, before the Adam step, and
    is not fed through the moments (where Adam's normalisation would cancel most of it).
    Use ``param_groups(model, wd)`` to exempt biases and norm weights.
    """

    decoupled_weight_decay = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


# ---------------------------------------------------------------------- schedules
class LRSchedule:
    """Linear warmup from 0 to each group's base lr, then a decay to ``min_lr``.

    ``step`` counts training steps from 0; the lr used by training step s is ``get_lr(s)``::

        s < warmup:   lr = base * s / warmup
        otherwise:    lr = min_lr + (base - min_lr) * decay(progress),
                      progress = (s - warmup) / (total - warmup), clipped to [0, 1]

    Creating the schedule sets the lr of step 0; call ``step()`` once per training step,
    after ``optimizer.step()``. Subclasses define ``decay``: 1 at progress 0, 0 at 1.
    """

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0):
        if not 0 <= warmup_steps <= total_steps or total_steps <= 0:
            raise ValueError(
                f"{type(self).__name__}: need 0 <= warmup_steps <= total_steps and total_steps > 0, "
                f"got warmup_steps={warmup_steps}, total_steps={total_steps}"
            )
        self.optimizer = optimizer
        self.warmup_steps, self.total_steps, self.min_lr = int(warmup_steps), int(total_steps), float(min_lr)
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.step_count = 0
        self._apply()

    @staticmethod
    def decay(progress: float) -> float:
        raise NotImplementedError

    def _lr(self, step, base):
        if step < self.warmup_steps:
            return base * step / self.warmup_steps
        span = self.total_steps - self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / span) if span else 1.0
        return self.min_lr + (base - self.min_lr) * self.decay(progress)

    def get_lr(self, step=None) -> float:
        """The lr of the first param group at ``step`` (default: the current step)."""
        return self._lr(self.step_count if step is None else step, self.base_lrs[0])

    def _apply(self):
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self._lr(self.step_count, base)

    def step(self):
        self.step_count += 1
        self._apply()

    def state_dict(self) -> dict:
        return {
            "step_count": self.step_count, "base_lrs": list(self.base_lrs),
            "warmup_steps": self.warmup_steps, "total_steps": self.total_steps, "min_lr": self.min_lr,
        }

    def load_state_dict(self, state):
        if len(state["base_lrs"]) != len(self.optimizer.param_groups):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: {len(state['base_lrs'])} base lrs for "
                f"{len(self.optimizer.param_groups)} param groups"
            )
        self.step_count = int(state["step_count"])
        self.base_lrs = [float(b) for b in state["base_lrs"]]
        self.warmup_steps, self.total_steps = int(state["warmup_steps"]), int(state["total_steps"])
        self.min_lr = float(state["min_lr"])
        self._apply()

    def __repr__(self):
        return (f"{type(self).__name__}(warmup_steps={self.warmup_steps}, total_steps={self.total_steps}, "
                f"min_lr={self.min_lr}, step_count={self.step_count})")


class WarmupLinear(LRSchedule):
    """Linear warmup, then linear decay to ``min_lr`` at ``total_steps`` (MLP-Mixer's recipe)."""

    @staticmethod
    def decay(progress):
        return 1.0 - progress


class WarmupCosine(LRSchedule):
    """Linear warmup, then half a cosine from the base lr down to ``min_lr``."""

    @staticmethod
    def decay(progress):
        return 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------- clipping
def clip_grad_norm(params, max_norm, sync=True):
    """Scale the gradients in place so that their joint L2 norm is at most ``max_norm``.

    The norm is taken over all gradients together, as if concatenated into one vector:
    ``total = sqrt(sum_p ||g_p||^2)``; if ``total > max_norm`` every gradient is multiplied by
    ``max_norm / (total + 1e-6)``. Parameters without a gradient are ignored, and a
    non-finite total leaves the gradients alone.

    Returns ``total`` (before clipping) as a Python float. With ``sync=False`` it returns
    a 0-d array on the gradients' device instead, and on a GPU the whole clip then runs
    without waiting for the device: the training loop uses this, and reads the norm, if
    at all, when it synchronises for its metrics (the price: one multiply over the gradients
    even when nothing is clipped).
    """
    grads = [p.grad for p in _as_param_list(params) if p.grad is not None]
    xp = array_module(grads[0]) if grads else np
    if not grads:
        return 0.0 if sync else xp.zeros(())
    squares = [xp.vdot(g.reshape(-1), g.reshape(-1)) for g in grads]  # a BLAS dot each, no temporaries
    total = xp.sqrt(xp.stack(squares).sum())
    if sync:  # the decision is taken on the host
        norm = float(total)
        if math.isfinite(norm) and norm > max_norm:
            scale = max_norm / (norm + 1e-6)
            for g in grads:
                g *= scale
        return norm
    # on the device: scale = min(1, max_norm / total), or 1 when total is not finite
    scale = xp.where(xp.isfinite(total), xp.minimum(1.0, max_norm / (total + 1e-6)), 1.0)
    scale = scale.astype(grads[0].dtype)
    for g in grads:
        g *= scale
    return total
