"""The flat buffers of the fast optimizers: one contiguous array per state name for a whole
param group, each parameter's state a view of its slice (fast/optim.py runs the updates on them)."""

from __future__ import annotations

from ..backend import array_module, device_of

__all__ = ["FlatGroup"]


class FlatGroup:
    """One group's state as flat buffers; parameter ``i`` owns ``buf[starts[i]:stops[i]]``."""

    def __init__(self, optimizer, gi):
        group = optimizer.param_groups[gi]
        params = group["params"]
        first = params[0].data
        self.device, self.dtype = device_of(first), first.dtype
        self.shapes = [p.shape for p in params]
        self.stops, end = [], 0
        for p in params:
            end += p.size
            self.stops.append(end)
        self.starts = [0] + self.stops[:-1]
        xp = array_module(first)
        self.grad = xp.empty(end, dtype=self.dtype)
        self.work = xp.empty(end, dtype=self.dtype)
        self.bufs = {name: xp.zeros(end, dtype=self.dtype) for name in optimizer.state_names(group)}
        for i in range(len(params)):        # the per-parameter state becomes views of the buffers
            state = optimizer.param_state(gi, i)
            for name, buf in self.bufs.items():
                view = self.view(buf, i)
                view[...] = state[name]
                state[name] = view

    @staticmethod
    def uniform(params):
        """Whether the parameters share one dtype and one device (what one flat buffer needs)."""
        arrays = [p.array for p in params]       # one array type is one device (GPU 0 only)
        kind, dtype = type(arrays[0]), arrays[0].dtype
        return all(type(a) is kind and a.dtype == dtype for a in arrays)

    def view(self, flat, i):
        return flat[self.starts[i]:self.stops[i]].reshape(self.shapes[i])

    def fits(self, optimizer, gi):
        group = optimizer.param_groups[gi]
        first = group["params"][0].data
        return (device_of(first) == self.device and first.dtype == self.dtype
                and set(self.bufs) == set(optimizer.state_names(group)))
