"""The studio on SFT and DPO specs through its HTTP API: the Rules tab's words for a method without reward rules,
the Data tab's rows as conversations and chosen/rejected pairs (skipped as the run skips them), preflight's
report, a run started from the page (a real 2-step SFT run), overrides the method does not read refused in one
line, and each method's outcome in words."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():  # starlette 1.x suggests httpx2 for its test client; httpx is what is installed
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from sailrl.studio.app import build_app
from sailrl.studio.methods import method_outcome
from sailrl.studio.security import cookie_name
from sailrl.studio.session import Studio
from tests.fakes.studio_serve import serve_studio
from tests.methods.test_methods_commands import SFT_LINES, write_run
from tests.studio.test_studio_browser import (
    ARGS,
    CHROMIUM,
    CSP_LISTENER,
    TIMEOUT_MS,
    _no_browser,
    csp_violations,
    wait_for,
)
from tests.studio.test_studio_browser import TOKEN as BROWSER_TOKEN

ROOT = Path(__file__).resolve().parents[2]
PORT = 8766
TOKEN = "methods-token"

DPO = """\
method: dpo
name: pairs
model: {name: sailrl/tiny, renderer: role_colon}
dataset: {source: pairs.jsonl, fields: [q, good, bad], shuffle: false}
prompt: {user: '{{ q }}='}
dpo: {chosen_field: good, rejected_field: bad, batch_size: 2}
training: {steps: 2, eval_every: 0}
sampling: {sampler: local}
"""

SFT = """\
method: sft
name: convs
model: {name: sailrl/tiny, renderer: role_colon, lora_rank: 4}
dataset: {source: data/addition.jsonl, fields: [question, answer], shuffle: false}
prompt: {user: '{{ question }}=', reference_field: answer}
sft: {completion: '{{ answer }}', batch_size: 4}
training: {steps: 2, eval_every: 0, save_every: 0}
sampling: {sampler: local, max_tokens: 4}
output: {run_dir: runs/convs}
"""


def client(spec: Path) -> tuple[Studio, TestClient]:
    studio = Studio(spec)
    c = TestClient(build_app(studio, token=TOKEN, host="127.0.0.1", port=PORT), base_url=f"http://127.0.0.1:{PORT}")
    c.cookies.set(cookie_name(PORT), TOKEN)
    return studio, c


@pytest.fixture
def dpo_project(tmp_path):
    rows = [{"q": f"{i}+1", "good": str(i + 1), "bad": str(i + 2)} for i in range(8)]
    rows[7]["bad"] = rows[7]["good"]  # no preference: the run skips it
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "dpo.yaml").write_text(DPO)
    return tmp_path / "dpo.yaml"


@pytest.fixture
def sft_project(tmp_path):
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "spec/examples/data/addition.jsonl", tmp_path / "data" / "addition.jsonl")
    (tmp_path / "sft.yaml").write_text(SFT)
    return tmp_path / "sft.yaml"


def test_the_rules_tab_of_a_dpo_spec_says_it_has_no_rules(dpo_project):
    _, c = client(dpo_project)
    text = dpo_project.read_text()
    check = c.post("/api/check", json={"text": text}).json()
    assert check["valid"] is True and check["method"] == "dpo" and check["rules"] is None
    assert check["rules_note"] == ("method dpo has no reward rules: it trains each row's chosen reply over its "
                                   "rejected one (the Data tab shows the pairs). Nothing here scores completions.")
    tried = c.post("/api/try", json={"text": text, "completion": "2", "fields": {}}).json()
    assert tried["ok"] is False and tried["problem"] == check["rules_note"]


def test_the_data_tab_of_a_dpo_spec_shows_pairs_and_skips_what_the_run_skips(dpo_project):
    _, c = client(dpo_project)
    text = dpo_project.read_text()
    rows = c.post("/api/rows", json={"text": text, "q": "", "offset": 0, "limit": 20}).json()
    assert rows["total"] == 8
    skipped = [r for r in rows["rows"] if r["split"] == "skipped"]
    assert [(r["index"], r["skip_reason"]) for r in skipped] == [
        (7, "its 'good' and 'bad' completions are the same text (no preference)")]
    row = c.post("/api/row", json={"text": text, "index": 2}).json()
    pair = row["pair"]
    assert (pair["prompt"], pair["chosen"], pair["rejected"]) == ("User: 2+1=\n\nAssistant:", "3", "4")
    one = len("User: 2+1=\n\nAssistant: 3\n\nUser:") - 1  # byte tokens; a datum is its sequence less one
    assert (pair["chosen_tokens"], pair["rejected_tokens"], row["tokens"]) == (one, one, 2 * one)
    assert (pair["chosen_field"], pair["rejected_field"]) == ("good", "bad") and row["reference"] is None
    report = c.post("/api/preflight", json={"text": text}).json()
    assert report["tokens"]["what"] == "pair tokens (chosen + rejected)"
    assert report["verdict"] == "ready, with 1 warning: 1 of 8 rows skipped"
    assert report["reward"]["formula"] == [
        "DPO has no reward rules: it trains each pair's chosen reply over its rejected one"]


def test_the_data_tab_of_an_sft_spec_shows_the_conversation(sft_project, tmp_path):
    _, c = client(sft_project)
    text = sft_project.read_text()
    row = c.post("/api/row", json={"text": text, "index": 0}).json()
    assert row["conversation"] == [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]
    whole = "User: 2+3=\n\nAssistant: 5\n\nUser:"
    assert row["prompt"] == whole and row["tokens"] == len(whole) - 1
    assert row["trained_tokens"] == len(" 5\n\nUser:")
    check = c.post("/api/check", json={"text": text}).json()
    assert check["method"] == "sft" and check["rules_note"].startswith("method sft needs no reward rules: it trains "
                                                                       "on each row's conversation")
    # a spec whose rows hold whole conversations (no prompt:) shows them as they are
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"chat": chat}) + "\n")
    (tmp_path / "chat.yaml").write_text("method: sft\nname: chat\nmodel: {name: sailrl/tiny, renderer: role_colon}\n"
                                        "dataset: {source: chat.jsonl, fields: [chat]}\nsft: {messages_field: chat}\n"
                                        "sampling: {sampler: local}\n")
    _, c = client(tmp_path / "chat.yaml")
    text = (tmp_path / "chat.yaml").read_text()
    row = c.post("/api/row", json={"text": text, "index": 0}).json()
    assert row["conversation"] == chat and row["prompt"] == "User: hi\n\nAssistant: hello\n\nUser:"
    assert c.post("/api/check", json={"text": text}).json()["rules_note"].startswith(
        "method sft needs no reward rules")


def test_an_override_the_method_does_not_read_is_refused_in_one_line(sft_project):
    _, c = client(sft_project)
    text = sft_project.read_text()
    r = c.post("/api/run/plan", json={"text": text, "overrides": {"training.group_size": 8}})
    assert r.status_code == 400 and r.json()["error"] == (
        "training.group_size is not read by method sft: a step trains sft.batch_size conversations; leave it empty "
        "(or set the method's own key in the spec)")
    r = c.post("/api/run/start", json={"text": text, "mode": "new", "overrides": {"training.groups_per_step": 2}})
    assert r.status_code == 400 and r.json()["error"].startswith("training.groups_per_step is not read by method sft")
    plan = c.post("/api/run/plan", json={"text": text, "overrides": {"training.steps": 2}}).json()
    assert any("2 SFT steps x 4 conversations" in line for line in plan["cost"])


@pytest.mark.slow
def test_an_sft_run_started_from_the_page_trains(sft_project):
    studio, c = client(sft_project)
    text = sft_project.read_text()
    started = c.post("/api/run/start", json={"text": text, "mode": "new"}).json()
    assert started["run"] == "runs/convs"
    run_dir = sft_project.parent / "runs" / "convs"
    proc = studio.runner.alive(run_dir)
    assert proc is not None and proc.wait(timeout=300) == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2] and all(m["conversations"] == 4 for m in lines)
    status = c.get("/api/run/status?run=runs/convs").json()
    assert status["exit_code"] == 0 and status["progress"]["done"] == 2
    assert status["outcome"] == (f"the training NLL went from {lines[0]['train/nll']:.3f} to "
                                 f"{lines[1]['train/nll']:.3f}")


def test_each_method_outcome_in_words():
    sft = [{"step": 1, "train/nll": 5.5, "eval/nll_start": 5.25}, {"step": 2, "train/nll": 1.0, "eval/nll": 1.5}]
    assert method_outcome(sft, "sft") == "the held-out NLL went from 5.250 to 1.500"
    dpo = [{"step": 1, "dpo/accuracy": 0.5}, {"step": 2, "dpo/accuracy": 0.75}]
    assert method_outcome(dpo, "dpo") == "the DPO accuracy went from 50% to 75%"
    kl = [{"step": 1, "distill/reverse_kl": 0.5}, {"step": 2, "distill/reverse_kl": 0.125}]
    assert method_outcome(kl, "distill") == "the reverse KL to the teacher went from 0.500 to 0.125"
    assert method_outcome(kl[:1], "distill") is None and method_outcome(sft, "rl") is None


# ------------------------------------------------------------------------------------------------ in a browser

@pytest.fixture
def chromium():
    """Debian's Chromium under Playwright, as the studio's browser test drives it (skipped without one; a failure
    with CI=true)."""
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


def _data_tab(browser) -> tuple:
    """A new page under the studio's own CSP (never bypassed), recording script errors and CSP violations:
    (page, script errors)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_init_script(CSP_LISTENER)
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.csp_console = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: pg.csp_console.append(m.text)
          if m.type == "error" and "Content Security Policy" in m.text else None)
    return pg, errors


