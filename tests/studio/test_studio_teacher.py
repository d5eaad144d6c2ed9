"""The studio for someone who knows what a good answer is: rules in sentences, pattern words, labelled replies and
the rules proposed from them, examples that never block a save, and runs started, followed and stopped from the
page (Starlette's TestClient; the run is a stand-in process, tests/fakes/studio_fake_run.py)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():  # starlette 1.x suggests httpx2 for its test client; httpx is what is installed
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from sailrl.compiler.validate import validate_text
from sailrl.runtime.loop.gaming import GamingWatch
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.errors import SpecErrors
from sailrl.spec.loader import load_spec
from sailrl.spec.rewards import RewardSpec
from sailrl.studio.app import build_app
from sailrl.studio.security import cookie_name
from sailrl.studio.session import Studio
from sailrl.studio.words import page_hint, pattern_phrase, pattern_words, rule_sentences
from tests.fakes.studio_project import make_project

PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = "test-token-abc"
FAKE_RUN = Path(__file__).resolve().parents[1] / "fakes" / "studio_fake_run.py"


def _client(spec: Path, *, command=None, token: bool = True) -> TestClient:
    app = build_app(Studio(spec, run_command=command), token=TOKEN, host="127.0.0.1", port=PORT)
    c = TestClient(app, base_url=BASE)
    if token:
        c.cookies.set(cookie_name(PORT), TOKEN)
    return c


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "proj")


@pytest.fixture
def client(project):
    return _client(project)


# ---------------------------------------------------------------------------------------------- words


def test_each_rule_has_its_sentence_with_patterns_in_words(client, project):
    check = client.post("/api/check", json={"text": project.read_text()}).json()
    spec = load_spec(project).spec
    explain = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field).explain()
    assert check["sentences"][0] == explain[0]
    # a pattern is said in words in the sentence itself (explain, for the terminal, quotes the pattern)
    assert explain[1].startswith("format: +0.5 if all of: the completion contains a match of '^\\s*-?\\d+\\s*$'")
    assert check["sentences"][1] == ("format: +0.5 if all of: the reply is only a number (a '-' allowed, spaces "
                                     "around it); the completion ended cleanly (stop sequence or end of turn, not "
                                     "cut off at max_tokens); otherwise 0.")
    # a rule with a problem has no sentence; the others keep theirs
    broken = project.read_text().replace("kind: termination", "kind: terminaton")
    check = client.post("/api/check", json={"text": broken}).json()
    assert check["sentences"] == [explain[0], None]
    assert check["broken"] == {"1": {"name": "format", "problem": check["broken"]["1"]["problem"]}}


def test_a_pattern_in_words():
    assert pattern_words("2\\+3=") == "the text '2+3=' exactly, anywhere in the reply"
    assert pattern_words("=", fullmatch=True) == "the text '=' exactly and nothing else"
    assert pattern_words("^\\s*-?\\d+\\s*$") == (
        "at the start, then a space (or tab, or line break), any number of times (or none), then '-', optionally, "
        "then a digit, one or more times, then a space (or tab, or line break), any number of times (or none), "
        "then at the end")
    assert pattern_words("2+3=") == "'2', one or more times, then '3='"
    assert pattern_words("(") is None


def test_check_gives_the_words_of_every_pattern(client, project):
    check = client.post("/api/check", json={"text": project.read_text()}).json()
    assert list(check["pattern_words"]) == ["reward.rules.1.checks.0.pattern"]
    assert check["pattern_words"]["reward.rules.1.checks.0.pattern"].startswith("at the start, then a space")


def test_starters_are_sentences(client):
    starters = client.get("/api/starters").json()["starters"]
    assert [s["sentence"] for s in starters] == [
        "the last number in the reply equals the answer", "the reply contains ...", "the reply is at most N words",
        "the reply ends on its own (not cut off at the length limit)", "a judge decides: ..."]


# ---------------------------------------------------------------------------------------------- examples


def test_examples_whose_scores_no_longer_hold_are_flagged_not_blocking(client, project):
    text = project.read_text().replace("weight: 0.5\n    - name: format", "weight: 1.0\n    - name: format")
    check = client.post("/api/check", json={"text": text}).json()
    assert check["valid"] is False and check["only_examples"] is True
    assert {p["code"] for p in check["problems"] if p["severity"] == "error"} <= {"S301"}
    # the page's "use the new scores": the examples' expectations from their scores now, then it validates
    scored = client.post("/api/examples", json={"text": text}).json()["examples"]
    examples = []
    for e in scored:
        ex = dict(e["example"])
        if "expect_total" in ex:
            ex["expect_total"] = e["total"]
        if "expect" in ex:
            ex["expect"] = {k: e["contributions"][k] for k in ex["expect"]}
        examples.append(ex)
    rules = check["rules"]
    patched = client.post("/api/patch", json={"text": text, "rules": rules, "examples": examples}).json()
    assert patched["check"]["valid"] is True
    assert "expect_total: 1.5" in patched["text"]


# ---------------------------------------------------------------------------------------------- labels


def _working_spec(project: Path) -> str:
    """The quickstart with its format rule replaced by 'working': the reply contains '='."""
    text = project.read_text()
    start = text.index("    - name: format")
    end = text.index("\ntraining:")
    text = text[:start] + "    - name: working\n      kind: match\n      pattern: '='\n      weight: 1.0\n" + text[end:]
    return text[:text.index("examples:")]


LABELS = [
    {"completion": "3+4=7", "fields": {"question": "3+4", "answer": "7"}, "good": True},
    {"completion": "2+2=4", "fields": {"question": "2+2", "answer": "4"}, "good": True},
    {"completion": "2=aaaaaaaaa", "fields": {"question": "1+1", "answer": "2"}, "truncated": True, "good": False},
    {"completion": " 7", "fields": {"question": "3+4", "answer": "7"}, "good": False},
]


def test_each_rule_shows_which_labels_it_gets_right_and_a_safe_rule_is_proposed(client, project):
    got = client.post("/api/labels", json={"text": _working_spec(project), "labels": LABELS}).json()
    assert got["labels"] == 4
    # correct reads the whole reply as the number (so not "3+4=7"); working passes "2=aaa..." cut at max_tokens
    assert got["rules"] == {"correct": [False, False, True, False], "working": [True, True, False, True]}
    first = got["proposals"][0]
    assert first["replaces"] == 1 and first["how"] == "also requiring the reply to end on its own"
    assert first["rule"] == {"name": "working", "weight": 1.0, "kind": "all_of",
                             "checks": [{"kind": "match", "pattern": "="}, {"kind": "termination"}]}
    assert first["sentence"] == ("working: +1 if all of: the reply contains '='; the completion "
                                 "ended cleanly (stop sequence or end of turn, not cut off at max_tokens); otherwise 0.")
    # no proposal passes a gaming probe: e.g. 'contains =' alone (passed by '=' repeated, cut at max_tokens)
    assert all(p["rule"].get("kind") != "match" or p["rule"].get("mode") == "fullmatch" for p in got["proposals"])


def test_labels_are_checked(client, project):
    r = client.post("/api/labels", json={"text": project.read_text(), "labels": [{"completion": 3}]})
    assert r.status_code == 400 and r.json()["error"] == "each label needs completion (text) and good (true or false)"


# ---------------------------------------------------------------------------------------------- runs


def _fake(run_dir_steps: int = 3):
    def command(spec_path: Path, mode: str, overrides: dict) -> list[str]:
        return [sys.executable, str(FAKE_RUN), str(spec_path.parent / "runs" / "quickstart"), str(run_dir_steps), mode]
    return command


def _wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.05)


def _step(run_dir: Path, n: int) -> None:
    """Let the fake run write its step n, and wait for it."""
    (run_dir / "go").write_text("")
    deadline = time.monotonic() + 30
    while sum(1 for _ in (run_dir / "metrics.jsonl").open()) < n if (run_dir / "metrics.jsonl").exists() else True:
        assert time.monotonic() < deadline, f"step {n} was not written"
        time.sleep(0.05)


def test_start_follow_stop_resume_from_the_page(project):
    c = _client(project, command=_fake(3))
    text = project.read_text()
    run_dir = project.parent / "runs" / "quickstart"
    plan = c.post("/api/run/plan", json={"text": text, "overrides": {"training.steps": 3}}).json()
    assert plan["run"] == "runs/quickstart" and plan["needs_save"] is False and plan["resumable"] is False
    assert plan["verdict"] and any("tokens" in line for line in plan["cost"])
    assert plan["cost"][-1] == "with training.steps=3 (the estimate above is for these values)"
    assert any("3 RL steps" in line for line in plan["cost"]) and not any("100 RL steps" in ln for ln in plan["cost"])
    assert all(isinstance(line, str) and "null" not in line for line in plan["cost"])
    started = c.post("/api/run/start", json={"text": text, "mode": "new", "overrides": {"training.steps": 3}}).json()
    assert started["run"] == "runs/quickstart" and started["argv"][-1] == "new"
    _wait_for(run_dir / "fake.json", "the run's start")
    fake = json.loads((run_dir / "fake.json").read_text())
    # detached: its own session and process group, so the studio's Ctrl-C and exit do not reach it
    assert fake["sid"] == fake["pid"] == fake["pgid"] != os.getsid(0)
    # one run at a time per spec
    again = c.post("/api/run/start", json={"text": text, "mode": "new"})
    assert again.status_code == 409 and again.json()["error"].startswith("a run of this spec is going on")
    _step(run_dir, 1)
    status = c.get("/api/run/status?run=runs/quickstart").json()
    assert status["running"] is True and status["started_here"] is True
    assert status["progress"] == {"done": 1, "total": 3, "seconds_per_step": 2.0, "seconds_left": 4.0,
                                  "fraction": 1 / 3}
    assert "fake run: new from step 1" in status["log"]
    # the page lists the run without a reload
    assert "runs/quickstart" in [r["id"] for r in c.post("/api/runs", json={"text": text}).json()["runs"]]
    stopped = c.post("/api/run/stop", json={"run": "runs/quickstart"}).json()
    assert stopped["stopping"] is True
    _wait_for(run_dir / "stopped", "the stop")
    deadline = time.monotonic() + 30
    while c.get("/api/run/status?run=runs/quickstart").json()["alive"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (run_dir / "stopped").read_text() == "2\n"  # SIGINT, as Ctrl-C
    os.utime(run_dir / "metrics.jsonl", (0, 0))  # long ago: no run is writing it now
    status = c.get("/api/run/status?run=runs/quickstart").json()
    assert status["exit_code"] == 130 and status["running"] is False
    (run_dir / "fake.json").unlink()
    resumed = c.post("/api/run/start", json={"text": text, "mode": "resume"}).json()
    assert resumed["argv"][-1] == "resume"
    _wait_for(run_dir / "fake.json", "the resume")
    _step(run_dir, 2)
    _step(run_dir, 3)
    deadline = time.monotonic() + 30
    while c.get("/api/run/status?run=runs/quickstart").json()["alive"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.utime(run_dir / "metrics.jsonl", (0, 0))
    status = c.get("/api/run/status?run=runs/quickstart").json()
    assert status["exit_code"] == 0 and status["progress"]["done"] == 3
    assert status["outcome"] == ("the model now gets 60% of the prompts right by rule 'correct' (mean of the last 1 "
                                 "steps), up from 40% (the first 1)")


def test_a_run_needs_the_token_a_saved_spec_and_allowed_overrides(project):
    text = project.read_text()
    no_token = _client(project, command=_fake(), token=False)
    assert no_token.post("/api/run/start", json={"text": text, "mode": "new"}).status_code == 401
    assert no_token.post("/api/run/stop", json={"run": "runs/quickstart"}).status_code == 401
    c = _client(project, command=_fake())
    r = c.post("/api/run/start", json={"text": text + "\n# edited\n", "mode": "new"})
    assert r.status_code == 409 and r.json()["error"] == "save the spec first: a run trains the spec file as saved"
    r = c.post("/api/run/start", json={"text": text, "mode": "new", "overrides": {"output.run_dir": "/tmp/x"}})
    assert r.status_code == 400 and r.json()["error"].startswith("output.run_dir cannot be overridden from the page")
    r = c.post("/api/run/start", json={"text": text, "mode": "resume"})
    assert r.status_code == 404
    assert not (project.parent / "runs" / "quickstart" / "fake.json").exists()
    cross = c.post("/api/run/start", json={"text": text, "mode": "new"}, headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403


def test_stop_acts_only_on_runs_the_studio_started(project):
    run_dir = project.parent / "runs" / "quickstart"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "correct": 0.4}) + "\n")  # a terminal's run
    c = _client(project, command=_fake())
    r = c.post("/api/run/stop", json={"run": "runs/quickstart"})
    assert r.status_code == 409 and "stops only the runs it started" in r.json()["error"]
    # a run started elsewhere that is writing now: no second run on the same spec
    r = c.post("/api/run/start", json={"text": project.read_text(), "mode": "new"})
    assert r.status_code == 409 and "started elsewhere" in r.json()["error"]
    status = c.get("/api/run/status?run=runs/quickstart").json()
    assert status["running"] is True and status["started_here"] is False


def test_the_run_outlives_the_studio(project, tmp_path):
    """The studio's process ends; the run it started goes on (its own session: not a child that dies with it)."""
    import subprocess

    script = tmp_path / "serve.py"
    script.write_text(
        "import sys, json\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from tests.studio.test_studio_teacher import _client, _fake\n"
        "from pathlib import Path\n"
        "spec = Path(sys.argv[1])\n"
        "c = _client(spec, command=_fake(2))\n"
        "r = c.post('/api/run/start', json={'text': spec.read_text(), 'mode': 'new'})\n"
        "print(json.dumps(r.json()))\n")
    out = subprocess.run([sys.executable, str(script), str(project)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pid = json.loads(out.stdout)["pid"]
    run_dir = project.parent / "runs" / "quickstart"
    _wait_for(run_dir / "fake.json", "the run's start")
    os.kill(pid, 0)  # still alive after the studio's process exited
    _step(run_dir, 1)
    _step(run_dir, 2)


# ---------------------------------------------------------------------------------------------- new scores


def _without_format(project: Path) -> str:
    """The quickstart with its format rule removed (example 2 still expects a score for it)."""
    text = project.read_text()
    start = text.index("    - name: format")
    end = text.index("\ntraining:")
    return text[:start].rstrip("\n") + text[end:]


def test_new_scores_drop_expectations_of_a_removed_rule_so_save_works(client, project):
    text = _without_format(project)
    check = client.post("/api/check", json={"text": text}).json()
    assert "S302" in {p["code"] for p in check["problems"]} and check["only_examples"] is True
    new = client.post("/api/examples/new-scores", json={"text": text}).json()
    assert new["changes"] == [
        {"index": 0, "dropped": False, "guard": False, "words": ["total 1 -> 0.5"]},
        {"index": 1, "dropped": False, "guard": False,
         "words": ["the expectation for 'format' dropped (no rule has that name now)"]}]
    assert new["examples"][1] == {"completion": " 8", "fields": {"question": "3+4", "answer": "7"},
                                  "expect": {"correct": 0.0}}
    patched = client.post("/api/patch", json={"text": text, "rules": check["rules"],
                                              "examples": new["examples"]}).json()
    assert patched["check"]["valid"] is True
    base = client.get("/api/spec").json()["disk_sha"]
    assert client.post("/api/save", json={"text": patched["text"], "base_sha": base}).status_code == 200
    # an example that expected only the removed rule is dropped, said in words
    only = text.replace("expect: {correct: 0.0, format: 0.5}", "expect: {format: 0.5}")
    new = client.post("/api/examples/new-scores", json={"text": only}).json()
    assert new["changes"][1] == {"index": 1, "dropped": True, "guard": False, "words": [
        "the example dropped: it expected scores only for rules the spec no longer has ('format')"]}
    assert len(new["examples"]) == 3 and all(ex["completion"] != " 8" for ex in new["examples"])


def test_new_scores_say_what_changes_and_flag_a_guard_that_would_pass(client, project):
    # format weighs 1.0 now: ' 8 (or maybe 7)' still totals 0, ' 7' totals 1.5; a looser format passes the gamed reply
    text = project.read_text().replace("pattern: '^\\s*-?\\d+\\s*$'", "pattern: '\\d'")
    new = client.post("/api/examples/new-scores", json={"text": text}).json()
    by_index = {c["index"]: c for c in new["changes"]}
    assert by_index[3] == {"index": 3, "dropped": False, "guard": True,
                           "words": ["total 0 -> 0.5 (it was expected to fail: it would now pass)"]}
    assert new["guards"] == sum(1 for c in new["changes"] if c["guard"]) >= 1
    assert new["examples"][3]["expect_total"] == 0.5


def _rules_spec(project: Path, rules: str) -> str:
    text = project.read_text()
    start = text.index("  rules:\n") + len("  rules:\n")
    end = text.index("\ntraining:")
    return (text[:start] + rules + text[end:])[:(text[:start] + rules + text[end:]).index("examples:")]


def test_no_proposal_copies_a_rule_the_spec_has(client, project):
    text = _rules_spec(project, "    - name: correct\n      kind: answer\n      extract: {from: whole}\n"
                                "      compare: numeric\n      weight: 1.0\n"
                                "    - name: shows_working\n      kind: all_of\n      checks:\n"
                                "        - {kind: match, pattern: '='}\n        - {kind: termination}\n")
    got = client.post("/api/labels", json={"text": text, "labels": LABELS}).json()
    assert got["rules"]["shows_working"] == [True, True, True, True]
    bodies = [{k: v for k, v in p["rule"].items() if k not in ("name", "weight")} for p in got["proposals"]]
    assert {"kind": "all_of", "checks": [{"kind": "match", "pattern": "="}, {"kind": "termination"}]} not in bodies


def test_a_check_is_proposed_together_with_the_answer_rule(client, project):
    text = _rules_spec(project, "    - name: correct\n      kind: answer\n      extract: {from: last_number}\n"
                                "      compare: numeric\n      weight: 1.0\n")
    labels = [{"completion": "3+4=7", "fields": {"question": "3+4", "answer": "7"}, "good": True},
              {"completion": "2+2=4", "fields": {"question": "2+2", "answer": "4"}, "good": True},
              {"completion": "3+4=8", "fields": {"question": "3+4", "answer": "7"}, "good": False},
              {"completion": " 7", "fields": {"question": "3+4", "answer": "7"}, "good": False}]
    got = client.post("/api/labels", json={"text": text, "labels": labels}).json()
    first = got["proposals"][0]
    assert first["together_with"] == "correct" and first["replaces"] is None
    assert first["how"] == "a new rule, together with 'correct': a reply is good when both pass"
    # '+' (in every good reply, missing from ' 7'), and ended on its own ('3+4=7aaa...' cut off is a gamed reply)
    assert first["rule"] == {"name": "rule_1", "kind": "all_of", "weight": 1.0,
                             "checks": [{"kind": "match", "pattern": "\\+"}, {"kind": "termination"}]}


def test_a_stopped_run_is_over_at_once_and_a_new_one_shows_none_of_the_old(project):
    c = _client(project, command=_fake(3))
    text = project.read_text()
    run_dir = project.parent / "runs" / "quickstart"
    c.post("/api/run/start", json={"text": text, "mode": "new", "overrides": {"training.steps": 3}})
    _wait_for(run_dir / "fake.json", "the run's start")
    _step(run_dir, 1)
    (run_dir / "gaming.jsonl").write_text(json.dumps({"step": 1, "rule": "format", "message": "old"}) + "\n")
    c.post("/api/run/stop", json={"run": "runs/quickstart"})
    deadline = time.monotonic() + 30
    while c.get("/api/run/status?run=runs/quickstart").json()["alive"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # metrics.jsonl was written a moment ago, by the run that has now exited: it is stopped, not running
    status = c.get("/api/run/status?run=runs/quickstart").json()
    assert status["running"] is False and status["exit_code"] == 130
    assert status["progress"]["seconds_left"] is None and status["progress"]["done"] == 1
    plan = c.post("/api/run/plan", json={"text": text}).json()
    assert plan["running"] is False and plan["resumable"] is True
    # start over at once: the new run's status shows none of the old run's step, outcome or warnings
    (run_dir / "fake.json").unlink()
    started = c.post("/api/run/start", json={"text": text, "mode": "new", "overrides": {"training.steps": 2}})
    assert started.status_code == 200
    _wait_for(run_dir / "fake.json", "the new run's start")
    status = c.get("/api/run/status?run=runs/quickstart").json()
    assert status["progress"]["done"] == 0 and status["progress"]["total"] == 2
    assert status["outcome"] is None and status["gaming"] == []
    c.post("/api/run/stop", json={"run": "runs/quickstart"})
    while c.get("/api/run/status?run=runs/quickstart").json()["alive"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_status_says_every_rules_pass_rate_and_a_goal_never_reached(project):
    """The outcome gives each rule's pass rate at the start and the end; a rule that passed on no reply for 10 steps
    is said once, in the page's words (the Try box), from the run's gaming.jsonl."""
    rules = [{"name": "correct", "kind": "answer", "weight": 1.0},
             {"name": "shows_working", "kind": "match", "pattern": "=", "weight": 0.5}]
    run_dir = project.parent / "runs" / "quickstart"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"spec": {"training": {"steps": 12}, "reward": {"rules": rules}}}))
    watch = GamingWatch(RewardSpec.model_validate({"rules": rules}).rules, "correct", run_dir)
    history = []
    for step in range(1, 13):
        history.append({"step": step, "correct": 0.4 if step <= 5 else 0.52, "reward/correct": 0.4,
                        "reward/shows_working": 0.0, "time/step": 1.0})
        watch.observe(step, history, [])
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))
    os.utime(run_dir / "metrics.jsonl", (0, 0))
    status = _client(project).get("/api/run/status?run=runs/quickstart").json()
    assert status["outcome"] == ("the model now gets 52% of the prompts right by rule 'correct' (mean of the last 5 "
                                 "steps), up from 40% (the first 5); 'shows_working' passed on 0% of replies, from 0%")
    assert [(g["step"], g["rule"], g["signs"], g["message"]) for g in status["gaming"]] == [
        (10, "shows_working", ["never_passed"],
         "no reply passed 'shows_working' in the last 10 steps: the model never writes what it asks for; this model "
         "may not be able to (try a reply by hand with Try), or give it examples (training.warmup)")]


