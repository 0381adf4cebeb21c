"""What an answer's process may not do: write files, start processes, reach the network or other
processes, load native code, read files outside the libraries, or rework code at run time.

This is the second layer: the first is the operating system's sandbox the process runs in
(``sandbox.py``), which shows it nothing to write, no network, no other process and no library
code of the exercise. Where the grader runs ``--unconfined`` these barriers are all there is.

The grader runs each answer in a process of its own (``worker.py``). Before the answer's code
runs there, ``confine`` sets two barriers that the code cannot take down again:

* an audit hook (PEP 578; a hook cannot be removed once added) that refuses, from then on:
  opening a file for writing, and reading one outside Python's and the libraries' folders (the
  other students' notebooks, the answer key); removing, renaming or creating files and folders;
  starting processes, signalling them, forking; sockets; ``ctypes`` and other ways to load or
  call native code; importing tinymlp's modules anew (a fresh copy of code made unavailable);
  and, when the answer's own code asks, compiling or executing code, creating code or function
  objects, reading a function's code or a frame, walking the garbage collector or the stack;
* resource limits: no file may grow past 0 bytes (a write from native code fails too), no
  core dumps, and a ceiling on memory.

Each refusal raises ``Forbidden`` with the reason. Library code keeps working: imports of
Python's and NumPy's modules, ``namedtuple`` and ``dataclass`` (which compile code) and
``inspect`` are used by the library on the answer's behalf, not by the answer.
"""

from __future__ import annotations

import os
import sys
import sysconfig

from .forbidden import Forbidden

__all__ = ["confine"]

ALWAYS = {
    "subprocess.Popen": "starts a process", "os.system": "runs a shell command", "os.exec": "runs a program",
    "os.posix_spawn": "starts a process", "os.spawn": "starts a process", "os.fork": "forks the process",
    "os.forkpty": "forks the process", "os.kill": "signals a process", "os.killpg": "signals processes",
    "signal.pthread_kill": "signals a thread", "pty.spawn": "starts a process", "os.startfile": "starts a program",
    "os.remove": "removes a file", "os.rename": "renames a file", "os.rmdir": "removes a folder",
    "os.mkdir": "creates a folder", "os.chmod": "changes a file's permissions",
    "os.chown": "changes a file's owner", "os.link": "creates a link", "os.symlink": "creates a link",
    "os.truncate": "truncates a file", "os.utime": "changes a file's times",
    "os.chdir": "changes the working folder", "os.putenv": "changes the environment",
    "os.unsetenv": "changes the environment", "os.setxattr": "changes a file's attributes",
    "os.removexattr": "changes a file's attributes", "shutil.copyfile": "copies files",
    "shutil.copytree": "copies files", "shutil.move": "moves files", "shutil.rmtree": "removes files",
    "shutil.make_archive": "writes an archive", "shutil.unpack_archive": "writes files",
    "socket.__new__": "opens a socket", "socket.connect": "opens a connection", "socket.bind": "opens a socket",
    "socket.getaddrinfo": "reaches the network", "ctypes.dlopen": "loads native code",
    "ctypes.dlsym": "loads native code", "ctypes.cdata": "reaches raw memory",
    "ctypes.call_function": "calls native code", "ctypes.addressof": "reaches raw memory",
    "ctypes.string_at": "reads raw memory", "ctypes.PyObj_FromPtr": "reaches raw memory",
    "mmap.__new__": "maps memory", "gc.get_objects": "walks every object of the interpreter",
    "gc.get_referrers": "walks the interpreter's objects", "gc.get_referents": "walks the interpreter's objects",
    "sys._current_frames": "reads every thread's stack", "sys.settrace": "changes the interpreter's tracing",
    "sys.setprofile": "changes the interpreter's tracing", "builtins.input": "waits for keyboard input",
    "builtins.breakpoint": "stops for a debugger", "urllib.Request": "reaches the network",
    "http.client.connect": "reaches the network", "ftplib.connect": "reaches the network",
    "smtplib.connect": "reaches the network", "webbrowser.open": "opens a browser",
    "winreg.ConnectRegistry": "reads the registry",
}
FROM_THE_ANSWER = {
    "compile": "compiles code the grader cannot read", "exec": "runs code the grader cannot read",
    "code.__new__": "builds code objects", "function.__new__": "builds functions from code objects",
    "object.__getattr__": "reads the interpreter's internals",
    "object.__setattr__": "rewrites the interpreter's internals",
    "object.__delattr__": "rewrites the interpreter's internals",
    "sys._getframe": "reads the interpreter's call stack", "marshal.loads": "loads compiled code",
}
NO_IMPORT = ("ctypes", "_ctypes", "cffi", "_cffi_backend", "subprocess", "_posixsubprocess", "socket", "_socket",
             "ssl", "_ssl", "multiprocessing", "_multiprocessing", "pty", "mmap", "fcntl", "resource", "signal",
             "winreg", "_winapi", "msvcrt", "asyncio", "selectors", "select")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class _State:
    answer = False  # the answer's code may run from now on
    busy = False  # inside the hook (it must not see its own events)


