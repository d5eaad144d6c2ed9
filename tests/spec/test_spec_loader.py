"""The spec loader: YAML 1.2 scalars, Plain wrappers, locations, file handling, shipped specs, defaults."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

from sailrl.compiler.validate import validate_file, validate_text
from sailrl.spec.base import Plain
from sailrl.spec.errors import SpecErrors
from sailrl.spec.loader import load_spec, load_spec_text, parse_yaml, resolve_plain
from sailrl.spec.models import BUILTIN_MODELS
from sailrl.spec.schema import Spec

SPEC_DIR = Path(__file__).resolve().parents[2] / "spec"


@pytest.mark.parametrize(
    "text,value",
    [
        ("1e-5", 1e-5), ("2E-5", 2e-5), ("1.5", 1.5), ("-.5", -0.5), ("+3", 3), ("010", 10), ("0o10", 8),
        ("0x1F", 31), ("true", True), ("True", True), ("TRUE", True), ("false", False), ("FALSE", False),
        ("null", None), ("~", None), ("", None), (".inf", math.inf), ("-.Inf", -math.inf),
        # YAML 1.1 would turn these into bools, octal or ints; YAML 1.2 keeps them strings
        ("yes", "yes"), ("NO", "NO"), ("on", "on"), ("1_000", "1_000"), ("0b101", "0b101"), ("1e", "1e"),
        ("tRUE", "tRUE"), ("12:30", "12:30"),
    ],
)
def test_resolve_plain_follows_yaml_1_2_core(text, value):
    got = resolve_plain(text)
    assert got == value and type(got) is type(value)


def test_resolve_plain_nan():
    assert math.isnan(resolve_plain(".nan"))


def test_plain_scalars_are_wrapped_with_their_text():
    tree, data, _, errors = parse_yaml("a: 1e-5\nb: '1e-5'\nc: yes\nd: 010\ne: [true, x]\n")
    assert errors == []
    assert tree["a"] == Plain(1e-5, "1e-5") and tree["b"] == "1e-5" and tree["c"] == "yes"
    assert tree["d"] == Plain(10, "010") and tree["e"] == [Plain(True, "true"), "x"]
    assert data == {"a": 1e-5, "b": "1e-5", "c": "yes", "d": 10, "e": [True, "x"]}


def test_explicit_tags():
    tree, data, _, errors = parse_yaml("a: !!str 010\nb: !!float 3\n")
    assert errors == [] and tree["a"] == "010" and data["b"] == 3.0 and isinstance(data["b"], float)
    _, _, _, errors = parse_yaml("a: !python/object 1\n")
    assert len(errors) == 1 and errors[0].message == "unsupported YAML tag !python/object"
    assert (errors[0].line, errors[0].column, errors[0].key_path) == (1, 4, "a")


def test_anchors_and_aliases_are_resolved():
    _, data, _, errors = parse_yaml("a: &fmt {x: 1}\nb: *fmt\n")
    assert errors == [] and data == {"a": {"x": 1}, "b": {"x": 1}}


def test_null_means_unset_for_optional_text(write_spec, minimal_spec):
    text = minimal_spec.replace("  name: sailrl/tiny\n", "  name: sailrl/tiny\n  renderer: null\n")
    text += "description: ~\n"
    spec = load_spec(write_spec(text)).spec
    assert spec.model.renderer is None and spec.description is None


def test_loaded_spec_fields_and_locate(write_spec, minimal_spec):
    path = write_spec(minimal_spec + "training:\n  learning_rate: 1e-5\n")
    loaded = load_spec(path)
    assert loaded.path == path and loaded.text == path.read_text()
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert isinstance(loaded.spec, Spec) and loaded.data["reward"]["rules"][0]["kind"] == "answer"
    n = minimal_spec.count("\n")
    assert loaded.locate(("training", "learning_rate")) == (n + 2, 18)   # a scalar: its value
    assert loaded.locate("training.learning_rate") == (n + 2, 18)        # dotted form
    assert loaded.locate(("training",)) == (n + 1, 1)                    # a block mapping: its key
    assert loaded.locate(("dataset", "fields")) == (6, 11)               # a flow list: its '['
    assert loaded.locate(("reward", "rules", 0, "kind")) == (12, 13)
    assert loaded.locate(("reward", "rules", 0)) == (11, 7)              # a list item
    assert loaded.locate(("training", "steps")) is None                  # a default, not in the file


def test_load_spec_text_uses_the_given_filename():
    with pytest.raises(SpecErrors) as info:
        load_spec_text("name: x\n", filename="inline.yaml")
    assert {e.file for e in info.value.errors} == {"inline.yaml"}


def test_missing_file():
    with pytest.raises(SpecErrors) as info:
        load_spec("/nonexistent/spec.yaml")
    assert info.value.errors[0].message == "file not found"
    assert "sailrl init" in info.value.errors[0].hint


@pytest.mark.parametrize("text,message", [
    ("", "the spec file is empty"),
    ("# only a comment\n", "the spec file is empty"),
    ("- a\n- b\n", "a spec must be a mapping of sections (name:, model:, dataset:, ...)"),
])
def test_not_a_spec(text, message):
    with pytest.raises(SpecErrors) as info:
        load_spec_text(text, "x.yaml")
    assert [e.message for e in info.value.errors] == [message]


def test_byte_order_mark_and_crlf(write_spec, minimal_spec):
    path = write_spec("")
    path.write_bytes(b"\xef\xbb\xbf" + minimal_spec.replace("\n", "\r\n").encode())
    assert load_spec(path).spec.name == "test-run"


def test_missing_local_data_file(write_spec, minimal_spec):
    path = write_spec(minimal_spec.replace("rows.jsonl", "nothere.jsonl"))
    with pytest.raises(SpecErrors) as info:
        validate_file(path)
    err = info.value.errors[0]
    assert (err.key_path, err.line, err.column) == ("dataset.source", 5, 11)
    assert err.message == f"data file not found: {path.parent / 'nothere.jsonl'}"


def test_reward_example_disagreement_is_reported(write_spec, minimal_spec):
    text = minimal_spec + "examples:\n  - completion: 'so \\boxed{4}'\n    fields: {answer: '4'}\n    expect_total: 0.0\n"
    with pytest.raises(SpecErrors) as info:
        validate_file(write_spec(text))
    assert [e.key_path.split(".")[0] for e in info.value.errors] == ["examples"]


def test_reward_examples_that_agree(write_spec, minimal_spec):
    text = minimal_spec + "examples:\n  - completion: 'so \\boxed{4}'\n    fields: {answer: '4'}\n    expect_total: 1.0\n"
    assert validate_file(write_spec(text)).spec.examples[0].expect_total == 1.0


@pytest.mark.parametrize("name", sorted(p.name for p in (SPEC_DIR / "examples").glob("*.yaml")))
def test_shipped_example_specs_validate(name):
    loaded = validate_file(SPEC_DIR / "examples" / name)
    assert loaded.spec.name


def test_starter_spec_validates():
    # (`sailrl init` copies data/addition.jsonl beside it; tests/commands/test_cli_spec.py validates that as a file)
    spec = validate_text((SPEC_DIR / "starter.yaml").read_text(encoding="utf-8"), "<starter>").spec
    assert spec.model.name in BUILTIN_MODELS and spec.sampling.sampler == "local"  # no download, no keys
    assert spec.dataset.source == "data/addition.jsonl"
    assert spec.examples, "the starter shows worked reward examples"


def test_defaults_reproduce_the_sail_guide():
    spec = Spec.model_validate({
        "name": "g", "dataset": {"source": "x"}, "prompt": {"user": "{{ question }}"},
        "reward": {"rules": [{"name": "correct", "kind": "answer"}]},
    })
    assert spec.model.name == "moonshotai/Kimi-K2.6" and spec.model.lora_rank == 32
    t = spec.training
    assert (t.steps, t.group_size, t.groups_per_step, t.learning_rate, t.loss_fn) == (
        7, 4, 16, 1e-5, "importance_sampling")
    s = spec.sampling
    assert (s.sampler, s.max_tokens, s.temperature, s.completion_window) == ("sail", 1024, 1.0, "balanced")
