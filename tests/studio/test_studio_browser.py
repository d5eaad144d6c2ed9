"""``sailrl studio`` in a real browser: Debian's Chromium driven by Playwright against a live uvicorn server.

One server and one browser, one test (20-40 s on 2 cores) walking through the page: load it, edit a rule and see
the verdict change, see a problem at its field, add an example, save and read the file back, follow the file on
disk (reload, or refuse to overwrite it), read the data tab, open a run's rollouts and follow new steps, and check
that a request without the token or from a foreign origin is refused, and open a file that does not parse.

Without a browser (``/usr/bin/chromium`` or ``SAILRL_CHROMIUM``) the tests skip with the reason; with ``CI=true``
a missing browser fails them. Screenshots go to ``SAILRL_STUDIO_SCREENSHOTS`` (the README's ``docs/studio-*.png``
are made with ``SAILRL_STUDIO_SCREENSHOTS=docs``), else to a temporary folder.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest

from sailrl.runtime.rundir.rollout_log import read_rollouts
from sailrl.studio.session import Studio
from tests.fakes.studio_project import make_project, write_steps
from tests.fakes.studio_serve import serve_studio

CHROMIUM = os.environ.get("SAILRL_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
TOKEN = "browser-test-token"
TIMEOUT_MS = 15_000


def _no_browser(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and the studio's browser tests cannot run: {reason}")
    pytest.skip(reason)


class Recorder:
    """ASGI wrapper outside the guard: every request's path, Origin and answered status."""

    def __init__(self, app):
        self.app = app
        self.seen: list[tuple[str, str, str | None, int]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        origin = dict(scope["headers"]).get(b"origin")

        async def spy(message):
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], origin.decode() if origin else None,
                                  message["status"]))
            await send(message)

        await self.app(scope, receive, spy)


@pytest.fixture
def studio(tmp_path):
    """(base URL, spec path, recorder): a live server on a free loopback port, in a thread."""
    folder = tmp_path / "studio"
    spec = make_project(folder)
    write_steps(spec, folder / "runs" / "quickstart", range(1, 13))
    with serve_studio(Studio(spec), TOKEN, wrap=Recorder) as (url, recorder):
        yield url, spec, recorder


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        _no_browser(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set SAILRL_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def shots(tmp_path):
    out = os.environ.get("SAILRL_STUDIO_SCREENSHOTS")
    path = Path(out) if out else tmp_path / "shots"
    path.mkdir(parents=True, exist_ok=True)
    return path


#: Recorded in the page before its own scripts run: every Content-Security-Policy violation, as the browser reports
#: it (the directive, what was blocked, and where).
CSP_LISTENER = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__cspViolations.push(
  `${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber} ${e.sample || ""}`));
"""


def csp_violations(pg) -> list[str]:
    """The page's CSP violations so far: its ``securitypolicyviolation`` events and the console's CSP errors."""
    return list(pg.evaluate("window.__cspViolations")) + list(pg.csp_console)


def wait_for(pg, expression: str, arg=None) -> None:
    """Wait until ``expression`` (an expression, or a function of ``arg``) is truthy in the page. Playwright's own
    ``wait_for_function`` builds its predicate with ``new Function``, which the page's CSP refuses (no
    'unsafe-eval'), so this polls ``evaluate`` (run by the browser's debugger protocol, which CSP does not
    govern) instead, up to TIMEOUT_MS."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not pg.evaluate(expression, arg):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {TIMEOUT_MS} ms: {expression}")
        pg.wait_for_timeout(25)


def open_page(browser, base: str, *, timeout_ms: int = TIMEOUT_MS, **context_options):
    """The studio's page at ``base`` in a new context (``context_options`` as Playwright takes them), its own CSP
    enforced, CSP violations and console CSP errors recorded: (the page, the list its script errors go to)."""
    context = browser.new_context(**context_options)
    context.add_init_script(CSP_LISTENER)
    pg = context.new_page()
    pg.set_default_timeout(timeout_ms)
    errors: list[str] = []
    pg.csp_console = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: pg.csp_console.append(m.text)
          if m.type == "error" and "Content Security Policy" in m.text else None)
    pg.goto(f"{base}/?token={TOKEN}")
    pg.wait_for_selector("#verdicts tbody tr")
    return pg, errors


