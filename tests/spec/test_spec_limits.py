"""Inputs that used to crash or hang validation: each is a located problem stating its limit, answered quickly."""

from __future__ import annotations

import time

import pytest
from tests.conftest import MINIMAL_SPEC

from sailrl.cli import main
from sailrl.compiler.validate import validate_file, validate_text
from sailrl.spec.constants import MAX_INT_DIGITS, MAX_NESTING, MAX_SPEC_BYTES, MAX_VALUES
from sailrl.spec.errors import SpecErrors
from sailrl.spec.loader import resolve_plain

N = MINIMAL_SPEC.count("\n")


def problems_of(text: str) -> list:
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "s.yaml")
    return info.value.errors


def timed(text: str) -> tuple[list, float]:
    start = time.perf_counter()
    found = problems_of(text)
    return found, time.perf_counter() - start


@pytest.mark.parametrize("nested", [
    "[" * 600 + "]" * 600,                                          # flow lists
    "{a: " * 600 + "1" + "}" * 600,                                 # flow mappings
])
def test_deep_flow_nesting_is_a_located_error_not_a_recursion_error(nested):
    found, took = timed(MINIMAL_SPEC + f"description: {nested}\n")
    deep = [e for e in found if e.code == "S020"]
    # a located error, not a RecursionError or a hang: ~0.2 s quiet, up to ~5 s on 2 cores under load 10 (the
    # bound only has to catch a hang or a blow-up; speed is measured in benchmarks, not here)
    assert len(deep) == 1 and took < 30
    # the document is level 1, so the 50th '[' (column 14 + 49) or the key inside the 49th '{' is level 51
    assert (deep[0].line, deep[0].column) == (N + 1, 14 + 49 if nested[0] == "[" else 14 + 4 * 48 + 1)
    assert f"nested more than {MAX_NESTING} levels deep" in deep[0].message


def test_deep_block_nesting_is_located_at_the_level_past_the_limit():
    text = "name: x\n" + "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n"
    found, took = timed(text)
    err = next(e for e in found if e.code == "S020")
    assert (err.line, err.column) == (2 + MAX_NESTING - 1, MAX_NESTING) and took < 2


def test_aliases_cannot_nest_deeper_than_the_limit_either():
    lines = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 1) + "]" for i in range(1, 80)]
    found = problems_of("name: x\n" + "\n".join(lines) + "\n")
    assert any(e.code == "S020" and "aliases expanded" in e.message for e in found)


def test_an_alias_bomb_fails_fast_at_the_alias_that_passes_the_limit():
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    text = "\n".join(lines) + "\n"
    assert len(text) < 2600  # the classic 'billion laughs', ~10**9 values expanded
    found, took = timed(text)
    bomb = [e for e in found if e.code == "S019"]
    assert len(bomb) == 1 and took < 1
    assert (bomb[0].line, bomb[0].column) == (5, 4)  # e: 9**5 values > 20,000
    assert f"more than {MAX_VALUES:,} values" in bomb[0].message
    # what came before the bomb is still checked
    assert [e.key_path for e in found if e.code == "S101"] == ["a", "b", "c", "d"]


def test_a_form_feed_in_a_comment_is_located_and_the_rest_is_still_checked():
    text = MINIMAL_SPEC.replace("model:\n", "model:   # a comment\x0c here\n") + "training:\n  group_size: 1\n"
    found = problems_of(text)
    assert [(e.code, e.line, e.column) for e in found] == [("S014", 2, 21), ("S214", N + 2, 15)]
    assert "U+000C (form feed)" in found[0].message
    report = SpecErrors(found, text).format()
    assert "2 | model:   # a comment\x0c here" in report  # the excerpt is the right line


def test_a_model_name_over_255_bytes_is_a_located_error_in_validate_and_compile(tmp_path, capsys):
    long_name = "org/" + "m" * 300
    text = MINIMAL_SPEC.replace("name: sailrl/tiny", f"name: {long_name}")
    found = problems_of(text)
    err = next(e for e in found if e.key_path == "model.name")
    assert err.code == "S225" and (err.line, err.column) == (3, 9)
    assert "300 bytes long; file systems allow 255 bytes a name" in err.message
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    (tmp_path / "rows.jsonl").write_text('{"question": "1", "answer": "1"}\n')
    assert main(["compile", str(spec), "-o", str(tmp_path / "out.py")]) == 1
    out = capsys.readouterr().err
    assert "Traceback" not in out and "S225" in out and "File name too long" not in out
    assert main(["compile", str(tmp_path / ("x" * 300 + ".yaml"))]) == 1
    err = capsys.readouterr().err
    assert "cannot read the file: File name too long" in err and "S002" in err


