"""Issue 20 leftover: where nothing is trained (``sailrl preflight --sample``, the studio's try panel and its
examples) a judge rule is either judged (a local judge always; a remote one when the user asked: ``--judge``, as
``sailrl validate --judge``) or shown plainly as "not checked (needs the judge: ...)" -- never counted as passed.
Remote judges are faked at their boundary: the loopback Sail server answering ``/v1/chat/completions``."""

from __future__ import annotations

import io
import re
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from rich.console import Console

from sailrl.commands.preflight import render_report
from sailrl.preflight import build_report
from sailrl.runtime.backends.judge_clients import judge_connector
from sailrl.spec.schema import Spec
from sailrl.studio.app import build_app
from sailrl.studio.security import cookie_name
from sailrl.studio.session import Studio
from tests.fakes.sail_server import FakeSailServer, point_sail_sdk_at
from tests.fakes.studio_project import make_project
from tests.fakes.studio_serve import serve_studio
from tests.commands.test_preflight import EXAMPLES, QUICKSTART_REWARD, ScriptedPolicy
from tests.studio.test_studio_browser import TOKEN, browser, page, wait_for  # noqa: F401 -- fixtures

JUDGE_RULE = {"name": "polite", "kind": "judge", "rubric": "The reply answers {{ question }} politely.",
              "judge": {"model": "judge-m", "sampler": "sail", "retries": 0}}


def right_sum(body: dict) -> str:
    """The fake judge: yes when the completion is the sum the rubric's question asks for."""
    text = body["messages"][0]["content"]
    a, b = map(int, re.search(r"The reply answers (\d+)\+(\d+) politely", text).groups())
    completion = text.split("<completion>\n", 1)[1].split("\n</completion>", 1)[0]
    return "<score>yes</score>" if completion.strip() == str(a + b) else "<score>no</score>"


def judge_spec() -> Spec:
    return Spec.model_validate({
        "name": "pf-judge", "model": {"name": "sailrl/tiny", "renderer": "role_colon"},
        "dataset": {"source": "data/addition.jsonl"}, "prompt": {"user": "{{ question }}="},
        "reward": {"rules": [*QUICKSTART_REWARD["rules"], JUDGE_RULE]},
        "training": {"group_size": 4, "groups_per_step": 4}, "sampling": {"sampler": "local", "max_tokens": 8}})


# ------------------------------------------------------------------------------------------------ preflight


def test_preflight_without_the_judge_shows_the_rule_as_not_checked_never_as_passed_or_failed():
    report = build_report(judge_spec(), EXAMPLES, sample=2, policy=ScriptedPolicy(),
                          judges=judge_connector(EXAMPLES, every=False))
    s = report["sample"]
    polite = s["rules"]["polite"]
    assert polite["passed"] is None and polite["pass_rate"] is None and polite["mean"] is None
    assert polite["not_checked"] == ("the judge (sail: judge-m) was not called; `sailrl preflight --judge` calls "
                                     "it (its keys set)")
    assert s["not_checked"] == {"polite": polite["not_checked"]}
    assert s["rules"]["correct"]["pass_rate"] == 0.5  # the other rules are scored as always
    assert all(ex["contributions"]["polite"] is None for ex in s["examples"])
    messages = [p["message"] for p in report["problems"]]
    assert any(m.startswith("judge rule 'polite' was not checked on the sampled completions (needs the judge: "
                            "the judge (sail: judge-m) was not called") for m in messages)
    assert not any("'polite' passed 0" in m or "'polite' passed every" in m for m in messages)
    assert "judge rule 'polite' not checked" in report["verdict"]
    out = io.StringIO()
    render_report(report, Console(file=out, width=200, color_system=None))
    rows = [line for line in out.getvalue().splitlines() if re.match(r"^\W*polite\W+(not checked|\d+ of)", line)]
    assert len(rows) == 1 and "not checked" in rows[0]


