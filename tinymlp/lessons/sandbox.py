"""The operating system's confinement of everything a submission runs: a throwaway sandbox.

The notebook's kernel and the processes that run its answers each start in a sandbox of their
own, made by bubblewrap (``bwrap``, the sandbox of Flatpak: Linux namespaces, no daemon, no
privileges needed where unprivileged user namespaces are allowed). Inside, as an unprivileged
user with no capabilities, a process sees

* the Python environment, read-only: the interpreter's and the virtual environment's folders
  (``sys.prefix``, ``sys.base_prefix``, their site-packages) and the system's ``/usr`` and
  shared-library configuration;
* a library folder, read-only, at ``/sandbox/lib``: for a kernel the tinymlp package, for an
  answer the student edition of it that the exercise's own library code is absent from
  (``edition.py``);
* a scratch folder at ``/sandbox/scratch``, its working folder and home, and a private ``/tmp``;

and nothing else: not the checkout (the answer key in ``lessons/``), not the other students'
notebooks, not the grader's outputs, not the network (a network namespace of its own with only
loopback), not the other processes of the machine (a PID namespace of its own). Where one of
those places lies inside a folder shown (a checkout inside the virtual environment's folder, or
tinymlp installed into its site-packages), it is covered by an empty one. Where a folder shown
lies inside one of them (a virtual environment inside the checkout), the sandbox holds that folder
alone: the names on its path are seen, nothing else of the checkout.

``Sandbox.start`` runs a command in it; ``Sandbox.end`` kills the sandbox's first process, the
kernel then kills every other process of its PID namespace, and ``end`` returns only once they
are all gone: nothing a submission started outlives its grading or sees the results written.
The scratch folder is removed then.

``unavailable()`` says why no sandbox can start here (bubblewrap missing, namespaces refused),
in one sentence; the grader then grades only when told ``--unconfined``, and says so.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import select
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import time

__all__ = ["LIB", "SCRATCH", "Sandbox", "unavailable"]

LIB, SCRATCH = "/sandbox/lib", "/sandbox/scratch"
PACKAGE = pathlib.Path(__file__).resolve().parent.parent  # the tinymlp package: the exercises' library code
ROOT = PACKAGE.parent  # the checkout (or site-packages when installed)
CHECKOUT = ROOT if (ROOT / "setup.cfg").exists() else None  # its answer key in lessons/; not site-packages
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/fonts",
       "/etc/localtime", "/etc/matplotlibrc")
PASSED_ON = re.compile(r"^(TINYMLP_|OPENBLAS_|OMP_|MKL_|NUMBA_|LANG$|LC_|TZ$|MPLBACKEND$|PYTHONHASHSEED$)")
UID = 65534  # nobody: the user the sandbox's processes run as


def bwrap() -> str | None:
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=None)
def unavailable() -> str:
    """"" when a sandbox can start here, else one sentence saying why not."""
    if not sys.platform.startswith("linux"):
        return f"the grader's sandbox needs Linux (this is {sys.platform})"
    path = bwrap()
    if path is None:
        return ("bubblewrap (bwrap) is not installed, and the grader runs every submission in a bubblewrap sandbox: "
                "install it (Debian, Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)")
    probe = [path, "--unshare-all", "--unshare-user", "--uid", str(UID), "--gid", str(UID), "--die-with-parent",
             *_system_binds(), "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        run = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bubblewrap could not start a sandbox here ({err})"
    if run.returncode != 0:
        said = (run.stderr.strip().splitlines() or ["no reason given"])[-1]
        return (f"bubblewrap cannot create a sandbox here ({said}): unprivileged user namespaces are off "
                "(sysctl kernel.unprivileged_userns_clone=1, or a container that allows them)")
    return ""


def _system_binds():
    out = []
    for path in SYSTEM:
        if os.path.islink(path):
            out += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            out += ["--ro-bind", path, path]
    for path in ETC:
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    return out


def python_folders() -> list:
    """The folders of the Python environment: the prefixes and the site-packages (no user site)."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    found |= {p for key, p in sysconfig.get_paths().items() if key in ("stdlib", "platstdlib", "purelib", "platlib")}
    found |= set(site.getsitepackages())
    folders = sorted({os.path.realpath(p) for p in found if p and os.path.isdir(p)} |
                     {os.path.abspath(p) for p in found if p and os.path.isdir(p)})
    kept = []
    for f in folders:  # sorted: a folder comes before the folders inside it
        if f != "/usr" and not any(f.startswith(k + os.sep) for k in kept + ["/usr"]):
            kept.append(f)
    return kept


