"""The process that runs one exercise's answer, and nothing else: ``serve(job, requests, replies)``.

The grader (``remote.py``) starts one such process per exercise and submission. The job says
which exercise, the library code it makes unavailable, and the answer's program: the notebook's
cells and the statements of them that define the answer (``notebook.py``), and the answer's
expression. Before any of the student's code runs, the process

1. sends its output to /dev/null and works in the root folder (no folder of anyone's);
2. loads tinymlp's modules (never the checks: they hold the references), and makes the
   exercise's library code, numerical differentiation and the fast tier unavailable (``forbidden.py``);
3. compiles the program's statements, then confines itself (``confine.py``): no files written,
   no processes, no network, no code built at run time by the answer.

It then runs the program, evaluates the answer and replies with it (``wire.py``: plain data; the
answer's classes, functions and modules stay here and are called by number), and serves the
grader's requests until the grader closes the pipe:

* ``call``: call an object of the answer with arguments (a Function class through the engine's
  own ``apply``; inputs marked in ``needs`` become Tensors that require a gradient; a module gets
  ``params`` first); with ``record``, keep the graph for a later ``grad``;
* ``grad``: backward from a kept output with the grader's upstream gradient; the gradients of
  the marked inputs, then of the module's parameters;
* ``parameters``: a module's named parameters; ``violations``: the refusals so far (the answer
  may have caught them); ``backwards``: the answer's own Functions whose backward has run;
  ``evidence``: the answer's own number types (dual numbers), however they were made.

What this process computes is only ever the answer's numbers: the inputs, the references, the
comparisons and the grade are the grader's.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import linecache
import os
import pkgutil
import sys

import numpy as np

__all__ = ["serve"]

ARITHMETIC = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__pow__", "__neg__")
KEEP_GRAPHS = 64  # recorded calls kept for a backward (gradcheck records one or two at a time)


class _Exercise:
    """What the guard needs to know of an exercise (the checks are not loaded here)."""

    def __init__(self, ex_id, forbidden, derived=False):
        self.id, self.forbidden, self.derived = ex_id, tuple(forbidden), derived


def zygote(fd):
    """Load tinymlp, then fork one answer process per request on the socket ``fd`` (from
    ``remote.py``): a job and its two pipes in, the child's pid out; or a pid to end, if it is
    still one of ours. Runs until the grader closes the socket."""
    import json
    import signal
    import socket
    import struct

    _load_library()
    from .forbidden import Guard

    Guard(_Exercise("warm", ()), process=True)  # the library's fingerprints, computed once for every child
    sock = socket.socket(fileno=fd)
    children = set()
    while True:
        head, fds, _, _ = socket.recv_fds(sock, 9, 2)
        if len(head) < 9:
            return
        kind, n = struct.unpack("<cQ", head)
        while children:  # the children that have ended are no longer ours to end
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
        if kind == b"k":
            if n in children:
                os.kill(n, signal.SIGKILL)
                os.waitpid(n, 0)
                children.discard(n)
            sock.sendall(struct.pack("<Q", 0))
            continue
        body = b""
        while len(body) < n:
            chunk = sock.recv(n - len(body))
            if not chunk:
                return
            body += chunk
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                os.setsid()
                serve(json.loads(body), fds[0], fds[1])
            finally:
                os._exit(0)
        children.add(pid)
        for f in fds:
            os.close(f)
        sock.sendall(struct.pack("<Q", pid))


def serve(job, requests, replies):
    """Run the answer of ``job`` and serve the grader's requests (see the module docstring);
    ``requests`` and ``replies`` are the file descriptors of the two pipes."""
    _quiet()
    os.chdir(os.sep)  # no folder of the grader's or the student's: relative paths lead nowhere
    _load_library()
    from .confine import confine
    from .forbidden import Guard

    guard = Guard(_Exercise(job["exercise"], job.get("forbidden", ()), bool(job.get("derived"))), process=True)
    guard.__enter__()
    server = _Server(guard, requests, replies)
    statements, answer_code, files = _compile(job)
    begin = confine(answer_files=files, allowed_code=[id(c) for c in statements] + [id(answer_code)])
    begin()
    server.run_program(statements, answer_code)
    server.loop()


def _quiet():
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)


NOT_LOADED = ("tinymlp.lessons.checks", "tinymlp.lessons.grader", "tinymlp.lessons.reports",
              "tinymlp.lessons.similarity", "tinymlp.lessons.identity", "tinymlp.__main__", "tinymlp.lessons.__main__")


def library_modules():
    """The names of tinymlp's modules that an answer's process loads (found on disk, not imported)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names, stack = [], [(root, "tinymlp.")]
    while stack:
        path, prefix = stack.pop()
        for info in pkgutil.iter_modules([path], prefix):
            if info.name.startswith(NOT_LOADED):
                continue
            names.append(info.name)
            if info.ispkg:
                stack.append((os.path.join(path, info.name.rsplit(".", 1)[1]), info.name + "."))
    return sorted(names)


