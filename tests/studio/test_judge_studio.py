"""Issue 20: the studio's rollout view shows a judge rule's answer and the score taken from it, in a real browser
(Debian's Chromium driven by Playwright, as tests/studio/test_studio_browser.py; skipped without a browser)."""

from __future__ import annotations

import json

import pytest

from sailrl.studio.session import Studio
from tests.fakes.studio_project import make_project, write_steps
from tests.fakes.studio_serve import serve_studio
from tests.studio.test_studio_browser import TOKEN, browser, page, wait_for  # noqa: F401 -- fixtures

ANSWER = "Polite & short: <b>fine</b>. <score>yes</score>"


@pytest.fixture
def studio(tmp_path):
    """A studio over a project whose run logged a judge rule's verdicts (rules.polite.judge / judge_score)."""
    folder = tmp_path / "studio"
    spec = make_project(folder)
    run = folder / "runs" / "quickstart"
    write_steps(spec, run, range(1, 3))
    lines = []
    for line in (run / "rollouts.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["rules"]["polite"] = {"score": 1.0, "passed": True, "why": "the judge answered <score>yes</score> "
                                     "(normalised 1)", "judge": ANSWER, "judge_score": "yes"}
        lines.append(json.dumps(record))
    (run / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    with serve_studio(Studio(spec), TOKEN) as (url, _):
        yield url, spec, None


@pytest.mark.slow
def test_the_rollout_view_shows_the_judges_answer_and_the_score_taken(page) -> None:  # noqa: F811
    pg = page
    pg.click('nav .tab[data-tab="runs"]')
    wait_for(pg, "document.querySelectorAll('#rollouts .rollout').length === 16")
    first = pg.locator("#rollouts .rollout").first
    panel = first.locator("details.judge")
    assert panel.count() == 1
    assert panel.locator("summary").inner_text() == "judge: score taken <score>yes</score>"
    panel.locator("summary").click()
    assert panel.locator("pre").inner_text() == ANSWER  # as text: the answer's markup is not rendered
    assert first.locator("details.judge b").count() == 0