@pytest.fixture
def page(browser, studio):
    """The studio's page under its own Content-Security-Policy (no bypass): at the end, no script error and no
    CSP violation."""
    base, _, _ = studio
    pg, errors = open_page(browser, base, viewport={"width": 1500, "height": 1000})
    yield pg
    assert errors == [], f"the page raised: {errors}"
    assert csp_violations(pg) == [], "the page broke its own Content-Security-Policy"
    pg.context.close()


def open_details(pg) -> None:
    """Open every rule's details (the spec's words for it), as a click on each toggle does."""
    closed = pg.locator("#rules details.rule-details:not([open]) > summary")
    while closed.count():
        closed.first.click()


def verdict(pg, rule: str) -> str:
    return pg.locator(f'#verdicts tbody tr[data-rule="{rule}"] td').nth(1).inner_text()


def edit_a_rule_see_the_verdict_change_add_an_example_and_save(page, studio, shots):
    _, spec, _ = studio
    original = spec.read_text()
    pg = page
    assert pg.input_value('#row-fields input[data-field="answer"]') == "5"  # row 0 of addition.jsonl: 2+3
    pg.fill("#completion", " 5")
    wait_for(pg, "document.querySelector('#total').textContent === '1'")
    pg.fill("#completion", "5!")
    wait_for(pg, "document.querySelector('#total').textContent === '0'")
    assert verdict(pg, "format") == "fail" and verdict(pg, "correct") == "fail"
    open_details(pg)
    pattern = pg.locator('#rules input[data-path="reward.rules.1.checks.0.pattern"]')
    assert pattern.input_value() == r"^\s*-?\d+\s*$"
    pattern.fill(r"^\s*-?\d+\s*[.!]?\s*$")  # a trailing full stop or ! is fine now
    wait_for(pg, "document.querySelector('#total').textContent === '0.5'")
    assert verdict(pg, "format") == "pass"
    wait_for(pg, r"""document.querySelector('#yaml').value.includes("pattern: '^\\s*-?\\d+\\s*[.!]?\\s*$'\n")""")
    pg.click("#add-example")
    wait_for(pg, "document.querySelectorAll('#examples tbody tr').length === 5")
    last = pg.locator("#examples tbody tr").nth(4)
    assert '"5!"' in last.inner_text() and last.locator("td.pass").count() == 1
    assert pg.locator("#validity").inner_text() == "valid"
    pg.screenshot(path=str(shots / "studio-rules.png"))
    pg.click("#save")
    wait_for(pg, "document.querySelector('#status').textContent.startsWith('saved')")
    saved = spec.read_text()
    assert "          pattern: '^\\s*-?\\d+\\s*[.!]?\\s*$'\n" in saved
    assert "  - completion: 5!\n" in saved or "  - completion: '5!'\n" in saved
    assert "    expect_total: 0.5\n    expect:\n      correct: 0\n      format: 0.5\n" in saved
    assert [ln for ln in original.splitlines() if "#" in ln] == [ln for ln in saved.splitlines() if "#" in ln]
    assert saved.split("reward:")[0] == original.split("reward:")[0]
    assert (spec.parent / "quickstart.yaml.bak").read_text() == original
    from sailrl.compiler.validate import validate_file

    assert validate_file(spec).spec.examples[-1].completion == "5!"


