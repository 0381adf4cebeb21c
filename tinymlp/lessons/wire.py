"""What crosses between the grading process and an answer's process: plain values, never code.

The grader and the process that runs a student's answer exchange messages of plain data:
numbers, strings, lists, tuples, sets, dicts, NumPy arrays and scalars, tinymlp Tensors (their
values), the nodes of lesson 2's scalar graphs, and a few functions known by name
(``FUNCTIONS``). A message is one JSON header followed by the raw bytes of its arrays::

    [8 bytes: header length][header: JSON, utf-8][array 0 bytes][array 1 bytes]...

Nothing is pickled: decoding a message runs no code of the sender's, whatever the sender is.
``unpack`` checks every array's dtype, shape and size against its bytes, and refuses a message
larger than ``MAX_BYTES`` or nested deeper than ``MAX_DEPTH``; any other object the answer
returns arrives as an ``Opaque`` that names its type (the checks then say "returned a ...").

Only the answer's process sends ``Handle``\\ s (the answer's classes, functions and modules,
which stay in that process and are called by number) and ``Opaque`` values.
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time

import numpy as np

__all__ = ["FUNCTIONS", "MAX_BYTES", "Handle", "Named", "Node", "Opaque", "WireError", "pack", "read_frame",
           "unpack", "write_frame"]

MAX_BYTES = 512 << 20
MAX_DEPTH = 64
DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"}


class WireError(ValueError):
    """A message that does not follow the format (or is too large to read)."""


class Node:
    """A node of a scalar graph (lesson 2): data, grad, parents, local_grads, name."""

    def __init__(self, data, parents=(), local_grads=(), name=""):
        self.data, self.grad = float(data), 0.0
        self.parents, self.local_grads, self.name = tuple(parents), tuple(local_grads), name

    def __repr__(self):
        return f"Value({self.name or self.data})"


class Named:
    """A function known to both processes by name (``FUNCTIONS``), passed to an answer as an argument."""

    def __init__(self, name):
        self.name = name
        self.fn = FUNCTIONS[name]

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return self.name


FUNCTIONS = {"cube": lambda v: v ** 3, "sin": np.sin}
"""The functions a check may hand to an answer (lesson 1's central difference differentiates them)."""


class Handle:
    """An object that lives in the answer's process (a class, a function, a module): its number,
    what kind of object it is, its name and the names of its parameters."""

    def __init__(self, number, kind, name, parameters=()):
        self.number, self.kind, self.name, self.parameters = number, kind, name, tuple(parameters)

    def __repr__(self):
        return f"<{self.kind} {self.name} in the answer's process>"


class Opaque:
    """A value of a type that does not cross between the processes; ``type_name`` names it."""

    def __init__(self, type_name):
        self.type_name = str(type_name)[:80]

    def __repr__(self):
        return f"<a {self.type_name}>"


# ------------------------------------------------------------------------------ encoding
class _Writer:
    def __init__(self, nodes=None, handles=None):
        self.buffers = []
        self.known = nodes  # a reply: id(node) -> the number the request gave it (no new nodes)
        self.nodes = {}  # a request: id(node) -> number in this message's graph table
        self.node_list = []
        self.handles = handles  # the answer's process: object -> Handle, or None (the grader)

    def value(self, v, depth=0):
        if depth > MAX_DEPTH:
            return {"$o": "structure nested too deep"}
        if isinstance(v, np.generic):
            if str(v.dtype) not in DTYPES:
                return {"$o": type(v).__name__}
            return {"$s": str(v.dtype), "a": self.array(np.asarray(v))}
        if v is None or isinstance(v, (bool, str)):
            return v if v is None or type(v) in (bool, str) else {"$o": type(v).__name__}
        if isinstance(v, int) and not isinstance(v, bool):
            return v if type(v) is int else {"$o": type(v).__name__}
        if isinstance(v, float):
            return v if type(v) is float else {"$o": type(v).__name__}
        if isinstance(v, complex):
            return {"$c": [v.real, v.imag]}
        if v is Ellipsis:
            return {"$e": 1}
        if type(v) is np.ndarray:
            if str(v.dtype) not in DTYPES:
                return {"$o": f"array of {v.dtype}"}
            return self.array(v)
        if type(v) in (list, tuple):
            key = "$l" if type(v) is list else "$u"
            return {key: [self.value(x, depth + 1) for x in v]}
        if type(v) in (set, frozenset):
            items = list(v)
            if all(type(x) in (str, int, float, bool) for x in items):
                return {"$set": items}
            return {"$o": "set of objects"}
        if type(v) is dict:
            return {"$d": [[self.value(k, depth + 1), self.value(x, depth + 1)] for k, x in v.items()]}
        if isinstance(v, Named):
            return {"$f": v.name}
        if type(v) is Node:
            if self.known is not None:
                return {"$n": self.known[id(v)]} if id(v) in self.known else {"$o": "node that is not in the graph"}
            return {"$n": self.node(v)}
        from ..tensor import Tensor

        if isinstance(v, Tensor):
            data = np.asarray(v.numpy())
            return {"$t": self.array(data) if str(data.dtype) in DTYPES else {"$o": "array"},
                    "grad": bool(v.requires_grad)}
        if self.handles is not None:
            handle = self.handles(v)
            if handle is not None:
                return {"$h": handle.number, "kind": handle.kind, "name": handle.name,
                        "parameters": list(handle.parameters)}
        return {"$o": type(v).__name__}

    def array(self, a):
        a = a if a.flags.c_contiguous else a.copy(order="C")
        self.buffers.append(a.tobytes())
        return {"$a": len(self.buffers) - 1, "dtype": str(a.dtype), "shape": list(a.shape)}

    def node(self, n):
        if id(n) in self.nodes:
            return self.nodes[id(n)]
        number = len(self.node_list)
        self.nodes[id(n)] = number
        self.node_list.append(None)  # reserved: parents may refer back to it
        self.node_list[number] = {"data": self.value(n.data), "grad": self.value(n.grad),
                                  "parents": [self.node(p) if type(p) is Node else -1 for p in n.parents],
                                  "local": [self.value(g) for g in n.local_grads], "name": self.value(n.name)}
        return number


def pack(message: dict, *, handles=None, nodes=None, numbered=None) -> bytes:
    """One message as bytes. ``handles(obj)`` gives a ``Handle`` for an object of the answer's
    process (or None). A request sends the graphs of its nodes; a reply passes ``nodes``
    (id(node) -> the number the request gave it) and may refer to those nodes only; a request
    fills ``numbered`` (number -> node) with the nodes it sends, to read the reply with."""
    writer = _Writer(nodes, handles)
    body = {key: writer.value(value) for key, value in message.items()}
    if numbered is not None:
        by_id = {id(n): n for n in _graph_nodes(message)}
        numbered.update({number: by_id[key] for key, number in writer.nodes.items() if key in by_id})
    if writer.node_list:
        body["$nodes"] = writer.node_list
    body["$sizes"] = [len(b) for b in writer.buffers]
    header = json.dumps(body, allow_nan=True).encode()
    return b"".join([struct.pack("<Q", len(header)), header, *writer.buffers])


def _graph_nodes(value, depth=0):
    """Every Node reachable from a value (through containers and parents)."""
    out, stack = [], [value]
    seen = set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if type(v) is Node:
            out.append(v)
            stack.extend(v.parents)
        elif type(v) in (list, tuple, set, frozenset):
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v.keys())
            stack.extend(v.values())
    return out