def test_preflight_with_the_judge_calls_it_on_every_sampled_completion(monkeypatch):
    with FakeSailServer(chat_models={"judge-m"}, chat_answer=right_sum) as server:
        point_sail_sdk_at(server.url, monkeypatch)
        report = build_report(judge_spec(), EXAMPLES, sample=2, policy=ScriptedPolicy(),
                              judges=judge_connector(EXAMPLES, every=True))
    s = report["sample"]
    assert "not_checked" not in s["rules"]["polite"] and s["not_checked"] == {}
    # the judge agrees with the answer rule: half the scripted completions are the sum
    assert s["rules"]["polite"]["pass_rate"] == s["rules"]["correct"]["pass_rate"] == 0.5
    assert s["rules"]["polite"]["passed"] == 4
    assert 1 <= server.count("POST") <= 8  # each distinct completion judged once (repeats from the cache)


def test_preflight_with_the_judge_and_no_key_says_why_it_was_not_checked(monkeypatch, tmp_path):
    import sail

    point_sail_sdk_at("http://127.0.0.1:9", monkeypatch)
    monkeypatch.delenv("SAIL_API_KEY")
    monkeypatch.setenv("HOME", str(tmp_path))
    sail.reset_transports()
    try:
        report = build_report(judge_spec(), EXAMPLES, sample=1, policy=ScriptedPolicy(),
                              judges=judge_connector(EXAMPLES, every=True))
    finally:
        sail.reset_transports()
    assert report["sample"]["rules"]["polite"]["not_checked"].endswith("SAIL_API_KEY is not set (export it, or run "
                                                                      "`sail auth login`)")


# ------------------------------------------------------------------------------------------------ the studio


def judge_project(folder):
    spec = make_project(folder)
    text = spec.read_text()
    rule = ("    - name: polite\n      kind: judge\n      rubric: 'The reply answers {{ question }} politely.'\n"
            "      judge: {model: judge-m, sampler: sail, retries: 0}\n")
    spec.write_text(text.replace("      weight: 0.5\n\ntraining:", "      weight: 0.5\n" + rule + "\ntraining:"))
    return spec


def client_for(studio: Studio) -> TestClient:
    c = TestClient(build_app(studio, token="t", host="127.0.0.1", port=8765), base_url="http://127.0.0.1:8765")
    c.cookies.set(cookie_name(8765), "t")
    return c


def _try(c: TestClient, text: str, completion: str) -> dict:
    r = c.post("/api/try", json={"text": text, "completion": completion, "fields": {"question": "3+4", "answer": "7"}})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_studio_without_the_judge_shows_judge_rules_as_not_checked(tmp_path):
    spec = judge_project(tmp_path / "proj")
    c = client_for(Studio(spec))
    text = spec.read_text()
    r = _try(c, text, " 7")
    polite = next(v for v in r["rules"] if v["name"] == "polite")
    assert polite == {"name": "polite", "passed": None, "score": None, "not_checked": True, "error": None,
                      "why": "not checked (needs the judge: the judge (sail: judge-m) was not called; `sailrl studio "
                             "--judge` calls it (its keys set))"}
    assert r["total"] is None and r["total_note"] == "total not known: judge rule 'polite' not checked"
    assert [v["passed"] for v in r["rules"] if v["name"] != "polite"] == [True, True]
    examples = c.post("/api/examples", json={"text": text}).json()["examples"]
    # examples 1, 3 and 4 expect the total (which reads the judge rule); example 2 only correct and format
    assert [e["passed"] for e in examples] == [None, True, None, None]
    assert examples[0]["problem"].startswith("not checked (needs the judge: the judge (sail: judge-m) was not called")


def test_the_studio_with_the_judge_calls_it_once_per_completion(tmp_path, monkeypatch):
    spec = judge_project(tmp_path / "proj")
    with FakeSailServer(chat_models={"judge-m"}, chat_answer=right_sum) as server:
        point_sail_sdk_at(server.url, monkeypatch)
        c = client_for(Studio(spec, judge=True))
        text = spec.read_text()
        right, wrong = _try(c, text, "7"), _try(c, text, "8")
        assert next(v for v in right["rules"] if v["name"] == "polite")["passed"] is True
        assert right["total"] == 1.0 + 1.0 and right["total_note"] is None
        assert next(v for v in wrong["rules"] if v["name"] == "polite")["passed"] is False
        assert server.count("POST") == 2
        edited = text.replace("# the completion, read", "# edited: the completion, read")
        assert edited != text
        assert next(v for v in _try(c, edited, "7")["rules"] if v["name"] == "polite")["passed"] is True
        assert server.count("POST") == 2  # the same judgement after an edit comes from the studio's cache
        examples = c.post("/api/examples", json={"text": text}).json()["examples"]
        assert all(e["passed"] is not None for e in examples)


