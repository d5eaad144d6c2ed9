"""The compiled script shows the reward: the rules in plain words above two steps, sampling then scoring; the values
the loop reads above it, the rest of the spec in one literal below it; no unused names; the earlier layout is
explained by `sailrl compile --check`."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sailrl.compiler.render import comment_lines, read_keys
from sailrl.compiler.validate import validate_file
from sailrl.compiler.words import reward_words
from sailrl.launch import build_spec, write_into_config
from sailrl.runtime.rewards.rules import RewardFunction

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("generated/*.py"), *(s.with_suffix(".py") for s in ROOT.glob("tests/goldens/*.yaml"))])
FIRST_SCREEN = 60  # lines


def _spec_of(script: Path) -> Path:
    return ROOT / ("spec/examples" if script.parent.name == "generated" else "tests/goldens") / (script.stem + ".yaml")


def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_loop_starts_in_the_first_screen_and_reads_only_what_stands_above_it(script: Path):
    text = script.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert next(i for i, line in enumerate(lines, 1) if line.startswith("    for step in run.steps()")) <= FIRST_SCREEN
    tree = ast.parse(text)
    top = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "TRAINING")
    shown = [k.value for k in top.value.keys]
    read = set(re.findall(r'\bt\["(\w+)"\]', text))
    assert set(shown) == read, (shown, read)  # every value the loop reads, and only those
    assert shown == read_keys(validate_file(_spec_of(script)).spec)
    # the rest of the spec: one literal below the loop, its training the values above plus the others
    config = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "CONFIG")
    assert config.lineno > _functions(tree)["main"].end_lineno
    assert "TRAINING | {" in ast.get_source_segment(text, config)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_unused_names(script: Path):
    tree = ast.parse(script.read_text(encoding="utf-8"))
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert assigned - loaded == set()
    for name, fn in _functions(tree).items():
        bound = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert bound - used - {"_"} == set(), (name, bound - used)
    assert "degenerate" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _comment_above(text: str, call: str) -> list[str]:
    """The comment lines (without '#') between '# The reward, in plain words' and the line holding ``call``."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if call in line)
    start = max(i for i, line in enumerate(lines[:end]) if line.strip() == "# The reward, in plain words (sailrl explain):")
    return [line.strip().removeprefix("#").strip() for line in lines[start + 1:end]]


def test_quickstart_states_its_rules_in_sailrl_explains_words_above_sampling_then_scoring():
    text = (ROOT / "generated/quickstart.py").read_text(encoding="utf-8")
    main = text[text.index("async def main"):text.index("async def train_step")]
    assert main.index("rollouts = await run.sampler.sample(policy, step)") < \
        main.index("batch = await run.rewards.score(step, rollouts)")
    spec = validate_file(ROOT / "spec/examples/quickstart.yaml").spec
    explained = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field).explain()  # `sailrl explain`'s
    above = " ".join(_comment_above(text, "run.sampler.sample("))
    for sentence in explained:
        assert " ".join(sentence.split()) in above, sentence
    assert explained[0].startswith("correct: +0.5 if the whole completion equals the reference answer")


def test_an_episode_script_says_sampling_and_scoring_interleave_and_names_its_feedback_rule():
    text = (ROOT / "generated/feedback.py").read_text(encoding="utf-8")
    above = " ".join(_comment_above(text, "run.sampler.sample("))
    assert "When rule 'correct' fails on an answer without tool calls, the user says:" in above
    main = text[text.index("async def main"):text.index("async def train_step")]
    assert "# 4. Score: sampling and scoring interleave turn by turn" in main


def test_off_policy_starts_sampling_then_scoring_of_later_steps_in_the_background():
    text = (ROOT / "tests/goldens/off_policy.py").read_text(encoding="utf-8")
    assert "asyncio.create_task(run.rewards.score(later, run.sampler.sample(policy, later)))" in text
    assert "# The reward, in plain words (sailrl explain):" in text


def test_the_rules_words_are_one_comment_line_each_whatever_they_quote():
    nasty = "p: +1 if the completion contains a match of 'a\nraise SystemExit(9)\r\u2028\t\ud800'; otherwise 0."
    lines = comment_lines([nasty, "total = p (from 0 to 1)."], 8, width=60)
    assert all(line.startswith("        #   ") and line.isprintable() for line in lines)
    source = "x = 1\n" + "\n".join(lines) + "\n"
    assert ast.dump(ast.parse(source)) == ast.dump(ast.parse("x = 1\n"))
    joined = " ".join(line.strip().removeprefix("#").strip() for line in lines)
    assert "'a\\nraise SystemExit(9)\\r\\u2028\\t\\ud800'" in joined.replace("\\ ", "\\")


def test_reward_words_are_the_explain_sentences_then_the_episode_sentences():
    spec = validate_file(ROOT / "spec/examples/feedback.yaml").spec
    fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field)
    assert reward_words(spec) == fn.explain() + spec.environment.describe()


def test_set_overrides_reach_the_values_above_the_loop_and_config():
    ns: dict = {}
    tree = ast.parse((ROOT / "generated/quickstart.py").read_text(encoding="utf-8"))
    body = [n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id in ("TRAINING", "CONFIG")]
    exec(compile(ast.Module(body=body, type_ignores=[]), "quickstart", "exec"), ns)
    spec = build_spec(ns["CONFIG"], ["training.learning_rate=0.002", "training.steps=3"])
    write_into_config(ns["CONFIG"], spec, ns["TRAINING"])
    assert ns["TRAINING"]["learning_rate"] == 0.002 and "steps" not in ns["TRAINING"]
    assert ns["CONFIG"]["training"]["learning_rate"] == 0.002 and ns["CONFIG"]["training"]["steps"] == 3


def test_check_on_a_script_of_the_earlier_layout_explains_before_the_diff(tmp_path):
    old = tmp_path / "plain.py"
    shutil.copy(ROOT / "tests/goldens/earlier_layout/plain.py", old)
    r = subprocess.run([sys.executable, "-m", "sailrl", "compile", "tests/goldens/plain.yaml", "-o", str(old),
                        "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1
    first, _, rest = r.stderr.partition("\n\n")
    assert first == (f"{old} was compiled with the earlier layout of sailrl's scripts (the loop now shows sampling "
                     "and scoring as two steps under the reward in plain words, and the spec's values the loop does "
                     "not read moved below it into CONFIG), so it differs from a fresh compile whatever its spec "
                     f"says: recompile with `sailrl compile tests/goldens/plain.yaml -o {old}`.")
    assert rest.startswith(f"--- {old} (committed)\n+++ {old} (fresh compile)\n")
    assert "-        batch = await run.sampler.rollout(policy, step)" in rest
    assert "+        batch = await run.rewards.score(step, rollouts)" in rest
    assert rest.endswith(f"{old} is stale. Regenerate it with:\n    sailrl compile tests/goldens/plain.yaml -o {old}\n\n")
    # recompiled, it is current
    assert subprocess.run([sys.executable, "-m", "sailrl", "compile", "tests/goldens/plain.yaml", "-o", str(old)],
                          cwd=ROOT, capture_output=True).returncode == 0
    again = subprocess.run([sys.executable, "-m", "sailrl", "compile", "tests/goldens/plain.yaml", "-o", str(old),
                            "--check"], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "earlier layout" not in again.stderr
