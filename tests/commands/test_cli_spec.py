"""`sailrl validate`, `sailrl schema`, `sailrl init`, and the generated spec reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sailrl.cli import main
from sailrl.compiler.validate import validate_file
from sailrl.spec.loader import parse_yaml
from sailrl.spec.models import BUILTIN_MODELS

ROOT = Path(__file__).resolve().parents[2]


# -- validate ----------------------------------------------------------------------------------------------

def test_validate_ok(write_spec, minimal_spec, capsys):
    path = write_spec(minimal_spec)
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == f"ok: {path}\n"


def test_validate_reports_every_spec(write_spec, minimal_spec, capsys):
    good = write_spec(minimal_spec, "good.yaml")
    bad = write_spec(minimal_spec + "training:\n  group_size: 1\n", "bad.yaml")
    assert main(["validate", str(good), str(bad), "--color", "never"]) == 1
    out, err = capsys.readouterr()
    assert out == f"ok: {good}\n"
    n = minimal_spec.count("\n")
    assert f"{bad}:{n + 2}:15: training.group_size: group_size must be at least 2, got 1" in err
    assert "1 of 2 specs have problems" in err
    assert "Traceback" not in err and "\033[" not in err


def test_validate_color(write_spec, minimal_spec, capsys):
    bad = write_spec(minimal_spec + "training:\n  group_size: 1\n")
    assert main(["validate", str(bad), "--color", "always"]) == 1
    assert "\033[" in capsys.readouterr().err


def test_validate_missing_file(capsys, tmp_path):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 1
    assert f"{tmp_path / 'nope.yaml'}: file not found" in capsys.readouterr().err


def test_validate_does_not_import_torch_or_transformers(write_spec, minimal_spec):
    path = write_spec(minimal_spec)
    code = (
        "import sys\n"
        "from sailrl.cli import main\n"
        f"rc = main(['validate', {str(path)!r}])\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'peft', 'datasets') if m in sys.modules)\n"
        "print('heavy:', heavy, 'rc:', rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("heavy: [] rc: 0")


# -- schema ------------------------------------------------------------------------------------------------

def _schema_accepts(schema: dict, node: dict, data, path: str = "") -> list[str]:
    """Unknown keys of ``data`` under ``node`` (a tiny stand-in for yaml-language-server's validation)."""
    defs = schema["$defs"]
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    for key in ("anyOf", "oneOf"):
        if key in node:
            options = [o for o in node[key] if o.get("type") != "null"]
            if isinstance(data, dict) and "kind" in data:  # discriminated rule union
                options = [o for o in options
                           if defs[o["$ref"].rsplit("/", 1)[-1]]["properties"]["kind"].get("const") == data["kind"]]
            problems = [_schema_accepts(schema, o, data, path) for o in options]
            return min(problems, key=len) if problems else []
    if isinstance(data, dict) and "properties" in node:
        out = []
        for k, v in data.items():
            if k not in node["properties"]:
                out.append(f"{path}.{k}")
            else:
                out += _schema_accepts(schema, node["properties"][k], v, f"{path}.{k}")
        return out
    if isinstance(data, list) and isinstance(node.get("items"), dict):
        return [p for i, v in enumerate(data) for p in _schema_accepts(schema, node["items"], v, f"{path}.{i}")]
    return []


def test_schema_prints_draft_2020_12_json_schema(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "sailrl spec" and "RL fine-tuning run" in schema["description"]
    # prompt: and reward: are required by method (rl: both), which the loader checks beside the schema
    assert set(schema["required"]) == {"name", "dataset"}
    assert schema["properties"]["method"]["enum"] == ["rl", "sft", "dpo", "distill"]
    assert schema["additionalProperties"] is False
    training = schema["$defs"]["TrainingSpec"]["properties"]
    assert training["learning_rate"]["default"] == 1e-5 and training["group_size"]["default"] == 4
    assert "from" in schema["$defs"]["Extractor"]["properties"]  # YAML spelling, not the python name from_


def test_schema_describes_every_key_of_the_shipped_specs(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    for path in [ROOT / "spec" / "starter.yaml", *sorted((ROOT / "spec" / "examples").glob("*.yaml"))]:
        _, data, _, errors = parse_yaml(path.read_text(encoding="utf-8"))
        assert errors == []
        assert _schema_accepts(schema, schema, data) == [], path.name


def test_schema_to_file(tmp_path, capsys):
    out = tmp_path / "sub" / "spec.schema.json"
    assert main(["schema", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["title"] == "sailrl spec"
    assert f"wrote {out}" in capsys.readouterr().err


# -- init --------------------------------------------------------------------------------------------------

def test_init_writes_a_starter_that_validates(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    out = capsys.readouterr().out
    assert "wrote spec.yaml" in out and "wrote data/addition.jsonl" in out
    assert (tmp_path / "spec.yaml").read_text() == (ROOT / "spec" / "starter.yaml").read_text()
    data = (tmp_path / "data" / "addition.jsonl").read_text().splitlines()
    assert len(data) == 100 and set(json.loads(data[0])) == {"question", "answer"}
    loaded = validate_file(tmp_path / "spec.yaml")  # includes the data-file check and the reward examples
    assert loaded.spec.sampling.sampler == "local" and loaded.spec.model.name in BUILTIN_MODELS
    assert main(["validate", "spec.yaml"]) == 0


def test_init_refuses_to_overwrite(tmp_path, capsys):
    target = tmp_path / "mine.yaml"
    target.write_text("name: keep me\n")
    assert main(["init", str(target)]) == 1
    assert "already exists" in capsys.readouterr().err and target.read_text() == "name: keep me\n"
    assert main(["init", str(target), "--force"]) == 0
    assert target.read_text().startswith("# sailrl starter spec")


def test_init_keeps_existing_data(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "addition.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    assert main(["init", str(tmp_path / "run" / ".." / "spec.yaml")]) == 0
    assert (tmp_path / "data" / "addition.jsonl").read_text() == '{"question": "1+1", "answer": "2"}\n'
    assert "kept" in capsys.readouterr().out


# -- the generated reference -------------------------------------------------------------------------------

def test_spec_reference_is_current():
    from sailrl.compiler.docgen import render
    from sailrl.spec.schema import json_schema

    committed = (ROOT / "docs" / "spec-reference.md").read_text(encoding="utf-8")
    assert committed == render(json_schema()), (
        "docs/spec-reference.md is stale: run `python -m sailrl.compiler.docgen > docs/spec-reference.md`"
    )


def test_spec_reference_lists_every_field():
    from sailrl.spec.schema import json_schema

    text = (ROOT / "docs" / "spec-reference.md").read_text(encoding="utf-8")
    schema = json_schema()
    for name, model in schema["$defs"].items():
        assert f"## {name}" in text
        for key in model.get("properties", {}):
            assert f"| `{key}` |" in text
    assert "| `learning_rate` | number (> 0) | `1e-05` |" in text


def test_error_codes_doc_lists_every_code():
    from sailrl.compiler.docgen import render_codes
    from sailrl.spec.codes import CODES

    committed = (ROOT / "docs" / "error-codes.md").read_text(encoding="utf-8")
    assert committed == render_codes(), (
        "docs/error-codes.md is stale: run `python -m sailrl.compiler.docgen --codes > docs/error-codes.md`"
    )
    for code in CODES.values():
        assert f"| `{code.code}` | `{code.name}` | {code.severity} |" in committed


def test_init_comments_name_the_file_it_writes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "myspec.yaml"]) == 0
    text = (tmp_path / "myspec.yaml").read_text()
    assert "#     sailrl validate myspec.yaml    # every problem at once" in text
    assert "#     sailrl run myspec.yaml         # compile and train now" in text
    assert "spec.yaml" not in text.replace("myspec.yaml", "").replace("spec.schema.json", "")
    assert capsys.readouterr().out.endswith("next: sailrl validate myspec.yaml  then  sailrl run myspec.yaml\n")
    assert main(["init", "my spec.yaml"]) == 0
    assert "#     sailrl run 'my spec.yaml'      # compile" in (tmp_path / "my spec.yaml").read_text()
    assert main(["validate", "my spec.yaml"]) == 0
