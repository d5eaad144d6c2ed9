"""Hostile input to the training methods and pipelines, each test one attack and the contract it must meet: a
user error is one located line (exit 1), never a traceback; records stay true (strict JSON, one method per run
directory); a huge row costs time bounded by the context, not by its size."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from sailrl.cli import main
from tests.methods.test_pipeline import write

ROOT = Path(__file__).resolve().parents[2]


def test_a_symbolic_link_loop_as_init_from_is_one_located_line_not_a_bug(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "b.yaml", "sums-b", training="  init_from: runs/loop-a\n")
    (tmp_path / "runs").mkdir()
    os.symlink("loop-b", tmp_path / "runs" / "loop-a")
    os.symlink("loop-a", tmp_path / "runs" / "loop-b")
    assert main(["run", "b.yaml"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("b.yaml:32:14: training.init_from: runs/loop-a is a symbolic link that leads to no folder "
                          "(a loop of links, or its target is gone)\n"), err
    assert "= code: S261 init-from-unfinished" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["loop-a", "loop-b"]


def test_a_symbolic_link_loop_as_the_run_directory_is_one_line_not_a_bug(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.yaml", "sums-a")
    (tmp_path / "runs").mkdir()
    os.symlink("sums-a", tmp_path / "runs" / "sums-a")  # a link to itself
    assert main(["run", "a.yaml"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert err.splitlines()[-1] == (f"error: {tmp_path}/runs/sums-a/metrics.jsonl cannot be read (Too many levels "
                                    "of symbolic links): check the run directory"), err
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["sums-a"]


MESSAGES_SPEC = """\
method: sft
name: long
model: {{name: sailrl/tiny, renderer: role_colon, lora_rank: 8, seed: 0}}
dataset:
  source: {source}
  fields: [messages]
sft: {{messages_field: messages, batch_size: 4}}
training: {{steps: 1, learning_rate: 1e-3}}
sampling: {{sampler: local, max_tokens: 8}}
output: {{run_dir: runs/long}}
"""


def _conversation(system: str, a: int) -> dict:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"{a}+1="},
                         {"role": "assistant", "content": str(a + 1)}]}


def _strict(line: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"metrics.jsonl holds {name}, which is not JSON: {line}")
    return json.loads(line, parse_constant=refuse)


def test_a_conversation_whose_reply_lies_past_the_context_is_skipped_not_trained_as_nan(tmp_path, monkeypatch,
                                                                                       capsys):
    # sailrl/tiny's context is 4,096 tokens (bytes): a 5,000-byte system message pushes the reply out of it, where
    # the datum is cut, its weights are all 0 and its NLL is 0/0.
    monkeypatch.chdir(tmp_path)
    rows = [_conversation("x" * 5000, 1), _conversation("be brief", 2), _conversation("be brief", 3)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "sft.yaml").write_text(MESSAGES_SPEC.format(source="rows.jsonl"), encoding="utf-8")
    assert main(["run", "sft.yaml"]) == 0
    err = capsys.readouterr().err
    assert ("skipped 1 dataset rows (first: row 0: its assistant turns begin after the model's context of 4,096 "
            "tokens, so nothing of them would be trained)") in err, err
    (line,) = (tmp_path / "runs" / "long" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    metrics = _strict(line)
    assert metrics["conversations"] == 4 and metrics["assistant_tokens"] > 0
    assert 4.0 < metrics["train/nll"] < 7.0  # about ln 259 for a random byte model


def test_a_dataset_whose_every_reply_lies_past_the_context_is_one_line_and_writes_nothing(tmp_path, monkeypatch,
                                                                                         capsys):
    monkeypatch.chdir(tmp_path)
    rows = [_conversation("x" * 5000, a) for a in range(3)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "sft.yaml").write_text(MESSAGES_SPEC.format(source="rows.jsonl"), encoding="utf-8")
    assert main(["run", "sft.yaml"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        "error: every one of the 3 selected rows was skipped (3 x its assistant turns begin after the model's "
        "context of 4,096 tokens, so nothing of them would be trained); fix the data or the fields the prompt and "
        "reward rules use"), err
    assert not (tmp_path / "runs").exists()


SUMS_SFT = """\
method: sft
name: sums
model: {name: sailrl/tiny, renderer: role_colon, lora_rank: 8, seed: 0}
dataset:
  source: addition.jsonl
  fields: [question, answer]
  eval: {count: 4}