# ------------------------------------------------------------------------------ decoding
class _Reader:
    def __init__(self, body, data, offset, nodes):
        sizes = body.get("$sizes", [])
        if not isinstance(sizes, list) or not all(isinstance(s, int) and s >= 0 for s in sizes):
            raise WireError("bad array sizes")
        self.buffers, start = [], offset
        for size in sizes:
            self.buffers.append(data[start:start + size])
            start += size
        if start != len(data):
            raise WireError("the arrays' bytes do not add up")
        self.body = body
        self.table = body.get("$nodes", [])
        self.nodes = nodes  # number -> Node, shared with the caller so that replies map back
        self.fresh = {}

    def value(self, v, depth=0):
        if depth > MAX_DEPTH:
            raise WireError("nested too deep")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v
        if not isinstance(v, dict) or len(v) == 0:
            raise WireError(f"unexpected {type(v).__name__}")
        if "$a" in v:
            return self.array(v)
        if "$s" in v:
            return self.array(v["a"]).reshape(())[()]
        if "$t" in v:
            from ..tensor import tensor

            data = self.value(v["$t"], depth + 1)
            if not isinstance(data, np.ndarray):
                return data
            return tensor(data, requires_grad=bool(v.get("grad")) and data.dtype.kind == "f", dtype=data.dtype)
        if "$l" in v:
            return [self.value(x, depth + 1) for x in self.items(v["$l"])]
        if "$u" in v:
            return tuple(self.value(x, depth + 1) for x in self.items(v["$u"]))
        if "$set" in v:
            items = self.items(v["$set"])
            if not all(type(x) in (str, int, float, bool) for x in items):
                raise WireError("a set of non-plain values")
            return set(items)
        if "$d" in v:
            out = {}
            for pair in self.items(v["$d"]):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise WireError("bad dict item")
                key = self.value(pair[0], depth + 1)
                if isinstance(key, (list, dict, set, np.ndarray)):
                    raise WireError("an unhashable dict key")
                out[key] = self.value(pair[1], depth + 1)
            return out
        if "$c" in v:
            re_, im = self.items(v["$c"])
            return complex(float(re_), float(im))
        if "$e" in v:
            return Ellipsis
        if "$f" in v:
            if v["$f"] not in FUNCTIONS:
                raise WireError(f"no function named {v['$f']!r}")
            return Named(v["$f"])
        if "$n" in v:
            return self.node(v["$n"], depth)
        if "$h" in v:
            params = [str(p) for p in self.items(v.get("parameters", []))]
            return Handle(int(v["$h"]), str(v.get("kind")), str(v.get("name"))[:80], params)
        if "$o" in v:
            return Opaque(v["$o"])
        raise WireError(f"unknown value {sorted(v)[:3]}")

    @staticmethod
    def items(v):
        if not isinstance(v, list):
            raise WireError("expected a list")
        return v

    def array(self, v):
        index, dtype, shape = v.get("$a"), v.get("dtype"), v.get("shape")
        if not isinstance(index, int) or not 0 <= index < len(self.buffers) or dtype not in DTYPES:
            raise WireError("bad array")
        if not isinstance(shape, list) or len(shape) > 32 or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise WireError("bad array shape")
        buf = self.buffers[index]
        if math.prod(shape) * np.dtype(dtype).itemsize != len(buf):
            raise WireError("an array's bytes do not match its shape")
        return np.frombuffer(buf, dtype=dtype).reshape(shape).copy()

    def node(self, number, depth):
        if isinstance(number, int) and number in self.nodes:
            return self.nodes[number]
        if not isinstance(number, int) or not 0 <= number < len(self.table):
            raise WireError("bad node")
        entry = self.table[number]
        if not isinstance(entry, dict):
            raise WireError("bad node")
        n = Node(0.0)
        self.nodes[number] = n
        data = self.value(entry.get("data"), depth + 1)
        n.data = float(data) if isinstance(data, (int, float)) else data
        n.grad = self.value(entry.get("grad"), depth + 1)
        n.parents = tuple(self.node(p, depth + 1) for p in self.items(entry.get("parents", [])) if p != -1)
        n.local_grads = tuple(self.value(g, depth + 1) for g in self.items(entry.get("local", [])))
        n.name = self.value(entry.get("name", ""), depth + 1)
        return n


