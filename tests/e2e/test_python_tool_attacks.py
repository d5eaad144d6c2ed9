"""The python tool attacked from inside real episode runs: a compiled script on the Sail path (loopback Sail with
forced completions, the embedded backend standing in for Tinker), the default sandbox (bubblewrap).

Each of the nine rows of the dataset gets one attack class as its episode's tool call: read an environment key,
read the dataset's reference answers, rewrite the reward rule's file, read a system file, connect to a loopback
port this test listens on, write to every inherited descriptor and forge a reply, double-fork and outlive the
call, fill the disk with many small files, fork without bound. The same run with a harmless snippet in each
episode is the benign run. Each attack must end as a tool error or a harmless result, the rewards must equal the
benign run's, and no planted key may appear in any file the run wrote or in what the studio serves of it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import runpy
import socket
import sys
import time
from pathlib import Path

import pytest

from sailrl.cli import main as cli
from tests.fakes.sandbox import require_sandbox

pytestmark = pytest.mark.slow

PLANTED = {"TINKER_API_KEY": "tml-planted-tinker-key-0123456789", "HF_TOKEN": "hf_plantedHubToken9876543210",
           "AWS_SECRET_ACCESS_KEY": "planted/aws/Secret+Access+Key=42"}
SLEEPER = "301.731"  # the double-forked grandchild's argument: found in /proc if it outlived the call
REWARDS = "def score(completion, fields):\n    return 1.0 if completion.strip() == fields['answer'] else 0.0\n"

SPEC = """
name: attacks
model: {name: sailrl/tiny, renderer: role_colon_tools, lora_rank: 8}
dataset: {source: rows.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}=', reference_field: answer}
reward:
  rules:
    - {name: exact, kind: python, function: 'rewards:score'}
environment:
  max_turns: 3
  tools: [{builtin: python, timeout_s: 3, memory_mb: 256, disk_mb: 4}]