prompt: {user: '{{ question }}=', reference_field: answer}
sft: {batch_size: 4}
training: {steps: 4, learning_rate: 1e-2, save_every: 2, eval_every: 2}
sampling: {sampler: local, max_tokens: 8}
output: {run_dir: runs/sums}
"""


def _summary(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith(("train nll: ", "eval nll: "))]


def test_a_resumed_sft_run_summarises_the_whole_run_as_an_uninterrupted_one_does(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "spec" / "examples" / "data" / "addition.jsonl", tmp_path)
    (tmp_path / "sft.yaml").write_text(SUMS_SFT, encoding="utf-8")
    assert main(["run", "sft.yaml", "--set", "output.run_dir=runs/whole"]) == 0
    whole = _summary(capsys.readouterr().out)
    assert main(["run", "sft.yaml", "--set", "training.steps=2"]) == 0  # stops after 2 steps, as a kill at a save
    capsys.readouterr()
    assert main(["run", "sft.yaml", "--resume"]) == 0
    resumed = _summary(capsys.readouterr().out)
    lines = [json.loads(x) for x in (tmp_path / "runs" / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert whole == [f"train nll: {lines[0]['train/nll']:.3f} -> {lines[-1]['train/nll']:.3f}",
                     f"eval nll: {lines[0]['eval/nll_start']:.3f} -> {lines[-1]['eval/nll']:.3f}"]
    assert resumed == whole  # not steps 3-4 alone, nor the held-out NLL of step 2 as its start


EDGE_DISTILL = """\
method: distill
name: edge
model: {name: sailrl/tiny, renderer: role_colon, lora_rank: 8, seed: 0}
dataset: {source: rows.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}=', reference_field: answer}
distill: {teacher: {name: sailrl/tiny}}
training: {steps: 1, learning_rate: 1e-3, group_size: 4, groups_per_step: 1}
sampling: {sampler: local, max_tokens: 4}
output: {run_dir: runs/edge}
"""


def test_a_distill_prompt_that_leaves_no_token_for_the_teachers_scoring_is_skipped_not_a_bug(tmp_path, monkeypatch,
                                                                                            capsys):
    # role_colon on the byte tokenizer: "User: <question>=\n\nAssistant:" is len(question) + 19 tokens. The context is
    # 4,096 and max_tokens 4: a 4,092-token prompt and a completion cut at 4 tokens fill the context, and the
    # teacher's compute_logprobs (a sample of 1 token after the sequence) has no room: that row is skipped; a
    # 4,091-token prompt trains.
    monkeypatch.chdir(tmp_path)
    rows = [{"question": "1" * 4073, "answer": "2"}, {"question": "1" * 4072, "answer": "2"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "distill.yaml").write_text(EDGE_DISTILL, encoding="utf-8")
    assert main(["run", "distill.yaml"]) == 0, capsys.readouterr().err[-3000:]
    err = capsys.readouterr().err
    assert ("skipped 1 dataset rows (first: row 0: prompt is 4,092 tokens; the model's context is 4,096 and "
            "sampling.max_tokens is 4, and scoring the whole sequence needs 1 token more, so a prompt may have at "
            "most 4,091)") in err, err
    (line,) = (tmp_path / "runs" / "edge" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    metrics = _strict(line)
    assert metrics["tokens/teacher"] > 4 * 4091 and metrics["distill/reverse_kl"] == metrics["distill/reverse_kl"]


LONG_DPO = """\
method: dpo
name: pairs
model: {name: sailrl/tiny-arith, renderer: role_colon, lora_rank: 8, seed: 0}
dataset: {source: pairs.jsonl, fields: [question, chosen, rejected]}
prompt: {user: '{{ question }}='}
dpo: {batch_size: 2}
training: {steps: 1, learning_rate: 1e-3}
sampling: {sampler: local, max_tokens: 8}
output: {run_dir: runs/pairs}
"""


def test_a_dpo_pair_longer_than_the_context_is_skipped_not_a_bug(tmp_path, monkeypatch, capsys):
    # The reference scores each sequence whole (compute_logprobs samples a token after it), so a pair cut at the
    # context cannot be scored: the run skips it.
    monkeypatch.chdir(tmp_path)
    rows = [{"question": "x" * 5000 + "2+3", "chosen": "5", "rejected": "6"},
            {"question": "2+3", "chosen": "5", "rejected": "6"}, {"question": "1+1", "chosen": "2", "rejected": "3"}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "dpo.yaml").write_text(LONG_DPO, encoding="utf-8")
    assert main(["run", "dpo.yaml"]) == 0, capsys.readouterr().err[-3000:]
    err = capsys.readouterr().err
    assert ("skipped 1 dataset rows (first: row 0: its prompt with the 'chosen' completion is 5,031 tokens; the "
            "model's context is 4,096 and a pair is scored whole with a token to spare, so at most 4,095)") in err, err
    (line,) = (tmp_path / "runs" / "pairs" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    metrics = _strict(line)
    assert abs(metrics["dpo/loss"] - 0.6931) < 1e-3  # step 1: the policy is the reference, every margin 0


def test_resume_with_a_spec_of_another_method_is_refused_and_leaves_the_run_as_it_was(tmp_path, monkeypatch, capsys):
    # Continuing would append RL steps after the SFT ones and rewrite config.json as RL: one run directory with two
    # methods' records.
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "spec" / "examples" / "data" / "addition.jsonl", tmp_path)
    (tmp_path / "sft.yaml").write_text(SUMS_SFT.replace("steps: 4,", "steps: 2,"), encoding="utf-8")
    assert main(["run", "sft.yaml"]) == 0
    run_dir = tmp_path / "runs" / "sums"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    write(tmp_path, "rl.yaml", "sums")  # an RL spec whose output.run_dir is runs/sums
    capsys.readouterr()
    assert main(["run", "rl.yaml", "--resume", "--set", "training.steps=4"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"error: {run_dir} holds a run of method sft (supervised fine-tuning on demonstrations), and this spec's "
        "method is rl: --resume continues a run with its own method. Set output.run_dir to a new directory "
        f"(training.init_from: {run_dir} starts from its final weights), or start over with --overwrite."), err
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_resume_over_a_config_that_is_not_json_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "spec" / "examples" / "data" / "addition.jsonl", tmp_path)
    (tmp_path / "sft.yaml").write_text(SUMS_SFT, encoding="utf-8")
    run_dir = tmp_path / "runs" / "sums"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text("{", encoding="utf-8")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n', encoding="utf-8")
    assert main(["run", "sft.yaml", "--resume"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"error: {run_dir}/config.json is not a run's config (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)): put back the file the run wrote, or start over with --overwrite"), err
    assert (run_dir / "config.json").read_text() == "{" and (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_conversation_of_more_messages_than_the_context_renders_only_what_reaches_it():
    # Rendering every message of a huge row costs time in proportion to its size, in the row check and at every
    # step that draws it, for a datum cut to the context's first tokens: only the messages that reach them render.
    import transformers
    from tinker_cookbook.supervised.data import conversation_to_datum

    from sailrl.runtime.backends.models import get_renderer
    from sailrl.runtime.supervised.datums import REDUCTION, TRAIN_ON, conversation_datum

    renderer = get_renderer("role_colon", transformers.ByT5Tokenizer(extra_ids=0))
    seen: list[int] = []

    class Counting:
        def __getattr__(self, name):
            return getattr(renderer, name)

        def build_supervised_example(self, messages, **kwargs):
            seen.append(len(messages))
            return renderer.build_supervised_example(messages, **kwargs)

    messages = [m for a in range(1500) for m in ({"role": "user", "content": f"{a % 10}+1="},
                                                   {"role": "assistant", "content": str(a % 10 + 1)})]
    datum = conversation_datum(messages, Counting(), 512)
    assert seen == [513]
    whole = conversation_to_datum(messages, renderer, 512, TRAIN_ON, reduction=REDUCTION)
    assert datum.model_input.to_ints() == whole.model_input.to_ints() and len(datum.model_input.to_ints()) == 511
    for key in ("target_tokens", "weights"):
        assert datum.loss_fn_inputs[key].tolist() == whole.loss_fn_inputs[key].tolist()
    assert conversation_datum(messages[:40], Counting(), 512).model_input.to_ints() == \
        conversation_to_datum(messages[:40], renderer, 512, TRAIN_ON, reduction=REDUCTION).model_input.to_ints()
    assert seen == [513, 40]


LOCAL_SFT = """\
method: sft
name: local
model: {{name: ./model, lora_rank: 8, seed: 0}}
dataset: {{source: rows.jsonl, fields: [{fields}]}}
{section}
training: {{steps: 1, learning_rate: 1e-3}}
sampling: {{sampler: local, max_tokens: 8}}
output: {{run_dir: runs/local}}
"""


def test_sft_on_a_local_model_with_its_own_chat_template_trains_and_skips_what_it_cannot(tmp_path, monkeypatch,
                                                                                         capsys):
    # A local model folder's default renderer is chat_template, which builds only a conversation's last assistant
    # message; SFT asked it for every assistant message, a ValueError on every row (exit 70).
    from tests.fakes.tiny_models import save_model_dir

    monkeypatch.chdir(tmp_path)
    save_model_dir("qwen2", tmp_path / "model")
    rows = [{"question": f"{a}+1", "answer": str(a + 1)} for a in range(4)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    section = "prompt: {user: '{{ question }}=', reference_field: answer}\nsft: {batch_size: 4}"
    (tmp_path / "sft.yaml").write_text(LOCAL_SFT.format(fields="question, answer", section=section), encoding="utf-8")
    assert main(["run", "sft.yaml"]) == 0, capsys.readouterr().err[-3000:]
    (line,) = (tmp_path / "runs" / "local" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    metrics = _strict(line)
    assert metrics["conversations"] == 4 and metrics["assistant_tokens"] >= 4 and metrics["train/nll"] > 0

    two_turns = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
                 {"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    rows = [{"messages": two_turns}, {"messages": two_turns[:2]}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    section = "sft: {messages_field: messages, batch_size: 2}"
    (tmp_path / "sft.yaml").write_text(LOCAL_SFT.format(fields="messages", section=section), encoding="utf-8")
    capsys.readouterr()
    assert main(["run", "sft.yaml", "--overwrite"]) == 0, capsys.readouterr().err[-3000:]
    err = capsys.readouterr().err
    assert ("skipped 1 dataset rows (first: row 0: it has 2 assistant messages or does not end with one, and the "
            "chat_template renderer (the model's own template) trains only a conversation that ends in its one "
            "assistant message: set model.renderer to one that trains every turn (role_colon works with any "
            "tokenizer))") in err, err


def test_a_conversation_with_one_assistant_message_at_its_end_trains_as_every_assistant_message_would():
    import transformers
    from tinker_cookbook.supervised.data import conversation_to_datum

    from sailrl.runtime.backends.models import get_renderer
    from sailrl.runtime.supervised.datums import REDUCTION, TRAIN_ON, conversation_datum

    renderer = get_renderer("role_colon", transformers.ByT5Tokenizer(extra_ids=0))
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "3+4="},
                {"role": "assistant", "content": "7"}]
    datum = conversation_datum(messages, renderer, 4096)
    every = conversation_to_datum(messages, renderer, 4096, TRAIN_ON, reduction=REDUCTION)
    assert datum.model_input.to_ints() == every.model_input.to_ints()
    for key in ("target_tokens", "weights"):
        assert datum.loss_fn_inputs[key].tolist() == every.loss_fn_inputs[key].tolist()
    assert sum(w > 0 for w in datum.loss_fn_inputs["weights"].tolist()) == len(" 7\n\nUser:")  # reply, end of turn


def test_a_dpo_completion_that_is_a_list_of_messages_is_located_at_validate_and_skipped_by_the_run(tmp_path):
    # Preference datasets often hold each side as a conversation; read as text it would train on its Python repr.
    from sailrl.runtime.prompts.pairs import pair_problem
    from tests.methods.test_dpo_spec import SPEC, _problems

    side = [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]
    row = {"q": "2+3", "good": side, "bad": [*side[:1], {"role": "assistant", "content": "6"}]}
    assert pair_problem(row, "good", "bad") == "its 'good' completion is a list, not text"
    assert pair_problem({**row, "good": "5", "bad": {"text": "6"}}, "good", "bad") == \
        "its 'bad' completion is a mapping, not text"
    assert pair_problem({**row, "good": 5, "bad": "6"}, "good", "bad") is None
    assert _problems(tmp_path, SPEC, [{"q": "1+1", "good": "2", "bad": "3"}, row]) == [
        ("S264", "dpo.chosen_field", 10, 17, "dataset row 1's good completion is a list, not text, so that pair "
                                             "cannot train")]


def test_the_row_check_renders_only_the_conversations_that_might_not_fit(tmp_path):
    # Rendering every row whole when the run opens costs each row's tokenisation; a bound on the text's bytes
    # settles short rows, and only a row that might not fit is rendered.
    import transformers

    from sailrl.compiler.validate import validate_text
    from sailrl.runtime.backends.models import get_renderer
    from sailrl.runtime.supervised.run import _row_check

    (tmp_path / "rows.jsonl").write_text("", encoding="utf-8")
    spec = validate_text(MESSAGES_SPEC.format(source="rows.jsonl"), "sft.yaml", path=tmp_path / "sft.yaml").spec
    renderer = get_renderer("role_colon", transformers.ByT5Tokenizer(extra_ids=0))
    rendered: list[list[str]] = []

    class Counting:
        def __getattr__(self, name):
            return getattr(renderer, name)

        def build_supervised_example(self, messages, **kwargs):
            rendered.append([m["content"] for m in messages])
            return renderer.build_supervised_example(messages, **kwargs)

    check = _row_check(spec, None, Counting(), 4096)
    assert [check(_conversation("be brief", a) | {"_index": a}) for a in range(50)] == [None] * 50
    assert rendered == [["", "", ""]]  # the roles' own tokens, measured once
    assert check(_conversation("x" * 2100, 7) | {"_index": 50}) is None  # might not fit: rendered, and fits
    assert check(_conversation("x" * 5000, 7) | {"_index": 51}) == (
        "its assistant turns begin after the model's context of 4,096 tokens, so nothing of them would be trained")
    assert [len(r[0]) for r in rendered] == [0, 2100, 5000]


def test_a_value_that_is_not_finite_is_logged_as_null_so_metrics_stay_json(tmp_path):
    from sailrl.compiler.validate import validate_text
    from sailrl.runtime.loop.console import RunConsole
    from sailrl.runtime.planning.cost import CostModel
    from sailrl.runtime.rundir.directory import RunDirectory
    from sailrl.runtime.supervised.records import StepRecords

    (tmp_path / "rows.jsonl").write_text("", encoding="utf-8")
    spec = validate_text(MESSAGES_SPEC.format(source="rows.jsonl"), "sft.yaml", path=tmp_path / "sft.yaml").spec
    records = StepRecords(spec=spec, run_dir=RunDirectory(tmp_path / "run"), console=RunConsole(quiet=True),
                          cost=CostModel.from_spec(spec), completed=0, is_local=True)
    records.add(1, {"train/nll": float("nan"), "eval/nll": float("inf"), "learning_rate": 1e-3})
    records.end_step(1)
    (line,) = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    metrics = _strict(line)
    assert metrics["train/nll"] is None and metrics["eval/nll"] is None and metrics["learning_rate"] == 1e-3
    assert records.summary("local://x") == "done: 1 steps; final state local://x"


def test_a_stage_number_is_written_in_ascii_digits():
    from sailrl.commands.run import stage_overrides

    # "١" (ARABIC-INDIC DIGIT ONE) is a digit to Python's int() and to \d, but no stage number a user writes.
    assert stage_overrides(["\u0661:training.steps=1"], 2) == [["\u0661:training.steps=1"]] * 2
    assert stage_overrides(["2:training.steps=1"], 2) == [[], ["training.steps=1"]]


def test_a_completion_beside_a_messages_field_is_a_located_warning(tmp_path, monkeypatch, capsys):
    # The messages field is each row's whole conversation: the completion template is never read.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.jsonl").write_text(json.dumps(_conversation("be brief", 1)) + "\n", encoding="utf-8")
    text = MESSAGES_SPEC.format(source="rows.jsonl").replace(
        "sft: {messages_field: messages, batch_size: 4}", "sft: {messages_field: messages, batch_size: 4,\n"
        "      completion: '{{ messages }}'}")
    (tmp_path / "sft.yaml").write_text(text, encoding="utf-8")
    assert main(["validate", "sft.yaml"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("sft.yaml:8:19: warning: sft.completion: sft.completion is not read: sft.messages_field "
                          "'messages' holds each row's whole conversation, its assistant messages the replies that "
                          "train\n"), err
    assert "= code: W105 sft-completion-unused" in err
