"""The model card of an export: ``README.md`` with a YAML metadata block (``huggingface_hub.ModelCardData``, as
tinker_cookbook's ``weights.generate_model_card`` writes it), and the files beside it.

The card says what the model was trained for, from the run's own records: the base model, the LoRA rank, the spec
(name, sha256, its method and the reward rules in the words ``sailrl explain`` uses), the data (source, split,
rows), the steps,
the first-vs-last metrics and evaluation from ``metrics.jsonl``, the checkpoint, and the versions of sailrl and the
libraries. The spec file (when it is still the one the run hashed; otherwise the resolved spec from
``config.json``) and ``metrics.jsonl`` are copied beside it. Nothing from the environment is written: no key, no
token, no host name.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from sailrl.compiler.words import method_words
from sailrl.export.build import BASE_SUBFOLDER, Built
from sailrl.export.runinfo import Checkpoint, RunInfo
from sailrl.export.sample import renderer_for, row_messages
from sailrl.runtime.data import DatasetError, dataset_row, load_rows
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rundir.directory import METRICS_FILE, RunFileError, read_run_bytes
from sailrl.runtime.rundir.method_logs import method_keys
from sailrl.spec.constants import LOCAL_DATA_SUFFIXES, MAX_SPEC_BYTES
from sailrl.spec.errors import UserError
from sailrl.spec.models import is_builtin
from sailrl.spec.schema import Spec
from sailrl.spec.version import __version__

LIBRARIES = ("torch", "transformers", "peft", "tinker", "tinker-cookbook")
SPEC_COPY = "spec.yaml"
RESOLVED_SPEC_COPY = "spec.resolved.json"
#: Per method: the card's tags and how the model was trained, in words.
METHOD_TAGS = {"rl": ["reinforcement-learning", "grpo"], "sft": ["sft"], "dpo": ["dpo"],
               "distill": ["distillation", "on-policy-distillation"]}
TRAINED_WITH = {"rl": "reinforcement learning", "sft": "supervised fine-tuning (`method: sft`)",
                "dpo": "direct preference optimisation (`method: dpo`)",
                "distill": "on-policy distillation from a teacher (`method: distill`)"}
HUB_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./")


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a Hugging Face repository id (``org/name``), not a built-in model or a file."""
    return (name.count("/") == 1 and not name.startswith((".", "/", "~")) and set(name) <= HUB_ID_CHARS
            and not is_builtin(name) and not name.lower().endswith((*LOCAL_DATA_SUFFIXES, ".gguf")))


def explain_lines(spec: Spec, spec_dir: Path) -> list[str]:
    """The reward rules in words, exactly as ``sailrl explain`` prints them (none for a spec without rules)."""
    if spec.reward is None:
        return []
    reference = spec.prompt.reference_field if spec.prompt is not None else "answer"
    return RewardFunction.from_spec(spec.reward, reference, spec_dir).explain()