def unpack(data: bytes, *, nodes=None) -> dict:
    """The message in ``data`` (see ``pack``); raises ``WireError`` if it breaks the format.

    ``nodes`` maps node numbers to the Node objects already known for them (a reply about a
    graph that was sent refers to the sender's own nodes); new nodes are added to it.
    """
    try:
        if len(data) > MAX_BYTES or len(data) < 8:
            raise WireError(f"a message of {len(data)} bytes")
        (length,) = struct.unpack("<Q", data[:8])
        if length > len(data) - 8:
            raise WireError("a header longer than the message")
        body = json.loads(data[8:8 + length].decode())
        if not isinstance(body, dict):
            raise WireError("the header is not an object")
        reader = _Reader(body, data, 8 + length, nodes if nodes is not None else {})
        return {key: reader.value(value) for key, value in body.items() if not key.startswith("$")}
    except WireError:
        raise
    except (ValueError, TypeError, KeyError, RecursionError, UnicodeDecodeError, struct.error) as err:
        raise WireError(f"{type(err).__name__}: {err}") from None


# ------------------------------------------------------------------------------ frames on a pipe
def write_frame(fd, data: bytes):
    """Write one message to a pipe: its length (8 bytes), then its bytes."""
    view = memoryview(struct.pack("<Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd, n, deadline):
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd, deadline=None) -> bytes:
    """Read one message written by ``write_frame``; ``TimeoutError`` past ``deadline`` (a
    ``time.monotonic()`` value; None: wait), ``EOFError`` when the writer has closed the pipe,
    ``WireError`` for a message over ``MAX_BYTES``."""
    (length,) = struct.unpack("<Q", _read_exactly(fd, 8, deadline))
    if length > MAX_BYTES:
        raise WireError(f"a message of {length} bytes")
    return _read_exactly(fd, length, deadline)