def _load_library():
    """Every module of tinymlp loaded now, while loading is allowed, except the checks."""
    for name in library_modules():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (an optional module (CuPy kernels, interop extras) may not load)
            pass
    for name in [n for n in sys.modules if n.startswith("tinymlp.lessons.checks")] + ["tinymlp.lessons.checks"]:
        sys.modules[name] = None  # the checks' references: importing them fails here
    sys.modules.setdefault("checks", sys.modules["tinymlp.lessons"])  # old notebooks: from checks import check


def _compile(job):
    """The program's statements and the answer's expression, compiled with the notebook's cell names."""
    trees, statements = {}, []
    for filename, source in job["cells"].items():
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        trees[filename] = ast.parse(source, filename=filename)
    for filename, index in job["statements"]:
        node = trees[filename].body[index]
        statements.append(compile(ast.Module(body=[node], type_ignores=[]), filename, "exec"))
    label = job.get("label", "notebook")
    answer_file = f"<{label}, the check call>"
    answer_code = compile(job["answer"], answer_file, "eval")
    return statements, answer_code, set(job["cells"]) | {answer_file}


class _Server:
    def __init__(self, guard, requests, replies):
        self.guard, self.requests, self.replies = guard, requests, replies
        self.objects, self.numbers = [], {}
        self.graphs, self.next_graph = {}, 0

    # ------------------------------------------------------------------ replies
    def send(self, message, nodes=None):
        from .wire import pack, write_frame

        known = {id(n): k for k, n in (nodes or {}).items()}
        write_frame(self.replies, pack(message, handles=self.handle_of, nodes=known))

    def send_error(self, err):
        from .forbidden import Forbidden
        from .runner import describe_error, stub_reached

        forbidden = _within(err, Forbidden)
        try:
            text = str(forbidden) if forbidden is not None else describe_error(err)
        except Exception:  # noqa: BLE001 (an exception whose message itself raises)
            text = f"{type(err).__name__} (its message could not be read)"
        self.send({"error": {"text": text, "not_done": stub_reached(err), "forbidden": forbidden is not None}})

    def handle_of(self, obj):
        """A ``Handle`` for an object that stays here (None: it is not one of those)."""
        from ..autograd import Function
        from ..nn import Module
        from .wire import Handle

        if isinstance(obj, type) and issubclass(obj, Function):
            kind, fn = "function", obj.forward
        elif isinstance(obj, type) and issubclass(obj, Module):
            kind, fn = "module_class", obj.__init__
        elif isinstance(obj, Module):
            kind, fn = "module", obj.forward
        elif callable(obj) and not isinstance(obj, type):
            kind, fn = "callable", obj
        else:
            return None
        if id(obj) not in self.numbers:
            self.numbers[id(obj)] = len(self.objects)
            self.objects.append(obj)
        try:
            names = [p for p in inspect.signature(fn).parameters if p not in ("self", "ctx")]
        except (TypeError, ValueError):
            names = []
        name = getattr(obj, "__name__", None) or type(obj).__name__
        return Handle(self.numbers[id(obj)], kind, str(name), names)

    # ------------------------------------------------------------------ the program
    def run_program(self, statements, answer_code):
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        try:
            for code in statements:
                exec(code, namespace)  # noqa: S102 (the student's own code, in this process of its own)
            self.guard.mark_answer()
            answer = eval(answer_code, namespace)  # noqa: S307
        except BaseException as err:  # noqa: BLE001 (whatever the student's code raises is the result)
            self.send_error(err)
            return
        own = [v for v in namespace.values() if getattr(v, "__module__", None) == "__main__"]
        copied = self.guard.copies(*own)
        if copied:
            self.send({"error": {"text": copied[0], "forbidden": True}})
            return
        self.send({"answer": answer})

    def loop(self):
        from .wire import WireError, read_frame, unpack

        while True:
            try:
                data = read_frame(self.requests)
            except (EOFError, OSError, WireError):
                return
            nodes = {}
            try:
                message = unpack(data, nodes=nodes)
                reply = getattr(self, "do_" + str(message.get("op")))(message)
            except WireError:
                return
            except BaseException as err:  # noqa: BLE001 (the answer's errors are replies)
                self.send_error(err)
                continue
            if nodes:
                reply["grads"] = {number: node.grad for number, node in nodes.items()}
            self.send(reply, nodes)

    # ------------------------------------------------------------------ requests
    def do_call(self, message):
        from ..autograd import Function
        from ..nn import Module
        from ..tensor import tensor

        target = self.objects[int(message["target"])]
        args, kwargs = list(message.get("args") or []), dict(message.get("kwargs") or {})
        needs = list(message.get("needs") or [])
        inputs = [None] * len(args)
        for i, need in enumerate(needs[:len(args)]):
            if need and isinstance(args[i], np.ndarray):
                args[i] = inputs[i] = tensor(args[i], requires_grad=True, dtype=args[i].dtype)
        params = []
        if isinstance(target, Module):
            own = dict(target.named_parameters())
            for name, value in (message.get("params") or {}).items():
                if name in own and isinstance(value, np.ndarray):
                    own[name].data = value
                    own[name].grad = None
                    params.append(own[name])
        if isinstance(target, type) and issubclass(target, Function):
            out = self.guard.engine_apply(target, *args, **kwargs)
        else:
            with self.guard.inside("call"):
                out = target(*args, **kwargs)
        reply = {"value": out}
        if message.get("record"):
            if not hasattr(out, "backward"):
                raise TypeError(f"the answer returned a {type(out).__name__}, not a Tensor: nothing to differentiate")
            self.graphs[self.next_graph] = (out, inputs, params)
            self.graphs.pop(self.next_graph - KEEP_GRAPHS, None)
            reply["ctx"] = self.next_graph
            self.next_graph += 1
        return reply

    def do_grad(self, message):
        from ..tensor import tensor

        out, inputs, params = self.graphs[int(message["ctx"])]
        grad = message["grad"]
        for t in inputs + params:
            if t is not None:
                t.grad = None
        out.backward(tensor(grad, dtype=grad.dtype), retain_graph=True)
        value = [None if t is None else t.grad for t in inputs] + [p.grad for p in params]
        return {"value": [v.numpy() if hasattr(v, "numpy") else v for v in value]}

    def do_parameters(self, message):
        target = self.objects[int(message["target"])]
        return {"value": [[name, p.numpy()] for name, p in target.named_parameters()]}

    def do_violations(self, message):
        return {"value": self.guard.violations}

    def do_backwards(self, message):
        return {"value": sorted(self.guard.ran)}

    def do_evidence(self, message):
        """The answer's own number types, however they were made (a class body, ``type(...)``,
        operators assigned later): classes of the notebook's with two arithmetic operators or more."""
        from ..autograd import Function
        from ..nn import Module

        found, stack, seen = [], list(object.__subclasses__()), set()
        while stack:
            cls = stack.pop()
            if cls in seen:
                continue
            seen.add(cls)
            try:
                stack.extend(type.__subclasses__(cls))
            except TypeError:
                continue
            if cls.__module__ != "__main__" or issubclass(cls, (Function, Module, BaseException)):
                continue
            ops = sorted(name for name in ARITHMETIC if callable(vars(cls).get(name)))
            if len(ops) >= 2:
                found.append(f"{cls.__qualname__} ({', '.join(ops)})")
        return {"value": sorted(found)}


def _within(err, kind):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, kind):
            return err
        err = err.__cause__ or err.__context__
    return None


def sandboxed(requests, replies):
    """In an answer's sandbox (``sandbox.py``): read the job, the first message on ``requests``,
    then serve it."""
    import json

    from .wire import read_frame

    os.set_inheritable(requests, False)
    os.set_inheritable(replies, False)
    serve(json.loads(read_frame(requests)), requests, replies)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--zygote":
    zygote(int(sys.argv[2]))