def data_rows(spec: Spec, spec_dir: Path) -> str:
    """How many training / eval rows the run had, counted from a local file; for a hub dataset, not counted here
    (that would download it)."""
    if not spec.dataset.source.lower().endswith(LOCAL_DATA_SUFFIXES):
        return "not counted here (a hub dataset)"

    try:
        fn = (RewardFunction.from_spec(spec.reward, spec.prompt.reference_field, spec_dir)
              if spec.reward is not None and spec.prompt is not None else None)
        rows = load_rows(spec, spec_dir, fn)
    except (DatasetError, OSError, ValueError) as exc:
        return f"not counted (the file cannot be read here: {str(exc).splitlines()[0][:160]})"
    text = f"{len(rows.train)} training rows"
    if rows.eval:
        text += f", {len(rows.eval)} eval rows"
    if rows.skipped:
        text += f", {len(rows.skipped)} skipped"
    return text


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def metric_rows(metrics: list[dict[str, Any]], rule_names: list[str], k: int = 5,
                method: str = "rl") -> list[tuple[str, str, str, int]]:
    """``(metric, first, last, n)``: means of the first and last ``n`` steps that logged it (``n`` = min(k, half)),
    for the method's own metrics (SFT's NLL, DPO's loss and accuracy, a distillation's reverse KL), reward, each
    rule, ``correct``, the degenerate and truncated fractions, and the eval metrics."""
    keys = [*method_keys(method), "reward/total", *[f"reward/{r}" for r in rule_names], "correct",
            "degenerate_frac", "frac_truncated", "eval/reward/total", "eval/correct"]
    keys = list(dict.fromkeys(keys))  # a method's key that is also RL's is listed once
    out = []
    for key in keys:
        values = [m[key] for m in metrics if isinstance(m.get(key), int | float)]
        if not values:
            continue
        n = min(k, len(values) // 2) if len(values) > 1 else 1
        first, last = _mean(values[:n]), _mean(values[-n:])
        if first is None or last is None:
            continue
        out.append((key, f"{first:.3f}", f"{last:.3f}", n))
    return out


@dataclass
class ExamplePrompt:
    """A prompt as the run built it, for the card's snippet: ``text`` (the rendered prompt decoded, special tokens
    written out; None when the renderer cannot be built here), ``stops`` (the renderer's stop strings and stop
    token ids), ``where`` (where the prompt came from, in words), ``messages`` (the messages it renders),
    ``renderer`` (its name, when known)."""

    text: str | None
    stops: list[str | int]
    where: str
    messages: list[dict[str, str]]
    renderer: str | None


def example_prompt(run: RunInfo, spec: Spec) -> ExamplePrompt:
    """Row 0 of the run's data through the spec's template and the run's renderer, decoded to text (what the
    embedded sampler and Tinker were given); a plain user turn when the data cannot be read here."""
    messages = [{"role": "user", "content": "Hello"}]
    try:
        tokenizer, renderer, renderer_name = renderer_for(spec, run.spec_dir)
    except (UserError, OSError, ValueError):
        return ExamplePrompt(None, [], "a user turn", messages, spec.model.renderer)
    try:
        values, _ = dataset_row(spec, run.spec_dir, 0)
        where = "row 0 of the training data"
    except (UserError, LookupError, OSError, ValueError):  # a hub dataset not cached here, a moved file
        values, where = None, "a user turn (the run's data cannot be read here)"
    builder = PromptBuilder(spec.prompt, renderer) if spec.prompt is not None else None
    stops = list(spec.sampling.stop or renderer.get_stop_sequences())
    if values is not None:
        try:
            messages = row_messages(spec, builder, values)
        except (UserError, ValueError, TypeError) as exc:  # a template that fails on row 0: a plain user turn
            where = f"a user turn (row 0 of the data does not render: {str(exc).splitlines()[0][:100]})"
    ids = renderer.build_generation_prompt(messages).to_ints()
    return ExamplePrompt(str(tokenizer.decode(ids)), stops, f"{where}, through the {renderer_name} renderer",
                         messages, renderer_name)


def _usage(built: Built, fmt: str, folder_name: str, repo_id: str | None, spec: Spec | None = None,
           prompt: ExamplePrompt | None = None, tokenizer_in_folder: bool = True) -> str:
    """The card's snippet: load the model, build the prompt as the run did, generate greedily, cut the reply
    where the renderer's stop sequence ends it, print it. It runs as written from the folder's parent folder."""
    where = repo_id or f"./{folder_name}"
    builtin = is_builtin(built.base_model)
    lines = ["import torch"]
    if fmt == "merged":
        lines += ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  f'folder = "{where}"  # this folder, wherever it is now',
                  "model = AutoModelForCausalLM.from_pretrained(folder).eval()"]
    else:
        lines += ["from peft import PeftModel", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  f'folder = "{where}"  # this folder, wherever it is now']
        if builtin and repo_id is not None:
            lines.append(f'base = AutoModelForCausalLM.from_pretrained(folder, subfolder="{BASE_SUBFOLDER}")  '
                         f"# {built.base_model}: not on the Hub, so this repository carries it")
        elif builtin:
            lines.append(f'base = AutoModelForCausalLM.from_pretrained(f"{{folder}}/{BASE_SUBFOLDER}")  '
                         f"# {built.base_model}: not on the Hub, so this folder carries it")
        elif built.base_model.lower().endswith(".gguf"):
            base_path = Path(built.base_model)
            lines.append(f"base = AutoModelForCausalLM.from_pretrained({str(base_path.parent)!r}, "
                         f"gguf_file={base_path.name!r})")
        else:
            lines.append(f"base = AutoModelForCausalLM.from_pretrained({built.base_model!r})")
        lines.append("model = PeftModel.from_pretrained(base, folder).eval()")
    lines.append("tokenizer = AutoTokenizer.from_pretrained(folder)" if tokenizer_in_folder or fmt == "merged"
                 else f"tokenizer = AutoTokenizer.from_pretrained({built.base_model!r})")
    if spec is None or prompt is None:
        return "\n".join(lines)
    lines.append("")
    if prompt.text is not None:
        lines += [f"# The prompt as the run built it: {prompt.where}.",
                  f"prompt = {prompt.text!r}",
                  "# add_special_tokens=False: the prompt is whole as written (a tokenizer may add an end-of-text "
                  "token such as </s>).",
                  'ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids']
    else:
        renderer = prompt.renderer or "its model's default renderer"
        lines += [f"# The run rendered its prompts with {renderer}, which could not be built where this was "
                  "exported; the tokenizer's chat template is the nearest.",
                  f"messages = {prompt.messages!r}",
                  "ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, "
                  'return_tensors="pt")']
    stop_ids = [s for s in prompt.stops if isinstance(s, int)]
    stop_texts = [s for s in prompt.stops if isinstance(s, str)]
    eos = f"[tokenizer.eos_token_id, *{stop_ids!r}]" if stop_ids else "tokenizer.eos_token_id"
    lines += ["with torch.no_grad():  # greedy; the run sampled at temperature "
              f"{spec.sampling.temperature:g}",
              f"    out = model.generate(ids, max_new_tokens={spec.sampling.max_tokens}, do_sample=False, "
              f"eos_token_id={eos})",
              "reply = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)"]
    for stop in stop_texts:
        lines.append(f"reply = reply.split({stop!r})[0]  # the renderer's stop sequence ends the reply")
    if prompt.renderer == "role_colon":
        lines.append('reply = reply.removeprefix(" ")  # role_colon writes "Assistant: " before the reply')
    lines.append("print(reply)")
    return "\n".join(lines)


