"""What the python tool's sandbox and its neighbours guarantee, call by call: a snippet's bad behaviour is a tool
error of its kind; workers of trusted code get no key they do not name; a run's rule files are frozen; secrets
are replaced wherever sailrl writes."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from sailrl.runtime.loop.console import make_console
from sailrl.runtime.rewards import python_rules
from sailrl.runtime.rewards.python_rules import PythonFunction, freeze_files
from sailrl.runtime.sandbox import bubblewrap
from sailrl.runtime.sandbox.redact import MARKER, redact, secret_values
from sailrl.runtime.sandbox.workers import worker_environment
from sailrl.runtime.tools.python_tool import PythonTool, UnisolatedPythonTool
from tests.fakes.sandbox import require_sandbox


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    require_sandbox()
    return PythonTool(timeout_s=1.0, memory_mb=128, max_output_chars=300)


@pytest.mark.slow
def test_bad_snippets_are_tool_errors_of_their_kind(tool):
    closed = tool.call({"code": "import sys\nprint('a')\nsys.stdout.close()\nprint('b')"})
    assert closed.error == "raised" and "ValueError: I/O operation on closed file" in closed.content
    both = tool.call({"code": "import os\nos.close(1)\nos.close(2)\nraise SystemExit(3)"})
    assert both.error == "died" and "exited with code 1" in json.loads(both.content)["error"]
    binary = tool.call({"code": "import os\nos.write(1, bytes(range(200, 256)))"})
    assert binary.error is None and binary.content.count("\ufffd") == 56
    t0 = time.monotonic()
    hang = tool.call({"code": "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: pass"})
    assert hang.error == "timeout" and time.monotonic() - t0 < 3
    group = tool.call({"code": "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)"})
    assert group.error == "raised" and "ProcessLookupError" in group.content  # no group of the run's is in sight
    own = tool.call({"code": "import os, signal\nos.killpg(0, signal.SIGKILL)"})
    assert own.error == "died" and "SIGKILL" in own.content  # its own group: itself
    parent = tool.call({"code": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')"})
    assert parent.content == "still here\n"  # its parent is the namespace's init, which ignores it
    assert tool.call({"code": "print(6 * 7)"}).content == "42\n"  # and this process, pytest, is still here


@pytest.mark.slow
def test_the_sandbox_sees_no_file_network_or_descriptor_of_the_machine(tool, tmp_path):
    (tmp_path / "mine.txt").write_text("private")
    seen = tool.call({"code": f"import os\nprint(sorted(os.listdir('/')), os.path.exists({str(tmp_path)!r}))\n"
                              "print(sorted(os.listdir('/proc/self/fd')), os.getcwd(), os.listdir('.'))"})
    assert seen.error is None
    top, fds = seen.content.splitlines()
    assert top.endswith("False") and "'home'" not in top and "'root'" not in top and "'etc'" not in top
    assert fds == "['0', '1', '2', '3'] /tmp []"  # 3 is the listing's own descriptor
    pkgs = tool.call({"code": "import importlib.util\nprint([importlib.util.find_spec(m) is None for m in "
                              "('torch', 'sailrl', 'pydantic', 'json')])"})
    assert pkgs.content == "[True, True, True, False]\n"  # the standard library only
    net = tool.call({"code": "import socket\nprint(socket.if_nameindex())"})
    assert net.content == "[(1, 'lo')]\n"  # its own network namespace: a loopback that is not the host's


def test_a_network_tool_shares_the_hosts_network_and_says_so_in_its_command():
    plain = bubblewrap.bwrap_command("/usr/bin/python3", [], bubblewrap.Limits())
    opened = bubblewrap.bwrap_command("/usr/bin/python3", [], bubblewrap.Limits(network=True))
    assert "--unshare-all" in plain and "--share-net" not in plain
    assert "--share-net" in opened and "--die-with-parent" in opened and "--clearenv" in opened
    size = plain.index("--size")
    assert plain[size + 1] == str(64 * 2**20) and plain[size + 2:size + 4] == ["--tmpfs", "/tmp"]


def test_workers_get_no_key_but_those_their_rule_names(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-0123456789")
    monkeypatch.setenv("GRADER_URL", "http://grader")
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@proxy:3128")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = worker_environment()
    assert "TINKER_API_KEY" not in env and "GRADER_URL" not in env and "HTTPS_PROXY" not in env
    assert env["LC_ALL"] == "C.UTF-8" and "PATH" in env
    named = worker_environment(["TINKER_API_KEY", "GRADER_URL", "UNSET_NAME"])
    assert named["TINKER_API_KEY"] == "tml-0123456789" and named["GRADER_URL"] == "http://grader"
    assert "UNSET_NAME" not in named


@pytest.mark.slow
def test_a_python_rule_gets_the_variables_it_names_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv("SOME_API_KEY", "sk-abcdefgh12345")
    monkeypatch.setenv("RULE_SETTING", "7")
    (tmp_path / "envrule.py").write_text(
        "import os\n\ndef score(completion, fields):\n"
        "    return float(os.environ.get('RULE_SETTING', 0)) + (100 if 'SOME_API_KEY' in os.environ else 0)\n")
    assert PythonFunction(tmp_path, "envrule:score", 5).call("x", {}).value == 0.0
    assert PythonFunction(tmp_path, "envrule:score", 5, env=["RULE_SETTING"]).call("x", {}).value == 7.0


@pytest.mark.slow
def test_a_frozen_rule_file_is_not_reloaded_when_it_changes(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(python_rules, "_FROZEN", {})
    monkeypatch.setattr(python_rules, "_SEEN_CHANGED", {})
    rule = tmp_path / "frozenrule.py"
    rule.write_text("def score(completion, fields):\n    return 0.25\n")
    fn = PythonFunction(tmp_path, "frozenrule:score", 5)
    shas = freeze_files([rule])
    assert fn.call("x", {}).value == 0.25
    rule.write_text("def score(completion, fields):\n    return 1.0\n")
    os.utime(rule, ns=(time.time_ns() + 10**9,) * 2)
    assert fn.call("x", {}).value == 0.25  # the version the run started with
    assert PythonFunction(tmp_path, "frozenrule:score", 5).call("y", {}).value == 0.25  # a new worker too
    err = capsys.readouterr().err
    assert err.count("changed on disk during the run") == 1 and shas[str(rule)][:12] in err


def test_secret_values_are_replaced_in_text_json_and_the_console(monkeypatch, capsys):
    monkeypatch.setenv("MY_SERVICE_TOKEN", 'tok"with\\quote-1234')
    monkeypatch.setenv("SHORT_KEY", "abc")  # too short to tell from ordinary text: left alone
    assert 'tok"with\\quote-1234' in secret_values() and "abc" not in secret_values()
    assert redact('say tok"with\\quote-1234 now') == f"say {MARKER} now"
    assert redact(json.dumps({"t": 'tok"with\\quote-1234'})) == json.dumps({"t": MARKER})
    assert redact("abc") == "abc"
    make_console(stderr=False).print('console: tok"with\\quote-1234', markup=False)
    assert capsys.readouterr().out == f"console: {MARKER}\n"


@pytest.mark.slow
def test_the_runs_own_interpreter_brings_its_standard_library_and_nothing_else_of_its_prefix(monkeypatch):
    require_sandbox()
    monkeypatch.setattr(bubblewrap, "_drop_to_nobody", lambda: False)  # the user who owns the interpreter
    python, binds = bubblewrap._interpreters()[0]
    assert bubblewrap._probe(python, binds) is None
    prefix = os.path.realpath(sys.base_prefix)
    code = (f"import os, sys, importlib.util\nprint(sys.prefix == {prefix!r}, importlib.util.find_spec('pip'))\n"
            f"print(sorted(os.listdir({prefix!r})) if {prefix!r} != '/usr' else 'system')")
    box = bubblewrap._Sandbox(python, binds, bubblewrap.Limits())
    error, raw = box.collect(code.encode(), bubblewrap.Limits(), 10)
    box.end()
    first, second = raw.decode().splitlines()
    assert error is None and first == "True None"  # its own prefix, and pip (a site package) is not there
    assert second == "system" or set(eval(second)) <= {"bin", "lib", "lib64"}


# ------------------------------------------------------------------------------------------------ what a review broke

# A snippet takes over the sandbox's PID 1 (bwrap's init) with ptrace and clears its parent-death signal, then
# sleeps: were the namespace to outlive its init's parent, the sleeper would outlive the call.
PTRACE_PID1 = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
class R(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi "
                "orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs").split()]
assert libc.ptrace(16, 1, None, None) == 0
os.waitpid(1, 0x40000000)
saved = R(); libc.ptrace(12, 1, None, ctypes.byref(saved))
word = libc.ptrace(1, 1, ctypes.c_void_p(saved.rip), None)
libc.ptrace(4, 1, ctypes.c_void_p(saved.rip), ctypes.c_void_p(((word & ~0xffff) | 0x050f) & (2**64 - 1)))
r = R(); ctypes.memmove(ctypes.byref(r), ctypes.byref(saved), ctypes.sizeof(R))
r.rax, r.rdi, r.rsi, r.orig_rax = 157, 1, 0, 2**64 - 1   # prctl(PR_SET_PDEATHSIG, 0) in pid 1
libc.ptrace(13, 1, None, ctypes.byref(r)); libc.ptrace(9, 1, None, None); os.waitpid(1, 0x40000000)
libc.ptrace(4, 1, ctypes.c_void_p(saved.rip), ctypes.c_void_p(word & (2**64 - 1)))
if saved.orig_rax != 2**64 - 1:
    saved.rip -= 2; saved.rax = saved.orig_rax
libc.ptrace(13, 1, None, ctypes.byref(saved)); libc.ptrace(17, 1, None, None)
os.execv("/usr/bin/sleep", ["sleep", "8.271828"])
'''




def _pids_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_no_folder_but_tmp_is_writable_so_disk_mb_bounds_every_file(tool):
    code = ("import os\nw = {}\nfor d in ['/', '/dev', '/dev/shm', '/usr/lib/python3/dist-packages', '/tmp']:\n"
            "    try:\n        open(os.path.join(d, 'f'), 'wb').write(b'x' * (2 << 20)); w[d] = 'wrote'\n"
            "    except OSError as e:\n        w[d] = e.errno\nprint(w)")
    out = PythonTool(timeout_s=5, memory_mb=64, disk_mb=1).call({"code": code})
    assert out.content == ("{'/': 30, '/dev': 30, '/dev/shm': 30, '/usr/lib/python3/dist-packages': 30, "
                           "'/tmp': 28}\n")  # EROFS everywhere, and ENOSPC past disk_mb in /tmp


@pytest.mark.slow
def test_a_snippet_cannot_make_a_nested_user_namespace_nor_ptrace(tool):
    nested = tool.call({"code": "import ctypes\nprint(ctypes.CDLL(None).unshare(0x10000000))"})
    assert nested.content == "-1\n"  # EPERM: no capabilities to be had in a namespace of its own
    traced = tool.call({"code": "import ctypes\nprint(ctypes.CDLL(None, use_errno=True).ptrace(16, 1, 0, 0), "
                                "ctypes.get_errno())"})
    assert traced.content == "-1 1\n"  # the seccomp filter: EPERM


@pytest.mark.slow
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the injection is x86_64 machine code")
def test_no_process_outlives_the_call_even_when_the_snippet_takes_over_pid_1(tool, monkeypatch):
    monkeypatch.setattr(bubblewrap, "seccomp_filter", lambda machine=None: None)  # the pidfd kill alone
    out = PythonTool(timeout_s=2).call({"code": PTRACE_PID1})
    time.sleep(0.5)
    left = _pids_with("8.271828")
    for pid in left:  # never leave the machine with what a failing test let out
        os.kill(pid, 9)
    assert out.error in ("timeout", "died", None) and not left


@pytest.mark.slow
def test_an_unisolated_snippet_cannot_queue_a_request_on_its_worker():
    inject = ("import os, pickle, struct\n"
              "req = pickle.dumps({'op': 'run', 'code': \"print('FORGED')\", 'snippet_timeout_s': 3.0, "
              "'limits': {'memory_mb': 256, 'max_output_chars': 3000}, 'timeout_s': 5.0})\n"
              "try:\n    fd = os.open('/proc/self/fd/0', os.O_WRONLY)\n"
              "    os.write(fd, struct.pack('>I', len(req)) + req)\nexcept OSError as e:\n    print(e)\n")
    unisolated = UnisolatedPythonTool(timeout_s=3, memory_mb=256)
    unisolated.call({"code": inject})
    assert [unisolated.call({"code": f"print('honest {i}')"}).content for i in range(2)] == ["honest 0\n",
                                                                                            "honest 1\n"]


@pytest.mark.slow
def test_a_frozen_rules_neighbour_modules_are_frozen_too(tmp_path, monkeypatch):
    monkeypatch.setattr(python_rules, "_FROZEN", {})
    monkeypatch.setattr(python_rules, "_FROZEN_MODULES", {})
    monkeypatch.setattr(python_rules, "_SEEN_CHANGED", {})
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "weights.py").write_text("W = 0.0\n")
    (tmp_path / "helper.py").write_text("from pkg.weights import W\n\ndef value():\n    return W\n")
    (tmp_path / "neighbourrule.py").write_text(
        "import helper\n\ndef score(c, f):\n    if c == 'slow':\n        import time\n        time.sleep(5)\n"
        "    return helper.value()\n")
    rule = type("Rule", (), {"kind": "python", "function": "neighbourrule:score"})()
    shas = python_rules.freeze_spec_code([rule], [], tmp_path)
    assert sorted(shas) == ["helper.py", "neighbourrule.py", "pkg/__init__.py", "pkg/weights.py"]
    fn = PythonFunction(tmp_path, "neighbourrule:score", timeout_s=2)
    assert fn.call("x", {}).value == 0.0
    (tmp_path / "helper.py").write_text("def value():\n    return 1.0\n")
    (tmp_path / "pkg" / "weights.py").write_text("W = 1.0\n")
    (tmp_path / "json.py").write_text("raise SystemExit('a new file that shadows the standard library')\n")
    assert fn.call("slow", {}).timed_out  # its worker is killed and replaced
    assert fn.call("x", {}).value == 0.0  # the replacement runs the frozen code, not the edited files