def an_empty_contains_rule_is_refused_at_its_field(page):
    pg = page
    rules = pg.locator("#rules .rule").count()
    pg.select_option("#new-kind", "starter:contains")
    pg.fill("#new-ask", "")
    pg.click("#add-rule")
    assert pg.locator("#new-ask-problem").inner_text() == (
        "type the text the reply must contain: an empty text is in every reply, so the rule would pass everything")
    assert pg.locator("#rules .rule").count() == rules
    pg.fill("#new-ask", "=")
    pg.click("#add-rule")
    assert pg.locator("#new-ask-problem").is_hidden()
    wait_for(pg, "document.querySelector('#yaml').value.includes('name: contains')")
    pg.locator("#rules .remove-rule").last.click()  # the walk goes on with the spec's own two rules
    wait_for(pg, "!document.querySelector('#yaml').value.includes('name: contains')")


def problems_show_at_their_field_with_the_clis_code(page, shots):
    pg = page
    yaml = pg.locator("#yaml")
    text = yaml.input_value()
    yaml.fill(text.replace("pattern: '^\\s*-?\\d+\\s*[.!]?\\s*$'", "pattern: '^(\\d+'"))
    problem = pg.locator('#rules .field[data-path="reward.rules.1.checks.0.pattern"] .problem[data-code="S201"]')
    problem.wait_for()
    assert "reward.rules.1.checks.0.pattern" in problem.inner_text()
    assert pg.locator("#validity").inner_text() == "1 error"
    assert pg.locator("#save").is_disabled()
    yaml.fill(text)  # back to the saved text
    wait_for(pg, "document.querySelector('#validity').textContent === 'valid'")
    open_details(pg)
    pg.locator('#rules select[data-path="reward.rules.0.extract.from"]').select_option("last_number")
    gamed = pg.locator('#rules .group[data-path="reward.rules.0.extract"] .problem[data-code="W110"]')
    gamed.wait_for()
    assert "can be gamed" in gamed.inner_text()
    pg.locator("#rules .rule").first.screenshot(path=str(shots / "studio-problem.png"))
    pg.locator('#rules select[data-path="reward.rules.0.extract.from"]').select_option("whole")
    wait_for(pg, "document.querySelector('#validity').textContent === 'valid'")
    wait_for(pg, "(t) => document.querySelector('#yaml').value === t", arg=text)


def follows_the_file_on_disk_and_never_overwrites_a_change(page, studio):
    _, spec, _ = studio
    pg = page
    on_disk = spec.read_text().replace("  steps: 100\n", "  steps: 80\n")
    spec.write_text(on_disk)  # another editor saves the file; the page has no unsaved edits: it reloads
    wait_for(pg, "(t) => document.querySelector('#yaml').value === t", arg=on_disk)
    assert pg.locator("#banner").inner_text() == "reloaded: the file changed on disk"
    yaml = pg.locator("#yaml")
    yaml.fill(on_disk.replace("  steps: 80\n", "  steps: 70\n"))  # an unsaved edit here ...
    wait_for(pg, "!document.querySelector('#save').disabled")
    changed = on_disk.replace("  group_size: 8\n", "  group_size: 4\n")
    spec.write_text(changed)  # ... and another change on disk: the page says so and keeps the edit
    wait_for(pg, "document.querySelector('#banner').textContent.startsWith('The file changed on disk.')")
    assert "steps: 70" in yaml.input_value()
    pg.click("#save")
    wait_for(pg, "document.querySelector('#banner').textContent.includes('nothing was written')")
    assert spec.read_text() == changed
    pg.locator("#banner button").click()  # reload from disk
    wait_for(pg, "(t) => document.querySelector('#yaml').value === t", arg=changed)


def data_tab_shows_rows_the_rendered_prompt_and_preflight(page, shots):
    pg = page
    pg.click('nav .tab[data-tab="data"]')
    wait_for(pg, "!document.querySelector('#preflight-verdict').textContent.startsWith('checking')")
    assert pg.locator("#preflight-verdict").inner_text() == "ready: no problems found"
    wait_for(pg, "document.querySelectorAll('#data-rows tbody tr').length === 20")
    pg.locator('#data-rows tbody tr[data-index="3"]').click()
    wait_for(pg, "document.querySelector('#prompt-index').textContent === '3'")
    assert pg.locator("#prompt-text").inner_text() == "User: 0+7=\n\nAssistant:"
    assert pg.locator("#prompt-meta").inner_text().startswith("22 tokens")
    pg.screenshot(path=str(shots / "studio-data.png"))
    pg.click('nav .tab[data-tab="rules"]')
    assert pg.input_value('#row-fields input[data-field="answer"]') == "7"


