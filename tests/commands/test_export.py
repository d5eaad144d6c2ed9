"""``sailrl export`` / ``sailrl sample`` on a real run of the embedded backend, and bad input.

A tiny Llama-architecture model is built from a small config and saved as a local model folder
(tests/fakes/tiny_models.py); ``sailrl run`` trains it (a supervised warm-up, so the adapter is not zero, then two
RL steps). Both export formats load with transformers / peft as they are, and the merged model's greedy completion
equals the embedded backend's greedy completion from the same checkpoint.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import tinker
import torch

from sailrl.cli import main
from tests.fakes.tiny_models import save_model_dir

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"TINKER_API_KEY": "tml-FAKESECRETtinker0123456789", "SAIL_API_KEY": "sail-FAKESECRETsail0123456789",
           "HF_TOKEN": "hf_FAKESECRETtoken0123456789"}


def _spec_text(model: str, run_dir: Path) -> str:
    text = (ROOT / "spec/examples/quickstart.yaml").read_text()
    text = text.split("\nexamples:")[0] + "\n"
    for old, new in [("name: sailrl/tiny-arith", f"name: {model}"), ("lora_rank: 16", "lora_rank: 4"),
                     ("source: data/addition.jsonl", f"source: {ROOT / 'spec/examples/data/addition.jsonl'}"),
                     ("steps: 100", "steps: 2\n  warmup: {steps: 3, batch_size: 8, learning_rate: 3e-2}"),
                     ("group_size: 8", "group_size: 2"), ("groups_per_step: 16", "groups_per_step: 2"),
                     ("save_every: 20", "save_every: 1"), ("run_dir: runs/quickstart", f"run_dir: {run_dir}"),
                     ("name: quickstart", "name: export-test")]:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run_dir, base folder, SAILRL_HOME, spec path): a two-step run of a tiny local Llama folder."""
    root = tmp_path_factory.mktemp("export")
    home = root / "home"
    base = root / "tiny-llama"
    save_model_dir("llama", base)
    spec = root / "spec.yaml"
    run_dir = root / "run"
    spec.write_text(_spec_text(str(base), run_dir))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAILRL_HOME", str(home))
        assert main(["run", str(spec)]) == 0
    return run_dir, base, home, spec


@pytest.fixture
def home(trained, monkeypatch):
    monkeypatch.setenv("SAILRL_HOME", str(trained[2]))
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    return trained[2]


def _final_dir(home: Path, run_dir: Path) -> Path:
    records = [json.loads(line) for line in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    final = [r for r in records if r.get("final")][-1]["sampler_path"]
    return home / "checkpoints" / final.removeprefix("local://")


def _greedy_embedded(home: Path, base: Path, run_dir: Path, prompt: tinker.ModelInput, max_tokens: int) -> list[int]:
    from sailrl.runtime.backends.local import LocalServiceClient

    records = [json.loads(line) for line in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    path = [r for r in records if r.get("final")][-1]["sampler_path"]
    svc = LocalServiceClient(str(base), base_dir=home / "checkpoints", seed=0)
    try:
        client = svc.create_sampling_client(model_path=path)
        out = client.sample(prompt=prompt, num_samples=1, sampling_params=tinker.SamplingParams(
            max_tokens=max_tokens, temperature=0.0)).result()
    finally:
        svc.close("done")
    return list(out.sequences[0].tokens)


def _prompt(base: Path) -> tuple[tinker.ModelInput, list[int]]:
    from sailrl.runtime.backends.models import get_renderer, get_tokenizer

    renderer = get_renderer("role_colon", get_tokenizer(str(base)))
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "3+4="}])
    return prompt, prompt.to_ints()


