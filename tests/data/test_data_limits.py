"""Data the loader refuses or skips, each located: duplicate JSON keys, huge numbers, deep nesting, ragged and
header-only CSV files, and prompts too long for the model's context (skipped with their index and reason)."""

from __future__ import annotations

import functools
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sailrl.runtime.data as data
from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.data import DatasetError, load_rows
from sailrl.runtime.data.readers import MAX_CSV_CELL_CHARS, MAX_JSON_DEPTH, MAX_NUMBER_DIGITS
from sailrl.spec.errors import DataError, UserError
from sailrl.spec.schema import Spec


def make_spec(source: str, *, max_tokens: int = 8, **dataset) -> Spec:
    return Spec.model_validate({
        "name": "t",
        "model": {"name": "sailrl/tiny", "renderer": "role_colon"},
        "dataset": {"source": source, "shuffle": False, **dataset},
        "prompt": {"user": "{{ question }}="},
        "reward": {"rules": [{"name": "correct", "kind": "answer", "extract": {"from": "last_number"}}]},
        "sampling": {"max_tokens": max_tokens},
    })


def load_error(tmp_path, name: str, text: str) -> DatasetError:
    (tmp_path / name).write_text(text)
    started = time.perf_counter()
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec(name), tmp_path)
    assert time.perf_counter() - started < 2.0
    return err.value


def test_the_package_keeps_the_public_names():
    for name in ("load_rows", "DatasetRows", "SkippedRow", "DatasetError", "rows_for_step", "shuffle_seed",
                 "batches", "field_mapping", "required_fields", "LOCAL_SUFFIXES"):
        assert name in data.__all__ and hasattr(data, name)
    assert issubclass(DatasetError, DataError) and issubclass(DatasetError, UserError)
    assert issubclass(DatasetError, ValueError)


# ------------------------------------------------------------------------------------------- JSON


def test_duplicate_key_in_a_jsonl_object_names_file_line_and_key(tmp_path):
    err = load_error(tmp_path, "rows.jsonl", '{"question": "1+1", "answer": "2"}\n'
                                            '{"question": "2+2", "answer": "4", "answer": "5"}\n')
    assert str(err) == (f"{tmp_path / 'rows.jsonl'}:2: key 'answer' appears twice in one object; JSON keeps only "
                        f"the last value, so remove or rename one of them")
    assert (err.path, err.line) == (str(tmp_path / "rows.jsonl"), 2)


def test_duplicate_key_in_a_json_array_names_the_item_line(tmp_path):
    err = load_error(tmp_path, "rows.json", '[\n  {"question": "1+1", "answer": "2"},\n  {"question": "2+2",\n'
                                           '   "question": "3+3", "answer": "6"}\n]\n')
    assert str(err).startswith(f"{tmp_path / 'rows.json'}:3: item 1 of the array: key 'question' appears twice")
    assert err.line == 3


def test_a_5000_digit_number_is_a_located_error_with_the_limit(tmp_path):
    err = load_error(tmp_path, "rows.jsonl", '{"question": "1+1", "answer": "2"}\n'
                                            '{"question": "1+1", "answer": ' + "9" * 5000 + '}\n')
    assert str(err) == (f"{tmp_path / 'rows.jsonl'}:2: a number has 5,000 digits, more than the "
                        f"{MAX_NUMBER_DIGITS:,} sailrl reads; write it as a string (in double quotes) if it is "
                        f"meant as text")
    assert err.line == 2


def test_a_number_at_the_digit_limit_loads(tmp_path):
    big = "7" * MAX_NUMBER_DIGITS
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "answer": ' + big + '}\n')
    assert load_rows(make_spec("rows.jsonl"), tmp_path).train[0]["answer"] == int(big)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 100_000])
def test_a_deeply_nested_value_is_a_located_error_with_the_limit(tmp_path, depth):
    nested = "[" * depth + "]" * depth  # with the row object itself, depth + 1 levels
    err = load_error(tmp_path, "rows.jsonl", '{"question": "1+1", "answer": "2"}\n\n'
                                            '{"question": "1+1", "answer": "2", "x": ' + nested + '}\n')
    assert str(err) == (f"{tmp_path / 'rows.jsonl'}:3: a value is nested more than {MAX_JSON_DEPTH} levels deep "
                        f"(lists or objects inside each other), more than sailrl reads; flatten it")


def test_nesting_at_the_limit_loads(tmp_path):
    depth = MAX_JSON_DEPTH - 1
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "answer": "2", "x": ' + "[" * depth + "]" * depth + "}\n")
    row = load_rows(make_spec("rows.jsonl", fields=["question", "answer", "x"]), tmp_path).train[0]
    assert row["x"] == json.loads("[" * depth + "]" * depth)