def runs_tab_draws_curves_filters_rollouts_and_follows_the_run(page, studio, shots):
    _, spec, _ = studio
    run = spec.parent / "runs" / "quickstart"
    pg = page
    pg.click('nav .tab[data-tab="runs"]')
    pg.locator('#curves polyline[data-key="reward/total"]').wait_for()
    assert pg.locator('#curves polyline[data-key="reward/correct"]').count() == 1
    assert pg.locator("#curves path.point").count() == 2  # eval points at steps 5 and 10
    wait_for(pg, "document.querySelectorAll('#rollouts .rollout').length === 16")
    assert pg.input_value("#step-select") == "12"
    records = read_rollouts(run, step=12, kind="train")
    failed = [r for r in records if not r["rules"]["correct"]["passed"]]
    pg.select_option("#rule-filter", "correct")
    pg.select_option("#verdict-filter", "fail")
    pg.select_option("#order-select", "worst")
    assert pg.locator("#rollouts .rollout").count() == len(failed) > 0
    first = pg.locator("#rollouts .rollout").first
    text = first.inner_text()
    assert "sampler checkpoint local://studio-test/sampler_weights/000011" in text and "advantage" in text
    assert first.locator("pre.completion").inner_text() in {r["completion"] for r in failed}
    # single-turn rollouts look as before: no turns, no episode line, no "scored text" label
    assert pg.locator("#rollouts .turns, #rollouts .episode-summary, #rollouts .scored-label").count() == 0
    pg.screenshot(path=str(shots / "studio-runs.png"), full_page=True)
    pg.select_option("#verdict-filter", "")
    write_steps(spec, run, range(13, 15))  # the run goes on: the page follows without a reload
    wait_for(pg, "document.querySelector('#step-select').value === '14'")
    wait_for(pg, "document.querySelector('#run-follow').textContent.startsWith("
                 "'following: 14 steps in metrics.jsonl, last step 14')")
    first = pg.locator("#rollouts .rollout").first
    completion = first.locator("pre.completion").inner_text()
    first.get_by_role("button", name="Try it").click()
    wait_for(pg, "(t) => document.querySelector('#completion').value === t", arg=completion)
    assert pg.locator("#tab-rules").is_visible()


def every_tab_keeps_the_pages_csp_and_the_legend_has_its_colours(page):
    """The page works under its own Content-Security-Policy on every tab (the run's legend once set its colours
    in a style attribute, which style-src 'self' refuses: six violations and a legend without colours)."""
    pg = page
    for tab in ("rules", "data", "runs"):
        pg.click(f'nav .tab[data-tab="{tab}"]')
        assert pg.locator(f"#tab-{tab}").is_visible()
        assert csp_violations(pg) == [], tab
    pg.locator("#curves .legend span").first.wait_for()
    swatches = pg.evaluate("""[...document.querySelectorAll('#curves .legend span')].map(
        (s) => [s.textContent, getComputedStyle(s, '::before').backgroundColor])""")
    drawn = pg.evaluate("""[...document.querySelectorAll('#curves polyline.series, #curves path.point')].map(
        (p) => p.getAttribute('stroke'))""")
    rgb = {f"rgb({int(c[1:3], 16)}, {int(c[3:5], 16)}, {int(c[5:7], 16)})" for c in drawn}
    assert len(swatches) == len(rgb) >= 6 and {colour for _, colour in swatches} == rgb, (swatches, rgb)