def test_a_pattern_is_said_in_words_or_as_a_pattern_to_see_in_details():
    assert pattern_phrase(r"^\s*-?\d+\s*$") == "the reply is only a number (a '-' allowed, spaces around it)"
    assert pattern_phrase("=") == "the reply contains '='"
    assert pattern_phrase("Answer:", fullmatch=True, negate=True) == "the reply is not only 'Answer:'"
    assert pattern_phrase(r"^Answer: ") == "the reply starts with 'Answer: '"
    assert pattern_phrase(r"\d+\s*$") == "the reply ends with a number (spaces after it)"
    assert pattern_phrase(r"\\boxed\{([^{}]+)\}") == (
        "the reply contains a match of the pattern '\\\\boxed\\{([^{}]+)\\}' (see details)")
    assert pattern_phrase(r"(.)\1{7,}", negate=True) == (
        "the reply does not contain a match of the pattern '(.)\\1{7,}' (see details)")
    # MULTILINE makes ^ and $ line ends: not "the reply is only"
    assert pattern_phrase(r"^=$", flags=["MULTILINE"]) == "the reply contains a match of the pattern '^=$' (see details)"
    assert rule_sentences([{"name": "m", "kind": "match", "pattern": "abc", "flags": ["IGNORECASE"]}], "answer") == [
        "m: +1 if the reply contains 'abc' (flags IGNORECASE); otherwise 0."]


