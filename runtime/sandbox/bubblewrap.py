"""Run one python-tool snippet isolated from the machine: a fresh process in its own Linux namespaces (bubblewrap).

Code a model wrote is hostile: under RL the model is optimised to find whatever raises its reward, so whatever
the snippet can reach, a run eventually uses. Each call of :func:`run_isolated` starts ``bwrap`` (Debian's
``bubblewrap``) around a fresh ``python3 -I -S`` that runs :mod:`sailrl.runtime.sandbox.snippet`'s own source, and the
snippet finds inside:

* **no environment** but ``PATH``, ``LANG``, ``HOME``/``TMPDIR`` (its folder), ``PYTHONHASHSEED=0`` (the same
  snippet prints the same set order every run) and ``PYTHONDONTWRITEBYTECODE`` -- no key, token or proxy;
* **a filesystem** of ``/usr`` (``/usr/local`` hidden) and the interpreter's own ``bin`` and ``lib``, read-only,
  with every ``site-packages`` / ``dist-packages`` folder there hidden under an empty read-only tmpfs, a private
  ``/proc`` and a minimal read-only ``/dev``; the root and every other folder read-only but one empty writable
  folder ``/tmp`` on a tmpfs of ``disk_mb`` MiB (the total of the bytes its files hold); nothing of the spec's
  folder, the dataset, the run directory, ``SAILRL_HOME``, the home folder or a virtual environment;
* **no network**: its own network namespace, where even the host's loopback is out of reach (``network`` opts a
  tool in to the host's network, a documented risk that ``sailrl validate`` warns about, W134);
* **no descriptors** but its stdin (the snippet, then end of file), stdout and stderr (both one pipe to this
  process, read bounded); the runner closes any other before the snippet runs;
* **no lasting processes**: its own PID namespace, whose every process the kernel kills when the namespace's PID 1
  ends -- which this side makes sure of after every call, through a pidfd of that process (bwrap's ``--info-fd``),
  and which ``--die-with-parent`` does when this process dies; a seccomp filter refuses ``ptrace`` and
  ``process_vm_readv`` / ``writev`` (so the snippet cannot take over that PID 1), ``--disable-userns`` a user
  namespace of its own (where it would have capabilities); a new session, so it cannot signal the run's process
  group; at most :data:`MAX_PROCESSES` processes and threads (``RLIMIT_NPROC``, counted in its own user namespace,
  and when this process is root the sandbox runs as ``nobody`` so that the limit binds), each with
  ``RLIMIT_CPU`` just over ``timeout_s``;
* **bounded memory**: ``RLIMIT_AS`` at the interpreter's size plus ``memory_mb``, per process.

Not bounded but by time: the inodes of empty files in ``/tmp`` (kernel memory a tmpfs size does not count;
freed when the call ends) -- a memory cgroup would bound it, and none can be had without privileges.

Why bubblewrap rather than namespaces and seccomp written here: it is the small, setuid-free tool that Flatpak
and others ship for exactly this, it sets the namespaces, mounts and ``PR_SET_NO_NEW_PRIVS`` up in one exec and
drops every capability, and it runs both as root and unprivileged (user namespaces). Starting it adds a few
milliseconds to a call (``benchmarks/bench_python_tool.py``).

Nothing the snippet writes is read back as anything but text: the outcome is the exit status and, for a snippet
that raised, the last :data:`~sailrl.runtime.sandbox.snippet.ERROR_MARK` line of its own output. A snippet that forges
that line only changes its own call's result; each call is a new process, so no call's output can answer another.

:func:`sandbox_problem` says, once per process, why isolation is unavailable here (not Linux, no ``bwrap``, or
namespaces refused), so a spec that needs it is refused before anything runs.
"""

from __future__ import annotations

import errno
import functools
import glob
import inspect
import json
import os
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

from sailrl.runtime.sandbox import snippet

__all__ = ["DEFAULT_DISK_MB", "INSTALL_HINT", "MAX_PROCESSES", "Isolated", "Limits", "bwrap_command",
           "run_isolated", "sandbox_problem"]

#: The sandbox's writable folder, in MiB: the total size of the files a snippet may write.
DEFAULT_DISK_MB = 64
#: Processes and threads a snippet may have at once (its main process and bwrap's init included).
MAX_PROCESSES = 32
#: The user a root process runs the sandbox as, so that the process limit binds (root is exempt from it).
NOBODY = 65534
#: What to do when bubblewrap is missing.
INSTALL_HINT = ("install bubblewrap (Debian / Ubuntu: `apt-get install bubblewrap`, Fedora: `dnf install "
                "bubblewrap`, Arch: `pacman -S bubblewrap`)")
