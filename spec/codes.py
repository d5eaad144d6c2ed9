"""Stable codes of spec problems (dbt's idea): every :class:`~sailrl.spec.errors.SpecError` carries one.

A code names a kind of problem independently of its wording, so tools and tests match codes, de-duplication
compares codes, and ``docs/error-codes.md`` lists every code with its meaning (a test checks that list against
:data:`CODES`). ``S0xx``: reading the file and YAML; ``S1xx``: the schema (keys, types, bounds); ``S2xx``:
semantic checks (regexes, templates, model, training, sampling, data); ``S3xx``: the worked reward ``examples:``;
``Wxxx``: warnings (the spec is usable, but a value looks wrong).

Codes are never reused for another meaning; a retired code stays in the table with ``retired`` in its meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Code:
    """One problem kind: ``code`` (``S101``), ``name`` (``unknown-key``), ``severity``, ``meaning`` (one sentence)."""

    code: str
    name: str
    severity: Severity
    meaning: str


_TABLE: tuple[Code, ...] = (
    # -- reading the file and YAML ---------------------------------------------------------------------------
    Code("S001", "file-not-found", "error", "The spec file does not exist."),
    Code("S002", "file-unreadable", "error", "The spec file exists but cannot be read (permissions, a folder, a "
         "name too long)."),
    Code("S003", "not-utf8", "error", "The spec file is not UTF-8 text."),
    Code("S004", "file-too-large", "error", "The spec is larger than the size limit (a spec is a few kilobytes)."),
    Code("S005", "empty-spec", "error", "The spec file holds no YAML document."),
    Code("S006", "not-a-mapping", "error", "The document is not a mapping of sections (name:, model:, ...)."),
    Code("S010", "yaml-syntax", "error", "The text is not valid YAML."),
    Code("S011", "tab-indentation", "error", "A tab character is used for indentation; YAML forbids it."),
    Code("S012", "invalid-escape", "error", "A backslash escape inside double quotes that YAML does not know."),
    Code("S013", "unclosed", "error", "A quote, '[' or '{' is opened and never closed."),
    Code("S014", "non-printable-character", "error", "A control character YAML does not allow (e.g. a form feed)."),
    Code("S015", "duplicate-key", "error", "The same key is written twice in one mapping."),
    Code("S016", "unsupported-tag", "error", "A YAML tag (!!python/..., !custom) a spec does not use."),
    Code("S017", "merge-key", "error", "A YAML 1.1 merge key (<<), which YAML 1.2 and sailrl do not support."),
    Code("S018", "recursive-alias", "error", "An alias refers to the node that contains it."),
    Code("S019", "too-many-values", "error", "The document expands (anchors and aliases included) to more values "
         "than the limit, e.g. a YAML alias bomb."),
    Code("S020", "nesting-too-deep", "error", "Mappings and lists are nested deeper than the limit."),
    Code("S021", "integer-too-long", "error", "An integer has more digits than the limit."),
    Code("S022", "unquoted-template", "error", "A {{ ... }} template is not quoted, so YAML read it as a mapping."),
    Code("S023", "complex-key", "error", "A key is a list or a mapping instead of a name."),
    Code("S024", "invalid-tagged-value", "error", "A value with an explicit tag (!!int, !!float, ...) does not fit "
         "the tag."),
    Code("S025", "lone-surrogate", "error", "A \\uD800-\\uDFFF escape: half of a UTF-16 surrogate pair, not a "
         "character."),
    # -- schema ---------------------------------------------------------------------------------------------
    Code("S101", "unknown-key", "error", "A key the spec language does not have at this place."),
    Code("S102", "missing-key", "error", "A required section or key is missing."),
    Code("S103", "wrong-type", "error", "A value has the wrong type (text where a number belongs, ...)."),
    Code("S104", "not-a-choice", "error", "A value is not one of the allowed choices."),
    Code("S105", "unknown-kind", "error", "A reward rule or check has an unknown `kind`."),
    Code("S106", "missing-kind", "error", "A reward rule or check has no `kind`."),
    Code("S107", "out-of-range", "error", "A number is outside the bounds its key allows."),
    Code("S108", "wrong-length", "error", "A list has too few or too many items."),
    Code("S109", "invalid-value", "error", "A value that the key's own rule refuses (the message says why)."),
    Code("S110", "not-finite", "error", "A number is infinite or not a number (.inf, .nan, 1e400)."),
    Code("S111", "invalid-run-name", "error", "The run name cannot name a directory and checkpoints."),
    Code("S119", "schema-other", "error", "Another schema problem (the message says what)."),
    # -- semantic checks ------------------------------------------------------------------------------------
    Code("S201", "regex-invalid", "error", "A regular expression does not compile, or is nested too deeply."),
    Code("S202", "control-character", "error", "A double-quoted escape (\\b, \\a, ...) became a control "
         "character in a pattern or template."),
    Code("S203", "template-syntax", "error", "A Jinja template does not parse."),
    Code("S204", "template-include", "error", "A template includes, imports or extends another template."),
    Code("S205", "template-unusable", "error", "A template parses but cannot be compiled (an unknown filter or "
         "test)."),
    Code("S206", "template-unknown-field", "error", "A template uses a name that is not a declared dataset field."),
    Code("S207", "template-forbidden", "error", "A template reaches for something the sandbox forbids "
         "(__class__, an unsafe attribute)."),
    Code("S208", "template-limit", "error", "A template runs past a rendering limit (time, output size, "
         "nesting) on an example row."),
    Code("S209", "template-fails-on-data", "error", "A prompt template fails on every one of the first dataset rows "
         "validate renders it on (an error in the template, whatever the row)."),
    Code("S211", "unknown-renderer", "error", "model.renderer is not a renderer name sailrl knows."),
    Code("S212", "unknown-model", "error", "No default renderer is known for model.name; set model.renderer."),
    Code("S213", "lora-rank", "error", "The LoRA rank is not a positive power of two."),
    Code("S214", "group-size", "error", "training.group_size is below 2, so every advantage is zero."),
    Code("S215", "substeps-divide", "error", "training.num_substeps does not divide training.groups_per_step."),
    Code("S216", "resume-from-sampler", "error", "training.resume_from or training.init_from is a sampler "
         "checkpoint, which holds weights for sampling only (no training state to load)."),
    Code("S217", "completion-window-retired", "error", "The Sail completion window is retired or not supported."),
    Code("S218", "completion-window-unknown", "error", "The Sail completion window is not a known one."),
    Code("S219", "unknown-field", "error", "A reference field is not a declared dataset field."),
    Code("S220", "field-listed-twice", "error", "dataset.fields names one field twice."),
    Code("S221", "duplicate-rule-name", "error", "Two reward rules have the same name (the metric key)."),
    Code("S222", "empty-range", "error", "dataset.range is empty or negative."),
    Code("S223", "eval-split-choice", "error", "dataset.eval sets none or several of split, count and fraction."),
    Code("S224", "data-file-missing", "error", "A local dataset file does not exist."),
    Code("S225", "path-too-long", "error", "A name or path is longer than a file system allows (255 bytes a "
         "component)."),
    Code("S226", "warmup-too-long", "error", "training.lr_warmup_steps is not below training.steps."),
    Code("S227", "data-unusable", "error", "The dataset cannot be used (reported by preflight at the key it "
         "concerns)."),
    Code("S228", "data-file-not-regular", "error", "dataset.source names a device, a named pipe (FIFO) or a socket "
         "instead of a data file."),
    Code("S229", "data-file-type", "error", "dataset.source names a local file of a type sailrl does not read (not "
         ".jsonl, .json, .csv or .parquet) or a folder that Dataset.save_to_disk did not write."),
    Code("S230", "python-rule-unusable", "error", "A python reward rule's function cannot be used: no such file "
         "or function next to the spec, the file raises on import, or the signature is not fn(completion, fields)."),
    Code("S231", "judge-model-unservable", "error", "A judge rule's model cannot be served where its judge runs "
         "(judge.sampler): a local folder or built-in model on sail or tinker, or a model the service answered "
         "it does not serve."),
    Code("S232", "judge-remote-only", "error", "A judge rule with sampler: local names a model that only a remote "
         "service serves (too large for the embedded backend)."),
    Code("S233", "judge-scale", "error", "A judge rule's scale is not binary, 0-1, 1-10 or labels each with a value "
         "from 0 to 1."),
    # -- the rows a step draws (training.dynamic_sampling, training.difficulty_filter) -------------------------
    Code("S234", "draws-need-synchronous", "error", "training.dynamic_sampling or training.difficulty_filter is set "
         "with max_steps_off_policy above 0: the rows of later steps would be drawn before this step's are known."),
    # -- budget and prices (sailrl.compiler.cost_checks) ----------------------------------------------------
    Code("S241", "budget-needs-prices", "error", "training.max_cost_usd is set but a price the run pays is unknown "
         "(pricing:)."),
    Code("S242", "budget-below-one-step", "error", "training.max_cost_usd is below the estimated cost of one RL "
         "step, so the run would stop before its first step."),
    # -- episodes (environment:; sailrl.compiler.episode_checks) ---------------------------------------------
    Code("S250", "duplicate-tool-name", "error", "Two tools of environment.tools have the same name (the name the "
         "model calls it by)."),
    Code("S251", "feedback-unknown-rule", "error", "environment.feedback names a rule that is not a reward rule."),
    Code("S252", "renderer-without-tools", "error", "The spec has tools but its renderer cannot write or read tool "
         "calls for the chosen model."),
    Code("S253", "not-available", "error", "A key or value of the design that this version of sailrl does not run "
         "yet."),
    Code("S254", "tool-unusable", "error", "A tool's function cannot be used: no such file or function next to the "
         "spec, the file raises on import, or its parameters have no usable type hints."),
    Code("S255", "sandbox-unavailable", "error", "The built-in python tool runs the model's code isolated in Linux "
         "namespaces (bubblewrap), and that isolation is unavailable on this machine (not Linux, bubblewrap not "
         "installed, or namespaces disabled)."),
    Code("S256", "tool-option-python-only", "error", "A tool sets network or disk_mb, which only the built-in python "
         "tool's sandbox has."),
    Code("S257", "key-of-another-method", "error", "A key or section that only another training method reads (e.g. "
         "training.group_size with method: sft, reward rules with method: dpo)."),
    Code("S258", "teacher-tokenizer-differs", "error", "method distill: the teacher's tokenizer is not the "
         "student's, so the teacher cannot score the student's tokens."),
    Code("S259", "sft-empty-assistant-turn", "error", "method sft: a data row's assistant turn is empty (sft.completion "
         "renders to nothing, or a message of sft.messages_field with role assistant has no content), so the row "
         "has nothing to train on."),
    Code("S260", "sft-messages-field", "error", "method sft: sft.messages_field is not a declared dataset field, or a "
         "row's value there is not a list of {role, content} messages with an assistant turn."),
    Code("S261", "init-from-unfinished", "error", "training.init_from names a run directory that holds no finished "
         "run: it does not exist (and no earlier stage of the same sailrl run writes it), holds no run, or the run "
         "has not saved its final state."),
    Code("S262", "init-from-other-model", "error", "training.init_from names a run of another model or LoRA rank "
         "than this spec's, or one whose weights live on another backend (local:// vs tinker://)."),
    Code("S263", "dpo-field-undeclared", "error", "method dpo: dpo.chosen_field or dpo.rejected_field is not a "
         "declared dataset field."),
    Code("S264", "dpo-empty-completion", "error", "method dpo: a data row's chosen or rejected completion is empty, or "
         "not text (a list of messages), so that pair cannot train."),
    Code("S265", "dpo-same-completion", "error", "method dpo: a data row's chosen and rejected completions are the "
         "same text, so the pair states no preference."),
    Code("S266", "sft-rules-without-prompt", "error", "method sft: reward rules in a spec whose rows hold whole "
         "conversations (sft.messages_field, no prompt:), which samples no held-out reply for them to score."),
    # -- worked reward examples ------------------------------------------------------------------------------
    Code("S301", "example-mismatch", "error", "A worked example does not score as it expects."),
    Code("S302", "example-unknown-rule", "error", "A worked example expects a score for a rule that does not exist."),
    Code("S303", "example-expects-nothing", "error", "A worked example sets neither expect nor expect_total."),
    Code("S304", "example-reference", "error", "A worked example's reference answer is unusable for the answer "
         "rules."),
    Code("S305", "pattern-matches-none", "error", "A pattern matches none of the examples that expect its rule to "
         "pass."),
    Code("S306", "judge-unreachable", "error", "sailrl validate --judge could not reach a judge rule's model, so its "
         "examples and injection probes were not scored."),
    # -- warnings ---------------------------------------------------------------------------------------------
    Code("W101", "unusual-value", "warning", "A value lies outside the usual range documented for its key."),
    Code("W102", "kl-discount-unused", "warning", "training.kl_discount_factor is set but kl_penalty_coef is 0, "
         "so it does nothing."),
    Code("W103", "max-tokens-vs-context", "warning", "sampling.max_tokens leaves no room for the prompt in the "
         "model's context window."),
    Code("W104", "examples-skipped", "warning", "Worked examples were not scored because rules they depend on "
         "have problems."),
    Code("W105", "sft-completion-unused", "warning", "method sft: sft.completion is set with sft.messages_field, whose "
         "rows hold whole conversations, so it does nothing."),
    Code("W110", "answer-rule-gameable", "warning", "An answer rule scores an adversarial completion as correct "
         "(every option listed, the reference outside the answer, a word that starts with the right letter)."),
    Code("W111", "judge-injection", "warning", "An injection probe passes a judge rule (a completion that tells the "
         "judge to answer 10, a fake <score> tag, the rubric quoted back): every probe's score."),
    Code("W112", "judge-examples-unchecked", "warning", "Worked examples that expect a judge rule's score were not "
         "checked: the judge was not called (use sailrl validate --judge)."),
    Code("W113", "tiny-judge-rubric", "warning", "A judge rule uses sailrl/tiny-judge with a rubric, scale or "
         "renderer it was not taught: it judges only 'The question was {{ question }}. A good reply is only the "
         "number {{ answer }}, nothing else.' on the binary scale, so its answers to anything else mean nothing."),
    Code("W120", "learning-rate-far-from-recommended", "warning", "training.learning_rate is more than 10x above "
         "(or 100x below) the LoRA learning rate tinker_cookbook's hyperparam_utils.get_lr recommends for the model."),
    Code("W130", "feedback-reveals-reference", "warning", "A feedback message shows `why` of an answer rule, whose "
         "reason names the reference answer: the model is told the answer it is scored on."),
    Code("W131", "sandbox-unused", "warning", "environment.sandbox: sail is set but no tool runs code there (only the "
         "built-in python tool does), so no Sailbox would start."),
    Code("W132", "feedback-never-given", "warning", "The spec has feedback but environment.max_turns is 1, so no "
         "episode can get a feedback turn (it needs a second assistant turn)."),
    Code("W133", "sandbox-unisolated", "warning", "environment.sandbox: unisolated_worker runs the model's code "
         "without isolation: it can read this machine's files and keys and reach its network."),
    Code("W134", "tool-network", "warning", "The python tool has network: true, so the model's code can reach the "
         "network from the machine that runs it."),
)

#: Every code, by its code string ("S101" -> Code).
CODES: dict[str, Code] = {c.code: c for c in _TABLE}
assert len(CODES) == len(_TABLE), "duplicate code in the table"
_BY_NAME: dict[str, Code] = {c.name: c for c in _TABLE}
assert len(_BY_NAME) == len(_TABLE), "duplicate code name in the table"


def code_of(name_or_code: str) -> Code:
    """The :class:`Code` for ``"S101"`` or ``"unknown-key"``. Raises KeyError for an unknown one."""
    return CODES.get(name_or_code) or _BY_NAME[name_or_code]


@dataclass(frozen=True)
class ErrorCode:
    """One error class: ``code`` (``E100``), ``cls`` (its dotted path), ``meaning`` (one sentence)."""

    code: str
    cls: str
    meaning: str


#: Every public error class sailrl raises, by its stable code (the class's ``code`` attribute). ``E0xx``: the roots
#: and categories; ``E1xx``: the runtime (a run, its data, rules, services, the local backend); ``E2xx``: commands.
#: A spec problem's own code (``S...``) is on each problem of a ``SpecErrors``. ``tests/test_architecture.py``
#: checks this table against the classes.
ERROR_CODES: dict[str, ErrorCode] = {e.code: e for e in (
    ErrorCode("E000", "sailrl.spec.errors.SailrlError", "The root: every error sailrl raises on purpose."),
    ErrorCode("E001", "sailrl.spec.errors.UserError", "A problem the user can fix; printed as one line, exit 1."),
    ErrorCode("E002", "sailrl.spec.errors.ConfigError", "A setting (spec value, override, environment variable) "
              "cannot be used."),
    ErrorCode("E003", "sailrl.spec.errors.DataError", "The dataset cannot be read or has no usable rows."),
    ErrorCode("E004", "sailrl.spec.errors.ModelError", "A model, tokenizer or checkpoint cannot be loaded."),
    ErrorCode("E005", "sailrl.spec.errors.StorageError", "A folder sailrl must write (run directory, SAILRL_HOME) "
              "cannot be created or written."),
    ErrorCode("E006", "sailrl.spec.errors.ServiceError", "A remote service (Tinker, Sail) or a backend failed while "
              "the run was going."),
    ErrorCode("E010", "sailrl.spec.errors.SpecErrors", "Every problem found in one spec file, each with its own "
              "S/W code."),
    ErrorCode("E011", "sailrl.spec.patterns.PatternError", "A regular expression cannot be compiled or is over a "
              "limit."),
    ErrorCode("E012", "sailrl.spec.models.UnknownModelError", "A model name the catalogue does not know."),
    ErrorCode("E100", "sailrl.runtime.loop.errors.RunError", "A service or backend fault (Tinker, Sail, their HTTP "
              "transport, the embedded backend), named by step and phase."),
    ErrorCode("E101", "sailrl.runtime.loop.errors.AllDegenerateError", "Every group of a step scored the same and "
              "training.on_all_degenerate is stop."),
    ErrorCode("E102", "sailrl.runtime.loop.errors.OnPolicyMismatch", "The sampler's logprobs disagree with the "
              "learner's and sampling.on_policy_mismatch is stop."),
    ErrorCode("E103", "sailrl.runtime.rundir.writes.RunDirectoryError", "The run directory holds a run this command would "
              "overwrite, or one already complete."),
    ErrorCode("E104", "sailrl.runtime.loop.errors.BudgetReached", "The next step would pass training.max_cost_usd (state "
              "saved, exit 3)."),
    ErrorCode("E105", "sailrl.runtime.rundir.writes.RunWriteError", "A write of the run failed: a full disk, a quota, a "
              "read-only or failing file system (the run stops at a step boundary; --resume continues it)."),
    ErrorCode("E106", "sailrl.runtime.rundir.directory.RunFileError", "A run directory's file is not a regular file (a FIFO, "
              "a device, a link to one) or is over its size limit."),
    ErrorCode("E107", "sailrl.runtime.loop.errors.RunStopped", "The run stopped where its spec says to stop "
              "(training.on_all_degenerate or sampling.on_policy_mismatch: stop): state saved, exit 4."),
    ErrorCode("E108", "sailrl.runtime.rundir.init_from.InitFromError", "training.init_from names a run directory "
              "that cannot start this run (its problem code: S261 or S262)."),
    ErrorCode("E110", "sailrl.runtime.backends.backend.BackendError", "A backend cannot be opened (a missing key, an "
              "unreachable Tinker)."),
    ErrorCode("E111", "sailrl.runtime.backends.tinker_service.TinkerUnreachable", "The Tinker service answered no request "
              "for SAILRL_TINKER_UNREACHABLE_S seconds (default 300); state saved, --resume continues."),
    ErrorCode("E112", "sailrl.runtime.backends.tinker_service.TinkerRefused", "The Tinker service refused a request for "
              "good: a loss it does not offer, a model it no longer holds."),
    ErrorCode("E120", "sailrl.runtime.data.base.DatasetError", "The dataset is missing, unreadable or malformed, or "
              "a step leaves no rows."),
    ErrorCode("E121", "sailrl.runtime.prompts.PromptError", "A prompt template cannot be rendered on a row."),
    ErrorCode("E122", "sailrl.runtime.backends.chat_template.ChatTemplateError", "The tokenizer has no usable chat "
              "template."),
    ErrorCode("E123", "sailrl.preflight.PreflightError", "sailrl preflight cannot check the spec as asked."),
    ErrorCode("E124", "sailrl.runtime.prompts.conversations.ConversationError", "A row's conversation cannot be "
              "trained on: an empty assistant turn (S259) or a messages field that is not a conversation (S260)."),
    ErrorCode("E130", "sailrl.runtime.sandbox.workers.WorkerError", "A scoring worker process could not start, died, or "
              "broke the protocol."),
    ErrorCode("E131", "sailrl.runtime.sandbox.workers.WorkerStartError", "A worker could not load its job (its reason "
              "says which: missing_module, import_error, ...)."),
    ErrorCode("E132", "sailrl.runtime.rewards.answers.UnreadableAnswer", "math-verify cannot read an answer or reference; "
              "the rule fails."),
    ErrorCode("E133", "sailrl.runtime.tools.calculator.CalculatorError", "The calculator tool cannot evaluate an "
              "expression."),
    ErrorCode("E134", "sailrl.runtime.rewards.judge.JudgeCallError", "A judge model's call failed after its retries."),
    ErrorCode("E135", "sailrl.runtime.rollouts.episode.ToolLoadError", "A tool of environment.tools cannot be loaded."),
    ErrorCode("E140", "sailrl.runtime.backends.sail.checkpoint_url.SailCheckpointError", "A sampler checkpoint cannot be "
              "handed to Sail; stops the run."),
    ErrorCode("E141", "sailrl.runtime.backends.sail.checkpoint_url.CheckpointURLRefused", "Tinker refused to sign the "
              "checkpoint URL Sail needs; stops the run."),
    ErrorCode("E142", "sailrl.runtime.backends.sail.completer.SailRolloutError", "A Sail rollout failed after its attempts; "
              "its group is dropped and counted."),
    ErrorCode("E143", "sailrl.runtime.backends.sail.completer.SailRequestRejected", "Sail refused the request itself; stops "
              "the run."),
    ErrorCode("E150", "sailrl.runtime.backends.local.weights.sources.BaseModelError", "The local backend cannot load the base "
              "model."),
    ErrorCode("E151", "sailrl.runtime.backends.local.processes.child.LocalProcessError", "A local backend child process stopped; stops "
              "the run."),
    ErrorCode("E152", "sailrl.runtime.backends.local.processes.sampler_process.SamplerProcessError", "The local sampling process "
              "stopped."),
    ErrorCode("E153", "sailrl.runtime.backends.local.processes.trainer_process.TrainerProcessError", "The local training process "
              "stopped."),
    ErrorCode("E154", "sailrl.runtime.backends.local.engine.losses.LossInputError", "A datum lacks what its loss_fn needs."),
    ErrorCode("E155", "sailrl.runtime.backends.local.weights.checkpoints.CheckpointPathError", "A local:// checkpoint path is "
              "malformed or missing."),
    ErrorCode("E200", "sailrl.export.runinfo.ExportError", "sailrl export cannot export the run as asked."),
    ErrorCode("E210", "sailrl.studio.security.PathRefused", "The studio refuses a path outside its folders."),
    ErrorCode("E211", "sailrl.studio.security.BodyTooLarge", "A studio request body is over its size limit."),
    ErrorCode("E212", "sailrl.studio.session.StudioError", "A studio request cannot be served (plain reason)."),
    ErrorCode("E213", "sailrl.studio.yaml_patch.PatchError", "The studio cannot apply an edit to the spec's YAML."),
    ErrorCode("E214", "sailrl.studio.runner.RunError", "The studio refuses to start or stop a run (one is running, "
              "the spec is not saved, a run it did not start)."),
    ErrorCode("E220", "sailrl.commands.show.ShowError", "sailrl show cannot print what was asked."),
)}