# ---------------------------------------------------------------------------------------------- hints


def test_hints_point_at_the_page_not_the_terminal(client, project):
    """A problem's hint and the cost table say what to do on the page; the CLI keeps its command."""
    text = project.read_text().replace("weight: 0.5\n    - name: format", "weight: 1.0\n    - name: format")
    hints = [p["hint"] for p in client.post("/api/check", json={"text": text}).json()["problems"]
             if p["code"] == "S301"]
    assert hints and set(hints) == {"Either the rules do not say what you mean (see each rule's sentence), or the "
                                    "expectation is off. Try other replies in Try below."}
    bad = text.replace("weight: 1.0\n    - name: format", "weight: 0.5\n    - name: format").replace(
        "pattern: '^\\s*-?\\d+\\s*$'", "pattern: '^\\s*-?\\d+z\\s*$'")
    s305 = [p["hint"] for p in client.post("/api/check", json={"text": bad}).json()["problems"]]
    assert any(h and h.endswith("Try a reply in Try below: it shows per rule why it passed or failed.") for h in s305)
    assert not any("`sailrl" in (h or "") for h in hints + s305)
    with pytest.raises(SpecErrors) as raised:
        validate_text(text, str(project), path=project)
    cli = [e.hint for e in raised.value.errors if e.code == "S301"]
    assert cli == ["Either the rules do not say what you mean (see `sailrl explain`), or the expectation is off. "
                   "Score other texts with `sailrl rewards SPEC --completion TEXT --field answer=...`."]
    cost = client.post("/api/run/plan", json={"text": project.read_text()}).json()["cost"]
    assert any(line.endswith("(prompt lengths not measured): the check before a run measures them.") for line in cost)
    assert not any("`sailrl" in line for line in cost)
    assert page_hint("see `sailrl explain` and `sailrl show RUN`") == "see `sailrl explain` and `sailrl show RUN`"


def test_export_choices_say_which_one_she_wants(client):
    """Each way to take the model away says, in one plain line, what it is."""
    page = client.get("/").text
    select = re.search(r'<select id="export-format">(.*?)</select>', page, re.S).group(1)
    assert re.findall(r'<option value="(\w+)">([^<]*)</option>', select) == [
        ("peft", "an adapter (LoRA: vLLM, SGLang, peft): small; it needs the base model to run"),
        ("merged", "a whole model (merged): one folder you can load anywhere without sailrl; larger")]