#: Seconds a call may take beyond the snippet's own limit (bwrap and the interpreter start in a few hundredths).
START_SLACK_S = 0.5
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp", "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}
_NETWORK_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates")

_RUNNER_TAIL = '''

def _sandboxed(memory_mb, max_processes, cpu_s):
    import resource
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.closerange(3, 1 << 16)
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (size + memory_mb * 2**20,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (max_processes,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    return code


import os
sys.exit(main(_sandboxed({memory_mb}, {max_processes}, {cpu_s})))
'''


@dataclass(frozen=True)
class Limits:
    """One call's bounds: seconds, MiB of memory, characters of output, MiB of files, and whether the snippet
    may use the host's network."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 4000
    disk_mb: int = DEFAULT_DISK_MB
    network: bool = False


@dataclass(frozen=True)
class Isolated:
    """A snippet's outcome: ``error`` None, or ``raised`` / ``memory`` / ``timeout`` / ``output`` / ``died`` /
    ``sandbox`` (bwrap itself failed); ``output``: what it printed (stdout and stderr in order); ``message``:
    the exception, the signal, or bwrap's error."""

    error: str | None
    output: str
    message: str = ""


def _drop_to_nobody() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _site_folders(folder: str) -> list[str]:
    """The package folders in a folder the sandbox binds (hidden there: only the standard library shows)."""
    found: list[str] = []
    for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages",
                    "local/lib/python3*/site-packages", "local/lib/python3*/dist-packages",
                    "python3*/site-packages", "python3*/dist-packages", "python3/dist-packages"):
        found.extend(p for p in sorted(glob.glob(os.path.join(folder, pattern))) if os.path.isdir(p))
    return found