def test_both_formats_load_as_is_and_merged_greedy_equals_the_embedded_backend(trained, home, tmp_path, capsys):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, base, _, _ = trained
    adapter = load_file(str(_final_dir(home, run_dir) / "adapter_model.safetensors"))
    assert max(float(v.abs().max()) for k, v in adapter.items() if "lora_B" in k) > 1e-3  # the run trained it

    assert main(["export", str(run_dir), "-o", str(tmp_path / "peft")]) == 0
    assert main(["export", str(run_dir), "--format", "merged", "-o", str(tmp_path / "merged")]) == 0
    out = capsys.readouterr().out
    assert f"as a PEFT adapter: {tmp_path / 'peft'}" in out and f"as a merged model: {tmp_path / 'merged'}" in out

    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base) and config["r"] == 4
    assert {"README.md", "spec.yaml", "metrics.jsonl", "adapter_model.safetensors"} <= {
        p.name for p in (tmp_path / "peft").iterdir()}
    assert not list(tmp_path.glob(".*partial*"))  # no staging folder left
    for name in ("tokenizer_config.json", "tokenizer.json"):  # copied as they are, not re-serialised
        assert (tmp_path / "merged" / name).read_bytes() == (base / name).read_bytes()

    prompt, ids = _prompt(base)
    n = 8
    embedded = _greedy_embedded(home, base, run_dir, prompt, n)
    x = torch.tensor([ids])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert AutoTokenizer.from_pretrained(tmp_path / "merged").encode("3+4=", add_special_tokens=False) == \
        AutoTokenizer.from_pretrained(base).encode("3+4=", add_special_tokens=False)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "peft").eval()
    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    with torch.no_grad():
        greedy = merged.generate(x, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(ids):]
        torch.testing.assert_close(peft_model(x).logits, merged(x).logits, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(plain(x).logits, merged(x).logits, atol=1e-3)  # the adapter is in it
    assert greedy.tolist() == embedded[: len(greedy)] and len(embedded) >= 1, (greedy.tolist(), embedded)


def test_the_model_card_says_what_the_model_was_trained_for_and_holds_no_secret(trained, home, tmp_path):
    from huggingface_hub import ModelCard

    from sailrl.runtime.rewards.rules import RewardFunction
    from sailrl.spec.loader import load_spec, read_spec_file

    run_dir, base, _, spec_path = trained
    assert main(["export", str(run_dir), "--checkpoint", "1", "-o", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "peft" and "sailrl" in card.data.tags
    text = (out / "README.md").read_text()
    spec = load_spec(spec_path).spec
    _, sha = read_spec_file(str(spec_path))
    assert f"sha256 `{sha}`" in text and "# export-test" in text
    assert f"- **Base model:** {base}" in text and "- **LoRA rank:** 4 (alpha 32)" in text
    assert "after step 1)" in text and "- **Steps:** 1 of 2 (2 logged in `metrics.jsonl`)" in text
    assert "100 training rows" in text
    for line in RewardFunction.from_spec(spec.reward, "answer").explain():
        assert f"- {line}" in text
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert f"| reward/total | {metrics[0]['reward/total']:.3f} (mean of 1) | {metrics[1]['reward/total']:.3f}" in text
    assert (out / "spec.yaml").read_bytes() == spec_path.read_bytes()
    assert (out / "metrics.jsonl").read_bytes() == (run_dir / "metrics.jsonl").read_bytes()
    for name in ("- sailrl: ", "- torch: ", "- transformers: ", "- peft: ", "- tinker-cookbook: "):
        assert name in text
    every_byte = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    for value in SECRETS.values():
        assert value.encode() not in every_byte and value[:12].encode() not in every_byte


def test_a_changed_spec_file_is_replaced_by_the_resolved_spec(trained, home, tmp_path):
    run_dir, _, _, spec_path = trained
    original = spec_path.read_text()
    try:
        spec_path.write_text(original + "# edited after the run\n")
        assert main(["export", str(run_dir), "-o", str(tmp_path / "out")]) == 0
    finally:
        spec_path.write_text(original)
    resolved = json.loads((tmp_path / "out" / "spec.resolved.json").read_text())
    assert resolved["name"] == "export-test" and not (tmp_path / "out" / "spec.yaml").exists()
    assert "`spec.resolved.json`, the values the run resolved" in (tmp_path / "out" / "README.md").read_text()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_bad_input_is_one_line_and_writes_nothing(trained, home, tmp_path, capsys):
    run_dir, *_ = trained
    assert main(["export", str(tmp_path / "nowhere")]) == 1
    assert "is not a run directory (no such folder)" in _one_line(capsys)
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty")]) == 1
    assert "it has no config.json" in _one_line(capsys)
    assert main(["export", str(run_dir), "--checkpoint", "7"]) == 1
    assert _one_line(capsys).endswith("has no checkpoint at step 7; it has checkpoints at step 1, 2 (final): "
                                      "pass --checkpoint STEP")
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    assert main(["export", str(run_dir), "-o", str(target)]) == 1
    assert "already exists: pass --overwrite to replace an earlier export" in _one_line(capsys)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert main(["export", str(run_dir), "-o", str(target), "--overwrite"]) == 1
    assert "was not written by sailrl export" in _one_line(capsys)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "taken"]


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder, the target for a link)."""
    out: dict[str, bytes | None] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        out[key] = os.readlink(p).encode() if p.is_symlink() else None if p.is_dir() else p.read_bytes()
    return out


def test_overwrite_replaces_only_a_folder_an_earlier_export_wrote(trained, home, tmp_path, capsys, monkeypatch):
    """``--overwrite`` deleted whatever folder -o named: a folder of personal files, the whole checkpoint store
    (``-o $SAILRL_HOME``), a project folder, each with exit 0. It replaces only a folder holding the marker an
    export leaves; any other folder is one line, exit 1, and stays byte for byte as it was."""
    import shutil

    run_dir = trained[0]
    store = tmp_path / "home-copy"
    shutil.copytree(home, store)
    monkeypatch.setenv("SAILRL_HOME", str(store))
    personal = tmp_path / "photos"
    personal.mkdir()
    (personal / "holiday.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "train.py").write_text("print('mine')\n")
    forged = tmp_path / "forged"  # a marker that is a link, and one that another program wrote
    forged.mkdir()
    (forged / "data.txt").write_text("keep")
    (forged / ".sailrl-export.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text('{"written_by": "sailrl export"}')
    other = tmp_path / "other"
    other.mkdir()
    (other / ".sailrl-export.json").write_text('{"written_by": "someone else"}')
    for target in (personal, store, project, forged, other):
        before = _tree(target)
        assert main(["export", str(run_dir), "-o", str(target), "--overwrite"]) == 1
        line = _one_line(capsys)
        assert line == (f"error: {target} exists and was not written by sailrl export (it has no "
                        ".sailrl-export.json): nothing was replaced; --overwrite replaces only an earlier export, "
                        "so give -o a new folder"), line
        assert _tree(target) == before
    assert not list(tmp_path.glob(".*partial*"))

    earlier = tmp_path / "earlier"
    assert main(["export", str(run_dir), "--checkpoint", "1", "-o", str(earlier)]) == 0
    marker = json.loads((earlier / ".sailrl-export.json").read_text())
    assert marker["written_by"] == "sailrl export" and marker["step"] == 1 and marker["format"] == "peft"
    (earlier / "stale.txt").write_text("from the earlier export's folder")
    assert main(["export", str(run_dir), "--format", "merged", "-o", str(earlier), "--overwrite"]) == 0
    marker = json.loads((earlier / ".sailrl-export.json").read_text())
    assert marker["step"] == 2 and marker["format"] == "merged" and not (earlier / "stale.txt").exists()
    assert (earlier / "model.safetensors").is_file()


def test_a_run_without_a_final_checkpoint_names_the_ones_it_has(trained, home, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "stopped"
    shutil.copytree(trained[0], run_dir)
    lines = (run_dir / "checkpoints.jsonl").read_text().splitlines()
    (run_dir / "checkpoints.jsonl").write_text("\n".join(line for line in lines if '"final"' not in line) + "\n")
    assert main(["export", str(run_dir)]) == 1
    assert _one_line(capsys).endswith("has no final checkpoint (it did not finish); it has checkpoints at step 1, 2: "
                                      "pass --checkpoint STEP")


def test_a_cleaned_checkpoint_and_a_base_model_that_cannot_load_are_one_line(trained, home, tmp_path, capsys,
                                                                             monkeypatch):
    import shutil

    run_dir, base, _, _ = trained
    empty_home = tmp_path / "other-home"
    monkeypatch.setenv("SAILRL_HOME", str(empty_home))  # the store holds nothing of this run: as if cleaned
    assert main(["export", str(run_dir), "-o", str(tmp_path / "b")]) == 1
    err = _one_line(capsys)
    assert "is no longer in the embedded backend's store" in err and "removed by `sailrl clean`" in err
    assert not (tmp_path / "b").exists()

    moved_home = tmp_path / "home-copy"
    shutil.copytree(home, moved_home)
    monkeypatch.setenv("SAILRL_HOME", str(moved_home))
    base_json = _final_dir(moved_home, run_dir) / "base_model.json"
    meta = json.loads(base_json.read_text())
    base_json.write_text(json.dumps({**meta, "model_name": str(tmp_path / "gone-model")}))
    assert main(["export", str(run_dir), "--format", "merged", "-o", str(tmp_path / "c")]) == 1
    err = _one_line(capsys)
    assert err.startswith("error: cannot load the base model the run trained on:") and "gone-model" in err
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob(".c.partial-*"))


def test_sample_scores_the_trained_policy_with_the_rules(trained, home, capsys):
    run_dir, base, _, _ = trained
    assert main(["sample", str(run_dir), "--row", "3", "--n", "2", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("completion 1") == 1 and "completion 2" in out and "correct" in out and "format" in out
    assert "2 completions, mean total" in out and "user: '" in out

    from sailrl.export import RunInfo
    from sailrl.export.sample import sample_run
    from sailrl.runtime.data import dataset_row
    from sailrl.spec.loader import load_spec

    info = RunInfo.read(run_dir)
    result = sample_run(info, info.checkpoint(), row=3, n=2, temperature=0.0)
    row, _ = dataset_row(load_spec(trained[3]).spec, trained[3].parent, 3)
    assert result.messages == [{"role": "user", "content": f"{row['question']}="}]
    greedy = _greedy_embedded(home, base, run_dir, _row_prompt(base, row), 12)
    assert result.completions[0].tokens == result.completions[1].tokens == greedy
    first = result.completions[0]
    assert first.score.total == result.reward_fn.score(first.text, row, truncated=first.truncated,
                                                         num_tokens=len(first.tokens)).total


def _row_prompt(base: Path, row: dict) -> tinker.ModelInput:
    from sailrl.runtime.backends.models import get_renderer, get_tokenizer

    renderer = get_renderer("role_colon", get_tokenizer(str(base)))
    return renderer.build_generation_prompt([{"role": "user", "content": f"{row['question']}="}])


def test_sample_needs_a_prompt_and_refuses_a_missing_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # argparse: --prompt or --row is required
        main(["sample", str(tmp_path)])
    assert exc.value.code == 2 and "one of the arguments --prompt --row is required" in capsys.readouterr().err
    assert main(["sample", str(tmp_path), "--prompt", "hi"]) == 1
    assert "it has no config.json" in _one_line(capsys)


def _card_snippet(folder: Path) -> str:
    """The python code block of the model card in ``folder``."""
    blocks = re.findall(r"```python\n(.*?)```", (folder / "README.md").read_text(), re.S)
    assert len(blocks) == 1, blocks
    return blocks[0]


def _run_snippet(code: str, cwd: Path, monkeypatch, capsys) -> str:
    """What the card's snippet prints, run as written from ``cwd``."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    exec(compile(code, "README.md", "exec"), {"__name__": "__card__"})
    return capsys.readouterr().out


def _greedy_reply(run_dir: Path) -> str:
    """sailrl's own greedy reply to row 0 (what ``sailrl sample RUN_DIR --row 0 --temperature 0`` prints)."""
    from sailrl.export import RunInfo
    from sailrl.export.sample import sample_run

    info = RunInfo.read(run_dir)
    return sample_run(info, info.checkpoint(), row=0, n=1, temperature=0.0).completions[0].text


def test_export_of_a_builtin_base_carries_the_base(tmp_path, capsys, monkeypatch):
    """sailrl/tiny is not on the hub: the peft export holds it in base/, adapter_config.json names it by its
    name (not by the path the export was first written to), and the card's snippet, run as written after the
    folder is moved, prints sailrl's own greedy reply. It answered wrong on every prompt: the snippet showed no
    prompt format, and the byte tokenizer appends </s> to a prompt unless add_special_tokens=False."""
    import shutil

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text = _spec_text("sailrl/tiny", tmp_path / "run")
    (tmp_path / "spec.yaml").write_text(text.replace("steps: 2\n", "steps: 1\n", 1))
    assert main(["run", str(tmp_path / "spec.yaml")]) == 0
    assert main(["export", str(tmp_path / "run")]) == 0
    first = tmp_path / "run" / "export" / "peft-final"
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.move(first, moved / "peft-final")
    out = moved / "peft-final"
    capsys.readouterr()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "sailrl/tiny"
    code = _card_snippet(out)
    assert 'folder = "./peft-final"' in code and 'from_pretrained(f"{folder}/base")' in code
    assert "prompt = 'User: 2+3=\\n\\nAssistant:'" in code and "add_special_tokens=False" in code
    assert "max_new_tokens=12" in code and "reply.split('\\n\\nUser:')[0]" in code
    assert AutoTokenizer.from_pretrained(out)("1+1=").input_ids[-1] == 1  # the </s> the snippet leaves out

    expected = _greedy_reply(tmp_path / "run")
    assert _run_snippet(code, moved, monkeypatch, capsys) == expected + "\n"
    assert expected.strip() and not (tmp_path / "run" / "export" / "peft-final").exists()

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out / "base"), out).eval()
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape[-1] == 259
    assert os.path.isfile(out / "base" / "config.json")


