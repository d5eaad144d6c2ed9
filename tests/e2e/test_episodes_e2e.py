"""Episodes end to end: a compiled script with environment: on the Sail path (loopback Sail, the local backend
standing in for Tinker) and on the embedded backend; a spec without environment: compiles as before."""

from __future__ import annotations

import collections
import json
import re
import runpy
import sys
from pathlib import Path

import pytest

from sailrl.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

SPEC = """
name: calc-e2e
model: {{name: sailrl/tiny, renderer: role_colon_tools, lora_rank: 8}}
dataset: {{source: rows.jsonl, fields: [question, answer]}}
prompt: {{user: '{{{{ question }}}}=', reference_field: answer}}
reward:
  rules:
    - {{name: correct, kind: answer, extract: {{from: whole}}, reference: {{extract: {{from: whole}}}},
       compare: numeric, weight: 1.0}}
environment:
  max_turns: 3
  tools: [{{builtin: calculator}}]
training: {{steps: 2, group_size: 2, groups_per_step: 2, learning_rate: 1e-3}}
sampling: {{sampler: {sampler}, max_tokens: 96}}
output: {{run_dir: run}}
"""


def _compile(tmp_path: Path, sampler: str) -> Path:
    rows = [{"question": f"{a}+{b}", "answer": str(a + b)} for a in range(1, 4) for b in range(1, 4)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spec.yaml").write_text(SPEC.format(sampler=sampler))
    script = tmp_path / "train.py"
    assert cli(["compile", str(tmp_path / "spec.yaml"), "-o", str(script)]) == 0
    return script


def test_the_compiled_script_shows_the_episode_and_its_tools(tmp_path):
    text = _compile(tmp_path, "local").read_text()
    assert '    "environment": {' in text and '"max_turns": 3,  # environment.max_turns' in text
    assert "episode" in text.split("async def main", 1)[1].lower()
    assert "run.sampler.tools" in text


def test_sail_path_runs_every_turn_on_the_steps_checkpoint(tmp_path, monkeypatch, fake_sail_server):
    """Every turn of an episode is a Sail request for the same signed checkpoint; the tool result comes back in the
    next turn's prompt; half the episodes use the calculator and are right, half answer wrong at once."""
    import tinker

    from sailrl.runtime.backends.local import LocalServiceClient
    from sailrl.runtime.backends.models import get_tokenizer
    from tests.fakes.sail_server import Sample

    tok = get_tokenizer("sailrl/tiny")
    seen: collections.Counter = collections.Counter()

    def sampler(prompt_tokens, payload):
        text = tok.decode(prompt_tokens)
        result = re.search(r"<tool_response>\n(\d+)\n</tool_response>\n\nAssistant:$", text)
        if result:  # second turn: answer what the calculator said
            reply = f" {result.group(1)}\n\nUser:"
        else:
            a, b = map(int, re.search(r"User: (\d+)\+(\d+)=", text).groups())
            seen[(a, b)] += 1
            call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a}+{b}"}})
            reply = f" <tool_call>{call}</tool_call>\n\nUser:" if seen[(a, b)] % 2 == 1 else f" {a + b + 1}\n\nUser:"
        ids = tok.encode(reply, add_special_tokens=False)
        return Sample(ids, [-0.5] * len(ids), "stop")

    fake_sail_server.sampler = sampler
    fake_sail_server.service_time_s = 0.0
    script = _compile(tmp_path, "sail")
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    monkeypatch.setattr(tinker, "ServiceClient", lambda *a, **k: LocalServiceClient("sailrl/tiny",
                                                                                    base_dir=tmp_path / "ckpt"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0
    posts = fake_sail_server.payloads
    assert len(posts) == 2 * 2 * 3  # steps x groups x (2 turns + 1 turn)
    names = [p["metadata"]["tinker_lora_name"] for p in posts]
    assert [n[-6:] for n in names] == ["000001"] * 6 + ["000002"] * 6  # every turn from its step's checkpoint
    assert len({p["metadata"]["lora"] for p in posts[:6]}) == 1
    second_turns = [p for p in posts if tok.decode(p["raw_prompt_tokens"]).endswith("</tool_response>\n\nAssistant:")]
    assert len(second_turns) == 4
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        assert m["correct"] == pytest.approx(0.5) and m["episode/tool_calls"] == pytest.approx(0.5)
        assert m["episode/turns"] == pytest.approx(1.5) and m["episode/end/answered"] == 1.0
        assert m["degenerate_frac"] == 0.0 and m["datums"] > 0
    records = [json.loads(x) for x in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    with_tool = [r for r in records if len(r["episode"]["turns"]) == 3]
    assert len(with_tool) == 4 and all(r["total"] == 1.0 for r in with_tool)
    assert with_tool[0]["episode"]["turns"][1]["role"] == "tool"
    assert all(r["sampler_path"] for r in records)


def test_feedback_example_runs_on_the_embedded_backend(tmp_path):
    """spec/examples/feedback.yaml, a few small steps: episodes with feedback turns train and are logged."""
    import subprocess

    r = subprocess.run([sys.executable, str(ROOT / "generated/feedback.py"), "--set",
                        f"output.run_dir={tmp_path / 'run'}", "--set", "training.steps=2", "--set",
                        "training.groups_per_step=4", "--set", "training.group_size=4"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert 1.0 <= m["episode/turns"] <= 2.0
        assert m["episode/feedback_turns"] == pytest.approx(m["episode/turns"] - 1.0)
    records = [json.loads(x) for x in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    fed = [r for r in records if any(t["role"] == "user" for t in r["episode"]["turns"])]
    assert all(t["text"].startswith("Not quite. Try again: ") for r in fed for t in r["episode"]["turns"]
               if t["role"] == "user")