def test_a_dataset_path_over_255_bytes_is_located_too():
    found = problems_of(MINIMAL_SPEC.replace("source: rows.jsonl", "source: " + "d" * 300 + ".jsonl"))
    assert [(e.code, e.key_path, e.line) for e in found] == [("S225", "dataset.source", 5)]


def test_an_integer_over_4300_digits_is_a_located_error():
    found = problems_of(MINIMAL_SPEC + "training:\n  steps: " + "9" * 5000 + "\n")
    err = next(e for e in found if e.code == "S021")
    assert (err.key_path, err.line, err.column) == ("training.steps", N + 2, 10)
    assert err.message == f"this integer has 5,000 digits; a number in a spec has at most {MAX_INT_DIGITS:,}"
    assert resolve_plain("9" * 5000) == "9" * 5000  # stays text instead of raising ValueError


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(MINIMAL_SPEC + "description: '" + "x" * (50 * 1024 * 1024) + "'\n")
    start = time.perf_counter()
    with pytest.raises(SpecErrors) as info:
        validate_file(path)
    assert time.perf_counter() - start < 1
    (err,) = info.value.errors
    assert err.code == "S004" and err.message == "the spec is 50.0 MiB; a spec file may be at most 256 KiB"
    with pytest.raises(SpecErrors) as info:  # the same limit for text (e.g. a spec rendered with --set values)
        validate_text("a" * (MAX_SPEC_BYTES + 1), "t.yaml")
    assert info.value.errors[0].code == "S004"


def test_thousands_of_unknown_keys_report_fifty_and_count_the_rest():
    keys = ", ".join(f"k{i}: 1" for i in range(6000))
    text = MINIMAL_SPEC + "training: {" + keys + "}\n"
    start = time.perf_counter()
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "s.yaml")
    assert time.perf_counter() - start < 30  # stops at 50 instead of building 6,000 messages (no hang; ~1 s quiet)
    exc = info.value
    assert len(exc.errors) == 50 and exc.omitted == 5950
    assert all(e.code == "S101" for e in exc.errors)
    assert exc.format().endswith("50 problems in s.yaml shown, and 5950 more not shown (a report lists at most "
                                 "50; fix these and run again).")


def test_an_escape_outside_unicode_is_a_located_error():
    found = problems_of('name: "\\U99999999"\n')
    assert (found[0].code, found[0].line, found[0].column) == ("S012", 1, 10)


def test_a_deeply_nested_regex_is_a_located_error():
    pattern = "(" * 600 + "a" + ")" * 600
    found = problems_of(MINIMAL_SPEC.replace("sampling:", f"    - name: m\n      kind: match\n      pattern: '{pattern}'\n"
                                             "sampling:"))
    (err,) = [e for e in found if e.key_path == "reward.rules.1.pattern"]
    assert err.code == "S201" and "nested more than 100 levels deep" in err.message
    assert err.column == 17 + 100  # at the 101st '(' (the first is at column 17)


def test_a_regex_that_expands_at_compile_time_is_refused():
    found = problems_of(MINIMAL_SPEC.replace("sampling:", "    - name: m\n      kind: match\n"
                                             "      pattern: '(?:a{1000}){1000}'\nsampling:"))
    (err,) = [e for e in found if e.key_path == "reward.rules.1.pattern"]
    assert err.message.startswith("this regular expression is over a limit: repeats a part at least 1,000,000 times")


@pytest.mark.parametrize("template,words", [
    ("{{ " + "(" * 60 + "question" + ")" * 60 + " }}", "brackets are nested more than 20 levels deep"),
    ("{% if question %}" * 60 + "x" + "{% endif %}" * 60, "are nested more than 20 levels deep"),
    ("{{ question" + "|upper" * 300 + " }}", "nest more than 40 levels deep"),
    ("{{ 1" + " + 1" * 700 + " }}", "nest more than 40 levels deep"),
])
def test_deeply_nested_templates_are_located_errors_answered_quickly(template, words):
    found, took = timed(MINIMAL_SPEC.replace("'{{ question }}'", f"'{template}'"))
    (err,) = [e for e in found if e.key_path == "prompt.user"]
    assert err.code == "S208" and words in err.message and took < 2


def test_a_traceback_never_exits_with_the_invalid_spec_code(monkeypatch, capsys, write_spec):
    import sailrl.commands.validate as validate

    def boom(args):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(validate, "run", boom)
    assert main(["validate", str(write_spec(MINIMAL_SPEC))]) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error (a bug in sailrl, not a problem in your files)" in err
