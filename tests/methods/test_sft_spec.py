"""method: sft without training: the spec validates and compiles, keys of another method and rows with nothing to
train on are located lines, the datum's weights train the assistant turn only, explain and the cost estimate say
what the run trains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import ByT5Tokenizer

from sailrl.compiler.validate import validate_text
from sailrl.runtime.backends.models import get_renderer
from sailrl.runtime.planning.cost import estimate_supervised, sft_evals
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.prompts.conversations import ConversationError, conversation, messages_problem
from sailrl.runtime.supervised.datums import conversation_datum
from sailrl.spec.errors import SpecErrors

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "spec/examples/sft_sums.yaml"

SPEC = """\
method: sft
name: t
model: {name: sailrl/tiny}
dataset:
  source: data.jsonl
  fields: [question, answer]
prompt:
  user: '{{ question }}='
sft:
  batch_size: 4
sampling: {sampler: local}
"""


def _problems(tmp_path: Path, text: str, rows: list[dict]) -> SpecErrors:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spec.yaml").write_text(text)
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "spec.yaml", path=tmp_path / "spec.yaml")
    return info.value


def _codes(errors: SpecErrors) -> list[tuple[str, str, int]]:
    return [(e.code, e.key_path, e.line) for e in errors.errors if not e.is_warning]


def test_the_example_validates_and_compiles_the_same_bytes_twice(tmp_path):
    out, texts = tmp_path / "sft_sums.py", []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-m", "sailrl", "compile", "spec/examples/sft_sums.yaml", "-o", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        texts.append(out.read_text())
    text = texts[0]
    assert texts[1] == text
    assert "from sailrl.runtime.supervised.run import SupervisedRun" in text
    assert 'fb = await run.training_client.forward_backward_async(data, loss_fn="cross_entropy")' in text
    assert '"method": "sft",  # method' in text and '"batch_size": 32,  # sft.batch_size' in text


def test_validate_says_what_an_sft_spec_trains():
    r = subprocess.run([sys.executable, "-m", "sailrl", "validate", "spec/examples/sft_sums.yaml"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == [
        "ok: spec/examples/sft_sums.yaml (1 warning)",  # W101: greedy samples (sampling.temperature 0)
        "  Each row becomes a conversation: the prompt (prompt.user), then sft.completion as the assistant's reply."]
    assert "cross_entropy on the assistant tokens only" in r.stdout


def test_explain_says_the_training_then_the_rules_that_score_samples():
    r = subprocess.run([sys.executable, "-m", "sailrl", "explain", "spec/examples/sft_sums.yaml"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Training of 'sft_sums' (method sft, supervised fine-tuning on demonstrations):"
    assert "  300 steps of 32 conversations each (the rows in a seeded order, epoch after epoch), Adam at learning " \
           "rate 0.003." in lines
    assert "Reward rules of 'sft_sums', scoring one sample per held-out row:" in lines
    # an SFT run logs no per-step 'correct': its rules score the held-out samples (eval/correct)
    assert "  'eval/correct' (logged at each evaluation) is the fraction of the held-out samples that pass " \
           "'correct'." in lines
    assert not any("logged each step" in x for x in lines)
    assert any(x.startswith("Estimated cost of 'sft_sums' (local backend, sailrl/tiny): 300 SFT steps x 32 "
                            "conversations = 9,600 conversations trained, 7 evaluations") for x in lines)


def test_a_key_of_another_method_is_located(tmp_path):
    text = SPEC + "training:\n  group_size: 8\n"
    errors = _problems(tmp_path, text, [{"question": "1+1", "answer": "2"}])
    assert _codes(errors) == [("S257", "training.group_size", 13)]
    assert "training.group_size is read only by method distill and rl; this spec's method is sft" in \
        errors.errors[0].message


def test_an_empty_reply_on_the_first_rows_is_located_at_the_completion(tmp_path):
    text = SPEC.replace("  batch_size: 4\n", "  batch_size: 4\n  completion: '{{ answer | trim }}'\n")
    errors = _problems(tmp_path, text, [{"question": "1+1", "answer": "2"}, {"question": "2+2", "answer": "  "}])
    assert _codes(errors) == [("S259", "sft.completion", 11)]
    assert errors.errors[0].message == ("sft.completion renders to an empty reply on dataset row 1, so that row has "
                                        "nothing to train on")


def test_a_completion_template_reading_an_undeclared_field_is_located(tmp_path):
    text = SPEC.replace("  batch_size: 4\n", "  batch_size: 4\n  completion: 'It is {{ answr }}'\n")
    errors = _problems(tmp_path, text, [{"question": "1+1", "answer": "2"}])
    assert _codes(errors) == [("S206", "sft.completion", 11)]
    assert errors.errors[0].message == ("the template uses 'answr', which is not a dataset field -- did you mean "
                                        "'answer'?")
    assert errors.errors[0].column == 25  # at the name, inside the template


def test_a_completion_template_that_does_not_parse_is_located(tmp_path):
    text = SPEC.replace("  batch_size: 4\n", "  batch_size: 4\n  completion: '{{ answer '\n")
    errors = _problems(tmp_path, text, [{"question": "1+1", "answer": "2"}])
    assert [c[:2] for c in _codes(errors)] == [("S203", "sft.completion")]


def test_an_empty_reference_answer_is_located_at_the_method_when_nothing_else_names_it(tmp_path):
    errors = _problems(tmp_path, SPEC, [{"question": "1+1", "answer": ""}])
    assert _codes(errors) == [("S259", "method", 1)]


MESSAGES_SPEC = """\
method: sft
name: t
model: {name: sailrl/tiny}
dataset:
  source: data.jsonl
  fields: [chat]
