"""The grader's side of an answer that runs in a process of its own.

``AnswerProcess(job)`` starts the process that runs one answer (``worker.py``), in a sandbox of
its own whose library is the exercise's student edition (``sandbox.py``, ``edition.py``; with
``confined=False``, forked from a process that loaded tinymlp), and talks to it in plain data
(``wire.py``). What the answer is comes back as stand-ins that the checks use exactly
as they would use the answer itself:

* a Function class: a ``Function`` of the grading process whose forward sends the input arrays
  and returns the answer's output, and whose backward sends the upstream gradient and returns
  the answer's gradients; the grading process's engine, gradcheck and comparisons do the rest;
* a Module class: a callable that builds the module there; the module: an object with the
  answer's ``named_parameters`` (held here, sent with every call) that runs it there;
* a function: a callable that sends its arguments and returns the answer's result (through a
  ``Function`` when its inputs require gradients, so that gradcheck can differentiate it).

Nothing but data comes back, and nothing of the answer's is imported or run here: whatever the
answer changes in its own process changes only the numbers it sends. A call that does not
return in time ends the process (``AnswerTimeout``); an error in the answer comes back as a
``RemoteError`` with the answer's own file, cell and line.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import os
import subprocess
import time

import numpy as np

from .wire import Handle, WireError, pack, read_frame, unpack, write_frame

__all__ = ["AnswerProcess", "AnswerTimeout", "ChannelError", "RemoteError"]

WORKER_ENV = {"TINYMLP_FAST": "0", "TINYMLP_NUMBA": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
"""The answer's process: the reference tier only, one BLAS thread (the checks' arrays are small)."""


class RemoteError(Exception):
    """The answer raised in its process: ``details`` says what and where; ``not_done`` is the id
    of the exercise whose stub it reached; ``forbidden``: it was refused library code."""

    def __init__(self, details, not_done=None, forbidden=False):
        super().__init__(details)
        self.details, self.not_done, self.forbidden = details, not_done, forbidden


class AnswerTimeout(TimeoutError):
    """The answer did not answer in time; its process was ended."""


class ChannelError(RuntimeError):
    """The answer's process ended, or sent what is not a reply."""


class _Zygote:
    """A process that has loaded tinymlp once and forks a fresh answer process on request (a new
    one then starts in milliseconds, not the second an interpreter takes to load the library).
    It runs nothing of the grader's: ``python -m tinymlp.lessons.worker --zygote``."""

    def __init__(self):
        import socket
        import sys

        if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
            raise RuntimeError("the grader runs each answer in a process of its own, forked from a process that "
                               "loaded tinymlp: this needs a POSIX system (Linux, macOS)")
        ours, theirs = socket.socketpair()
        env = {**os.environ, **WORKER_ENV}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        paths = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        command = [sys.executable, "-m", "tinymlp.lessons.worker", "--zygote", str(theirs.fileno())]
        self.process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.socket = ours

    def alive(self):
        return self.process.poll() is None

    def spawn(self, job):
        """A new answer process for ``job``: (its pid, the pipe to write requests to, the pipe to read replies from)."""
        import json
        import socket
        import struct

        requests_in, requests_out = os.pipe()
        replies_in, replies_out = os.pipe()
        try:
            body = json.dumps(job).encode()
            socket.send_fds(self.socket, [struct.pack("<cQ", b"s", len(body))], [requests_in, replies_out])
            self.socket.sendall(body)
            pid = self._reply()
        except BaseException:
            for fd in (requests_out, replies_in):
                os.close(fd)
            raise
        finally:
            os.close(requests_in)
            os.close(replies_out)
        return pid, requests_out, replies_in

    def end(self, pid):
        """End answer process ``pid`` if it still runs (the zygote knows which of its children do)."""
        import struct

        try:
            self.socket.sendall(struct.pack("<cQ", b"k", pid))
            self._reply()
        except (OSError, ChannelError):
            pass

    def _reply(self):
        import struct

        reply = b""
        while len(reply) < 8:
            chunk = self.socket.recv(8 - len(reply))
            if not chunk:
                raise ChannelError("the grader's answer-process server ended")
            reply += chunk
        return struct.unpack("<Q", reply)[0]

    def close(self):
        """End the zygote: it leaves when its socket closes."""
        self.socket.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_ZYGOTE = None


def _zygote():
    global _ZYGOTE
    if _ZYGOTE is None or not _ZYGOTE.alive():
        _ZYGOTE = _Zygote()
        atexit.register(_ZYGOTE.close)
    return _ZYGOTE


