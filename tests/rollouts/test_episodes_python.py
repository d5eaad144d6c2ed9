"""The built-in ``python`` tool: the model's snippet in its bubblewrap sandbox (the default), in a process forked
from a real worker (``environment.sandbox: unisolated_worker``), and in a Sailbox (``environment.sandbox: sail``)
through sail.tinker.TinkerSandbox against a loopback fake of the Sailbox API.
Every failure (raises, hangs, prints too much, eats memory, dies, the Sailbox fails or hangs) is a tool error the
model reads and a counted metric, never an exception."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time

import pytest

from sailrl.preflight import PreflightError, check_sandbox
from sailrl.runtime.rollouts.episode import ToolLoadError, build_tools
from sailrl.runtime.sandbox import snippet
from sailrl.runtime.tools.python_tool import NO_OUTPUT, PythonTool, UnisolatedPythonTool
from sailrl.runtime.tools.sailbox import SailboxPythonTool, remote_command
from sailrl.spec.environment import EnvironmentSpec
from tests.fakes.sailbox_server import fake_sailbox_server  # noqa: F401 - the fixture
from tests.fakes.sandbox import require_sandbox
from tests.rollouts.test_episodes import STOP, TOK, _run


def _error(content: str) -> dict:
    return json.loads(content)


# ------------------------------------------------------------------------------------------------ the runner


def test_a_last_expression_is_printed_as_a_shell_shows_it(capsys):
    snippet.run_code("x = [1, 2]\nx + [3]")
    snippet.run_code("print('a')\nNone")
    snippet.run_code("'text'")
    assert capsys.readouterr().out == "[1, 2, 3]\na\n'text'\n"


def test_an_error_names_the_snippets_line():
    with pytest.raises(ZeroDivisionError) as exc:
        snippet.run_code("a = 1\n\ndef f():\n    return 1 / 0\nf()")
    assert snippet.error_text(exc.value) == "ZeroDivisionError: division by zero (line 4)"
    with pytest.raises(SyntaxError) as exc:
        snippet.run_code("x = (")
    text = snippet.error_text(exc.value)
    assert text.startswith("SyntaxError: ") and text.endswith("(line 1)")


# ------------------------------------------------------------------------------------------------ bubblewrap sandbox


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    require_sandbox()
    return PythonTool(timeout_s=1.0, memory_mb=128, max_output_chars=200)


@pytest.mark.slow
def test_each_failure_of_a_snippet_in_its_sandbox_is_a_tool_error(tool):
    ok = tool.call({"code": "n = 2 ** 10\nprint('n is', n)\nn + 1"})
    assert (ok.content, ok.error) == ("n is 1024\n1025\n", None)
    assert tool.call({"code": "x = 1"}).content == NO_OUTPUT

    raised = tool.call({"code": "print('before')\n{}['k']"})
    assert raised.error == "raised"
    assert _error(raised.content) == {"error": "the code raised KeyError: 'k' (line 2)", "output": "before\n"}

    t0 = time.monotonic()
    hang = tool.call({"code": "import time\ntime.sleep(60)"})
    assert hang.error == "timeout" and time.monotonic() - t0 < 5
    assert _error(hang.content)["error"] == "the code ran longer than 1 s and was stopped"
    t0 = time.monotonic()  # a snippet that swallows every exception is killed all the same
    stubborn = tool.call({"code": "while True:\n    try:\n        while True: pass\n    except BaseException: pass"})
    assert stubborn.error == "timeout" and time.monotonic() - t0 < 5

    loud = tool.call({"code": "print('x' * 100_000)"})
    assert loud.error == "output" and _error(loud.content)["output"] == "x" * 200
    low_level = tool.call({"code": "import os\nos.write(1, b'y' * 100_000)"})
    assert low_level.error == "output"
    endless = tool.call({"code": "while True: print('z' * 50)"})
    assert endless.error == "output"

    hungry = tool.call({"code": "block = bytearray(2 ** 31)"})
    assert hungry.error == "memory"
    assert _error(hungry.content)["error"] == "the code used more than its memory limit (128 MiB)"

    died = tool.call({"code": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"})
    assert died.error == "died" and "SIGSEGV" in _error(died.content)["error"]

    assert tool.call({"code": ""}).error == "code"
    assert tool.call({"expression": "1"}).error == "code"
    assert tool.call({"code": "1" * 20_001}).error == "code"

    # each call starts afresh: the fork's state, files and working folder are gone after it
    assert tool.call({"code": "secret = 42\nopen('f.txt', 'w').write('x')\nimport os\nos.getcwd()"}).error is None
    fresh = tool.call({"code": "import os\nprint(os.listdir('.'))\nsecret"})
    assert fresh.error == "raised" and "NameError: name 'secret' is not defined (line 3)" in fresh.content
    assert "[]" in fresh.content
    full = tool.call({"code": "open('big', 'wb').write(b'0' * (80 * 2**20))"})  # the folder's 64 MiB tmpfs
    assert full.error == "raised" and "No space left on device" in full.content
    assert tool.call({"code": "6 * 7"}).content == "42\n"


@pytest.mark.slow
def test_the_unisolated_worker_runs_snippets_bounded():
    unisolated = UnisolatedPythonTool(timeout_s=1.0, memory_mb=128, max_output_chars=200)
    ok = unisolated.call({"code": "n = 2 ** 10\nprint('n is', n)\nn + 1"})
    assert (ok.content, ok.error) == ("n is 1024\n1025\n", None)
    raised = unisolated.call({"code": "print('before')\n{}['k']"})
    assert _error(raised.content) == {"error": "the code raised KeyError: 'k' (line 2)", "output": "before\n"}
    assert unisolated.call({"code": "import time\ntime.sleep(60)"}).error == "timeout"
    assert unisolated.call({"code": "block = bytearray(2 ** 31)"}).error == "memory"
    assert unisolated.call({"code": "open('big', 'wb').write(b'0' * (32 * 2**20))"}).error == "raised"  # FSIZE
    # the fork holds no descriptor of its worker's but its own output and result pipes
    fds = unisolated.call({"code": "import os\nsorted(int(f) for f in os.listdir('/proc/self/fd'))"})
    assert fds.content == "[0, 1, 2, 3, 4]\n"  # 3: its result pipe, 4: the listing itself
    assert unisolated.call({"code": "6 * 7"}).content == "42\n"


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0, reason="RLIMIT_NPROC does not bind root")
def test_an_unisolated_snippet_cannot_start_processes():
    out = UnisolatedPythonTool(timeout_s=1.0).call({"code": "import subprocess\nsubprocess.run(['true'])"})
    assert out.error == "raised" and ("BlockingIOError" in out.content or "Resource temporarily" in out.content)


@pytest.mark.slow
def test_an_episode_calls_the_python_tool_and_counts_its_errors():
    require_sandbox()
    def call(code: str) -> str:
        return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"

    replies = [(" " + call("3 + 4") + call("1/0") + STOP, "stop"), (" " + call("while True: pass") + STOP, "stop"),
               (" 7" + STOP, "stop")]
    env = {"max_turns": 4, "tools": [{"builtin": "python", "timeout_s": 0.5}]}
    traj, sampler, builder = _run(replies, env)
    assert builder.tools[0].to_spec()["name"] == "python"
    last = traj.transitions[-1]
    tools = [t for t in json.loads(last.logs["episode"]) if t["role"] == "tool"]
    assert [t["text"] for t in tools[:1]] == ["7\n"] and not tools[0]["error"]
    assert tools[1]["error"] and "ZeroDivisionError" in tools[1]["text"]
    assert tools[2]["error"] and "longer than 0.5 s" in tools[2]["text"]
    assert last.metrics["episode/tool_calls"] == 3.0 and last.metrics["episode/tool_errors"] == 2.0
    assert last.reward == 1.0 and last.logs["episode_end"] == "answered"
    # the tool's results are what the model read in its next prompt
    second = TOK.decode(sampler.prompts[1])
    assert "7\n" in second and "ZeroDivisionError: division by zero (line 1)" in second


# ------------------------------------------------------------------------------------------------ Sail sandbox


def test_the_sailbox_command_carries_the_snippet_and_the_runner():
    cmd = remote_command("print('it''s')", 64)
    assert cmd.startswith('cd "$(mktemp -d)" && exec python3 -c ')
    assert base64.b64encode(b"print('it''s')").decode() in cmd
    assert "def run_code(" in cmd and "_limit_memory(64)" in cmd


def _sail_tool(**kw) -> SailboxPythonTool:
    return SailboxPythonTool(**{"timeout_s": 2.0, "memory_mb": 128, "max_output_chars": 200, "slack_s": 3.0, **kw})


@pytest.mark.slow
def test_snippets_run_in_a_sailbox_through_tinker_sandbox(fake_sailbox_server):  # noqa: F811 - the imported fixture
    server = fake_sailbox_server
    tool = _sail_tool(timeout_s=4.0)  # python3 starts in the fake's subprocess on this (busy) machine

    async def go():
        out = {"ok": await tool.call({"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7"}),
               "raised": await tool.call({"code": "print('before')\n1/0"}),
               "hang": await tool.call({"code": "while True: pass"}),
               "loud": await tool.call({"code": "print('x' * 100_000)"}),
               "hungry": await tool.call({"code": "block = bytearray(2 ** 31)"})}
        await tool.aclose()
        return out

    out = asyncio.run(go())
    assert (out["ok"].content, out["ok"].error) == ("out\n42\nerr\n", None)
    assert _error(out["raised"].content) == {"error": "the code raised ZeroDivisionError: division by zero (line 2)",
                                             "output": "before\n"}
    assert out["hang"].error == "timeout" and out["loud"].error == "output" and out["hungry"].error == "memory"
    # one Sailbox for all five calls, made as the SDK makes it, and terminated at the end
    assert server.created == ["sb_fake1"] and server.terminated == ["sb_fake1"]
    create = next(body for method, path, body in server.requests if path == "/v1/sailboxes")
    assert create["image"] == {"base": "BASE_IMAGE_DEBIAN"} and create["name"].startswith("sailrl-python-")
    execs = [body for method, path, body in server.requests if path == "/v1/sailboxes/sb_fake1/exec"]
    assert len(execs) == 5 and all(b["command"][:2] == ["/bin/bash", "-lc"] and b["timeout"] == 4 for b in execs)
    assert any(path.endswith("/exec/-/cancel") for _, path, _ in server.requests)  # the timed-out command killed


@pytest.mark.slow
def test_sail_faults_are_bounded_counted_tool_errors(fake_sailbox_server):  # noqa: F811 - the imported fixture
    server = fake_sailbox_server
    tool = _sail_tool(create_timeout_s=1.0)

    async def go():
        out = {}
        server.create_errors = 1
        out["refused"] = await tool.call({"code": "1"})
        out["started"] = await tool.call({"code": "1"})
        server.exec_errors = 1
        out["exec_error"] = await tool.call({"code": "1"})
        server.exec_hang_s = 30  # the stream starts and never ends: the tool's own bound answers
        t0 = time.monotonic()
        out["hang"] = await tool.call({"code": "1"})
        out["hang_s"] = time.monotonic() - t0
        server.exec_hang_s = 0
        server.gone.add(server.created[-1])  # the Sailbox went away: two failures in a row replace it
        out["gone1"] = await tool.call({"code": "1"})
        out["gone2"] = await tool.call({"code": "1"})
        out["replaced"] = await tool.call({"code": "2"})
        await tool.aclose()
        server.create_delay_s = 5  # a start slower than create_timeout_s
        slow = _sail_tool(create_timeout_s=0.5)
        t0 = time.monotonic()
        out["slow_start"] = await slow.call({"code": "1"})
        out["slow_start_s"] = time.monotonic() - t0
        return out

    out = asyncio.run(go())
    assert out["refused"].error == "sandbox" and "did not start" in out["refused"].content
    assert out["started"].content == "1\n"
    assert out["exec_error"].error == "sandbox" and "exec failed (fake)" in out["exec_error"].content
    assert out["hang"].error in ("timeout", "sandbox") and out["hang_s"] < 2.0 + 3.0 + 2
    assert out["gone1"].error == "sandbox" and out["gone2"].error == "sandbox"
    assert "the next call starts a new Sailbox" in out["gone2"].content
    assert out["replaced"].content == "2\n" and server.created == ["sb_fake1", "sb_fake2"]
    assert server.terminated == ["sb_fake2"]  # the replacement; the lost one was asked to terminate too
    assert ("POST", "/v1/sailboxes/sb_fake1/terminate", {}) in server.requests
    assert out["slow_start"].error == "sandbox" and "did not start within 0.5 s" in out["slow_start"].content
    assert out["slow_start_s"] < 3


@pytest.mark.slow
def test_an_episode_with_the_sail_sandbox(fake_sailbox_server):  # noqa: F811 - the imported fixture
    call = "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": "3 + 4"}}) + "</tool_call>"
    env = {"max_turns": 3, "sandbox": "sail", "tools": [{"builtin": "python"}]}
    traj, _, builder = _run([(" " + call + STOP, "stop"), (" 7" + STOP, "stop")], env)
    asyncio.run(builder.tools[0].aclose())
    tools = [t for t in json.loads(traj.transitions[-1].logs["episode"]) if t["role"] == "tool"]
    assert tools == [{"role": "tool", "text": "7\n", "name": "python", "error": False}]
    assert fake_sailbox_server.terminated == fake_sailbox_server.created == ["sb_fake1"]


def test_a_sail_sandbox_needs_sail_credentials_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.delenv("SAIL_API_KEY", raising=False)
    monkeypatch.setenv("SAIL_HOME", str(tmp_path / "no-sail-home"))
    env = EnvironmentSpec.model_validate({"sandbox": "sail", "tools": [{"builtin": "python"}]})
    with pytest.raises(ToolLoadError, match="SAIL_API_KEY is not set.*environment.sandbox: worker"):
        build_tools(env, ".")
    spec = type("S", (), {"environment": env})()
    with pytest.raises(PreflightError, match="^environment.sandbox: sail: SAIL_API_KEY is not set"):
        check_sandbox(spec)
    worker = EnvironmentSpec.model_validate({"tools": [{"builtin": "python"}]})
    assert type(build_tools(worker, ".")[0]).__name__ == "PythonTool"
    check_sandbox(type("S", (), {"environment": worker})())  # the worker sandbox needs no key
