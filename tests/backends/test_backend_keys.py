"""API keys are checked for their form before any client starts: one line naming the variable, never the key."""

from __future__ import annotations

import inspect

import pytest

from sailrl.cli import main
from sailrl.runtime.backends.backend import BackendError, check_keys, tinker_key_problem

KEY = "tml-0123456789abcdef"
LOCAL = "sailrl run s.yaml --sampler local --set model.name=sailrl/tiny"


@pytest.fixture(autouse=True)
def _no_credential_cmd(monkeypatch):
    monkeypatch.delenv("TINKER_CREDENTIAL_CMD", raising=False)


@pytest.mark.parametrize(("value", "problem"), [
    ("sk-0123456789", "a Tinker API key starts with 'tml-'"),
    ("0123456789", "a Tinker API key starts with 'tml-'"),
    (" " + KEY, "it starts with a space or a line break"),
    (KEY + "\n", "it ends with a space or a line break"),
])
def test_a_malformed_tinker_key_is_one_line_without_the_key(monkeypatch, value, problem):
    monkeypatch.setenv("TINKER_API_KEY", value)
    monkeypatch.setenv("SAIL_API_KEY", "sail-key")
    with pytest.raises(BackendError) as err:
        check_keys("sail", "s.yaml")
    msg = str(err.value)
    assert msg == (f"TINKER_API_KEY does not look like a Tinker API key ({problem}): copy the key from the Tinker "
                   f"console again and export it as TINKER_API_KEY=tml-..., or run on the embedded local backend "
                   f"instead: {LOCAL}")
    assert value.strip() not in msg and "\n" not in msg


def test_well_formed_keys_pass(monkeypatch):
    for value in (KEY, "eyJhbGciOiJIUzI1NiJ9.e30.sig"):
        monkeypatch.setenv("TINKER_API_KEY", value)
        check_keys("tinker")
        assert tinker_key_problem(value) is None
    check_keys("local")  # no key needed


def test_a_credential_command_lets_the_sdk_decide(monkeypatch):
    # With TINKER_CREDENTIAL_CMD set, the SDK falls back to it when the key has the wrong form.
    monkeypatch.setenv("TINKER_API_KEY", "not-a-key")
    monkeypatch.setenv("TINKER_CREDENTIAL_CMD", "echo tml-from-cmd")
    check_keys("tinker")


def test_the_rule_is_the_sdks():
    from tinker.lib._auth_token_provider import ApiKeyAuthProvider

    source = inspect.getsource(ApiKeyAuthProvider.__init__)
    assert 'startswith("tml-")' in source and 'startswith("eyJ")' in source
    for value, ok in (("tml-x", True), ("eyJx", True), ("x", False), ("TML-x", False)):
        assert (tinker_key_problem(value) is None) is ok
        try:
            ApiKeyAuthProvider(value)
            accepted = True
        except Exception:  # noqa: BLE001 -- tinker.TinkerError
            accepted = False
        assert accepted is ok


def test_run_with_a_malformed_key_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TINKER_API_KEY", "sk-wrong")
    monkeypatch.setenv("SAIL_API_KEY", "sail-key")
    monkeypatch.chdir(tmp_path)
    from pathlib import Path

    quickstart = Path(__file__).resolve().parents[2] / "spec" / "examples" / "quickstart.yaml"
    rc = main(["run", str(quickstart), "--sampler", "sail", "--set", f"output.run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert err.splitlines()[-1].startswith("error: TINKER_API_KEY does not look like a Tinker API key")
    assert "sk-wrong" not in err and "Traceback" not in err
