"""User errors found by trying the product as a newcomer: each gives plain words and the right exit code."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sailrl.cli import main
from sailrl.compiler.validate import validate_text
from sailrl.launch import apply_overrides, build_spec
from sailrl.runtime.backends.backend import BackendError, open_backend
from sailrl.spec.errors import SpecErrors
from sailrl.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "spec/examples/quickstart.yaml"
CONFIG = {k: v for k, v in load_spec(QUICKSTART).spec.resolved().items() if k != "examples"}  # as scripts hold it
SPEC_DIR = QUICKSTART.parent


def _errors(text: str) -> list:
    with pytest.raises(SpecErrors) as e:
        validate_text(text, filename="s.yaml")
    return e.value.errors


BASE = """\
name: {name}
dataset: {{source: x.jsonl, fields: [question, answer]}}
prompt: {{user: '{user}'}}
reward: {{rules: [{{name: c, kind: answer}}]}}
training: {{learning_rate: {lr}, group_size: {gs}}}
"""


def test_run_name_must_be_usable_in_checkpoint_names():
    errs = _errors(BASE.format(name="My first run", user="{{ question }}", lr="1e-5", gs=4))
    e = next(e for e in errs if e.key_path == "name")
    assert (e.line, e.column) == (1, 7) and "letters, digits" in e.message
    errs = _errors(BASE.format(name="../../escape", user="{{ question }}", lr="1e-5", gs=4))
    assert any(e.key_path == "name" for e in errs)


def test_infinite_numbers_and_absurd_sizes_are_refused_where_written():
    errs = {e.key_path: e for e in _errors(BASE.format(name="r", user="{{ question }}", lr="1e400", gs=100000000))}
    assert "finite" in errs["training.learning_rate"].message and errs["training.learning_rate"].line == 5
    assert "at most 1024" in errs["training.group_size"].message


def test_unknown_jinja_filter_and_include_are_located_errors():
    errs = {e.key_path: e for e in _errors(BASE.format(name="r", user="{{ question | nofilter }}", lr="1e-5", gs=4))}
    assert "No filter named 'nofilter'" in errs["prompt.user"].message and errs["prompt.user"].line == 3
    errs = {e.key_path: e for e in _errors(BASE.format(name="r", user='{{ question }}{% include "x" %}', lr="1e-5",
                                                       gs=4))}
    assert "cannot include" in errs["prompt.user"].message


def test_set_overrides_go_through_every_spec_check(capsys):
    with pytest.raises(SpecErrors) as e:
        build_spec(CONFIG, ["training.group_size=1"], SPEC_DIR)
    assert "training.group_size" in str(e.value) and "nothing trains" in str(e.value)
    with pytest.raises(SpecErrors) as e:
        build_spec(CONFIG, ["training.stepz=2"], SPEC_DIR)
    assert "did you mean 'steps'" in str(e.value)
    from sailrl import launch

    rc = launch.main(None, CONFIG, spec_path="spec.yaml", spec_dir=SPEC_DIR, spec_sha256="0" * 64,
                     argv=["--set", "training.group_size=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "nothing trains" in err and "(these come from the --set overrides: training.group_size=1)" in err
    spec = build_spec(CONFIG, ["reward.rules.0.weight=1", "prompt.user={{ question }} = ?"], SPEC_DIR)
    assert spec.reward.rules[0].weight == 1 and spec.prompt.user == "{{ question }} = ?"


def test_malformed_set_values_are_plain_words():
    with pytest.raises(ValueError, match=r"not valid YAML .*quote it"):
        apply_overrides(CONFIG, ["training.steps=[1,2"])
    with pytest.raises(ValueError, match=r"reward.rules is a list of 2; use an index 0..1"):
        apply_overrides(CONFIG, ["reward.rules.5.weight=1"])
    with pytest.raises(ValueError, match=r"training.steps is a value, not a section"):
        apply_overrides(CONFIG, ["training.steps.x=1"])


def test_a_refused_run_writes_nothing_into_the_existing_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "reward/total": 0.5}\n')
    (run_dir / "train.py").write_text("# the script that ran\n")
    rc = main(["run", str(QUICKSTART), "--set", f"output.run_dir={run_dir}"])
    assert rc == 1
    assert "already holds a run (1 steps logged)" in capsys.readouterr().err
    assert (run_dir / "train.py").read_text() == "# the script that ran\n"


def test_hub_model_on_the_local_backend_is_one_line():
    """The embedded backend loads hub models; here (no hub, or an 8B model that does not fit) it says why."""
    from sailrl.spec.errors import ModelError

    spec = load_spec(ROOT / "spec/examples/gsm8k.yaml").spec
    with pytest.raises(ModelError) as e:
        open_backend(spec, sampler="local")
    assert "\n" not in str(e.value) and "'Qwen/Qwen3-8B'" in str(e.value)


def test_a_tinker_client_that_cannot_start_is_one_line(monkeypatch):
    import tinker

    def refuse(*a, **k):
        raise tinker.TinkerError("The api_key must start with the 'tml-' prefix")

    monkeypatch.setenv("TINKER_API_KEY", "tml-x")
    monkeypatch.setattr(tinker, "ServiceClient", refuse)
    spec = load_spec(ROOT / "spec/examples/gsm8k.yaml").spec
    with pytest.raises(BackendError, match=r"Tinker could not start a client: .*tml-.*check TINKER_API_KEY"):
        open_backend(spec, sampler="tinker")


def test_compile_check_on_a_missing_file_says_only_that(tmp_path, capsys):
    out = tmp_path / "none.py"
    assert main(["compile", str(QUICKSTART), "-o", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{out} is missing") and "@@" not in err


def test_rewards_without_a_reference_says_how_to_give_one(capsys):
    assert main(["rewards", str(QUICKSTART), "--completion", " 7"]) == 1
    assert "--field answer=VALUE" in capsys.readouterr().err


def test_examples_are_copied_with_their_data_by_init(tmp_path):
    assert main(["init", str(tmp_path / "s.yaml")]) == 0
    assert (tmp_path / "data" / "addition.jsonl").exists()
    shutil.rmtree(tmp_path)


def test_two_rules_with_one_name_are_reported_at_the_second_rule():
    text = """\