def requests_without_the_token_or_from_another_site_are_refused(browser, studio, page):
    base, spec, recorder = studio
    before = spec.read_bytes()
    stranger = browser.new_context()
    try:
        pg = stranger.new_page()
        answer = pg.goto(base + "/")
        assert answer.status == 401 and "no session token" in pg.inner_text("body")
        assert pg.goto(base + "/?token=guess").status == 401
    finally:
        stranger.close()
    # A page of another site on this machine (another loopback port: Chrome lets loopback pages reach loopback
    # servers), in the browser that holds the session cookie, tries to read the spec and to save over it.
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            body = b"<html><body>another site</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    evil_server = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil_server.serve_forever, daemon=True).start()
    evil = f"http://127.0.0.1:{evil_server.server_address[1]}"
    ctx = page.context
    other = ctx.new_page()
    try:
        other.goto(evil + "/")
        result = other.evaluate("""async (base) => {
            const out = [];
            try { await fetch(base + '/api/spec', {credentials: 'include'}); out.push('read'); }
            catch (e) { out.push('blocked'); }
            try { await fetch(base + '/api/save', {method: 'POST', mode: 'no-cors', credentials: 'include',
                                                   headers: {'Content-Type': 'text/plain'}, body: '{}'}); }
            catch (e) { }
            return out; }""", base)
    finally:
        other.close()
        evil_server.shutdown()
    assert result == ["blocked"]
    refused = [(m, p, s) for m, p, o, s in recorder.seen if o == evil]
    assert ("GET", "/api/spec", 403) in refused and ("POST", "/api/save", 403) in refused, recorder.seen[-5:]
    assert spec.read_bytes() == before
    api = ctx.request.get(base + "/api/spec", headers={"Origin": "http://evil.example"})
    assert api.status == 403
    assert ctx.request.get(base + "/api/spec").status == 200  # the same browser, from the studio itself


def a_spec_that_does_not_parse_shows_its_errors_and_stays_editable(page, studio):
    _, spec, _ = studio
    pg = page
    pg.click('nav .tab[data-tab="rules"]')
    good = spec.read_text()
    broken = good.replace("reward:\n  rules:\n", "reward:\n  rules: [\n", 1)
    spec.write_text(broken)  # the page has no unsaved edits: it reloads the broken file
    wait_for(pg, "(t) => document.querySelector('#yaml').value === t", arg=broken)
    pg.locator("#rule-note").wait_for()
    first = pg.locator("#problems li").first
    assert first.get_attribute("data-code").startswith("S0") and "quickstart.yaml:" in first.inner_text()
    assert re.fullmatch(r"\d+ errors?", pg.locator("#validity").inner_text())
    pg.locator("#yaml").fill(good)  # fixed in the page's YAML editor
    wait_for(pg, "document.querySelector('#validity').textContent === 'valid'")
    assert pg.locator("#rule-note").is_hidden() and pg.locator("#rules .rule").count() == 2


@pytest.mark.slow
def test_the_studio_in_a_browser(browser, studio, page, shots):
    """One walk through the page (one server, one browser: xdist keeps a test on one worker, and the steps build
    on each other: the example added and saved in the first is in the file the others read)."""
    an_empty_contains_rule_is_refused_at_its_field(page)
    edit_a_rule_see_the_verdict_change_add_an_example_and_save(page, studio, shots)
    problems_show_at_their_field_with_the_clis_code(page, shots)
    follows_the_file_on_disk_and_never_overwrites_a_change(page, studio)
    data_tab_shows_rows_the_rendered_prompt_and_preflight(page, shots)
    runs_tab_draws_curves_filters_rollouts_and_follows_the_run(page, studio, shots)
    every_tab_keeps_the_pages_csp_and_the_legend_has_its_colours(page)
    requests_without_the_token_or_from_another_site_are_refused(browser, studio, page)
    a_spec_that_does_not_parse_shows_its_errors_and_stays_editable(page, studio)
    assert {p.name for p in shots.glob("studio-*.png")} >= {"studio-rules.png", "studio-problem.png", "studio-data.png",
                                                         "studio-runs.png"}