@pytest.fixture
def studio(tmp_path):
    """A live studio (no --judge) over the quickstart project with a Sail judge rule added."""
    spec = judge_project(tmp_path / "proj")
    with serve_studio(Studio(spec), TOKEN) as (url, _):
        yield url, spec, None


@pytest.mark.slow
def test_the_try_panel_shows_an_unasked_judge_as_not_checked_and_adds_no_expectation_for_it(page):  # noqa: F811
    pg = page
    pg.fill("#completion", " 5")  # row 0 is 2+3
    # the verdicts of " 5" (an earlier keystroke's may still be on the page under load): correct passes it
    wait_for(pg, "document.querySelector('#verdicts tbody tr[data-rule=\"polite\"] td:nth-child(2)')"
                         ".textContent === 'not checked' && document.querySelector("
                         "'#verdicts tbody tr[data-rule=\"correct\"] td:nth-child(2)').textContent === 'pass'")
    cells = pg.locator('#verdicts tbody tr[data-rule="polite"] td')
    assert cells.nth(2).inner_text() == "-"
    assert cells.nth(3).inner_text().startswith("not checked (needs the judge: the judge (sail: judge-m) was not "
                                                "called; `sailrl studio --judge` calls it")
    assert pg.locator('#verdicts tbody tr[data-rule="correct"] td').nth(1).inner_text() == "pass"
    assert pg.locator("#total").inner_text() == "-"
    assert "total not known: judge rule 'polite' not checked" in pg.locator("#try-note").inner_text()
    assert pg.locator("#examples tbody tr").nth(0).inner_text().count("not checked (needs the judge") == 1
    pg.click("#add-example")
    wait_for(pg, "document.querySelector('#yaml').value.includes(\"completion: ' 5'\")")
    added = pg.input_value("#yaml").split("completion: ' 5'", 1)[1]
    assert "polite" not in added.split("\n\n")[0] and "expect_total" not in added.split("\n\n")[0]
    assert "correct: 0.5" in added and "format: 0.5" in added


LOCAL_JUDGE = {"name": "polite", "kind": "judge", "rubric": "The reply answers {{ question }} politely.",
               "judge": {"model": "sailrl/tiny", "sampler": "local", "max_tokens": 8, "retries": 0}}


@pytest.mark.slow
def test_a_local_judge_is_called_without_the_flag_in_preflight_and_the_studio(tmp_path):
    """sailrl/tiny cannot read a rubric (its answers have no <score>): the point is that it is asked, so the rule
    is judged (unparsed, counted as such) rather than listed as not checked."""
    spec = judge_spec().model_copy(update={"reward": judge_spec().reward.model_validate(
        {"rules": [*QUICKSTART_REWARD["rules"], LOCAL_JUDGE]})})
    report = build_report(spec, EXAMPLES, sample=1, policy=ScriptedPolicy(),
                          judges=judge_connector(EXAMPLES, every=False))
    s = report["sample"]
    assert s["not_checked"] == {} and s["rules"]["polite"]["passed"] is not None
    assert not any("not checked" in p["message"] for p in report["problems"])

    project = judge_project(tmp_path / "proj")
    project.write_text(project.read_text().replace("{model: judge-m, sampler: sail, retries: 0}",
                                                   "{model: sailrl/tiny, sampler: local, max_tokens: 8, retries: 0}"))
    c = client_for(Studio(project))
    polite = next(v for v in _try(c, project.read_text(), " 7")["rules"] if v["name"] == "polite")
    assert "not_checked" not in polite and polite["passed"] is not None
    assert "not checked" not in polite["why"] and "<score>" in polite["why"]  # its answer, read