class _Sandboxed:
    """An answer process in a sandbox of its own (``sandbox.py``), which shows the exercise's
    edition of the library (``edition.py``): ``worker.sandboxed`` there."""

    def __init__(self, hide=()):
        self.hide, self.box = hide, None

    def spawn(self, job):
        import json

        from .edition import edition
        from .sandbox import Sandbox

        library = edition(job["exercise"], job.get("forbidden", ()))
        self.box = Sandbox(library / "tinymlp", hide=self.hide)
        requests_in, requests_out = os.pipe()
        replies_in, replies_out = os.pipe()
        try:
            # numba (a second's load) is left out: the answer's process runs the reference tier only
            start = (f"import sys; sys.modules['numba'] = None; from tinymlp.lessons.worker import sandboxed; "
                     f"sandboxed({requests_in}, {replies_out})")
            self.box.start(["python", "-c", start], pass_fds=(requests_in, replies_out), env=WORKER_ENV)
            write_frame(requests_out, json.dumps(job).encode())
        except BaseException:
            for fd in (requests_out, replies_in):
                os.close(fd)
            self.box.end()
            raise
        finally:
            os.close(requests_in)
            os.close(replies_out)
        return self.box.child, requests_out, replies_in

    def end(self, pid):
        if self.box is not None:
            self.box.end()  # returns once every process of the sandbox is gone


class AnswerProcess:
    """One answer, running in its own process: in a sandbox of its own (``confined``), else
    forked from a process that loaded tinymlp, confined by Python alone. ``first`` is its first
    reply: ``{"answer": ...}`` (its value, stand-ins for what stays there) or ``{"error": ...}``
    (the notebook's code raised, or was refused)."""

    def __init__(self, job, timeout=120, *, confined=True, hide=()):
        self._zygote = _Sandboxed(hide) if confined else _zygote()
        self.pid, self._requests, self._replies = self._zygote.spawn(job)
        self.closed = False
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        self._limit = None
        try:
            self.first = self._receive({})
            if "answer" in self.first:
                self.first["answer"] = self.stand_in(self.first["answer"])
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ talking
    def request(self, op, **fields):
        """Send one request; return the reply's fields, or raise what the answer raised."""
        numbered = {}
        if self.closed:
            raise ChannelError("the answer's process has ended")
        try:
            write_frame(self._requests, pack({"op": op, **fields}, numbered=numbered))
        except OSError as err:
            raise ChannelError(self._ended(f"could not be reached ({err})")) from None
        reply = self._receive(numbered)
        for number, grad in (reply.get("grads") or {}).items():
            if number in numbered:
                numbered[number].grad = grad
        error = reply.get("error")
        if error is not None:
            if not isinstance(error, dict):
                raise ChannelError("the answer's process sent an error the grader cannot read")
            raise RemoteError(str(error.get("text", "")), not_done=error.get("not_done") or None,
                              forbidden=bool(error.get("forbidden")))
        return reply

    def _receive(self, numbered):
        deadline = self.deadline
        if self._limit is not None:
            deadline = min(deadline, time.monotonic() + self._limit)
        try:
            data = read_frame(self._replies, deadline)
        except TimeoutError:
            self.close()
            raise AnswerTimeout(f"the check did not finish in {self._limit or self.timeout:.3g} s: an endless loop in "
                                "the answer, or an answer far slower than its formula") from None
        except EOFError:
            self.close()
            raise ChannelError(self._ended("ended without a reply")) from None
        except (OSError, WireError) as err:
            self.close()
            raise ChannelError(f"the answer's process sent a reply the grader cannot read ({err})") from None
        try:
            reply = unpack(data, nodes=numbered)
        except WireError as err:
            self.close()
            raise ChannelError(f"the answer's process sent a reply the grader cannot read ({err})") from None
        return reply

    @staticmethod
    def _ended(what):
        return f"the answer's process {what}: the answer ended it or crashed it"

    @contextlib.contextmanager
    def limit(self, seconds):
        """Inside: a call of the answer that takes longer than ``seconds`` raises ``AnswerTimeout``."""
        previous, self._limit = self._limit, seconds
        try:
            yield
        finally:
            self._limit = previous

    def violations(self):
        """The refusals the answer's process recorded (the answer may have caught them)."""
        return [str(v) for v in self.request("violations").get("value", [])]

    def evidence(self):
        """The answer's own number types (classes with arithmetic operators), as its process saw them."""
        return [str(v) for v in self.request("evidence").get("value", [])]

    def backwards(self):
        """Names of the answer's own Functions whose backward has run."""
        return {str(v) for v in self.request("backwards").get("value", [])}

    def close(self):
        if self.closed:
            return
        self.closed = True
        for fd in (self._requests, self._replies):
            os.close(fd)
        self._zygote.end(self.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ stand-ins
    def stand_in(self, value):
        """What the checks use in place of a value of the answer's process."""
        if isinstance(value, Handle):
            kind = {"function": self._function, "module_class": self._module_class, "module": self._module,
                    "callable": self._callable}.get(value.kind)
            return kind(value) if kind else value
        if isinstance(value, tuple):
            return tuple(self.stand_in(v) for v in value)
        if isinstance(value, list):
            return [self.stand_in(v) for v in value]
        return value

    @staticmethod
    def array(value):
        """An output of the answer as an array (it may have returned a Tensor)."""
        from ..tensor import Tensor

        if isinstance(value, Tensor):
            return value.numpy()
        if isinstance(value, (np.ndarray, np.generic, int, float)) and not isinstance(value, bool):
            return np.asarray(value)
        raise RemoteError(f"forward returned a {getattr(value, 'type_name', type(value).__name__)}: return an array")

    def _function(self, handle):
        return self._differentiable(handle, 0, ())

    def _differentiable(self, handle, n_inputs, names):
        """A Function of this process that runs the answer there: ``handle`` a Function class
        (n_inputs 0: every positional input is the answer's) or a module or function whose last
        inputs are the parameters ``names``."""
        from ..autograd import Function

        proc = self

        class Remote(Function):
            @staticmethod
            def forward(ctx, *args, **kwargs):
                n = len(args) - len(names)
                params = dict(zip(names, args[n:]))
                reply = proc.request("call", target=handle.number, args=list(args[:n]), kwargs=kwargs,
                                     needs=list(ctx.needs_input_grad[:n]), params=params,
                                     record=any(ctx.needs_input_grad))
                ctx.remote = reply.get("ctx")
                return proc.array(reply.get("value"))

            @staticmethod
            def backward(ctx, grad):
                if ctx.remote is None:
                    raise ChannelError("the answer's process recorded no graph for this call")
                value = proc.request("grad", ctx=ctx.remote, grad=grad).get("value")
                if not isinstance(value, list):
                    raise ChannelError("the answer's process sent gradients the grader cannot read")
                return value[0] if len(value) == 1 else tuple(value)

        Remote.__name__ = Remote.__qualname__ = handle.name
        return Remote

    def _module_class(self, handle):
        proc = self

        def construct(*args, **kwargs):
            reply = proc.request("call", target=handle.number, args=list(args), kwargs=kwargs)
            return proc.stand_in(reply.get("value"))

        construct.__name__ = construct.__qualname__ = handle.name
        return construct

    def _module(self, handle):
        return type(handle.name, (RemoteModule,), {})(self, handle)  # named as the answer's class, for reports

    def _callable(self, handle):
        return RemoteCallable(self, handle)


def _signature(names):
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])