def render_card(run: RunInfo, ckpt: Checkpoint, fmt: str, built: Built, folder_name: str,
                spec_file: str = SPEC_COPY, repo_id: str | None = None, prompt: ExamplePrompt | None = None,
                tokenizer_in_folder: bool = True) -> str:
    """The ``README.md`` text. ``prompt``: the snippet's prompt (default :func:`example_prompt`);
    ``tokenizer_in_folder``: whether the export holds the tokenizer's files (else the snippet loads the base's)."""
    spec = run.spec()
    prompt = prompt if prompt is not None else example_prompt(run, spec)
    hub_base = _is_hub_id(built.base_model)
    tags = ["sailrl", *METHOD_TAGS[spec.method]] + (["peft", "lora"] if fmt == "peft" else [])
    data = ModelCardData(library_name="peft" if fmt == "peft" else "transformers", pipeline_tag="text-generation",
                         tags=tags, base_model=built.base_model if hub_base else None)
    if _is_hub_id(spec.dataset.source):
        data.datasets = [spec.dataset.source]
    t = spec.training
    rules = explain_lines(spec, run.spec_dir)
    rule_names = [r.name for r in spec.reward.rules] if spec.reward is not None else []
    rows = metric_rows(run.metrics, rule_names, method=spec.method)
    steps_logged = len(run.metrics)
    lines = [
        "---", data.to_yaml(), "---", "",
        f"# {spec.name}", "",
        f"A LoRA fine-tune of {built.base_model} trained with {TRAINED_WITH[spec.method]} by "
        f"sailrl {__version__} from the spec `{spec.name}` "
        f"({'the embedded local backend' if ckpt.is_local else 'Tinker'}).", "",
        "## Model", "",
        f"- **Base model:** {built.base_model}",
        "- **Format:** " + ("LoRA adapter (PEFT)" if fmt == "peft" else "merged model (the LoRA added into the base "
                            "weights)"),
        f"- **LoRA rank:** {built.lora_rank}" + (f" (alpha {built.lora_alpha:g})" if built.lora_alpha else ""),
    ]
    if built.target_modules:
        lines.append(f"- **LoRA modules:** {', '.join(built.target_modules)}")
    lines += [
        f"- **Checkpoint:** `{ckpt.path}` ({'final, ' if ckpt.final else ''}after step {ckpt.step})",
        f"- **Renderer:** {spec.model.renderer or 'the model default'}", "",
        "## Training", "",
        f"- **Spec:** `{spec.name}`, sha256 `{run.spec_sha256}` (beside this card: `{spec_file}`"
        + (", the values the run resolved: the spec file changed since" if spec_file == RESOLVED_SPEC_COPY else "")
        + ")",
        f"- **Steps:** {ckpt.step} of {t.steps} ({steps_logged} logged in `{METRICS_FILE}`), {_batch(spec)}",
        f"- **Optimiser:** learning rate {t.learning_rate:g}, loss {_loss(spec)}",
        f"- **Data:** `{spec.dataset.source}`, split `{spec.dataset.split}`, {data_rows(spec, run.spec_dir)}", "",
        *([f"### Method: {spec.method}", "", *[f"- {line}" for line in method_words(spec)], ""]
          if spec.method != "rl" else []),
        *(["### Reward, per completion" if spec.method == "rl" else "### Reward rules (measured, not the loss)"
           if spec.method == "sft" else "### Reward rules", "", *[f"- {line}" for line in rules], ""]
          if rules else []),
        "## Results", "",
    ]
    if rows:
        lines += ["| metric | first steps | last steps |", "|---|---|---|"]
        lines += [f"| {key} | {first} (mean of {n}) | {last} (mean of {n}) |" for key, first, last, n in rows]
    else:
        lines.append("No metrics were logged.")
    lines += [
        "", "## Usage", "",
        "Run from the folder that holds this one: it loads the model, builds a prompt as the run did and prints the "
        "greedy reply, the text the reward rules read (`sailrl sample RUN_DIR --row 0 --temperature 0` prints the "
        "same).", "",
        "```python", _usage(built, fmt, folder_name, repo_id, spec, prompt, tokenizer_in_folder), "```", "",
        *_usage_notes(built, fmt, folder_name),
        "## Versions", "",
        f"- sailrl: {__version__} (the run: {run.config.get('sailrl_version', 'unknown')})",
        *[f"- {name}: {_version(name)}" for name in LIBRARIES], "",
    ]
    return ModelCard("\n".join(lines)).content