@pytest.mark.parametrize("fmt", ["peft", "merged"])
def test_the_cards_snippet_prints_sailrls_greedy_reply(trained, home, tmp_path, monkeypatch, capsys, fmt):
    """A local base (a folder): the snippet loads it by its path, builds row 0's prompt with the run's renderer,
    and prints what sailrl's sampler answers greedily."""
    run_dir, base, _, _ = trained
    assert main(["export", str(run_dir), "--format", fmt, "-o", str(tmp_path / "out")]) == 0
    code = _card_snippet(tmp_path / "out")
    if fmt == "peft":
        assert f"base = AutoModelForCausalLM.from_pretrained({str(base)!r})" in code
        assert json.loads((tmp_path / "out" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
            str(base)
    assert _run_snippet(code, tmp_path, monkeypatch, capsys) == _greedy_reply(run_dir) + "\n"


# ------------------------------------------------------------------------------------------------ a Tinker run


class _Done:
    def __init__(self, value=None, error: Exception | None = None):
        self.value, self.error = value, error

    def result(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.value


class FakeTinker:
    """``tinker.ServiceClient`` at the rest-client boundary tinker_cookbook's ``weights.download`` uses: the
    archive URL of a sampler checkpoint is a ``file://`` URL of the tar bytes the test made."""

    archives: dict[str, Path] = {}
    asked: list[str] = []
    closed: list[str] = []

    def __init__(self, **kwargs):
        pass

    def create_rest_client(self):
        return self

    def get_checkpoint_archive_url_from_tinker_path(self, tinker_path: str):
        FakeTinker.asked.append(tinker_path)
        if tinker_path not in self.archives:
            return _Done(error=RuntimeError("404: checkpoint not found or expired"))
        from types import SimpleNamespace

        return _Done(SimpleNamespace(url=self.archives[tinker_path].as_uri()))

    def close(self, status):
        FakeTinker.closed.append(status)
        return _Done()


def _tinker_archive(trained_adapter_dir: Path, tmp_path: Path) -> Path:
    """A Tinker sampler checkpoint's archive: the trained adapter under Tinker's key names (``lm_head`` is
    ``model.unembed_tokens`` there), with Tinker's adapter_config.json fields."""
    import tarfile

    from safetensors.torch import load_file, save_file

    state = load_file(str(trained_adapter_dir / "adapter_model.safetensors"))
    renamed = {k.replace("base_model.model.lm_head.", "base_model.model.model.unembed_tokens."): v
               for k, v in state.items()}
    assert renamed != state  # the run put a LoRA on lm_head
    src = tmp_path / "tinker-files"
    src.mkdir()
    save_file(renamed, str(src / "adapter_model.safetensors"))
    (src / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 32, "peft_type": "LORA"}))
    archive = tmp_path / "checkpoint.tar"
    with tarfile.open(archive, "w") as tar:
        for f in sorted(src.iterdir()):
            tar.add(f, arcname=f.name)
    return archive


def _tinker_run(trained, tmp_path: Path, base_model: str) -> Path:
    """A run directory as a Tinker run leaves it: config.json and tinker:// checkpoint records."""
    run_dir = tmp_path / "tinker-run"
    run_dir.mkdir()
    config = json.loads((trained[0] / "config.json").read_text())
    config["spec"]["model"]["name"] = base_model
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "metrics.jsonl").write_bytes((trained[0] / "metrics.jsonl").read_bytes())
    records = [{"name": "t-000001", "batch": 1, "state_path": "tinker://run-7/weights/t-000001"},
               {"name": "t-final", "batch": 2, "final": True, "state_path": "tinker://run-7/weights/t-final",
                "sampler_path": "tinker://run-7/sampler_weights/t-final"}]
    (run_dir / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


@pytest.fixture
def fake_tinker(monkeypatch):
    FakeTinker.archives, FakeTinker.asked, FakeTinker.closed = {}, [], []
    monkeypatch.setattr(tinker, "ServiceClient", FakeTinker)
    return FakeTinker


def test_a_tinker_checkpoint_downloads_and_builds_both_formats(trained, home, tmp_path, fake_tinker, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, base, _, _ = trained
    fake_tinker.archives["tinker://run-7/sampler_weights/t-final"] = _tinker_archive(_final_dir(home, run_dir),
                                                                                      tmp_path)
    tinker_run = _tinker_run(trained, tmp_path, str(base))
    assert main(["export", str(tinker_run), "-o", str(tmp_path / "peft")]) == 0
    assert main(["export", str(tinker_run), "--format", "merged", "-o", str(tmp_path / "merged")]) == 0
    assert main(["export", str(run_dir), "--format", "merged", "-o", str(tmp_path / "local-merged")]) == 0
    assert fake_tinker.asked == ["tinker://run-7/sampler_weights/t-final"] * 2
    assert fake_tinker.closed == ["success", "success"]
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base) and config["r"] == 4
    assert "lm_head" in config["target_modules"]  # Tinker's unembed_tokens mapped to the model's module
    card = (tmp_path / "peft" / "README.md").read_text()
    assert "(Tinker)" in card and "`tinker://run-7/sampler_weights/t-final` (final, after step 2)" in card

    prompt, ids = _prompt(base)
    x = torch.tensor([ids])
    with torch.no_grad():
        local = AutoModelForCausalLM.from_pretrained(tmp_path / "local-merged").eval()(x).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()(x).logits
        peft_logits = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base),
                                                tmp_path / "peft").eval()(x).logits
    torch.testing.assert_close(peft_logits, local, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(merged, local, atol=3e-2, rtol=3e-2)  # build_hf_model may store bfloat16
    assert not list(tmp_path.glob("tinker-checkpoint-*")) and not list(tmp_path.glob(".*partial*"))


def test_a_tinker_checkpoint_that_expired_or_a_base_not_cached_is_one_line(trained, home, tmp_path, fake_tinker,
                                                                          capsys, monkeypatch):
    run_dir, base, _, _ = trained
    tinker_run = _tinker_run(trained, tmp_path, str(base))
    assert main(["export", str(tinker_run), "-o", str(tmp_path / "out")]) == 1  # no archive: expired
    err = _one_line(capsys)
    assert "cannot download tinker://run-7/sampler_weights/t-final" in err and "expired" in err
    assert "it has checkpoints at step 1, 2 (final)" in err and not (tmp_path / "out").exists()

    fake_tinker.archives["tinker://run-7/sampler_weights/t-final"] = _tinker_archive(_final_dir(home, run_dir),
                                                                                      tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "x").mkdir()
    offline = _tinker_run(trained, tmp_path / "x", "someorg/not-cached-model")
    assert main(["export", str(offline), "-o", str(tmp_path / "out")]) == 1
    err = _one_line(capsys)
    assert "cannot load the base model the run trained on" in err and "someorg/not-cached-model" in err
    assert "HF_HUB_OFFLINE" in err and not (tmp_path / "out").exists()
    assert not list(tmp_path.glob("tinker-checkpoint-*")) and not list(tmp_path.glob(".*partial*"))


# ------------------------------------------------------------------------------------------------ --push


class FakeHfApi:
    """``huggingface_hub.HfApi`` as tinker_cookbook's ``publish_to_hf_hub`` calls it: what was asked is recorded."""

    calls: list[tuple] = []
    fail: Exception | None = None

    def __init__(self, token=None):
        FakeHfApi.calls.append(("init", token))

    def create_repo(self, *, repo_id, repo_type, private, exist_ok):
        if FakeHfApi.fail is not None:
            raise FakeHfApi.fail
        FakeHfApi.calls.append(("create_repo", repo_id, repo_type, private, exist_ok))

    def upload_folder(self, *, folder_path, repo_id, repo_type):
        files = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
        FakeHfApi.calls.append(("upload_folder", repo_id, repo_type, files))


@pytest.fixture
def fake_hub(monkeypatch):
    from tinker_cookbook.weights import _publish

    FakeHfApi.calls, FakeHfApi.fail = [], None
    monkeypatch.setattr(_publish, "HfApi", FakeHfApi)
    return FakeHfApi


def test_push_uploads_the_folder_privately_by_default(trained, home, tmp_path, fake_hub, capsys):
    run_dir, *_ = trained
    assert main(["export", str(run_dir), "-o", str(tmp_path / "out"), "--push", "me/my-adder"]) == 0
    out = capsys.readouterr().out
    assert "pushed to https://huggingface.co/me/my-adder (private)" in out
    init, create, upload = fake_hub.calls
    assert init == ("init", None)  # the token is huggingface_hub's own (HF_TOKEN): sailrl never passes it
    assert create == ("create_repo", "me/my-adder", "model", True, True)
    assert upload[:3] == ("upload_folder", "me/my-adder", "model") and "README.md" in upload[3]
    assert {"adapter_config.json", "adapter_model.safetensors", "spec.yaml", "metrics.jsonl"} <= set(upload[3])
    assert SECRETS["HF_TOKEN"] not in out

    fake_hub.calls = []
    assert main(["export", str(run_dir), "-o", str(tmp_path / "pub"), "--push", "me/my-adder", "--public"]) == 0
    assert fake_hub.calls[1] == ("create_repo", "me/my-adder", "model", False, True)


def test_a_failed_push_is_one_line_and_keeps_the_export(trained, home, tmp_path, fake_hub, capsys):
    run_dir, *_ = trained
    fake_hub.fail = RuntimeError("401 Client Error: Unauthorized\nmore detail")
    assert main(["export", str(run_dir), "-o", str(tmp_path / "out"), "--push", "me/my-adder"]) == 1
    err = _one_line(capsys)
    assert err == (f"error: the export is in {tmp_path / 'out'}, but pushing it to me/my-adder failed: RuntimeError: "
                   "401 Client Error: Unauthorized (log in with `hf auth login` or set HF_TOKEN)")
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
    assert main(["export", str(run_dir), "-o", str(tmp_path / "out2"), "--push", "not-a-repo-id"]) == 1
    assert "--push takes a Hugging Face repository id like user/my-model" in _one_line(capsys)


def test_merging_an_lm_head_adapter_of_a_tied_model_keeps_the_input_embedding(trained, tmp_path, monkeypatch):
    """Qwen2 ties lm_head to the input embedding: the merged export unties them, as the embedded sampler does,
    so its greedy completion equals the backend's."""
    from tinker import types
    from tinker_cookbook.supervised.common import datum_from_model_input_weights
    from transformers import AutoModelForCausalLM

    from sailrl.runtime.backends.local import LocalServiceClient
    from sailrl.runtime.backends.models import get_renderer

    monkeypatch.setenv("SAILRL_HOME", str(tmp_path / "home"))
    base_model, tok = save_model_dir("qwen2", tmp_path / "qwen2")
    folder = str(tmp_path / "qwen2")
    svc = LocalServiceClient(folder, base_dir=tmp_path / "home" / "checkpoints", seed=0)
    try:
        tc = svc.create_lora_training_client(folder, rank=4)
        renderer = get_renderer("role_colon", tc.get_tokenizer())
        convo = [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}]
        datum = datum_from_model_input_weights(*renderer.build_supervised_example(convo))
        for _ in range(3):
            tc.forward_backward([datum], "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=3e-2)).result()
        path = tc.save_weights_for_sampler("tied").result().path
        prompt = renderer.build_generation_prompt([{"role": "user", "content": "3+4="}])
        embedded = svc.create_sampling_client(model_path=path).sample(
            prompt=prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=6, temperature=0.0)
        ).result().sequences[0].tokens
    finally:
        svc.close("done")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_bytes((trained[0] / "config.json").read_bytes())
    (run_dir / "checkpoints.jsonl").write_text(json.dumps(
        {"name": "tied", "batch": 1, "final": True, "sampler_path": path}) + "\n")
    assert main(["export", str(run_dir), "--format", "merged", "-o", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert merged.config.tie_word_embeddings is False
    torch.testing.assert_close(merged.get_input_embeddings().weight, base_model.get_input_embeddings().weight)
    assert not torch.allclose(merged.get_output_embeddings().weight, base_model.get_output_embeddings().weight)
    ids = prompt.to_ints()
    with torch.no_grad():
        greedy = merged.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[0, len(ids):].tolist()
    assert greedy[: len(embedded)] == list(embedded), (greedy, embedded)


def test_sample_of_a_tinker_run_uses_a_tinker_sampling_client(trained, home, tmp_path, monkeypatch, capsys):
    """The Tinker path of ``sailrl sample``: ``tinker.ServiceClient().create_sampling_client(model_path=...)`` with
    the run's tinker:// sampler path; here a stand-in whose sampling client is the embedded backend's over the same
    adapter, so the greedy completion must equal the local run's."""
    from sailrl.runtime.backends.local import LocalServiceClient
    from sailrl.runtime.backends.tinker_service import PLACEHOLDER_KEY

    run_dir, base, _, _ = trained
    records = [json.loads(line) for line in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    local_path = [r for r in records if r.get("final")][-1]["sampler_path"]
    asked: list[str] = []
    made: list[LocalServiceClient] = []

    keys: list[str | None] = []

    class FakeService:
        def __init__(self, **kwargs):
            self.local = LocalServiceClient(str(base), base_dir=home / "checkpoints", seed=0)
            made.append(self.local)
            keys.append(kwargs.get("api_key"))

        def create_sampling_client(self, model_path: str):
            asked.append(model_path)
            return self.local.create_sampling_client(model_path=local_path)

    monkeypatch.setattr(tinker, "ServiceClient", FakeService)
    tinker_run = _tinker_run(trained, tmp_path, str(base))
    assert main(["sample", str(tinker_run), "--prompt", "3+4=", "--field", "answer=7", "--n", "1",
                 "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert asked == ["tinker://run-7/sampler_weights/t-final"]
    assert "tinker://run-7/sampler_weights/t-final (step 2), 1 completion(s) of:" in out
    assert "reference answer: '7'" in out

    from sailrl.export import RunInfo
    from sailrl.export.sample import sample_run

    info = RunInfo.read(tinker_run)
    result = sample_run(info, info.checkpoint(), prompt="3+4=", n=1, temperature=0.0, max_tokens=8)
    prompt, _ = _prompt(base)
    assert result.completions[0].tokens == _greedy_embedded(home, base, run_dir, prompt, 8)

    monkeypatch.delenv("TINKER_API_KEY")
    monkeypatch.delenv("TINKER_CREDENTIAL_CMD", raising=False)
    assert main(["sample", str(tinker_run), "--prompt", "3+4="]) == 1
    assert "TINKER_API_KEY" in _one_line(capsys)
    # another Tinker server (TINKER_BASE_URL) that checks no key: the SDK gets a placeholder
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")
    assert main(["sample", str(tinker_run), "--prompt", "3+4=", "--n", "1", "--temperature", "0"]) == 0
    assert keys[-1] == PLACEHOLDER_KEY and "1 completion(s) of:" in capsys.readouterr().out
    for svc in made:
        svc.close("done")


def test_overwrite_never_replaces_the_run_directory_or_a_folder_holding_it(trained, home, tmp_path, capsys,
                                                                           monkeypatch):
    import shutil

    run_dir = tmp_path / "runs" / "mine"
    shutil.copytree(trained[0], run_dir)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for target in (run_dir, run_dir.parent, tmp_path, run_dir / "."):
        assert main(["export", str(run_dir), "-o", str(target), "--overwrite"]) == 1
        line = _one_line(capsys)
        assert "holds the run directory" in line and "nothing was written" in line, line
    monkeypatch.chdir(tmp_path / "runs")
    assert main(["export", str(run_dir), "-o", ".", "--overwrite"]) == 1
    assert "holds the run directory" in _one_line(capsys)
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "elsewhere" / "mine.txt").write_text("keep")
    monkeypatch.chdir(tmp_path / "elsewhere" / "deep")
    for target in (".", ".."):
        assert main(["export", str(run_dir), "-o", target, "--overwrite"]) == 1
        assert "is the current folder or holds it" in _one_line(capsys)
    assert (tmp_path / "elsewhere" / "mine.txt").read_text() == "keep"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "elsewhere" not in p.parts) == before


@pytest.mark.parametrize("argv, words", [
    (["--temperature", "-1"], "--temperature takes a number 0 or above"),
    (["--temperature", "nan"], "--temperature takes a number 0 or above"),
    (["--temperature", "inf"], "--temperature takes a number 0 or above"),
    (["--max-tokens", "0"], "--max-tokens takes a whole number from 1 to 1048576"),
    (["--max-tokens", "-5"], "--max-tokens takes a whole number from 1 to 1048576"),
    (["--seed", str(2**80)], "--seed takes a whole number from 0 to 2**63 - 1"),
    (["--field", "answer=\udcff"], "is not UTF-8 text"),
])
def test_sample_refuses_values_it_cannot_sample_with_as_usage(tmp_path, capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        main(["sample", str(tmp_path), "--prompt", "hi", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["sample", str(tmp_path), "--prompt", "\udcff"])
    assert exc.value.code == 2 and "is not UTF-8 text" in capsys.readouterr().err


def test_an_output_folder_that_cannot_be_made_is_one_line(trained, home, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    for target in (tmp_path / "afile" / "sub", Path("/proc/nope/x")):
        assert main(["export", str(trained[0]), "-o", str(target)]) == 1
        line = _one_line(capsys)
        assert line.startswith(f"error: cannot write {target}: ") and "give -o a folder you can write" in line
    assert main(["export", str(trained[0]), "-o", str(tmp_path / "x\udcff")]) == 1
    assert "the folder's name is not UTF-8 text" in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("damage, words", [
    ("config_torn", "adapter_config.json cannot be read"),
    ("config_list", "adapter_config.json is not a JSON object"),
    ("weights_torn", "adapter_model.safetensors cannot be read"),
    ("weights_gone", "adapter_model.safetensors is missing"),
])
def test_a_half_written_local_checkpoint_is_one_line_for_export_and_sample(trained, home, tmp_path, capsys,
                                                                          monkeypatch, damage, words):
    """A run killed while it saved leaves a checkpoint folder with torn files: export and sample say which file
    and which checkpoints the run has (were exit 70 with a JSONDecodeError / SafetensorError traceback, or, for a
    truncated adapter exported as peft, a broken adapter written with exit 0)."""
    import shutil

    run_dir = trained[0]
    moved_home = tmp_path / "home-copy"
    shutil.copytree(home, moved_home)
    monkeypatch.setenv("SAILRL_HOME", str(moved_home))
    final = _final_dir(moved_home, run_dir)
    config, weights = final / "adapter_config.json", final / "adapter_model.safetensors"
    if damage == "config_torn":
        config.write_text(config.read_text()[:10])
    elif damage == "config_list":
        config.write_text("[]")
    elif damage == "weights_torn":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        weights.unlink()
    for fmt in ("peft", "merged"):
        assert main(["export", str(run_dir), "--format", fmt, "-o", str(tmp_path / fmt)]) == 1
        err = _one_line(capsys)
        assert err.startswith("error: the checkpoint local://") and "is damaged: " + words in err, err
        assert err.endswith("it has checkpoints at step 1, 2 (final): pass --checkpoint STEP")
        assert not (tmp_path / fmt).exists() and not list(tmp_path.glob(f".{fmt}.partial-*"))
    assert main(["sample", str(run_dir), "--prompt", "1+1=", "--n", "1"]) == 1
    assert "is damaged: " + words in _one_line(capsys)
    assert main(["export", str(run_dir), "--checkpoint", "1", "-o", str(tmp_path / "step1")]) == 0
    assert (tmp_path / "step1" / "adapter_model.safetensors").is_file()


def test_sample_of_a_prompt_longer_than_the_context_window_is_one_line(trained, home, capsys):
    """The embedded sampler refuses a prompt that fills the context window with a ValueError: it reached the
    user as exit 70, 'internal error (a bug in sailrl)', and a traceback."""
    run_dir = trained[0]
    assert main(["sample", str(run_dir), "--prompt", "1+1 " * 3000, "--n", "1", "--max-tokens", "4"]) == 1
    err = _one_line(capsys)
    assert err.startswith("error: the prompt is ") and "which fills the context window of" in err
    assert err.endswith("(512 tokens): shorten it")


def test_a_config_json_this_sailrl_cannot_read_is_one_line(trained, home, tmp_path, capsys):
    """config.json edited by hand, or written by another sailrl version: its spec failed pydantic's validation (or
    a list had no .get) inside export and sample, exit 70 with a traceback."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained[0], run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    config["spec"]["training"]["steps"] = -5
    config["spec"]["a_future_section"] = {"x": 1}
    (run_dir / "config.json").write_text(json.dumps(config))
    assert main(["export", str(run_dir), "-o", str(tmp_path / "out")]) == 1
    err = _one_line(capsys)
    assert "config.json holds a spec this sailrl cannot read (" in err and "(and 1 more)" in err
    assert "written by another sailrl version" in err and not (tmp_path / "out").exists()
    assert main(["sample", str(run_dir), "--prompt", "1+1=", "--n", "1"]) == 1
    assert "holds a spec this sailrl cannot read" in _one_line(capsys)
    (run_dir / "config.json").write_text("[1]")
    assert main(["export", str(run_dir), "-o", str(tmp_path / "out")]) == 1
    assert "holds no resolved spec: the run directory is damaged" in _one_line(capsys)


def test_an_output_path_ending_in_dot_dot_is_the_folder_it_names(trained, home, tmp_path, capsys):
    """``-o OUT/sub/..`` is OUT: the staging folder was named after '..' and renaming it over 'sub/..' failed with
    EBUSY, exit 70 (and 'sub' was left made)."""
    out = tmp_path / "out"
    out.mkdir()
    assert main(["export", str(trained[0]), "-o", str(out / "sub" / ".."), "--overwrite"]) == 0
    assert (out / "adapter_model.safetensors").is_file() and not (out / "sub").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