sft:
  messages_field: chat
sampling: {sampler: local}
"""


def test_a_messages_field_not_declared_is_located(tmp_path):
    text = MESSAGES_SPEC.replace("messages_field: chat", "messages_field: talk")
    errors = _problems(tmp_path, text, [{"chat": [{"role": "user", "content": "hi"}]}])
    assert _codes(errors) == [("S260", "sft.messages_field", 8)]
    assert "'talk' is not a declared dataset field (dataset.fields: chat)" in errors.errors[0].message


RULES = """\
reward:
  rules:
    - {name: short, kind: length, unit: chars, max: 3}
"""
CHAT_ROW = {"chat": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]}


def test_reward_rules_beside_whole_conversations_are_located_s266(tmp_path):
    errors = _problems(tmp_path, MESSAGES_SPEC + RULES, [CHAT_ROW])
    assert _codes(errors) == [("S266", "reward", 10)]
    assert errors.errors[0].message == (
        "an SFT spec whose rows hold whole conversations (sft.messages_field) has no prompt to sample a held-out "
        "reply from, so these reward rules would score nothing: remove the reward: section")
    assert "write the rows as prompt.user and sft.completion instead" in errors.errors[0].hint


def test_whole_conversations_without_rules_and_a_prompt_with_rules_validate(tmp_path):
    for text, rows in ((MESSAGES_SPEC, [CHAT_ROW]), (SPEC + RULES, [{"question": "1+1", "answer": "2"}])):
        (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        validate_text(text, "spec.yaml", path=tmp_path / "spec.yaml")  # raises SpecErrors on a problem


@pytest.mark.parametrize("value, code, words", [
    ("hello", "S260", "chat is str, not a list of {role, content} messages"),
    ([{"role": "user"}], "S260", "chat message 0 is not a {role, content} mapping"),
    ([{"role": "user", "content": "hi"}], "S260", "chat has no assistant message"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}], "S259",
     "chat message 1 (assistant) is empty"),
])
def test_a_row_whose_messages_cannot_train_is_located(tmp_path, value, code, words):
    good = {"chat": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    errors = _problems(tmp_path, MESSAGES_SPEC, [good, {"chat": value}])
    assert _codes(errors) == [(code, "sft.messages_field", 8)]
    assert f"on dataset row 1, {words}" in errors.errors[0].message


def test_the_messages_check_and_the_conversation_agree():
    assert messages_problem([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) is None
    assert messages_problem([{"role": "robot", "content": "a"}]) == \
        ("messages", "message 0 has role 'robot'; roles are system, user, assistant")


def _renderer():
    return get_renderer("role_colon", ByT5Tokenizer(extra_ids=0))


def test_the_datum_trains_the_assistant_reply_and_its_end_of_turn_only(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "data.jsonl").write_text('{"question": "2+3", "answer": "5"}\n')
    spec = validate_text(SPEC, "spec.yaml", path=tmp_path / "spec.yaml").spec
    renderer = _renderer()
    messages = conversation({"question": "2+3", "answer": "5", "_index": 0}, spec, PromptBuilder(spec.prompt, renderer))
    assert messages == [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]
    datum = conversation_datum(messages, renderer)
    tok = renderer.tokenizer
    targets = datum.loss_fn_inputs["target_tokens"].data
    weights = datum.loss_fn_inputs["weights"].data
    # "User: 2+3=\n\nAssistant: 5\n\nUser:" shifted by one: the 9 trained targets are " 5\n\nUser:" (the reply and
    # the stop sequence that ends it), 1/9 each; the prompt's targets weigh 0.
    trained = "".join(tok.decode([t]) for t, w in zip(targets, weights, strict=True) if w > 0)
    assert trained == " 5\n\nUser:"
    assert weights == [0.0] * (len(weights) - 9) + [pytest.approx(1 / 9)] * 9
    assert tok.decode(targets[: len(weights) - 9]) == "ser: 2+3=\n\nAssistant:"


def test_a_messages_conversation_trains_every_assistant_turn():
    renderer = _renderer()
    messages = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
                {"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    datum = conversation_datum(messages, renderer)
    tok = renderer.tokenizer
    targets, weights = datum.loss_fn_inputs["target_tokens"].data, datum.loss_fn_inputs["weights"].data
    runs, cur = [], ""
    for t, w in zip(targets, weights, strict=True):
        if w > 0:
            cur += tok.decode([t])
        elif cur:
            runs.append(cur)
            cur = ""
    runs.append(cur)
    # an earlier turn ends where the next user turn starts; the last one with the stop sequence
    assert runs == [" 2\n\n", " 4\n\nUser:"]
    assert sum(weights) == pytest.approx(1.0)


def test_a_row_with_an_empty_reply_is_refused_by_the_run_too(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "data.jsonl").write_text('{"question": "2+3", "answer": "5"}\n')
    spec = validate_text(SPEC, "spec.yaml", path=tmp_path / "spec.yaml").spec
    with pytest.raises(ConversationError, match="row 7: sft.completion renders to an empty reply"):
        conversation({"question": "1+1", "answer": " ", "_index": 7}, spec, PromptBuilder(spec.prompt, _renderer()))


def test_the_cost_estimate_counts_each_conversation_drawn_and_each_evaluation(tmp_path):
    text = SPEC.replace("  fields: [question, answer]\n", "  fields: [question, answer]\n  eval: {count: 1}\n") + \
        "training: {steps: 3, eval_every: 2}\n"
    (tmp_path / "spec.yaml").write_text(text)
    (tmp_path / "data.jsonl").write_text('{"question": "2+3", "answer": "5"}\n')
    spec = validate_text(text, "spec.yaml", path=tmp_path / "spec.yaml").spec
    assert sft_evals(spec) == 3  # before training, step 2, and the last step (3)
    e = estimate_supervised(spec, [10, 20, 30], [7])
    # 3 steps x 4 conversations = 12 draws of 3 rows: 4 full epochs of 60 tokens
    assert (e.tokens["trained"].low, e.tokens["trained"].high) == (240.0, 240.0)
    assert (e.tokens["eval_prompt"].low, e.tokens["eval_prompt"].high) == (21.0, 21.0)
    assert e.total_usd is not None and e.total_usd.high == 0.0  # the local backend is free
