"""Optimizers (SGD, Adam, AdamW) and gradient clipping; the learning-rate schedules
(tinymlp/schedule.py) are importable from here too.

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

``step()`` updates every parameter that has a gradient, *in place*, one parameter at a time,
with the update written as the paper writes it (``update`` of each class). Its state (Adam's
two moments, SGD's momentum, the step count) is kept per parameter in ``self.state``.
Parameters whose ``.grad`` is None are skipped (their state does not advance).

Fast tier: ``tinymlp/fast/optim.py`` runs the same updates over ONE flat buffer per group (a
handful of in-place passes over all parameters at once, in cache-sized pieces); the state
arrays here then become views of its buffers, so both tiers read and write the same state.
This module does not import it: ``step()`` and ``clip_grad_norm`` look their fast versions up
in the dispatch table (``dispatch.OPTIMIZER_STEP``, ``dispatch.CLIP_GRAD_NORM``; see
tinymlp/dispatch.py), which the fast tier fills when it is imported.
"""

from __future__ import annotations

import math

import numpy as np

from . import dispatch
from .backend import array_module, device_of, to_device
from .guard import mark_written
from .hyperparameters import check_hyperparameter, describe, is_count
from .nn.module import value_problem
from .schedule import LRSchedule, WarmupCosine, WarmupLinear
from .tensor import Tensor

__all__ = [
    "SGD", "Adam", "AdamW", "Optimizer", "check_hyperparameter", "param_groups",
    "LRSchedule", "WarmupLinear", "WarmupCosine", "clip_grad_norm",
]


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