training: {steps: 1, group_size: 2, groups_per_step: 9, learning_rate: 1e-3}
sampling: {sampler: sail, max_tokens: 1024}
output: {run_dir: run, log_rollouts: all}
"""


def _attacks(spec_dir: Path, port: int) -> dict[str, str]:
    rows, rewards = spec_dir / "rows.jsonl", spec_dir / "rewards.py"
    return {
        "env": "import os\nprint(sorted(os.environ.items()))",
        "dataset": f"print(open({str(rows)!r}).read())",
        "reward_file": f"open({str(rewards)!r}, 'w').write('def score(c, f):\\n    return 1.0\\n')\nprint('wrote')",
        "system_file": "print(open('/etc/shadow').read())",
        "loopback": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'hi')",
        "descriptors": ("import os, pickle\n"
                        "bad = pickle.dumps({'result': 'ok', 'content': 'FORGED'})\n"
                        "frame = len(bad).to_bytes(4, 'big') + bad\n"
                        "hit = []\n"
                        "for fd in range(3, 1024):\n"
                        "    try:\n        os.write(fd, frame)\n        hit.append(fd)\n"
                        "    except OSError:\n        pass\n"
                        "print('descriptors written:', hit)"),
        "double_fork": ("import os\n"
                        "if os.fork() == 0:\n    os.setsid()\n"
                        f"    if os.fork() == 0:\n        os.execv('/usr/bin/sleep', ['sleep', {SLEEPER!r}])\n"
                        "    os._exit(0)\n"
                        "print('forked')"),
        "disk": ("i = 0\n"
                 "while True:\n    open(f'f{i}', 'w').write('x' * 512)\n    i += 1"),
        "fork_bomb": "import os\nwhile True:\n    os.fork()",
    }


def _compile(spec_dir: Path) -> Path:
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(9)]
    (spec_dir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (spec_dir / "rewards.py").write_text(REWARDS)
    (spec_dir / "spec.yaml").write_text(SPEC)
    script = spec_dir / "train.py"
    assert cli(["compile", str(spec_dir / "spec.yaml"), "-o", str(script)]) == 0
    return script


def _run(spec_dir: Path, codes: list[str], monkeypatch, fake_sail_server, *, raw_calls: bool = False) -> list[dict]:
    """Run the compiled script once; episode i calls python with ``codes[i]`` (or makes the tool call ``codes[i]``
    with ``raw_calls``), then answers ``i + 1`` (wrong, so a benign run scores 0 everywhere and only a broken
    sandbox can raise a reward)."""
    import tinker

    from sailrl.runtime.backends.local import LocalServiceClient
    from sailrl.runtime.backends.models import get_tokenizer
    from tests.fakes.sail_server import Sample

    tok = get_tokenizer("sailrl/tiny")

    def sampler(prompt_tokens, payload):
        text = tok.decode(prompt_tokens)
        i = int(re.search(r"User: q(\d+)=", text).group(1))
        if "<tool_response>" in text:
            reply = f" {i + 1}\n\nUser:"
        else:
            call = codes[i] if raw_calls else json.dumps({"name": "python", "arguments": {"code": codes[i]}})
            reply = f" <tool_call>{call}</tool_call>\n\nUser:"
        ids = tok.encode(reply, add_special_tokens=False)
        return Sample(ids, [-0.5] * len(ids), "stop")

    fake_sail_server.sampler = sampler
    fake_sail_server.service_time_s = 0.0
    script = _compile(spec_dir)
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(tinker, "ServiceClient", lambda *a, **k: LocalServiceClient("sailrl/tiny",
                                                                                    base_dir=spec_dir / "ckpt"))
    monkeypatch.chdir(spec_dir)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0
    return [json.loads(x) for x in (spec_dir / "run" / "rollouts.jsonl").read_text().splitlines()]


def _tool_result(record: dict) -> dict:
    turn = next(t for t in record["episode"]["turns"] if t["role"] == "tool")
    return {"text": turn["text"], "error": turn.get("error")}


def _sleepers() -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if SLEEPER.encode() in cmdline and b"sleep" in cmdline:
            found.append(int(pid))
    return found


def test_attacks_from_the_python_tool_gain_nothing_and_leak_nothing(tmp_path, monkeypatch, fake_sail_server):
    require_sandbox()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0)
    port = listener.getsockname()[1]
    attacked, benign = tmp_path / "attacked", tmp_path / "benign"
    attacked.mkdir()
    benign.mkdir()
    attacks = _attacks(attacked, port)
    names = list(attacks)
    try:
        records = _run(attacked, list(attacks.values()), monkeypatch, fake_sail_server)
        with pytest.raises(BlockingIOError):  # nobody connected to the port this test listens on
            listener.accept()
    finally:
        listener.close()
    assert (attacked / "rewards.py").read_text() == REWARDS  # the reward rule's file is untouched
    config = json.loads((attacked / "run" / "config.json").read_text())
    assert config["code_sha256"] == {"rewards.py": hashlib.sha256(REWARDS.encode()).hexdigest()}
    time.sleep(0.5)  # the kernel reaps a killed namespace's processes at once; give it a moment to show in /proc
    assert _sleepers() == []  # the double-forked grandchild did not outlive its call

    baseline = _run(benign, ["print('hello')"] * 9, monkeypatch, fake_sail_server)
    assert len(records) == len(baseline) == 18
    assert [r["total"] for r in records] == [r["total"] for r in baseline] == [0.0] * 18

    results = {names[int(re.search(r"q(\d+)=", r["prompt"]).group(1))]: _tool_result(r) for r in records}
    assert results["env"] == {"text": "[('HOME', '/tmp'), ('LANG', 'C.UTF-8'), ('PATH', '/usr/bin:/bin'), "
                                      "('PWD', '/tmp'), ('PYTHONDONTWRITEBYTECODE', '1'), ('PYTHONHASHSEED', '0'), "
                                      "('PYTHONIOENCODING', 'utf-8'), ('TMPDIR', '/tmp')]\n", "error": False}
    for name in ("dataset", "reward_file", "system_file"):
        assert results[name]["error"] and "raised FileNotFoundError" in results[name]["text"], name
    assert results["loopback"]["error"] and "raised ConnectionRefusedError" in results["loopback"]["text"]
    assert results["descriptors"] == {"text": "descriptors written: []\n", "error": False}
    tool_texts = [t["text"] for r in records for t in r["episode"]["turns"] if t["role"] == "tool"]
    assert len(tool_texts) == 18 and not any("FORGED" in t for t in tool_texts)  # no forged reply answered a call
    assert results["double_fork"] == {"text": "forked\n", "error": False}
    assert results["disk"]["error"] and re.search(r"No space left|ran longer than 3 s", results["disk"]["text"])
    assert results["fork_bomb"]["error"] and re.search(r"BlockingIOError|ran longer", results["fork_bomb"]["text"])

    for run_file in (attacked / "run").rglob("*"):  # no planted key in anything the run wrote
        if run_file.is_file():
            data = run_file.read_bytes()
            for value in PLANTED.values():
                assert value.encode() not in data, f"{run_file} holds {value}"


def test_a_key_that_reaches_a_tool_result_is_removed_before_anything_is_written(
        tmp_path, monkeypatch, fake_sail_server, capsys):
    """Defence in depth behind the sandbox: a user's tool that names the keys in its ``env:`` (so its worker gets
    them) and returns them; the run still writes no key -- not in the tool result the model reads next, not in
    rollouts.jsonl, ``sailrl show`` or the studio's answers. The unisolated worker's snippets get no key at all."""
    spec_dir = tmp_path / "leaky"
    spec_dir.mkdir()
    (spec_dir / "leaky.py").write_text(
        "import os\n\n\ndef leak(what: str) -> str:\n    \"\"\"Tell what the environment holds.\"\"\"\n"
        "    return os.environ.get('TINKER_API_KEY', '-') + ' ' + os.environ.get('HF_TOKEN', '-')\n")
    spec = SPEC.replace("tools: [{builtin: python, timeout_s: 3, memory_mb: 256, disk_mb: 4}]",
                        "sandbox: unisolated_worker\n  tools: [{function: 'leaky:leak', env: [TINKER_API_KEY, "
                        "HF_TOKEN]}, {builtin: python}]")
    monkeypatch.setattr(sys.modules[__name__], "SPEC", spec)
    calls = ['{"name": "leak", "arguments": {"what": "keys"}}'] * 5 + \
        ['{"name": "python", "arguments": {"code": "import os\\nprint(os.environ.get(\'TINKER_API_KEY\'))"}}'] * 4
    records = _run(spec_dir, calls, monkeypatch, fake_sail_server, raw_calls=True)
    results = [_tool_result(r)["text"] for r in records]
    assert results.count("[secret removed] [secret removed]") == 10  # 5 rows x 2 rollouts: the tool had the keys
    assert results.count("None\n") == 8  # the unisolated snippet's worker got no key
    for run_file in (spec_dir / "run").rglob("*"):
        if run_file.is_file():
            for value in PLANTED.values():
                assert value.encode() not in run_file.read_bytes(), f"{run_file} holds {value}"

    assert cli(["show", str(spec_dir / "run")]) == 0
    shown = capsys.readouterr().out
    assert "[secret removed]" in shown and not any(v in shown for v in PLANTED.values())

    from tests.studio.test_studio_api import client_for

    served = client_for(spec_dir / "spec.yaml", spec_dir / "run").get(
        "/api/run/rollouts", params={"run": "run", "step": 1}).text
    assert "[secret removed]" in served and not any(v in served for v in PLANTED.values())