def test_json_array_errors_are_located(tmp_path):
    err = load_error(tmp_path, "a.json", '[\n  {"question": "1+1", "answer": "2"},\n  5\n]\n')
    assert str(err) == f"{tmp_path / 'a.json'}:3: item 1 of the array is a JSON number, not an object with named fields"
    err = load_error(tmp_path, "b.json", '[\n  {"question": "1+1", "answer": "2"},\n]\n')
    assert str(err) == f"{tmp_path / 'b.json'}:3: malformed JSON: a ',' after the last item of the array; remove it"
    err = load_error(tmp_path, "c.json", '[\n  {"question": "1+1", "answer": "2"}\n')
    assert str(err) == f"{tmp_path / 'c.json'}: malformed JSON: the array is not closed with ']'"
    err = load_error(tmp_path, "d.json", '[{"question": "1+1", "answer": "2"}]\n{"x": 1}\n')
    assert str(err) == f"{tmp_path / 'd.json'}:2: malformed JSON: extra text after the array"


# ------------------------------------------------------------------------------------------- CSV


def test_a_ragged_csv_names_the_line_and_the_header(tmp_path):
    err = load_error(tmp_path, "rows.csv", "question,answer\n1+1,2\n2+2,4,extra\n")
    assert str(err) == (f"{tmp_path / 'rows.csv'}:3: the record on line 3 has 3 cells, but the header (line 1) "
                        f"has 2 columns (question, answer); a cell that contains a comma must be in double "
                        f'quotes, e.g. "3,4"')
    assert err.line == 3


def test_a_ragged_record_spanning_lines_names_them(tmp_path):
    err = load_error(tmp_path, "rows.csv", 'question,answer\n\n1+1,2\n"two\nlines"\n')
    assert str(err).startswith(f"{tmp_path / 'rows.csv'}:4: the record on lines 4-5 has 1 cell, but the header")


def test_a_header_only_csv_says_so(tmp_path):
    err = load_error(tmp_path, "rows.csv", "question,answer\n")
    assert str(err) == (f"{tmp_path / 'rows.csv'} has a header and no rows; add rows under the header line "
                        f"(question, answer)")


def test_csv_header_problems(tmp_path):
    err = load_error(tmp_path, "a.csv", "question,answer,\n1+1,2,\n")
    assert str(err) == f"{tmp_path / 'a.csv'}:1: column 3 of the header has no name; name it, or remove the extra delimiter"
    err = load_error(tmp_path, "b.csv", "question,question\n1,2\n")
    assert str(err) == f"{tmp_path / 'b.csv'}:1: column 'question' appears twice in the header"
    err = load_error(tmp_path, "c.csv", "\n\n")
    assert str(err) == f"{tmp_path / 'c.csv'}: the CSV file is empty (no header line)"


def test_a_cell_over_the_size_limit_is_located(tmp_path):
    err = load_error(tmp_path, "rows.csv", "question,answer\n1+1,2\n2+2," + "4" * (MAX_CSV_CELL_CHARS + 1) + "\n")
    assert str(err) == (f"{tmp_path / 'rows.csv'}:3: cannot read the CSV record: a cell is longer than "
                        f"{MAX_CSV_CELL_CHARS:,} characters, the most sailrl reads from one cell")
    import csv

    assert csv.field_size_limit() == 131072  # the process-wide limit is restored


def test_csv_quoting_blank_lines_and_empty_cells(tmp_path):
    (tmp_path / "rows.csv").write_text('question,answer\r\n"1,+1",\r\n\r\n"say ""hi""",07\r\n')
    out = load_rows(make_spec("rows.csv"), tmp_path)
    assert [r["_index"] for r in out.train] == [1]
    assert out.train[0] == {"question": 'say "hi"', "answer": "07", "_index": 1}
    assert out.skipped[0].index == 0 and out.skipped[0].kind == "null_field"
    assert out.skipped[0].row == {"question": "1,+1", "answer": None, "_index": 0}


# ------------------------------------------------------------------------------------------- prompt length


def tiny_renderer():
    return get_renderer("role_colon", get_tokenizer("sailrl/tiny"))