name: r
dataset: {source: x.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - name: c
      kind: answer
    - name: c
      kind: termination
"""
    errs = _errors(text)
    assert [(e.key_path, e.line, e.column) for e in errs if "two rules" in e.message] == [("reward.rules.1.name", 8, 13)]
    assert "the first is at line 6" in next(e for e in errs if "two rules" in e.message).message


def test_a_run_refused_for_a_missing_key_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("SAIL_API_KEY", raising=False)
    run_dir = tmp_path / "run"
    rc = main(["run", str(ROOT / "spec/examples/gsm8k.yaml"), "--set", f"output.run_dir={run_dir}"])
    err = capsys.readouterr().err
    assert rc == 1 and "TINKER_API_KEY is not set" in err and "Traceback" not in err
    assert not run_dir.exists()  # no train.py, no config.json: nothing of a run that never started


@pytest.mark.slow
def test_an_unreachable_tinker_is_one_line_within_the_connect_timeout(tmp_path):
    import subprocess
    import sys
    import time

    env = {**__import__("os").environ, "TINKER_API_KEY": "tml-unreachable", "SAIL_API_KEY": "x",
           "TINKER_BASE_URL": "http://127.0.0.1:9", "SAILRL_CONNECT_TIMEOUT_S": "2"}
    started = time.perf_counter()
    r = subprocess.run([sys.executable, str(ROOT / "generated/sail_guide.py"), "--set",
                        f"output.run_dir={tmp_path / 'run'}"], capture_output=True, text=True, env=env, timeout=120)
    assert time.perf_counter() - started < 30
    assert r.returncode == 1 and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: Tinker did not answer within 2 s (http://127.0.0.1:9)") and "--sampler local" in line
    assert not (tmp_path / "run").exists()