class Optimizer:
    """Base class: param groups, per-parameter state, ``step``, ``zero_grad``, ``state_dict``.

    A subclass defines ``state_names(group)`` (the arrays it keeps per parameter, created as
    zeros) and ``update(p, g, state, group)``, which changes the parameter array ``p`` in place
    from its gradient ``g`` and its ``state`` (a dict with ``"step"``, already counting this
    step, and the named arrays). ``fast_kind`` names its flat-buffer version in the fast tier
    (None: the fast tier leaves the optimizer alone).
    """

    fast_kind = None

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
        self.state = [[None] * len(g["params"]) for g in self.param_groups]   # state[group][i]
        self.flat_state = None    # the fast tier's flat buffers (None: rebuilt at its next step)

    # ------------------------------------------------------------------ hyperparameters
    def _check_hyper(self, group, name=None):
        name = name or type(self).__name__
        check_hyperparameter(name, "lr", group["lr"])
        check_hyperparameter(name, "weight_decay", group.get("weight_decay", 0.0))
        if "momentum" in group:
            check_hyperparameter(name, "momentum", group["momentum"], 0.0, 1.0, high_open=True)
        if "betas" in group:
            betas = group["betas"]
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise ValueError(f"{name}: betas must be a pair (beta1, beta2), got {betas!r}")
            for i, beta in enumerate(betas):
                check_hyperparameter(name, f"betas[{i}]", beta, 0.0, 1.0, high_open=True)
        if "eps" in group:
            check_hyperparameter(name, "eps", group["eps"], 0.0, low_open=True)
        if "nesterov" in group:
            if not isinstance(group["nesterov"], (bool, np.bool_)):
                raise TypeError(f"{name}: nesterov must be True or False, got {group['nesterov']!r}")
            if group["nesterov"] and group.get("momentum", 0) <= 0:
                raise ValueError(f"{name}: nesterov=True needs a momentum > 0")

    @property
    def lr(self) -> float:
        """The learning rate of the first group (param_groups() makes groups that share it)."""
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value):
        check_hyperparameter(type(self).__name__, "lr", value)
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

    def step(self):
        """Update every parameter that has a gradient, in place. The groups' hyperparameters are
        checked first (a value set since, ``param_groups[0]["lr"] = nan``, is refused, not applied)."""
        for gi, group in enumerate(self.param_groups):
            self._check_hyper(group, f"{type(self).__name__}.step (param_groups[{gi}])")
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    mark_written(p)   # a graph that saved p can no longer run backward
        if self.fast_kind:   # the same update over flat buffers, where the fast tier registered it
            device = device_of(self.param_groups[0]["params"][0].data)
            fast_step = dispatch.lookup(dispatch.OPTIMIZER_STEP, device)
            if fast_step is not None:
                return fast_step(self)
        for gi, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                state = self.param_state(gi, i)
                state["step"] += 1
                self.update(p.data, p.grad, state, group)

    def param_state(self, gi, i):
        """The state of parameter ``i`` of group ``gi`` (zeros and step 0 before its first update)."""
        p, group = self.param_groups[gi]["params"][i], self.param_groups[gi]
        state = self.state[gi][i]
        if state is None:
            xp = array_module(p.data)
            state = {"step": 0, **{name: xp.zeros_like(p.data) for name in self.state_names(group)}}
            self.state[gi][i] = state
        for name in self.state_names(group):   # a parameter moved (model.to(...)) after the state was made
            if name not in state:
                state[name] = array_module(p.data).zeros_like(p.data)
            elif device_of(state[name]) != device_of(p.data) or state[name].dtype != p.data.dtype:
                state[name] = to_device(state[name], device_of(p.data)).astype(p.data.dtype)
                self.flat_state = None
        return state

    def state_names(self, group):
        return ()

    def update(self, p, g, state, group):
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
            for i, entry in enumerate(self.state[gi]):
                if entry is not None and entry["step"]:
                    state[index + i] = {k: (v if k == "step" else to_device(v, "cpu").copy()) for k, v in entry.items()}
            index += n
        return {"state": state, "param_groups": groups}

    def check_state_dict(self, state_dict):
        """Raise a ValueError listing what does not fit; return ``{index: (group, i)}``.

        Checked as the constructor checks its arguments: the structure, every saved
        hyperparameter (a finite lr >= 0, betas in [0, 1), eps > 0, ...; no name this
        optimizer does not know), every step count (an integer >= 0) and every state array
        (the parameter's shape, floating point, finite; Adam's second moment >= 0).
        """
        name = type(self).__name__
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list) \
                or not isinstance(state_dict.get("state"), dict):
            raise ValueError(f"{name}.load_state_dict: expected a dict with 'state' (a dict) and 'param_groups' "
                             f"(a list), as state_dict() returns; got {describe(state_dict)}")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"{name}.load_state_dict: the state has {len(groups)} param group(s), "
                f"this optimizer has {len(self.param_groups)}"
            )
        where, problems = {}, []
        for gi, (saved, group) in enumerate(zip(groups, self.param_groups)):
            if not isinstance(saved, dict) or not isinstance(saved.get("params"), list):
                problems.append(f"group {gi}: not a dict with a 'params' list ({describe(saved)})")
                continue
            unknown = sorted(set(saved) - set(self.defaults) - {"params"})
            if unknown:
                problems.append(f"group {gi}: {', '.join(map(repr, unknown))} (not a hyperparameter of {name})")
            try:
                self._check_hyper({**group, **{k: v for k, v in saved.items() if k in self.defaults}})
            except (TypeError, ValueError) as err:
                problems.append(f"group {gi}: {err}")
            if len(saved["params"]) != len(group["params"]):
                problems.append(
                    f"group {gi}: {len(saved['params'])} parameters in the state, {len(group['params'])} here"
                )
                continue
            for i, index in enumerate(saved["params"]):
                if not is_count(index):
                    problems.append(f"group {gi}: parameter index {index!r} is not an integer >= 0")
                    continue
                where[int(index)] = (gi, i)
        for key, entry in state_dict["state"].items():
            index = int(key) if is_count(key) or (isinstance(key, str) and key.isdigit()) else None
            if index is None or index not in where:
                problems.append(f"state for parameter {key!r}, which no group lists")
                continue
            if not isinstance(entry, dict):
                problems.append(f"parameter {key}: its state is {describe(entry)}, not a dict")
                continue
            gi, i = where[index]
            group = self.param_groups[gi]
            names = set(self.state_names({**group, **groups[gi], "params": None}))
            have = set(entry) - {"step"}
            if have != names:
                problems.append(f"parameter {key}: state has {sorted(have)}, {name} needs {sorted(names)}")
            if not is_count(entry.get("step")):
                problems.append(f"parameter {key}: step {entry.get('step')!r} is not an integer >= 0")
            shape = tuple(group["params"][i].shape)
            for n in sorted(have & names):
                value = entry[n]
                if not hasattr(value, "shape") or not hasattr(value, "dtype"):
                    problems.append(f"parameter {key}: {n} is {describe(value)}, not an array")
                    continue
                if tuple(value.shape) != shape:
                    problems.append(f"parameter {key}: {n} has shape {tuple(value.shape)}, parameter {shape}")
                    continue
                why = value_problem(value, group["params"][i].dtype)
                if why is None and n == "exp_avg_sq" and bool((array_module(value).asarray(value) < 0).any()):
                    why = "has negative entries (a second moment is a mean of squares)"
                if why is not None:
                    problems.append(f"parameter {key}: {n} {why}")
        if problems:
            raise ValueError(f"{name}.load_state_dict: the state does not fit:\n  " + "\n  ".join(problems))
        return where

    def load_state_dict(self, state_dict):
        """Restore hyperparameters and state saved by ``state_dict()`` (nothing changes on error)."""
        where = self.check_state_dict(state_dict)
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if isinstance(v, list) else v
        self.state = [[None] * len(g["params"]) for g in self.param_groups]
        self.flat_state = None
        for key, entry in state_dict["state"].items():
            gi, i = where[int(key)]
            p = self.param_groups[gi]["params"][i]
            state = self.param_state(gi, i)
            state["step"] = int(entry["step"])
            for name in self.state_names(self.param_groups[gi]):
                state[name][...] = to_device(np.asarray(entry[name]), device_of(p.data))


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, Nesterov momentum and weight decay.

    As in PyTorch (no dampening), with g the gradient and mu the momentum::

        g <- g + wd * p                         (weight decay as an L2 penalty)
        b <- mu * b + g                         (b = g at the first step: b starts at 0)
        d <- g + mu * b  if nesterov  else  b   (d = g when mu = 0)
        p <- p - lr * d
    """

    fast_kind = "sgd"

    def __init__(self, params, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
        check_hyperparameter("SGD", "momentum", momentum, 0.0, 1.0, high_open=True)
        if nesterov and momentum <= 0:
            raise ValueError("SGD: nesterov=True needs a momentum > 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay))

    def state_names(self, group):
        return ("momentum_buffer",) if group["momentum"] else ()

    def update(self, p, g, state, group):
        lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
        g = g + wd * p
        if mu:
            b = state["momentum_buffer"]
            b[...] = mu * b + g
            g = g + mu * b if group["nesterov"] else b
        p -= lr * g


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015); ``weight_decay`` is an L2 penalty added to the gradient.

    With g the gradient at step t (counted from 1)::

        g <- g + wd * p
        m <- b1 * m + (1 - b1) * g              first moment
        v <- b2 * v + (1 - b2) * g^2            second moment
        p <- p - lr * m_hat / (sqrt(v_hat) + eps),   m_hat = m / (1 - b1^t),  v_hat = v / (1 - b2^t)
    """

    fast_kind = "adam"
    decoupled_weight_decay = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        betas = tuple(betas) if isinstance(betas, (tuple, list)) else betas   # checked with the groups
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def state_names(self, group):
        return ("exp_avg", "exp_avg_sq")

    def update(self, p, g, state, group):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        if self.decoupled_weight_decay:
            p -= lr * wd * p                    # AdamW: shrink the weights directly
        else:
            g = g + wd * p                      # Adam: an L2 penalty through the moments
        m[...] = b1 * m + (1 - b1) * g
        v[...] = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        p -= lr * m_hat / (array_module(p).sqrt(v_hat) + eps)


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
    check_hyperparameter("clip_grad_norm", "max_norm", max_norm, 0.0, low_open=True)
    grads = [p.grad for p in _as_param_list(params) if p.grad is not None]
    xp = array_module(grads[0]) if grads else np
    if not grads:
        return 0.0 if sync else xp.zeros(())
    fast_clip = dispatch.lookup(dispatch.CLIP_GRAD_NORM, device_of(grads[0]))
    if fast_clip is not None:   # on a GPU: a few launches for all the gradients together
        done = fast_clip(grads, max_norm, sync)
        if done is not None:
            return done
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