def test_prompts_too_long_for_the_context_are_skipped_with_index_and_reason(tmp_path):
    rows = [{"question": "1+1", "answer": "2"}, {"question": "9" * 50, "answer": "1"},
            {"question": "2+2", "answer": "4"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = load_rows(make_spec("rows.jsonl", max_tokens=8), tmp_path, renderer=tiny_renderer(), context_window=40)
    assert [r["_index"] for r in out.train] == [0, 2]
    (skip,) = out.skipped
    # role_colon: "User: " + question + "=" + "\n\nAssistant:" -> 50 + 19 byte tokens.
    assert (skip.index, skip.kind) == (1, "too_long")
    assert skip.reason == ("prompt is 69 tokens; the model's context is 40 and sampling.max_tokens is 8, so a "
                           "prompt may have at most 32")


def test_the_context_window_comes_from_the_model_catalogue(tmp_path):
    rows = [{"question": "1+1", "answer": "2"}, {"question": "9" * 5000, "answer": "1"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = load_rows(make_spec("rows.jsonl", max_tokens=1024), tmp_path, renderer=tiny_renderer())
    assert out.skipped[0].reason == ("prompt is 5,019 tokens; the model's context is 4,096 and sampling.max_tokens "
                                     "is 1,024, so a prompt may have at most 3,072")
    assert load_rows(make_spec("rows.jsonl"), tmp_path).skipped == []  # no renderer: lengths are not measured


def test_every_prompt_too_long_says_why_once(tmp_path):
    rows = [{"question": "9" * (30 + i), "answer": "1"} for i in range(3)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("rows.jsonl"), tmp_path, renderer=tiny_renderer(), context_window=20)
    assert str(err.value) == (
        "every one of the 3 selected rows was skipped (3 x prompt too long for the model's context (e.g. row 0: "
        "prompt is 49 tokens; the model's context is 20 and sampling.max_tokens is 8, so a prompt may have at most "
        "12)); fix the data or the fields the prompt and reward rules use")


def test_max_tokens_filling_the_context_is_said(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    with pytest.raises(DatasetError, match="so no prompt fits; lower sampling.max_tokens"):
        load_rows(make_spec("rows.jsonl", max_tokens=64), tmp_path, renderer=tiny_renderer(), context_window=64)


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=0, max_size=300), window=st.integers(min_value=20, max_value=400))
def test_the_cheap_length_bound_never_lets_a_long_prompt_through(text, window):
    from sailrl.runtime.data.rows import PromptLimit

    renderer = tiny_renderer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    limit = PromptLimit(renderer=renderer, context_window=window, max_tokens=8)
    exact = renderer.build_generation_prompt(messages).length
    measured = limit.tokens(messages)
    assert measured is None or measured == exact or limit.max_prompt_tokens < measured <= exact
    assert (measured is not None and measured > limit.max_prompt_tokens) == (exact > limit.max_prompt_tokens)


@functools.cache
def trained_bpe(kind: str):
    """A small BPE tokenizer trained here: byte-level (GPT-2 style) or metaspace (sentencepiece style)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    byte_level = kind == "byte_level"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False) if byte_level else pre_tokenizers.Metaspace()
    tok.decoder = decoders.ByteLevel() if byte_level else decoders.Metaspace()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else []
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"], initial_alphabet=alphabet)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog 3+4=7", "ünïcödé テスト 🙂 a b"] * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["byte_level", "metaspace"]),
       text=st.text(alphabet="the quick brown fox 3+4=7 ünï テ🙂\n", max_size=200),
       window=st.integers(min_value=10, max_value=300))
def test_the_cheap_length_bound_holds_for_bpe_tokenizers(kind, text, window):
    from sailrl.runtime.data.rows import PromptLimit

    renderer = get_renderer("role_colon", trained_bpe(kind))
    messages = [{"role": "user", "content": text}]
    limit = PromptLimit(renderer=renderer, context_window=window, max_tokens=4)
    exact = renderer.build_generation_prompt(messages).length
    measured = limit.tokens(messages)
    assert (measured is not None and measured > limit.max_prompt_tokens) == (exact > limit.max_prompt_tokens)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["byte_level", "metaspace"]),
       text=st.text(alphabet="the quick brown fox 3+4=7 ünï テ🙂\nxxxxxxxx", min_size=200, max_size=3000),
       window=st.integers(min_value=10, max_value=200))
def test_the_prefix_bound_on_long_prompts_decides_as_the_full_count_does(kind, text, window):
    from sailrl.runtime.data.rows import PromptLimit

    renderer = get_renderer("role_colon", trained_bpe(kind))
    messages = [{"role": "user", "content": text}]
    limit = PromptLimit(renderer=renderer, context_window=window, max_tokens=4)
    exact = renderer.build_generation_prompt(messages).length
    measured = limit.measure(messages)
    assert (measured is not None and measured[0] > limit.max_prompt_tokens) == (exact > limit.max_prompt_tokens)
    if measured is not None and not measured[1]:
        assert limit.max_prompt_tokens < measured[0] <= exact


class _CountingRenderer:
    """The tiny renderer, recording the longest message it was asked to tokenise."""

    def __init__(self, renderer):
        self.renderer, self.longest = renderer, 0

    def build_generation_prompt(self, messages):
        self.longest = max(self.longest, *(len(m["content"]) for m in messages))
        return self.renderer.build_generation_prompt(messages)


def test_a_huge_rendered_prompt_is_skipped_without_tokenising_it_whole(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    spec = Spec.model_validate({**make_spec("rows.jsonl").model_dump(mode="json", by_alias=True, exclude_unset=True),
                                "prompt": {"user": "{{ question|replace('', 'x' * 100000) }}"}})
    counting = _CountingRenderer(tiny_renderer())
    with pytest.raises(DatasetError) as err:
        load_rows(spec, tmp_path, renderer=counting, context_window=512)
    assert "2 x prompt too long for the model's context (e.g. row 0: prompt is more than " in str(err.value)
    assert "tokens (its beginning alone); the model's context is 512" in str(err.value)
    assert counting.longest <= 4 * 4 * (512 - 8 + 64)  # two prefixes at most, never the 400,000 characters