def _batch(spec: Spec) -> str:
    t = spec.training
    if spec.method == "sft":
        return f"{spec.sft.batch_size if spec.sft is not None else 32} conversations per step"
    if spec.method == "dpo":
        return f"{spec.dpo.batch_size if spec.dpo is not None else 16} pairs per step"
    return f"{t.groups_per_step} groups x {t.group_size} rollouts per step"


def _loss(spec: Spec) -> str:
    if spec.method == "sft":
        return "`cross_entropy` on the assistant tokens"
    if spec.method == "dpo":
        return f"DPO (beta {spec.dpo.beta:g}, against the frozen starting weights)"
    return f"`{spec.training.loss_fn}`" + (" with the reverse-KL advantage" if spec.method == "distill" else "")


def _usage_notes(built: Built, fmt: str, folder_name: str) -> list[str]:
    """What a user moving or serving the folder needs beyond the snippet."""
    notes = []
    if fmt == "peft" and is_builtin(built.base_model):
        notes.append(f"The base model, `{built.base_model}`, is built into sailrl and is not on the Hugging Face Hub: "
                     f"`{BASE_SUBFOLDER}/` holds it as transformers saved it, so the folder loads offline wherever it "
                     f"is moved (`adapter_config.json` names the base `{built.base_model}`; give "
                     f"`{folder_name}/{BASE_SUBFOLDER}` as the base to vLLM or SGLang).")
    elif fmt == "peft" and _is_hub_id(built.base_model):
        notes.append(f"Serving: `vllm serve {built.base_model} --enable-lora --lora-modules trained=./{folder_name}`.")
    elif fmt == "peft":
        notes.append(f"`adapter_config.json` names the base by its path, `{built.base_model}`: the folder can move, "
                     "the base must stay where it is (or change the path in the snippet).")
    return [*notes, ""] if notes else []


def write_card(out: Path, run: RunInfo, ckpt: Checkpoint, fmt: str, built: Built, folder_name: str) -> None:
    """Write ``README.md``, the spec and ``metrics.jsonl`` into ``out``."""
    spec_file = copy_records(out, run)
    text = render_card(run, ckpt, fmt, built, folder_name, spec_file,
                       tokenizer_in_folder=(out / "tokenizer_config.json").is_file())
    (out / "README.md").write_text(text, encoding="utf-8")


def copy_records(out: Path, run: RunInfo) -> str:
    """Copy the spec file (when its sha256 is still the run's; else write the resolved spec) and ``metrics.jsonl``
    into ``out``; returns the spec copy's name."""
    metrics = read_run_bytes(run.path / METRICS_FILE)  # regular files only, within their size limit
    if metrics is not None:
        (out / METRICS_FILE).write_bytes(metrics)
    source = run.spec_path
    if source is not None:
        try:
            raw = read_run_bytes(source, MAX_SPEC_BYTES)  # the bytes the run hashed, read once
        except (RunFileError, OSError):
            raw = None
        if raw is not None and hashlib.sha256(raw).hexdigest() == run.spec_sha256:
            (out / SPEC_COPY).write_bytes(raw)
            return SPEC_COPY
    (out / RESOLVED_SPEC_COPY).write_text(json.dumps(run.config["spec"], indent=2, sort_keys=True) + "\n",
                                          encoding="utf-8")
    return RESOLVED_SPEC_COPY
