"""Issue 21: the studio's run view shows every turn of an episode (assistant text, each tool call with its
arguments, the tool's result or error, feedback turns), the rules' verdicts on the scored text and why the episode
ended; everything the model or a tool wrote is text, never markup. The run is logged by the runtime's RolloutLog
from real episodes (tests/fakes/episode_project.py); the browser is Debian's Chromium driven by Playwright, as in
tests/studio/test_studio_browser.py (skipped without a browser, a failure with CI=true)."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from sailrl.runtime.rundir.rollout_log import read_rollouts
from sailrl.studio.app import build_app
from sailrl.studio.security import cookie_name
from sailrl.studio.session import Studio
from tests.fakes.episode_project import LOOKUP_RESULT, make_episode_project
from tests.fakes.studio_serve import serve_studio
from tests.studio.test_studio_browser import TOKEN, browser, page, shots, wait_for  # noqa: F401 -- fixtures

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_episode_project(tmp_path_factory.mktemp("episodes") / "proj")


@pytest.fixture
def studio(project):
    """A live studio over the episode project (the ``page`` fixture of test_studio_browser opens it)."""
    spec, _ = project
    with serve_studio(Studio(spec), TOKEN) as (url, _):
        yield url, spec, None


def test_the_api_gives_every_turn_as_logged(project):
    spec, run = project
    c = TestClient(build_app(Studio(spec), token=TOKEN, host="127.0.0.1", port=8765), base_url="http://127.0.0.1:8765")
    c.cookies.set(cookie_name(8765), TOKEN)
    assert c.post("/api/runs", json={"text": spec.read_text()}).json()["runs"][0]["id"] == "runs/episodes"
    assert c.get("/api/run/steps", params={"run": "runs/episodes"}).json() == {"train": [1], "eval": []}
    got = c.get("/api/run/rollouts", params={"run": "runs/episodes", "step": 1}).json()["records"]
    assert got == read_rollouts(run, step=1, kind="train") and len(got) == 6
    by = {(r["group"], r["sample"]): r for r in got}
    tool = by[(1, 0)]["episode"]
    assert tool["end"] == "max_turns"
    assert [t["role"] for t in tool["turns"]] == ["assistant", "tool", "assistant", "user", "assistant"]
    assert tool["turns"][0]["tool_calls"] == [{"name": "lookup", "arguments": '{"city": "Oslo"}'}]
    assert tool["turns"][1] == {"role": "tool", "text": LOOKUP_RESULT, "name": "lookup", "error": False}
    assert by[(1, 1)]["episode"]["turns"][1]["error"] is True
    # the raw bytes: JSON, so the markup travels as a string, never as HTML
    raw = c.get("/api/run/rollouts", params={"run": "runs/episodes", "step": 1})
    assert raw.headers["content-type"] == "application/json" and "<script>window.__pwned = 1</script>" in raw.text


def _rollout(pg, group: int, sample: int):
    return pg.locator(f'#rollouts .rollout[data-group="{group}"][data-sample="{sample}"]')


def test_the_run_view_shows_every_turn_the_verdicts_and_the_end(page, project, shots):  # noqa: F811
    pg = page
    pg.click('nav .tab[data-tab="runs"]')
    wait_for(pg, "document.querySelectorAll('#rollouts .rollout').length === 6")
    assert pg.locator("#run-select").input_value() == "runs/episodes"

    # group 0 sample 0: text before a calculator call, the result, the right answer
    first = _rollout(pg, 0, 0)
    turns = first.locator(".turns .turn")
    assert [turns.nth(i).locator(".turn-head").inner_text() for i in range(turns.count())] == [
        "turn 1 · assistant", "turn 2 · tool calculator", "turn 3 · assistant"]
    assert turns.nth(0).locator("pre.turn-text").inner_text().startswith("Let me <i>check</i>: <tool_call>")
    assert turns.nth(0).locator("li.tool-call").inner_text() == '→ tool call calculator({"expression": "3+4"})'
    assert turns.nth(1).locator("pre.turn-text").inner_text() == "7"
    assert first.locator(".episode-end").inner_text() == (
        "episode ended: answered after 2 model turns (the model answered (a reply without tool calls, and no feedback "
        "rule failed))")
    assert first.locator(".episode-summary").inner_text() == "episode: 2 replies, 1 tool call · ended: answered"
    assert first.locator(".scored-label").inner_text().startswith("scored text: the final reply")
    assert first.locator("pre.completion").inner_text() == "7"
    assert first.locator(".verdicts tbody td").nth(1).inner_text() == "pass"

    # group 0 sample 1: a feedback turn
    fed = _rollout(pg, 0, 1).locator(".turns .turn")
    assert fed.nth(1).locator(".turn-head").inner_text() == "turn 2 · feedback"
    assert fed.nth(1).locator("pre.turn-text").inner_text() == "Not quite. Try again: 3+4="
    assert "feedback" in (fed.nth(1).get_attribute("class") or "")

    # group 1 sample 0: a user tool whose result is markup, shown as text; then feedback, still wrong at max_turns
    hostile = _rollout(pg, 1, 0)
    tool_turn = hostile.locator(".turn.tool")
    assert tool_turn.locator(".turn-head").inner_text() == "turn 2 · tool lookup"
    assert tool_turn.locator("pre.turn-text").inner_text() == LOOKUP_RESULT
    assert hostile.locator(".episode-end").inner_text() == (
        "episode ended: max_turns after 3 model turns (it reached environment.max_turns)")
    assert hostile.locator(".episode-summary").inner_text() == (
        "episode: 3 replies, 1 tool call, 1 feedback · ended: max_turns")
    assert hostile.locator(".verdicts tbody td").nth(1).inner_text() == "fail"
    assert hostile.locator(".verdicts tbody td").nth(3).inner_text() == "answer '3' does not match reference '4'"
    assert pg.locator("#rollouts script, #rollouts b, #rollouts i").count() == 0
    assert pg.evaluate("window.__pwned") is None

    # group 1 sample 1: the calculator refused the expression: a tool error, marked
    err = _rollout(pg, 1, 1).locator(".turn.tool")
    assert err.locator(".turn-head").inner_text() == "turn 2 · tool calculator · error"
    assert "error" in (err.get_attribute("class") or "")
    assert "a function call is not allowed" in err.locator("pre.turn-text").inner_text()
    assert "(1 failed)" in _rollout(pg, 1, 1).locator(".episode-summary").inner_text()

    # group 2 sample 0: one reply cut at max_tokens
    cut = _rollout(pg, 2, 0)
    assert cut.locator(".episode-end").inner_text() == (
        "episode ended: max_tokens after 1 model turn (a reply was cut off at sampling.max_tokens)")
    assert "cut off at max_tokens" in cut.locator(".rollout-head").inner_text()

    hostile.scroll_into_view_if_needed()
    hostile.screenshot(path=str(shots / "studio-episode.png"))

    # the search box reads the turns too: only the episode that called lookup mentions Oslo
    pg.fill("#rollout-search", "oslo")
    wait_for(pg, "document.querySelectorAll('#rollouts .rollout').length === 1")
    assert _rollout(pg, 1, 0).count() == 1