@pytest.mark.slow
def test_the_data_tab_of_a_dpo_spec_in_a_browser(chromium, dpo_project):
    with serve_studio(Studio(dpo_project), BROWSER_TOKEN) as (url, _):
        pg, errors = _data_tab(chromium)
        pg.goto(f"{url}/?token={BROWSER_TOKEN}")
        wait_for(pg, "document.querySelector('#validity').textContent.startsWith('valid')")
        # the Rules tab: the method's words instead of "fix the YAML", and no rule to add
        assert pg.locator("#rule-note").inner_text().startswith("method dpo has no reward rules")
        assert pg.locator(".add-rule").is_hidden()
        pg.click('nav .tab[data-tab="data"]')
        wait_for(pg, "!document.querySelector('#preflight-verdict').textContent.startsWith('checking')")
        assert pg.locator("#preflight-verdict").inner_text() == "ready, with 1 warning: 1 of 8 rows skipped"
        assert "pair tokens (chosen + rejected) min 60 / median 60 / max 60 (context 4096)" in pg.locator("#data-summary").inner_text()
        wait_for(pg, "document.querySelectorAll('#data-rows tbody tr').length === 8")
        assert pg.locator('#data-rows tbody tr[data-index="7"] td').last.inner_text() == (
            "skipped: its 'good' and 'bad' completions are the same text (no preference)")
        pg.locator('#data-rows tbody tr[data-index="2"]').click()
        wait_for(pg, "document.querySelector('#prompt-index').textContent === '2'")
        assert pg.locator("#prompt-what").inner_text() == "Pair"
        assert pg.locator("#prompt-text").inner_text() == (
            "prompt\nUser: 2+1=\n\nAssistant:\nchosen (good), 30 tokens\n3\nrejected (bad), 30 tokens\n4")
        assert pg.locator("#prompt-text .pair-part.chosen").inner_text() == "chosen (good), 30 tokens"
        assert pg.locator("#prompt-meta").inner_text() == "60 tokens (chosen + rejected)"
        assert errors == [] and csp_violations(pg) == []
        pg.context.close()


