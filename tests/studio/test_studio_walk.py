"""The studio as someone who knows what a good answer is uses it, in Chromium with the page's own CSP enforced, no
terminal command: open the page, start a run of the quickstart whose 'working' rule (the reply contains '=') is
made to be gamed, see the gaming warning at that rule with three passing replies and a fix, label replies good and
bad (typed, and a run's rollout in one click), accept the proposed rule, save, ask the trained model a new
question, export it and download the zip with its model card.

Slow (a real run of a few steps, sampling and an export: about a minute on 2 busy cores). Screenshots:
``SAILRL_STUDIO_SCREENSHOTS`` (``docs`` makes the README's ``docs/studio-*.png``)."""

from __future__ import annotations

import io
import time
import zipfile

import pytest

from sailrl.studio.session import Studio
from tests.fakes.studio_project import make_project
from tests.fakes.studio_serve import serve_studio
from tests.studio.test_studio_browser import TOKEN, browser, csp_violations, open_page, shots  # noqa: F401 -- fixtures
from tests.studio.test_studio_teacher import _working_spec

RUN_MS = 300_000


def _wait(pg, expression: str, timeout_ms: int = 15_000) -> None:
    deadline = time.monotonic() + timeout_ms / 1000
    while not pg.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout_ms} ms: {expression}")
        pg.wait_for_timeout(100)


@pytest.mark.slow
def test_from_the_page_to_a_downloaded_model(browser, shots, tmp_path):  # noqa: F811 -- fixtures
    started = time.monotonic()
    spec = make_project(tmp_path / "proj")
    spec.write_text(_working_spec(spec))
    with serve_studio(Studio(spec), TOKEN) as (base, _):
        pg, errors = open_page(browser, base, timeout_ms=15_000, viewport={"width": 1500, "height": 1100},
                               accept_downloads=True)
        # rules in her words
        _wait(pg, "document.querySelectorAll('#rules p.sentence')[1].textContent.startsWith('working: +1 if')")
        assert pg.locator("#rules p.sentence").nth(1).inner_text() == (
            "working: +1 if the reply contains '='; otherwise 0.")

        # a run from the page: the check first, then Start
        pg.click("nav .tab[data-tab=runs]")
        pg.fill("#run-steps", "10")
        pg.click("#run-check")
        pg.locator("#run-start").wait_for()
        assert pg.locator("#run-plan .verdict").inner_text().startswith("preflight: ")
        assert "with training.steps=10" in pg.locator("#run-plan pre.cost").inner_text()
        pg.click("#run-start")
        gaming = pg.locator('#gaming .gaming[data-rule="working"]')
        gaming.wait_for(timeout=RUN_MS)
        assert "looks gamed" in gaming.inner_text() and gaming.locator("pre.text").count() == 3
        assert "Proposed fix: also require the reply to end on its own" in gaming.inner_text()
        pg.locator(".run-control").screenshot(path=str(shots / "studio-gaming.png"))
        _wait(pg, "document.querySelector('#run-progress-text').textContent.startsWith('step 10 of 10, not running')",
              RUN_MS)
        _wait(pg, "document.querySelector('#run-outcome').textContent.startsWith('The model now gets')")

        # label replies: a run's rollout (cut at max_tokens) bad with one click, typed ones good and bad
        pg.locator("#rollouts .rollout .label-bad").first.click()
        pg.click("nav .tab[data-tab=rules]")
        pg.fill("#completion", "2+3=5")
        pg.click("#label-good")
        pg.fill("#completion", " 5")
        pg.click("#label-bad")
        pg.fill("#completion", "1+4=5")
        pg.click("#label-good")
        _wait(pg, "document.querySelectorAll('#labels li').length === 4")
        _wait(pg, "document.querySelectorAll('#proposals .proposal').length > 0", 30_000)
        first = pg.locator("#proposals .proposal").first
        assert "also requiring the reply to end on its own" in first.inner_text()
        pg.screenshot(path=str(shots / "studio-labels.png"))
        first.locator("button.accept").click()
        _wait(pg, "document.querySelector('#yaml').value.includes('kind: all_of')")
        _wait(pg, "!document.querySelector('#save').disabled")
        pg.click("#save")
        _wait(pg, "document.querySelector('#status').textContent.startsWith('saved')")
        assert "- kind: termination" in spec.read_text()

        # take it away: a new question, then the export and its zip
        pg.click("nav .tab[data-tab=runs]")
        pg.locator("#take-away").wait_for()
        pg.fill('#sample-fields input[data-field="question"]', "4+4")
        pg.fill('#sample-fields input[data-field="answer"]', "8")
        pg.click("#sample-go")
        pg.locator("#sample-out .sample").first.wait_for(timeout=120_000)
        assert pg.locator("#sample-out .sample").count() == 4
        assert pg.locator("#sample-out .sample").first.locator("ul.sample-rules li").count() == 2
        pg.click("#export-go")
        pg.locator("#download").wait_for(timeout=120_000)
        pg.locator("#take-away").screenshot(path=str(shots / "studio-takeaway.png"))
        with pg.expect_download() as info:
            pg.click("#download")
        data = (tmp_path / "model.zip")
        info.value.save_as(str(data))
        names = zipfile.ZipFile(io.BytesIO(data.read_bytes())).namelist()
        assert "quickstart-peft/README.md" in names and "quickstart-peft/adapter_config.json" in names
        assert errors == [], f"the page raised: {errors}"
        assert csp_violations(pg) == [], "the page broke its own Content-Security-Policy"
        pg.context.close()
    print(f"\nthe walk took {time.monotonic() - started:.0f} s")