class Sandbox:
    """A throwaway sandbox: ``package`` (a ``tinymlp`` package folder) shown read-only as
    ``LIB/tinymlp``, a fresh scratch folder at ``SCRATCH``; ``hide``: places that must not be seen
    even where a shown folder holds them (the checkout, the submissions, the outputs)."""

    def __init__(self, package, *, hide=()):
        self.package = pathlib.Path(package)
        self.hide = [os.path.realpath(p) for p in (PACKAGE, *([CHECKOUT] if CHECKOUT else []), *hide)]
        self.scratch = pathlib.Path(tempfile.mkdtemp(prefix="tinymlp-sandbox-"))
        self.scratch.chmod(0o777)  # the sandbox's user writes here (the files stay the grader's user's outside)
        self.process = self.said = None
        self.child = None  # the sandbox's first process, as this process sees it

    def argv(self, command, env=None, info_fd=None) -> list:
        mounts = [(f, "--ro-bind") for f in python_folders()]
        shown = [f for f, _ in mounts] + ["/usr"] + [p for p in ETC if os.path.exists(p)]
        mounts += [(h, "--tmpfs") for h in self.hide if any(h.startswith(s + os.sep) for s in shown)]
        mounts.sort(key=lambda m: m[0].count(os.sep))  # a folder before what is mounted inside it
        args = [bwrap(), "--unshare-all", "--unshare-user", "--uid", str(UID), "--gid", str(UID),
                "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox",
                *(["--info-fd", str(info_fd)] if info_fd is not None else []), *_system_binds()]
        for path, how in mounts:
            args += [how, path] if how == "--tmpfs" else [how, path, path]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                 "--ro-bind", str(self.package), f"{LIB}/tinymlp", "--bind", str(self.scratch), SCRATCH,
                 "--chdir", SCRATCH, "--clearenv"]
        for key, value in {**self.environment(), **(env or {})}.items():
            args += ["--setenv", key, value]
        return args + ["--", *command]

    @staticmethod
    def environment() -> dict:
        env = {k: v for k, v in os.environ.items() if PASSED_ON.match(k)}
        bindir = os.path.dirname(os.path.abspath(sys.executable))
        env.update({"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": SCRATCH, "USER": "student",
                    "LOGNAME": "student", "TMPDIR": "/tmp", "PYTHONPATH": LIB, "PYTHONNOUSERSITE": "1",
                    "MPLCONFIGDIR": f"{SCRATCH}/.matplotlib", "JUPYTER_PLATFORM_DIRS": "1",
                    "PYTHONDONTWRITEBYTECODE": "1"})
        env.setdefault("LANG", "C.UTF-8")
        return env

    def start(self, command, *, pass_fds=(), env=None) -> subprocess.Popen:
        """Run ``command`` (its ``argv[0]`` as the sandbox sees it) in the sandbox; ``pass_fds``
        stay open in it under their numbers."""
        info_r, info_w = os.pipe()
        self.said = tempfile.TemporaryFile()  # what bubblewrap (and the sandbox) write to stderr: read, never waited on
        try:
            self.process = subprocess.Popen(self.argv(command, env, info_w), pass_fds=(info_w, *pass_fds),
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=self.said, start_new_session=True)
        finally:
            os.close(info_w)
        try:
            self.child = _child_pid(info_r, time.monotonic() + 60)
        finally:
            os.close(info_r)
        return self.process

    def errors(self) -> str:
        """What bubblewrap itself said, when the sandbox did not start (read once it has ended)."""
        if self.process is None or self.said is None or self.process.poll() is None:
            return ""
        self.said.seek(0)
        text = self.said.read(1 << 16).decode(errors="replace")
        return " ".join(line for line in text.splitlines() if line.startswith("bwrap:"))[:300]

    def end(self):
        """Kill every process of the sandbox, wait until they are gone, remove the scratch folder."""
        if self.process is not None:
            if self.child is not None and self.process.poll() is None:
                try:
                    os.kill(self.child, signal.SIGKILL)  # the namespace's first process: the kernel ends the rest
                except ProcessLookupError:
                    pass
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            if self.said is not None:
                self.said.close()
                self.said = None
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.end()
        return False


def _child_pid(fd, deadline):
    """The sandbox's first process, from bubblewrap's ``--info-fd`` JSON, read to its end (closing
    the pipe before bubblewrap has written it all would end bubblewrap with SIGPIPE)."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            match = re.search(rb'"child-pid":\s*(\d+)\D', data)
            return int(match.group(1)) if match else None
        data += chunk