@pytest.mark.slow
def test_the_data_tab_of_an_sft_spec_in_a_browser(chromium, sft_project):
    write_run(sft_project.parent / "runs" / "convs", "sft", SFT_LINES)
    with serve_studio(Studio(sft_project), BROWSER_TOKEN) as (url, _):
        pg, errors = _data_tab(chromium)
        pg.goto(f"{url}/?token={BROWSER_TOKEN}")
        wait_for(pg, "document.querySelector('#validity').textContent.startsWith('valid')")
        assert pg.locator("#rule-note").inner_text().startswith("method sft needs no reward rules")
        assert pg.locator(".add-rule").is_visible()  # rules are optional for SFT: they score held-out samples
        pg.click('nav .tab[data-tab="data"]')
        wait_for(pg, "!document.querySelector('#preflight-verdict').textContent.startsWith('checking')")
        assert pg.locator("#preflight-verdict").inner_text() == "ready: no problems found"
        assert "conversation tokens min 30 / median 30 / max 31 (context 4096)" in pg.locator(
            "#data-summary").inner_text()
        wait_for(pg, "document.querySelectorAll('#data-rows tbody tr').length === 20")
        pg.locator('#data-rows tbody tr[data-index="3"]').click()
        wait_for(pg, "document.querySelector('#prompt-index').textContent === '3'")
        assert pg.locator("#prompt-what").inner_text() == "Conversation"
        assert pg.locator("#prompt-text").inner_text() == "User: 0+7=\n\nAssistant: 7\n\nUser:"
        assert pg.locator("#prompt-meta").inner_text() == "30 tokens · 9 trained (the assistant turns)"
        # the Runs tab of an SFT run draws its NLL, not RL's reward
        pg.click('nav .tab[data-tab="runs"]')
        wait_for(pg, "document.querySelector('#curves polyline[data-key=\"train/nll\"]') !== null")
        assert "NLL per step (nats per assistant token)" in pg.locator("#curves svg").text_content()
        assert pg.locator("#curves .legend").inner_text().split("\n")[:2] == ["train NLL", "eval/nll (held-out)"]
        assert errors == [] and csp_violations(pg) == []
        pg.context.close()