class RemoteModule:
    """A module of the answer's process: its parameters are held here (gradcheck swaps and
    perturbs them) and sent with every call."""

    def __init__(self, proc, handle):
        from ..nn import Parameter

        self._proc, self._handle = proc, handle
        listed = proc.request("parameters", target=handle.number).get("value") or []
        self._params = []
        for item in listed:
            if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], np.ndarray):
                self._params.append((str(item[0]), Parameter(item[1], dtype=item[1].dtype)))
        self._call = proc._differentiable(handle, 0, tuple(name for name, _ in self._params))

        def forward(*args):
            return self(*args)
        forward.__signature__ = _signature(handle.parameters or ("x",))
        self.forward = forward

    def __repr__(self):
        return f"{self._handle.name}()"

    def named_parameters(self):
        return iter(list(self._params))

    def parameters(self):
        return iter([p for _, p in self._params])

    def named_buffers(self):
        return iter([])

    def __call__(self, *inputs):
        return self._call.apply(*inputs, *(p for _, p in self._params))


class RemoteCallable:
    """A function of the answer's process (its name and parameter names kept, for reports)."""

    def __init__(self, proc, handle):
        self._proc, self._handle = proc, handle
        self.__name__ = self.__qualname__ = handle.name
        self.__signature__ = _signature(handle.parameters)
        self._graph = proc._differentiable(handle, 0, ())

    def __call__(self, *args, **kwargs):
        from ..grad_mode import is_grad_enabled
        from ..tensor import Tensor

        if is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args):
            return self._graph.apply(*args, **kwargs)
        return self._proc.stand_in(self._proc.request("call", target=self._handle.number, args=list(args),
                                                      kwargs=kwargs).get("value"))

    def __repr__(self):
        return self._handle.name
