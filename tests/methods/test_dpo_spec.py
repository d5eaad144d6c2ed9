"""method: dpo without training: the example validates and compiles the same bytes twice, bad pairs and keys of
another method are located lines, and a row's pair datums weight the reply's tokens only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import ByT5Tokenizer

from sailrl.compiler.validate import validate_text
from sailrl.runtime.backends.models import get_renderer
from sailrl.runtime.preference.pairs import pair_datums
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.prompts.pairs import pair_problem
from sailrl.spec.errors import SpecErrors
from sailrl.spec.schema import Spec

ROOT = Path(__file__).resolve().parents[2]

SPEC = """\
method: dpo
name: t
model: {name: sailrl/tiny-arith}
dataset:
  source: data.jsonl
  fields: [q, good, bad]
prompt:
  user: '{{ q }}='
dpo:
  chosen_field: good
  rejected_field: bad
sampling: {sampler: local}
"""
GOOD = [{"q": "1+1", "good": "2", "bad": "3"}, {"q": "2+2", "good": "4", "bad": "5"}]


def _problems(tmp_path: Path, text: str, rows: list[dict]) -> list[tuple[str, str, int, int, str]]:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spec.yaml").write_text(text)
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "spec.yaml", path=tmp_path / "spec.yaml")
    return [(e.code, e.key_path, e.line, e.column, e.message) for e in info.value.errors if not e.is_warning]


def test_the_example_validates_and_compiles_the_same_bytes_twice(tmp_path):
    out, texts = tmp_path / "dpo_sums.py", []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-m", "sailrl", "compile", "spec/examples/dpo_sums.yaml", "-o", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        texts.append(out.read_text())
    assert texts[0] == texts[1]
    assert "forward_backward_custom_async(data, loss_fn)" in texts[0]
    assert "pair_loss_fn(reference, beta)" in texts[0] and '"beta": 1.0,  # dpo.beta' in texts[0]


def test_a_valid_pair_spec_validates(tmp_path):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GOOD))
    loaded = validate_text(SPEC, "spec.yaml", path=tmp_path / "spec.yaml")
    assert loaded.spec.method == "dpo" and loaded.spec.dpo.chosen_field == "good"


def test_the_same_text_chosen_and_rejected_is_located_at_the_rejected_field(tmp_path):
    rows = [GOOD[0], {"q": "3+3", "good": " 6", "bad": "6 "}]
    assert _problems(tmp_path, SPEC, rows) == [
        ("S265", "dpo.rejected_field", 11, 19, "dataset row 1's good and bad completions are the same text, so the "
                                               "pair states no preference")]


def test_an_empty_completion_is_located_at_its_field(tmp_path):
    rows = [GOOD[0], {"q": "3+3", "good": "6", "bad": "  "}, {"q": "4+4", "good": "", "bad": "9"}]
    assert _problems(tmp_path, SPEC, rows) == [
        ("S264", "dpo.rejected_field", 11, 19, "dataset row 1's bad completion is empty, so that pair cannot train")]
    rows = [GOOD[0], {"q": "4+4", "good": "", "bad": "9"}]  # the first row with the problem is named, once
    assert _problems(tmp_path, SPEC, rows) == [
        ("S264", "dpo.chosen_field", 10, 17, "dataset row 1's good completion is empty, so that pair cannot train")]


def test_undeclared_pair_fields_are_located(tmp_path):
    text = SPEC.replace("fields: [q, good, bad]", "fields: [q, good]")
    assert _problems(tmp_path, text, GOOD) == [
        ("S263", "dpo.rejected_field", 11, 19, "dpo.rejected_field 'bad' is not a declared dataset field "
                                               "(dataset.fields: q, good)")]
    defaults = text.replace("dpo:\n  chosen_field: good\n  rejected_field: bad\n", "")
    assert _problems(tmp_path, defaults, GOOD) == [
        ("S263", "method", 1, 9, "dpo.chosen_field 'chosen' and dpo.rejected_field 'rejected' are not declared "
                                 "dataset fields (dataset.fields: q, good)")]


def test_reward_rules_in_a_dpo_spec_are_a_key_of_another_method(tmp_path):
    text = SPEC + "reward:\n  rules:\n    - {name: c, kind: match, pattern: x}\n"
    (code, key, line, column, message), = _problems(tmp_path, text, GOOD)
    assert (code, key, line, column) == ("S257", "reward", 13, 1)
    assert message.startswith("method dpo learns from the chosen/rejected pairs, not from reward rules")


def test_sailrl_validate_exits_1_with_one_located_line_per_problem(tmp_path):
    (tmp_path / "data.jsonl").write_text(json.dumps({"q": "1+1", "good": "2", "bad": "2"}) + "\n")
    (tmp_path / "spec.yaml").write_text(SPEC)
    r = subprocess.run([sys.executable, "-m", "sailrl", "validate", str(tmp_path / "spec.yaml")], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{tmp_path / 'spec.yaml'}:11:19: dpo.rejected_field: dataset row 0's good and bad" in r.stderr + r.stdout
    assert "S265 dpo-same-completion" in r.stderr + r.stdout


def test_a_rows_pair_weights_its_reply_only_and_a_row_without_a_preference_is_named():
    spec = Spec.model_validate({"method": "dpo", "name": "t", "dataset": {"source": "x.jsonl"},
                                "prompt": {"user": "{{ q }}="}, "dpo": {"chosen_field": "good", "rejected_field": "bad"}})
    renderer = get_renderer("role_colon", ByT5Tokenizer(extra_ids=0))
    chosen, rejected = pair_datums(spec, PromptBuilder(spec.prompt, renderer), {"q": "2+3", "good": "5", "bad": "16"})
    tok = renderer.tokenizer
    for datum, reply in ((chosen, " 5\n\nUser:"), (rejected, " 16\n\nUser:")):
        targets = datum.loss_fn_inputs["target_tokens"].tolist()
        weights = datum.loss_fn_inputs["weights"].tolist()
        assert tok.decode([t for t, w in zip(targets, weights, strict=True) if w == 1.0]) == reply
        assert set(weights) == {0.0, 1.0} and weights[-len(tok.encode(reply, add_special_tokens=False)):] == \
            [1.0] * len(tok.encode(reply, add_special_tokens=False))
        assert tok.decode(datum.model_input.to_ints() + targets[-1:]) == "User: 2+3=\n\nAssistant:" + reply
    assert pair_problem({"q": "1", "good": 7, "bad": "7"}, "good", "bad") == \
        "its 'good' and 'bad' completions are the same text (no preference)"
    assert pair_problem({"q": "1", "good": "7"}, "good", "bad") == "it has no 'bad' field"
    assert pair_problem({"q": "1", "good": "7", "bad": " "}, "good", "bad") == "its 'bad' completion is empty"