def _readable_by_others(path: str) -> bool:
    """Whether a user other than the owner can reach ``path`` (every folder above it searchable by others)."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        try:
            mode = os.stat(os.sep.join(parts[:i]) or os.sep).st_mode
        except OSError:
            return False
        if not mode & 0o005:
            return False
    return True


def _interpreters() -> list[tuple[str, list[str]]]:
    """Candidate interpreters for the sandbox, best first: (python3, the folders to bind read-only besides /usr).
    The run's own interpreter's base installation (the same version as the run: its ``bin`` and ``lib`` only, not
    the rest of its prefix, e.g. a conda installation's other environments), then the system's python3."""
    out: list[tuple[str, list[str]]] = []
    base = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if os.path.isfile(base) and base.startswith(prefix + os.sep):
        if prefix == "/usr" or prefix.startswith("/usr/"):
            out.append((base, []))
        elif not _drop_to_nobody() or _readable_by_others(base):
            binds = [os.path.join(prefix, d) for d in ("bin", "lib", "lib64")
                     if os.path.isdir(os.path.join(prefix, d)) and not os.path.islink(os.path.join(prefix, d))]
            out.append((base, binds))
    for system in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.isfile(system) and all(system != c for c, _ in out):
            out.append((system, []))
    return out


def bwrap_command(python: str, binds: list[str], limits: Limits, bwrap: str = "bwrap", *,
                  info_fd: int | None = None, seccomp_fd: int | None = None) -> list[str]:
    """The ``bwrap`` command line that runs ``python`` with the snippet runner under ``limits`` (see the module
    docstring for what each part denies). ``info_fd``: where bwrap writes the sandbox's PID 1 as the host sees it;
    ``seccomp_fd``: a seccomp filter (:func:`seccomp_filter`) bwrap reads and installs."""
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
           "--clearenv"]
    if limits.network:
        cmd.append("--share-net")
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    for key, value in _ENV.items():
        cmd += ["--setenv", key, value]
    cmd += ["--ro-bind", "/usr", "/usr"]
    if not python.startswith("/usr/local/"):  # what a machine installs by hand (and its settings) stays hidden
        cmd += ["--tmpfs", "/usr/local", "--remount-ro", "/usr/local"]
    for top in ("bin", "lib", "lib32", "lib64", "sbin"):
        path = "/" + top
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    for folder in binds:
        cmd += ["--ro-bind", folder, folder]
    for folder in ["/usr", *binds]:
        for hidden in _site_folders(folder):
            if not hidden.startswith("/usr/local/") or python.startswith("/usr/local/"):
                cmd += ["--tmpfs", hidden, "--remount-ro", hidden]
    if limits.network:
        for path in _NETWORK_FILES:
            cmd += ["--ro-bind-try", path, path]
    # Every folder but /tmp read-only: bwrap's own tmpfs (/, /dev, /dev/shm) would hold files outside disk_mb.
    cmd += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(int(limits.disk_mb) * 2**20), "--tmpfs", "/tmp", "--remount-ro", "/", "--chdir", "/tmp"]
    runner = inspect.getsource(snippet) + _RUNNER_TAIL.format(memory_mb=int(limits.memory_mb),
                                                             max_processes=MAX_PROCESSES,
                                                             cpu_s=int(limits.timeout_s) + 2)
    return cmd + [python, "-I", "-S", "-c", runner]


#: Syscalls the seccomp filter refuses (EPERM), by machine: reading or writing another process's memory or
#: registers (ptrace, process_vm_readv / writev) -- a snippet could otherwise take over the sandbox's PID 1.
_DENIED = {"x86_64": (0xC000003E, (101, 310, 311)), "aarch64": (0xC00000B7, (117, 270, 271))}


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """A classic-BPF seccomp program (``struct sock_filter`` array) that refuses :data:`_DENIED` with EPERM and
    allows the rest; None on a machine it does not know (the PID 1 kill after each call still ends every
    process)."""
    found = _DENIED.get(machine or platform.machine())
    if found is None:
        return None
    arch, numbers = found
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM
    n = len(numbers)
    prog = [(ld, 0, 0, 4),                       # the architecture
            (jeq, 1, 0, arch),                   # another one (a 32-bit call): refuse it
            (ret, 0, 0, deny),
            (ld, 0, 0, 0),                       # the syscall number
            (jge, n + 1, 0, 0x40000000)]         # x32 numbering: refuse
    prog += [(jeq, n - i, 0, nr) for i, nr in enumerate(numbers)]
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


class _Sandbox:
    """One started sandbox: the bwrap process, its output pipe, and a pidfd of its PID 1, which :meth:`end` kills,
    ending every process of the PID namespace whatever the snippet did to the process tree."""

    def __init__(self, python: str, binds: list[str], limits: Limits) -> None:
        info_r, info_w = os.pipe()
        filt = seccomp_filter()
        seccomp_r = None
        try:
            if filt is not None:
                seccomp_r, seccomp_w = os.pipe()
                os.write(seccomp_w, filt)  # a few dozen bytes: never fills the pipe
                os.close(seccomp_w)
            cmd = bwrap_command(python, binds, limits, _bwrap(), info_fd=info_w, seccomp_fd=seccomp_r)
            extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if _drop_to_nobody() else {}
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, close_fds=True,
                pass_fds=(info_w,) + ((seccomp_r,) if seccomp_r is not None else ()), start_new_session=True,
                env={"PATH": "/usr/bin:/bin"}, **extra)
        finally:
            os.close(info_w)
            if seccomp_r is not None:
                os.close(seccomp_r)
        self.info = info_r
        self.init_pidfd: int | None = None
        self._info_text = b""

    def note_info(self) -> None:
        """Read what bwrap wrote on its info descriptor (its PID 1) and hold a pidfd of that process."""
        if self.info < 0:
            return
        chunk = os.read(self.info, 4096)
        if chunk:
            self._info_text += chunk
            return
        os.close(self.info)
        self.info = -1
        try:
            pid = int(json.loads(self._info_text.decode())["child-pid"])
            self.init_pidfd = os.pidfd_open(pid)
        except (ValueError, KeyError, OSError):
            pass  # bwrap failed before it started the namespace: nothing of it is left to end

    def end(self) -> int:
        """Kill the sandbox (its PID 1 first: the kernel then ends the namespace's every process), reap bwrap and
        close the descriptors; bwrap's exit status."""
        if self.info >= 0:
            os.set_blocking(self.info, False)
            try:
                while self.info >= 0:
                    self.note_info()
            except BlockingIOError:
                pass
        if self.init_pidfd is not None:
            try:
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            except OSError:
                pass  # it ended with the snippet's main process
            os.close(self.init_pidfd)
            self.init_pidfd = None
        _kill(self.proc)
        status = self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self.info >= 0:
            os.close(self.info)
            self.info = -1
        return status

    def collect(self, code: bytes, limits: Limits, wait_s: float) -> tuple[str | None, bytes]:
        """Send the snippet, read its output until end of file, ``wait_s`` or too much output; (``timeout`` /
        ``output`` / None, the bytes read)."""
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(code)
            proc.stdin.close()
        except OSError:  # the sandbox ended before reading its input: its exit status says why
            pass
        fd = proc.stdout.fileno()
        cap = 4 * int(limits.max_output_chars) + 4  # bytes past which the output is certainly too long
        out = bytearray()
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", bytes(out)
            ready, _, _ = select.select([fd] + ([self.info] if self.info >= 0 else []), [], [], left)
            if self.info in ready:
                self.note_info()
            if fd not in ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None, bytes(out)
            out += chunk
            if len(out) > cap:
                return "output", bytes(out)


def _kill(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
    except OSError:
        pass


def _read_outcome(status: int, text: str, max_output_chars: int) -> Isolated:
    if len(text) > max_output_chars:
        return Isolated("output", text)
    mark = text.rfind(snippet.ERROR_MARK)
    if status == 1 and mark >= 0:
        message = text[mark + len(snippet.ERROR_MARK):].strip()
        output = text[:mark]
        output = output[:-1] if output.endswith("\n") else output  # the newline the runner writes before its mark
        return Isolated("memory" if message.startswith("MemoryError") else "raised", output, message)
    if status == 0:
        return Isolated(None, text)
    signum = -status if status < 0 else status - 128 if status > 128 else 0  # bwrap's init exits 128 + signal
    if signum:
        try:
            return Isolated("died", text, f"killed by signal {signal.Signals(signum).name}")
        except ValueError:
            pass
    if status == 1 and text.startswith("bwrap: "):
        return Isolated("sandbox", "", text.splitlines()[0][:300])
    return Isolated("died", text, f"exited with code {status}")


def run_isolated(code: str, limits: Limits) -> Isolated:
    """Run ``code`` in a fresh sandbox (see the module docstring). Never raises for anything the snippet does;
    takes at most ``timeout_s`` plus :data:`START_SLACK_S`. Raises :class:`RuntimeError` when the sandbox cannot
    be used here (:func:`sandbox_problem`)."""
    problem = sandbox_problem()
    if problem is not None:
        raise RuntimeError(problem)
    python, binds = _chosen()
    box = _Sandbox(python, binds, limits)
    try:
        error, raw = box.collect(code.encode("utf-8", "replace"), limits, limits.timeout_s + START_SLACK_S)
        if error is None:
            box.proc.wait()  # the snippet's main process ended and closed its output: bwrap follows at once
    finally:
        status = box.end()
    text = raw.decode("utf-8", "replace")
    if error is not None:
        return Isolated(error, text[: limits.max_output_chars])
    return _read_outcome(status, text, limits.max_output_chars)


def _bwrap() -> str:
    return shutil.which("bwrap") or "bwrap"


_PROBE = ("import json, math, re, sys\n"
          "print(json.dumps([sys.version_info[0], math.isqrt(49), bool(re.match('a', 'a'))]))")


def _probe(python: str, binds: list[str]) -> str | None:
    """None when a snippet runs in the sandbox with this interpreter; else bwrap's or python's first line."""
    limits = Limits(timeout_s=20.0, memory_mb=256, max_output_chars=2000, disk_mb=1)
    try:
        box = _Sandbox(python, binds, limits)
    except OSError as exc:
        return str(exc)
    try:
        error, raw = box.collect(_PROBE.encode(), limits, limits.timeout_s)
        if error is None:
            box.proc.wait()
    finally:
        status = box.end()
    text = raw.decode("utf-8", "replace").strip()
    if error is None and status == 0 and text == "[3, 7, true]":
        return None
    return (text.splitlines() or [f"exit status {status}" if error is None else error])[0][:200]


@functools.lru_cache(maxsize=1)
def _check() -> tuple[str | None, tuple[str, tuple[str, ...]] | None]:
    if not sys.platform.startswith("linux"):
        return (f"the python tool's isolation needs Linux namespaces, and this is {sys.platform}", None)
    if shutil.which("bwrap") is None:
        return ("the python tool's isolation needs bubblewrap, which is not installed: " + INSTALL_HINT, None)
    last = "no python3 interpreter the sandbox can run"
    for python, binds in _interpreters():
        why = _probe(python, binds)
        if why is None:
            return None, (python, tuple(binds))
        last = why
    return ("bubblewrap cannot run the python tool's sandbox here (" + last + "): user namespaces may be disabled "
            "(sysctl kernel.unprivileged_userns_clone=1, or an AppArmor profile for bwrap)", None)


def sandbox_problem() -> str | None:
    """Why model-written code cannot be isolated on this machine (one sentence naming what to install or enable),
    or None. Checked once per process by running a probe snippet in the sandbox."""
    return _check()[0]


def _chosen() -> tuple[str, list[str]]:
    found = _check()[1]
    assert found is not None
    return found[0], list(found[1])
