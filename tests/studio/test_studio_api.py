"""``sailrl studio``'s server through Starlette's TestClient: the token, Host and Origin rules, confined paths,
and answers that are the CLI's own (validate's problems, the reward engine's verdicts, rollouts as logged)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

with warnings.catch_warnings():  # starlette 1.x suggests httpx2 for its test client; httpx is what is installed
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from sailrl.cli import main
from sailrl.compiler.validate import validate_text
from sailrl.runtime.rundir.rollout_log import read_rollouts
from sailrl.spec.errors import SpecErrors
from sailrl.studio import session as session_module
from sailrl.studio.app import build_app
from sailrl.studio.security import MAX_BODY_BYTES, cookie_name
from sailrl.studio.session import Studio
from tests.fakes.studio_project import make_project, write_steps

PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = "test-token-abc"


@pytest.fixture
def project(tmp_path):
    spec = make_project(tmp_path / "proj")
    write_steps(spec, spec.parent / "runs" / "quickstart", range(1, 4))
    return spec


def client_for(spec: Path, run_dir: Path | None = None, *, token: bool = True) -> TestClient:
    app = build_app(Studio(spec, run_dir), token=TOKEN, host="127.0.0.1", port=PORT)
    c = TestClient(app, base_url=BASE)
    if token:
        c.cookies.set(cookie_name(PORT), TOKEN)
    return c


@pytest.fixture
def client(project):
    return client_for(project)


# ---------------------------------------------------------------------------------------------- safety


def test_every_path_needs_the_session_token(project):
    c = client_for(project, token=False)
    for path in ("/", "/api/spec", "/static/app.js", "/api/disk", "/api/run/steps?run=runs/quickstart"):
        r = c.get(path)
        assert r.status_code == 401, path
        assert "no session token" in r.text
    assert c.post("/api/try", json={"text": "", "completion": ""}).status_code == 401
    assert c.get("/?token=wrong", follow_redirects=False).status_code == 401
    r = c.get(f"/?token={TOKEN}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(PORT)}={TOKEN};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    c.cookies.clear()
    assert c.get("/api/spec", headers={"X-Studio-Token": TOKEN}).status_code == 200
    assert c.get("/api/spec", headers={"X-Studio-Token": TOKEN + "x"}).status_code == 401


def test_the_cookie_from_the_url_opens_the_page(project):
    c = client_for(project, token=False)
    r = c.get(f"/?token={TOKEN}")  # follows the redirect with the cookie set
    assert r.status_code == 200 and '<script type="module" src="/static/app.js">' in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "127.0.0.1:9999", "127.0.0.1.nip.io:8765", ""])
def test_a_foreign_host_header_is_refused(client, host):
    r = client.get("/api/spec", headers={"Host": host})
    assert r.status_code == 403 and "Host header" in r.text


@pytest.mark.parametrize("host", ["127.0.0.1:8765", "localhost:8765", "[::1]:8765"])
def test_loopback_names_are_accepted(client, host):
    assert client.get("/api/spec", headers={"Host": host}).status_code == 200


def test_the_names_each_address_answers_to():
    import socket as sockets

    from sailrl.studio.security import allowed_hosts

    assert allowed_hosts("127.0.0.1", 80) == {"127.0.0.1:80", "localhost:80", "[::1]:80"}
    assert allowed_hosts("192.0.2.7", 80) == {"192.0.2.7:80"}  # one address: only its own name
    assert allowed_hosts("::1", 80) >= {"[::1]:80", "127.0.0.1:80"}
    wildcard = allowed_hosts("0.0.0.0", 80)
    assert {"0.0.0.0:80", "127.0.0.1:80", f"{sockets.gethostname()}:80"} <= wildcard
    assert "evil.example:80" not in wildcard


@pytest.mark.parametrize("origin", ["http://evil.example", "http://127.0.0.1:9999", "null", "https://127.0.0.1:8765"])
def test_a_foreign_origin_is_refused(client, project, origin):
    before = project.read_bytes()
    assert client.get("/api/spec", headers={"Origin": origin}).status_code == 403
    r = client.post("/api/save", json={"text": "name: x\n", "base_sha": None}, headers={"Origin": origin})
    assert r.status_code == 403 and "another site" in r.text
    assert project.read_bytes() == before


def test_every_asset_ships_in_the_package(client):
    from sailrl.studio.app import STATIC

    page = client.get("/").text
    assert re.findall(r'(?:src|href)="([^"]+)"', page) == ["data:,", "/static/style.css", "/static/app.js"]
    for name in ("app.js", "style.css", "index.html"):
        text = (STATIC / name).read_text()
        urls = set(re.findall(r"https?://[^\s\"'`)]+", text)) - {"http://www.w3.org/2000/svg"}  # an SVG namespace
        assert urls == set(), name
        assert not re.search(r"^\s*import\b|\bimport\(", text, re.M), name  # one module: it fetches nothing else
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")


def test_same_origin_is_accepted(client):
    assert client.get("/api/spec", headers={"Origin": BASE}).status_code == 200


def test_posts_take_json_only_and_bodies_are_capped(client):
    r = client.post("/api/check", content=b'{"text": ""}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = client.post("/api/check", content=b"x" * (MAX_BODY_BYTES + 1), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert client.post("/api/check", content=b"{not json", headers={"Content-Type": "application/json"}
                       ).json() == {"error": "the request body is not valid JSON"}
    assert client.put("/api/check").status_code == 405


def test_source_files_are_confined_to_the_spec_folder(client, project, tmp_path):
    (project.parent / "rewards.py").write_text("def score(completion, fields):\n    return 1.0\n")
    assert client.get("/api/source?path=rewards.py").json()["text"].startswith("def score")
    outside = tmp_path / "secret.txt"
    outside.write_text("TOP-SECRET-CONTENT")
    (project.parent / "link.txt").symlink_to(outside)
    for bad in ("../secret.txt", "data/../../secret.txt", str(outside), "/etc/passwd", "link.txt", "..", "C:/x"):
        r = client.get("/api/source", params={"path": bad})
        assert r.status_code == 403, bad
        assert "TOP-SECRET-CONTENT" not in r.text
    assert client.get("/api/source?path=nope.py").status_code == 404


def test_run_folders_are_confined(client, project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_steps(project, elsewhere, range(1, 2))
    (project.parent / "runs" / "linked").symlink_to(elsewhere)
    for bad in ("../elsewhere", str(elsewhere), "runs/linked", "runs/../../elsewhere", "@run"):
        r = client.get("/api/run/steps", params={"run": bad})
        assert r.status_code in (403, 404), bad
        assert "train" not in r.json()
    assert client.get("/api/run/steps", params={"run": "runs/quickstart"}).json() == {"train": [1, 2, 3], "eval": []}
    listed = [r["id"] for r in client.post("/api/runs", json={}).json()["runs"]]
    assert listed == ["runs/quickstart"]  # the symlink out is not offered


def test_the_run_folder_given_with_run_is_readable_wherever_it_is(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_steps(project, elsewhere, range(1, 3))
    c = client_for(project, elsewhere)
    assert c.get("/api/run/steps", params={"run": "@run"}).json()["train"] == [1, 2]
    assert c.get("/api/run/steps", params={"run": "@run/../proj"}).status_code == 403
    ids = [r["id"] for r in c.post("/api/runs", json={"text": project.read_text()}).json()["runs"]]
    assert ids == ["@run", "runs/quickstart"]


# ---------------------------------------------------------------------------------------------- the CLI's answers


def test_problems_are_validates_own(client, project):
    text = project.read_text().replace(r"pattern: '^\s*-?\d+\s*$'", "pattern: '^(\\d+'")
    check = client.post("/api/check", json={"text": text}).json()
    with pytest.raises(SpecErrors) as exc:
        validate_text(text, project.name, path=project)
    want = [(e.code, e.line, e.column, e.key_path, e.message, e.hint) for e in exc.value.errors]
    got = [(p["code"], p["line"], p["column"], p["key_path"], p["message"], p["hint"]) for p in check["problems"]]
    assert got == want and want[0][0] == "S201"
    assert check["valid"] is False and check["problems"][0]["headline"] == exc.value.errors[0].headline()
    assert check["problems"][0]["key_path"] == "reward.rules.1.checks.0.pattern"


def test_gaming_probes_are_reported_at_the_rule(client, project):
    text = project.read_text().replace("extract: {from: whole}\n      reference", "extract: {from: last_number}\n      reference")
    check = client.post("/api/check", json={"text": text}).json()
    w110 = [p for p in check["problems"] if p["code"] == "W110"]
    assert len(w110) == 1 and w110[0]["key_path"] == "reward.rules.0.extract" and w110[0]["severity"] == "warning"
    assert "can be gamed" in w110[0]["message"] and "' 8 or 7'" in w110[0]["message"]


def test_try_gives_the_verdicts_sailrl_rewards_prints(client, project, capsys):
    text = project.read_text()
    for completion, truncated in ((" 7", False), (" 8", False), (" 7 or 8", False), (" 7", True)):
        got = client.post("/api/try", json={"text": text, "completion": completion, "fields": {"answer": "7"},
                                             "truncated": truncated}).json()
        argv = ["rewards", str(project), "--completion", completion, "--field", "answer=7", "--json"]
        assert main(argv + (["--truncated"] if truncated else [])) == 0
        cli = json.loads(capsys.readouterr().out)
        assert got["total"] == cli["total"]
        assert {r["name"]: r["score"] for r in got["rules"]} == cli["contributions"]
        assert {r["name"]: r["passed"] for r in got["rules"]} == cli["passed"]
        assert {r["name"]: r["why"] for r in got["rules"]} == cli["reasons"]
    assert got["total"] == 0.5 and got["rules"][1]["why"].endswith("cut off at max_tokens")


def test_try_works_while_other_sections_are_broken(client, project):
    text = project.read_text().replace("source: data/addition.jsonl", "source: data/missing.jsonl")
    assert client.post("/api/check", json={"text": text}).json()["valid"] is False
    got = client.post("/api/try", json={"text": text, "completion": " 7", "fields": {"answer": "7"}}).json()
    assert got["ok"] and got["total"] == 1.0
    broken = text.replace("kind: termination", "kind: terminaton")
    got = client.post("/api/try", json={"text": broken, "completion": " 7", "fields": {"answer": "7"}}).json()
    # the rule with the problem shows it in its verdict's place; the other rule is still tried
    assert got["ok"] and [r["name"] for r in got["rules"]] == ["correct", "format"]
    assert got["rules"][0]["passed"] is True and got["rules"][0]["score"] == 0.5
    assert got["rules"][1]["passed"] is None and got["rules"][1]["broken"] is True
    assert got["rules"][1]["why"].startswith("not tried: this rule has a problem: ")
    assert "terminaton" in got["rules"][1]["error"]
    assert got["total"] == 0.5
    assert got["total_note"] == "total of the other rules: 'format' not tried until its problem is fixed"
    assert client.post("/api/rows", json={"text": text}).status_code == 422


def test_a_hostile_completion_gets_the_reward_engines_bounded_answer(client, project):
    got = client.post("/api/try", json={"text": project.read_text(), "completion": "7" * 300_000,
                                         "fields": {"answer": "7"}}).json()
    assert got["total"] == 0.0
    assert all("characters long; the rules read at most 200,000" in r["why"] for r in got["rules"])


def test_python_rules_run_in_the_worker_processes(client, project):
    (project.parent / "rewards.py").write_text(
        "def score(completion, fields):\n    return 0.25 if completion.strip() == fields['answer'] else 0.0\n")
    text = project.read_text().replace("reward:\n  rules:\n", "reward:\n  rules:\n"
                                       "    - name: mine\n      kind: python\n      function: rewards:score\n")
    got = client.post("/api/try", json={"text": text, "completion": " 7", "fields": {"answer": "7"}}).json()
    assert got["rules"][0] == {"name": "mine", "passed": True, "score": 0.25, "why": got["rules"][0]["why"],
                               "error": None}
    assert got["total"] == 1.25


def test_examples_are_scored_with_pass_or_fail(client, project):
    text = project.read_text().replace("expect: {correct: 0.0, format: 0.5}", "expect: {correct: 0.5, format: 0.5}")
    got = client.post("/api/examples", json={"text": text}).json()["examples"]
    assert [e["passed"] for e in got] == [True, False, True, True]
    assert got[1]["misses"] == ["correct: expected 0.5, got 0 (answer '8' does not match reference '7')"]


@pytest.mark.slow  # loads the tokenizer and renderer (seconds)
def test_rows_prompts_and_preflight(client, project):
    text = project.read_text()
    rows = client.post("/api/rows", json={"text": text, "limit": 3}).json()
    lines = [json.loads(x) for x in (project.parent / "data/addition.jsonl").read_text().splitlines()]
    assert rows["total"] == 100 and rows["columns"] == ["question", "answer"]
    assert [r["fields"] for r in rows["rows"]] == [{k: x[k] for k in ("question", "answer")} for x in lines[:3]]
    found = client.post("/api/rows", json={"text": text, "q": lines[42]["question"]}).json()
    assert 42 in [r["index"] for r in found["rows"]]
    row = client.post("/api/row", json={"text": text, "index": 3}).json()
    assert row["prompt"] == f"User: {lines[3]['question']}=\n\nAssistant:"
    assert row["tokens"] == len(row["prompt"].encode())  # the byte tokenizer: one id per byte
    assert row["reference"] == lines[3]["answer"]
    assert client.post("/api/row", json={"text": text, "index": 1000}).status_code == 404
    assert client.post("/api/row", json={"text": text, "random": True}).json()["index"] in range(100)
    report = client.post("/api/preflight", json={"text": text}).json()
    assert report["verdict"] == "ready: no problems found" and report["data"]["train"] == 100


def test_preflight_findings_name_unusable_rows(client, project):
    data = project.parent / "data/addition.jsonl"
    data.write_text(data.read_text() + '{"question": "1+1", "answer": "two"}\n')
    report = client.post("/api/preflight", json={"text": project.read_text()}).json()
    assert report["verdict"].startswith("ready, with 1 warning: 1 of 101 rows skipped")
    rows = client.post("/api/rows", json={"text": project.read_text(), "q": "two"}).json()["rows"]
    assert rows[0]["split"] == "skipped" and "two" in rows[0]["skip_reason"]


def test_run_metrics_and_rollouts_are_the_run_files(client, project):
    run = project.parent / "runs" / "quickstart"
    m = client.get("/api/run/metrics", params={"run": "runs/quickstart"}).json()
    size = (run / "metrics.jsonl").stat().st_size
    assert [x["step"] for x in m["lines"]] == [1, 2, 3] and m["next"] == size and not m["reset"]
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward/tot')  # a line still being written
    again = client.get("/api/run/metrics", params={"run": "runs/quickstart", "after": size, "file": m["file"]})
    assert again.json() == {"lines": [], "next": size, "file": m["file"], "reset": False, "more": False,
                            "skipped": 0, "exists": True}
    write_steps(project, run, range(4, 5))  # RolloutLog cuts nothing from metrics: finish the torn line first
    got = client.get("/api/run/rollouts", params={"run": "runs/quickstart", "step": 2}).json()
    assert got["records"] == read_rollouts(run, step=2, kind="train") and len(got["records"]) == 16
    r0 = got["records"][0]
    assert {"prompt", "completion", "rules", "advantage", "sampler_path", "total"} <= set(r0)


# ---------------------------------------------------------------------------------------------- YAML and save


def test_patch_replaces_the_rules_and_keeps_everything_else(client, project):
    text = project.read_text()
    check = client.post("/api/check", json={"text": text}).json()
    rules = check["rules"]
    rules[1]["checks"][0]["pattern"] = r"^\s*\d+$"
    rules.append({"name": "short", "kind": "length", "unit": "chars", "max": 20, "pass_score": 0, "fail_score": -0.1})
    examples = check["examples"] + [{"completion": " 9", "fields": {"answer": "9"}, "expect_total": 1.0}]
    got = client.post("/api/patch", json={"text": text, "rules": rules, "examples": examples}).json()
    new = got["text"]
    assert got["check"]["valid"] is True and got["check"]["rules"] == rules and got["check"]["examples"] == examples
    assert [ln for ln in text.splitlines() if "#" in ln] == [ln for ln in new.splitlines() if "#" in ln]
    head, tail = text.split("reward:")[0], text.split("training:")[1].split("examples:")[0]
    assert new.startswith(head) and tail in new
    assert "          pattern: '^\\s*\\d+$'\n" in new
    assert "    - name: short\n      kind: length\n      unit: chars\n      max: 20\n" in new
    fresh = client.post("/api/check", json={"text": text}).json()
    no_op = client.post("/api/patch", json={"text": text, "rules": fresh["rules"], "examples": fresh["examples"]}).json()
    assert no_op["text"] == text
    assert client.post("/api/patch", json={"text": "a: [", "rules": []}).status_code == 422


def test_save_writes_only_a_valid_spec_over_the_file_it_loaded(client, project):
    loaded = client.get("/api/spec").json()
    old = project.read_text()
    new = old.replace("  steps: 100\n", "  steps: 90\n")
    assert new != old
    bad = old.replace("kind: termination", "kind: terminaton")
    r = client.post("/api/save", json={"text": bad, "base_sha": loaded["disk_sha"]})
    assert r.status_code == 422 and "was not written" in r.json()["error"] and project.read_text() == old
    r = client.post("/api/save", json={"text": new, "base_sha": loaded["disk_sha"]})
    assert r.status_code == 200 and project.read_text() == new
    assert (project.parent / "quickstart.yaml.bak").read_text() == old
    assert sorted(p.name for p in project.parent.iterdir() if p.name.startswith(".")) == []  # no temp file left
    r = client.post("/api/save", json={"text": old, "base_sha": loaded["disk_sha"]})  # stale: the file moved on
    assert r.status_code == 409 and "changed on disk" in r.json()["error"] and project.read_text() == new
    import hashlib

    assert client.get("/api/disk").json()["disk_sha"] == hashlib.sha256(new.encode()).hexdigest()


def test_a_save_interrupted_before_the_replace_leaves_the_file_as_it_was(client, project, monkeypatch):
    loaded = client.get("/api/spec").json()
    old = project.read_bytes()
    real = os.replace

    def interrupted(src, dst):
        if Path(dst) == project:
            raise KeyboardInterrupt  # Ctrl-C between writing the new file and putting it in place
        return real(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)
    studio = client.app.app.state.studio
    with pytest.raises(KeyboardInterrupt):
        studio.save(old.decode().replace("  steps: 100\n", "  steps: 90\n"), loaded["disk_sha"])
    assert project.read_bytes() == old
    assert [p.name for p in project.parent.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("hostile", [
    "a: &a [" + ",".join(["x"] * 50) + "]\n" + "".join(f"b{i}: &b{i} [*{'a' if i == 0 else f'b{i - 1}'}, "
                                                       f"*{'a' if i == 0 else f'b{i - 1}'}]\n" for i in range(30)),
    "name: x\n" + "k: " + "[" * 5000 + "\n",
    "name: " + "x" * 300_000 + "\n",
    "\x00\x1b[2J name: x\n",
])
def test_a_hostile_spec_text_gets_validates_bounded_errors(client, project, hostile):
    check = client.post("/api/check", json={"text": hostile}).json()
    try:
        validate_text(hostile, project.name, path=project)
        want = []
    except SpecErrors as exc:
        want = [(e.code, e.line, e.message) for e in exc.errors]
    assert [(p["code"], p["line"], p["message"]) for p in check["problems"] if p["severity"] == "error"] == want
    assert want and check["valid"] is False


def test_a_spec_that_does_not_parse_opens_with_its_errors(tmp_path):
    spec = tmp_path / "broken.yaml"
    spec.write_text("name: x\nreward:\n  rules: [\n")
    got = client_for(spec).get("/api/spec").json()
    assert got["text"] == "name: x\nreward:\n  rules: [\n"
    assert got["check"]["valid"] is False and got["check"]["rules"] is None
    assert got["check"]["problems"][0]["code"].startswith("S0")


# ---------------------------------------------------------------------------------------------- the command


def _studio(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "sailrl", "studio", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_the_command_prints_a_tokened_url_and_ctrl_c_exits_130(project):
    proc = _studio(str(project), cwd=project.parent)
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:(\d+))/\?token=(\S+)", line)
        assert url, line
        import httpx

        with httpx.Client(follow_redirects=True) as c:
            assert c.get(url.group(1) + "/api/spec").status_code == 401
            r = c.get(url.group(0))
            assert r.status_code == 200 and "sailrl studio" in r.text
            assert c.get(url.group(1) + "/api/spec").json()["path"] == "quickstart.yaml"
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "stopped" in err and "Traceback" not in err


def test_the_command_says_one_line_for_bad_input(project, tmp_path, capsys):
    assert main(["studio", str(tmp_path / "missing.yaml")]) == 1
    assert capsys.readouterr().err.strip().endswith("spec not found (write one with `sailrl init`)")
    assert main(["studio", str(project), "--run", str(tmp_path / "norun")]) == 1
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'norun'}: no such run directory"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["studio", str(project), "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"error: port {port} on 127.0.0.1 is in use: pick another with --port N, or leave --port out "
                   "for a free one")
    for host in ("999.1.1.1", "no-such-host.invalid", "192.0.2.1"):  # not an address; no name; not this machine's
        assert main(["studio", str(project), "--host", host]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[0].startswith(f"warning: serving on {host}") and len(err) == 2, err
        assert err[1].startswith(f"error: --host {host}: cannot serve there (") and err[1].endswith(
            "give an address of this machine, or leave --host out for 127.0.0.1"), err


@pytest.mark.slow
def test_another_host_only_when_given_and_with_a_warning(project, monkeypatch):
    monkeypatch.setenv("BROWSER", "false")  # --open with a browser that cannot be opened: one line, serving on
    proc = _studio(str(project), "--host", "0.0.0.0", "--open", cwd=project.parent)
    try:
        line = proc.stdout.readline()
        assert line.startswith("sailrl studio: ") and "http://0.0.0.0:" in line
        port = int(re.search(r"http://0\.0\.0\.0:(\d+)/", line).group(1))
        import httpx

        by_name = httpx.get(f"http://127.0.0.1:{port}/api/spec", headers={"Host": f"{socket.gethostname()}:{port}"})
        assert by_name.status_code == 401  # this machine's name passes the Host check; the token is still needed
        assert httpx.get(f"http://127.0.0.1:{port}/api/spec", headers={"Host": "evil.example"}).status_code == 403
    finally:
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert err.startswith("warning: serving on 0.0.0.0, not only this machine") and "read any file you can read" in err
    assert "note: could not open a browser here: open the URL above yourself" in err
    assert proc.returncode == 130 and "Traceback" not in err


def test_an_any_of_rule_from_the_forms_scores_as_the_engine_does(client, project):
    text = project.read_text()
    rules = client.post("/api/check", json={"text": text}).json()["rules"]
    rules.append({"name": "marked", "kind": "any_of", "weight": 0.1, "checks": [
        {"kind": "has_answer", "extract": {"from": "boxed"}}, {"kind": "match", "pattern": "^Answer:", "flags": ["MULTILINE"]}]})
    patched = client.post("/api/patch", json={"text": text, "rules": rules}).json()
    assert patched["check"]["valid"] is True
    assert "    - name: marked\n      kind: any_of\n      weight: 0.1\n      checks:\n" in patched["text"]
    for completion, passed in (("\\boxed{7}", True), ("seven\nAnswer: 7", True), ("seven", False)):
        got = client.post("/api/try", json={"text": patched["text"], "completion": completion,
                                             "fields": {"answer": "7"}}).json()
        marked = got["rules"][2]
        assert (marked["passed"], marked["score"]) == (passed, 0.1 if passed else 0.0)
        assert "answer" in marked["why"] and "match" in marked["why"]  # both checks ran and are named


# ---------------------------------------------------------------------------------------------- hostile requests


def _raw_post(c: TestClient, path: str, body: bytes):
    return c.post(path, content=body, headers={"content-type": "application/json"})


def test_json_infinity_and_deep_nesting_are_bounded_errors_not_500(client, project):
    text = json.dumps(project.read_text()).encode()
    r = _raw_post(client, "/api/rows", b'{"text": %s, "offset": Infinity}' % text)
    assert r.status_code == 400 and r.json()["error"] == "offset must be a whole number, got inf"
    r = _raw_post(client, "/api/check", b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400 and r.json()["error"] == "the request body is nested too deeply"
    deep = json.loads("[" * 900 + "]" * 900)  # parses as JSON, too deep for the YAML writer
    r = client.post("/api/patch", json={"text": project.read_text(), "rules": [deep]})
    assert r.status_code == 400 and r.json()["error"] == "refused: the request is nested too deeply"


def _poll(c, after, file_id):
    params = {"run": "@run", "after": after}
    if file_id:
        params["file"] = file_id
    return c.get("/api/run/metrics", params=params).json()


def test_the_metrics_poll_reads_only_what_was_appended(project, monkeypatch):
    """``next`` is a byte offset: each poll reads from where the last one stopped, so a growing metrics.jsonl is
    read once in all, whatever its size; a line still being written waits for its newline."""
    run = project.parent / "runs" / "quickstart"
    metrics = run / "metrics.jsonl"
    c = client_for(project, run)
    first = _poll(c, 0, None)
    assert [x["step"] for x in first["lines"]] == [1, 2, 3] and first["next"] == metrics.stat().st_size
    read: list[int] = []  # bytes each poll read, from the file object the studio opened
    real_open = session_module.open_run_file

    def spy_open(path):
        f = real_open(path)
        if f is not None and Path(path).name == "metrics.jsonl":
            real_read = f.read
            f.read = lambda n=-1: (lambda b: (read.append(len(b)), b)[1])(real_read(n))
        return f

    monkeypatch.setattr(session_module, "open_run_file", spy_open)
    nxt, fid = first["next"], first["file"]
    for step in range(4, 9):
        with metrics.open("a") as f:
            f.write(json.dumps({"step": step, "reward/total": step / 10}) + "\n" + '{"step": ' + str(step + 1))
        read.clear()
        got = _poll(c, nxt, fid)
        assert [x["step"] for x in got["lines"]] == [step] and not got["reset"] and got["file"] == fid
        appended = metrics.stat().st_size - nxt
        assert sum(read) == appended + 1  # the new bytes, and the one newline before them that proves the offset
        nxt = got["next"]
        assert metrics.read_bytes()[:nxt].endswith(b"\n") and metrics.read_bytes()[nxt:].startswith(b'{"step": ')
        with metrics.open("rb+") as f:  # the torn line is finished and a new one is begun by the next step
            f.truncate(nxt)


def test_a_rotated_or_truncated_metrics_file_is_read_again_from_the_start(project):
    run = project.parent / "runs" / "quickstart"
    metrics = run / "metrics.jsonl"
    c = client_for(project, run)
    first = _poll(c, 0, None)
    # truncated and rewritten shorter (a run restarted with --overwrite writing in place)
    metrics.write_text(json.dumps({"step": 1, "reward/total": 0.5}) + "\n")
    cut = _poll(c, first["next"], first["file"])
    assert cut["reset"] is True and [x["reward/total"] for x in cut["lines"]] == [0.5]
    # replaced by another file at least as long (rotated: a new inode), the old offset must not be trusted
    tmp = run / "metrics.new"
    tmp.write_text("".join(json.dumps({"step": s, "new": True}) + "\n" for s in range(1, 40)))
    os.replace(tmp, metrics)
    rot = _poll(c, cut["next"], cut["file"])
    assert rot["reset"] is True and rot["file"] != cut["file"] and [x["step"] for x in rot["lines"]] == \
        list(range(1, 40)) and all(x["new"] for x in rot["lines"])
    # cut and rewritten in place longer than before, between two polls: the offset no longer follows a newline
    same = _poll(c, rot["next"], rot["file"])
    assert same["lines"] == [] and not same["reset"]
    with metrics.open("r+") as f:
        f.seek(0)
        f.write(json.dumps({"step": 1, "rewritten": "x" * 300}) + "\n")
        f.truncate()
    with metrics.open("a") as f:
        f.write("y" * (rot["next"] - metrics.stat().st_size + 10) + "\n")
    redo = _poll(c, rot["next"], rot["file"])
    assert redo["reset"] is True and redo["lines"][0]["rewritten"] == "x" * 300 and redo["skipped"] == 1
    # an offset past the end, or one that is not a number, from a hand-made request
    assert _poll(c, 10**9, None)["reset"] is True
    assert c.get("/api/run/metrics", params={"run": "@run", "after": "x"}).status_code == 400


def test_one_metrics_answer_is_bounded_and_says_there_is_more(project, monkeypatch):
    from sailrl.studio import session

    run = project.parent / "runs" / "quickstart"
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "pad": "p" * 100}) + "\n" for s in range(1, 201)))
    monkeypatch.setattr(session, "METRICS_CHUNK_BYTES", 4096)
    c = client_for(project, run)
    steps, after, fid, answers = [], 0, None, 0
    while True:
        got = _poll(c, after, fid)
        answers += 1
        assert not got["reset"] and len(json.dumps(got["lines"])) < 4096 + 200
        steps += [x["step"] for x in got["lines"]]
        after, fid = got["next"], got["file"]
        if not got["more"]:
            break
    assert steps == list(range(1, 201)) and after == metrics.stat().st_size and answers > 5
    # one line longer than a whole answer's bytes is skipped whole (and counted); the lines after it are read
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 201, "huge": "h" * 10_000}) + "\n" + json.dumps({"step": 202}) + "\n")
    big = _poll(c, after, fid)
    assert big["lines"] == [] and big["skipped"] == 1 and big["more"]
    assert _poll(c, big["next"], fid)["lines"] == [{"step": 202}]


def test_a_metrics_line_with_nan_is_sent_as_null(project):
    run = project.parent / "runs" / "quickstart"
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "loss": NaN, "kl": -Infinity}\n')
    r = client_for(project, run).get("/api/run/metrics?run=@run")
    assert r.status_code == 200
    assert r.json()["lines"][-1] == {"step": 9, "loss": None, "kl": None}


def test_run_files_linked_out_of_the_run_folder_are_not_read(project, tmp_path):
    run = project.parent / "runs" / "quickstart"
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"step": 1, "secret": "hunter2"}\n')
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(secret)
    (run / "rollouts.jsonl").unlink()
    (run / "rollouts.jsonl").symlink_to(secret)
    c = client_for(project, run)
    for url in ("/api/run/metrics?run=@run", "/api/run/metrics?run=runs/quickstart",
                "/api/run/steps?run=@run", "/api/run/rollouts?run=@run&step=1"):
        r = c.get(url)
        assert r.status_code == 200 and "hunter2" not in r.text, url
    assert c.get("/api/run/metrics?run=@run").json() == {"lines": [], "next": 0, "file": None, "reset": False,
                                                          "more": False, "exists": False}
    assert c.get("/api/run/steps?run=@run").json() == {"train": [], "eval": []}


@contextmanager
def fifo_watch(fifo: Path, after_s: float = 5.0):
    """A list that gets ``True`` when, ``after_s`` into the block, a reader is still waiting in ``open()`` on
    ``fifo`` (opening the write end succeeds only then, and lets that reader go)."""
    blocked: list[bool] = []

    def unblock():
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        blocked.append(True)
        os.close(fd)

    timer = threading.Timer(after_s, unblock)
    timer.start()
    try:
        yield blocked
    finally:
        timer.cancel()


def test_a_fifo_in_the_run_folder_does_not_hang_the_request(project):
    run = project.parent / "runs" / "quickstart"
    (run / "metrics.jsonl").unlink()
    fifo = run / "metrics.jsonl"
    os.mkfifo(fifo)
    with fifo_watch(fifo) as blocked:
        r = client_for(project, run).get("/api/run/metrics?run=@run")
    assert not blocked, "the request waited on the FIFO"
    assert r.json()["lines"] == [] and r.json()["exists"] is False


def test_source_reads_at_most_256_kib_of_a_big_file(client, project, monkeypatch):
    big = project.parent / "big.txt"
    with open(big, "wb") as f:
        f.write(b"x" * (300 * 1024))
    sizes = []
    real_read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: sizes.append(self) or real_read(self))
    r = client.get("/api/source?path=big.txt")
    assert r.status_code == 200 and len(r.json()["text"]) == 256 * 1024
    assert big not in sizes  # not read whole into memory first


def test_save_when_the_spec_was_deleted_writes_it_anew(project):
    c = client_for(project)
    text = project.read_text()
    project.unlink()
    loaded = c.get("/api/spec").json()
    assert loaded["disk_sha"] is None and loaded["read_problems"]
    r = c.post("/api/save", json={"text": text, "base_sha": None})
    assert r.status_code == 200 and r.json()["backup"] is None
    assert project.read_text() == text


def test_two_studios_on_one_host_keep_their_own_session_cookie(project):
    """A browser keeps cookies per host name, not per port: opening a second studio must not log out the first."""
    apps = {port: build_app(Studio(project), token=f"tok-{port}", host="127.0.0.1", port=port) for port in (8765, 8766)}
    jar: dict[str, str] = {}  # the browser's jar for 127.0.0.1: a cookie of the same name replaces the earlier one
    for port, app in apps.items():
        r = TestClient(app, base_url=f"http://127.0.0.1:{port}").get(f"/?token=tok-{port}", follow_redirects=False)
        name, _, value = r.headers["set-cookie"].split(";")[0].partition("=")
        jar[name] = value
    header = "; ".join(f"{k}={v}" for k, v in jar.items())
    for port, app in apps.items():
        c = TestClient(app, base_url=f"http://127.0.0.1:{port}")
        assert c.get("/api/disk", headers={"cookie": header}).status_code == 200, port


def test_a_save_the_disk_refuses_is_one_message_and_changes_nothing(project, monkeypatch):
    import tempfile

    c = client_for(project)
    loaded = c.get("/api/spec").json()
    before = sorted(p.name for p in project.parent.iterdir())

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(project.parent))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    r = c.post("/api/save", json={"text": loaded["text"] + "# edit\n", "base_sha": loaded["disk_sha"]})
    assert r.status_code == 507
    assert r.json()["error"] == (f"{project.name} was not written: Permission denied ({project.parent}); the file on "
                                 "disk is unchanged")
    assert sorted(p.name for p in project.parent.iterdir()) == before
    assert project.read_text() == loaded["text"]


def test_a_save_over_a_spec_replaced_by_a_fifo_is_refused_without_blocking(project):
    c = client_for(project)
    text = project.read_text()
    project.unlink()
    os.mkfifo(project)
    with fifo_watch(project) as blocked:
        r = c.post("/api/save", json={"text": text, "base_sha": None})
    assert not blocked, "the save waited on the FIFO"
    assert r.status_code == 409 and "is no longer a file" in r.json()["error"]
    assert sorted(p.name for p in project.parent.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_a_save_keeps_the_spec_files_permissions(project):
    """The save writes a temporary file (``mkstemp``: mode 0600) and renames it over the spec: the spec and its
    backup keep the spec's own mode (was: a group-readable 0644 spec became 0600, a shared 0664 one unwritable by
    the group), and a spec written anew gets the umask's mode, as an editor would give it."""
    project.chmod(0o664)
    c = client_for(project)
    loaded = c.get("/api/spec").json()
    new = loaded["text"].replace("  steps: 100\n", "  steps: 90\n")
    r = c.post("/api/save", json={"text": new, "base_sha": loaded["disk_sha"]})
    assert r.status_code == 200, r.text
    assert project.stat().st_mode & 0o7777 == 0o664
    assert (project.parent / "quickstart.yaml.bak").stat().st_mode & 0o7777 == 0o664
    project.unlink()
    old = os.umask(0o027)
    try:
        c = client_for(project)  # the studio reads the umask when it starts
    finally:
        os.umask(old)
    assert c.post("/api/save", json={"text": new, "base_sha": None}).status_code == 200
    assert project.stat().st_mode & 0o7777 == 0o640 and project.read_text() == new



def test_a_data_file_edited_on_disk_is_read_again(client, project):
    """The rows and preflight's report were cached by the spec text alone: a data file edited (or made) while the
    page was open kept its old rows in the data tab until the studio restarted."""
    text = project.read_text()
    data = project.parent / "data" / "addition.jsonl"
    assert client.post("/api/rows", json={"text": text}).json()["total"] == 100
    assert client.post("/api/preflight", json={"text": text}).status_code == 200
    data.write_text('{"question": "9+9", "answer": "18"}\n')
    rows = client.post("/api/rows", json={"text": text}).json()
    assert rows["total"] == 1 and rows["rows"][0]["fields"] == {"question": "9+9", "answer": "18"}
    report = client.post("/api/preflight", json={"text": text}).json()
    assert any("only 1 training rows" in p["message"] for p in report["problems"]), report["problems"]
    data.unlink()
    r = client.post("/api/rows", json={"text": text})
    assert r.status_code == 422 and "not found" in r.json()["error"]
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    assert client.post("/api/rows", json={"text": text}).json()["total"] == 2