def _readable_folders():
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    folders |= {p for p in sysconfig.get_paths().values() if p}
    for name in ("numpy", "tinymlp", "matplotlib", "scipy", "numba", "llvmlite", "IPython"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            folders.add(os.path.dirname(os.path.dirname(os.path.abspath(module.__file__))))
    if "matplotlib" in sys.modules:
        try:
            folders |= {sys.modules["matplotlib"].get_configdir(), sys.modules["matplotlib"].get_cachedir()}
        except Exception:  # noqa: BLE001 (without a config folder there is nothing to allow)
            pass
    return tuple(os.path.abspath(f) + os.sep for f in folders if f) + ("/dev/null", "/dev/urandom", "/proc/self/",
                                                                       "/sys/devices/system/cpu/")


def confine(*, answer_files, allowed_code, memory_bytes=4 << 30):
    """Set the barriers (see the module docstring); returns ``begin()``, which makes them apply
    from the moment the answer's code is about to run.

    ``answer_files``: the file names the answer's code is compiled with (``<alice/04.ipynb,
    cell 7>``); ``allowed_code``: ids of the code objects the worker itself compiled and will
    execute.
    """
    state = _State()
    tinymlp_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    readable = _readable_folders()
    answer_files = frozenset(answer_files)
    allowed_code = frozenset(allowed_code)
    getframe = sys._getframe

    def from_the_answer():
        frame = getframe(2)  # 0: this function, 1: the hook, 2: whoever raised the event
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back
        return frame is not None and frame.f_code.co_filename in answer_files

    def refuse(why):
        raise Forbidden(f"the answer {why}: an answer computes with NumPy and tinymlp only")

    def hook(event, args):
        if not state.answer or state.busy:
            return
        state.busy = True
        try:
            if event in ALWAYS:
                refuse(ALWAYS[event])
            elif event == "open":
                _check_open(args, readable, refuse)
            elif event == "import":
                name = str(args[0])
                if name.split(".")[0] in NO_IMPORT:
                    refuse(f"imports {name}")
                if name.startswith("tinymlp.lessons.checks"):
                    refuse("reaches for the checks' own references (tinymlp.lessons.checks), which are not in its "
                           "process: the grader compares its numbers elsewhere")
                if name == "tinymlp" or name.startswith("tinymlp."):
                    refuse(f"imports {name} anew (a fresh copy of library code the exercise makes unavailable)")
            elif event == "exec":
                code = args[0]
                if id(code) in allowed_code:
                    return
                filename = os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") else ""
                if filename.startswith(tinymlp_dir):
                    refuse("runs tinymlp's code anew (a fresh copy of library code the exercise makes unavailable)")
                if from_the_answer():
                    refuse(FROM_THE_ANSWER["exec"])
            elif event in FROM_THE_ANSWER and from_the_answer():
                refuse(FROM_THE_ANSWER[event])
        finally:
            state.busy = False

    sys.addaudithook(hook)
    _limit(memory_bytes)

    def begin():
        state.answer = True
    return begin


def _check_open(args, readable, refuse):
    path, mode, flags = (list(args) + [None, None, None])[:3]
    writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & WRITE_FLAGS)
    if isinstance(path, int):  # a file descriptor already open
        if writes:
            refuse("writes to an open file")
        return
    if path is None:
        return
    name = os.path.abspath(os.fsdecode(path))
    if writes:
        refuse(f"opens a file to write ({name})")
    if not name.startswith(readable) and name != "/dev/null":
        refuse(f"reads a file outside the libraries ({name})")


def _limit(memory_bytes):
    try:
        import resource
        import signal
    except ImportError:  # not a Unix system: the audit hook alone
        return
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of ending the process
    for limit, value in ((resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        used = 0
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        value = used + memory_bytes
        if hard == resource.RLIM_INFINITY or value < hard:
            resource.setrlimit(resource.RLIMIT_AS, (value, hard))
    except (ValueError, OSError, AttributeError):
        pass
