"""Prompts: a dataset row -> the conversation the model sees -> tokens.

The user message and the optional system message are Jinja2 templates over the row's fields, rendered in a
sandbox (``jinja2.sandbox.SandboxedEnvironment``: a template cannot reach Python internals) with
``StrictUndefined``: a template variable the row lacks is an error (:class:`PromptError`), never an empty
string. A field whose value is ``None`` (an empty cell, a JSON ``null``) is an error too.

The conversation then goes through the spec's renderer (``tinker_cookbook.renderers``), which turns it into a
``tinker.ModelInput`` and names the stop sequences, exactly as a Tinker cookbook recipe does.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.sandbox import SandboxedEnvironment

__all__ = ["PromptBuilder", "PromptError", "make_environment", "render_template", "template_variables"]


class PromptError(Exception):
    """A row cannot be turned into a prompt.

    ``row_index``: the row's source index (``_index``) when known; ``field``: the missing or empty field when
    that is the problem; ``template``: which template ("prompt.user", "prompt.system", "training.warmup.completion").
    ``str(exc)`` is one plain-words sentence.
    """

    def __init__(self, message: str, *, row_index: int | None = None, field: str | None = None,
                 template: str | None = None) -> None:
        super().__init__(message)
        self.row_index = row_index
        self.field = field
        self.template = template


@lru_cache(maxsize=1)
def make_environment() -> SandboxedEnvironment:
    """The one Jinja2 environment used for every user template: sandboxed, ``StrictUndefined``.

    ``keep_trailing_newline`` is False (Jinja2's default): a YAML block scalar's final newline is dropped.
    """
    return SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)


@lru_cache(maxsize=256)
def _compile(source: str) -> jinja2.Template:
    return make_environment().from_string(source)


@lru_cache(maxsize=256)
def template_variables(source: str) -> frozenset[str]:
    """Names a template reads from its context (the row's fields), e.g. ``{"question"}``.

    Jinja2 globals (``range``, ``dict``, ``namespace`` ...) and names the template assigns itself are excluded.
    Raises ``jinja2.TemplateSyntaxError`` on a template that does not parse.
    """
    env = make_environment()
    names = meta.find_undeclared_variables(env.parse(source))
    return frozenset(n for n in names if n not in env.globals)


def render_template(source: str, fields: Mapping[str, Any], *, template: str = "prompt.user",
                    row_index: int | None = None, field_names: Iterable[str] | None = None) -> str:
    """Render one user template over ``fields``.

    Raises :class:`PromptError` when a variable the template uses is missing from ``fields`` or is ``None``
    (with a did-you-mean among ``field_names``), when the template does not parse, or when rendering fails
    (a sandbox violation, a filter error).
    """
    where = f"row {row_index}: " if row_index is not None else ""
    try:
        variables = template_variables(source)
    except jinja2.TemplateSyntaxError as exc:
        raise PromptError(f"{template} is not a valid template: {exc.message} (line {exc.lineno})",
                          template=template, row_index=row_index) from None
    known = sorted(field_names) if field_names is not None else sorted(k for k in fields if not k.startswith("_"))
    for name in sorted(variables):
        if name not in fields:
            raise PromptError(
                f"{where}{template} uses {{{{ {name} }}}} but the row has no field '{name}'"
                f"{_did_you_mean(name, known)} (fields: {', '.join(known) or 'none'})",
                row_index=row_index, field=name, template=template,
            )
        if fields[name] is None:
            raise PromptError(
                f"{where}field '{name}' is empty (null), and {template} uses {{{{ {name} }}}}",
                row_index=row_index, field=name, template=template,
            )
    try:
        return _compile(source).render(**fields)
    except jinja2.UndefinedError as exc:  # e.g. {{ row.missing_attr }}
        raise PromptError(f"{where}{template}: {exc.message}", row_index=row_index, template=template) from None
    except jinja2.exceptions.SecurityError as exc:
        raise PromptError(f"{where}{template} tried something the sandbox forbids: {exc}",
                          row_index=row_index, template=template) from None
    except Exception as exc:  # noqa: BLE001 -- a filter or expression failed on this row's values
        raise PromptError(f"{where}{template} failed on this row: {type(exc).__name__}: {exc}",
                          row_index=row_index, template=template) from None


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" -- did you mean '{close[0]}'?" if close else ""


class PromptBuilder:
    """Builds the model's conversation, tokens and stop sequences for a dataset row.

    ``prompt``: the spec's :class:`~sailrl.spec.schema.PromptSpec`. ``renderer``: a ``tinker_cookbook``
    renderer (may be ``None`` when only :meth:`messages` is needed, e.g. to check rows at load time).
    ``field_names``: the names the spec declares (for did-you-mean hints in errors).
    """

    def __init__(self, prompt: Any, renderer: Any = None, *, field_names: Iterable[str] | None = None) -> None:
        self.prompt = prompt
        self.renderer = renderer
        self.field_names = list(field_names) if field_names is not None else None

    @property
    def variables(self) -> frozenset[str]:
        """Fields the user and system templates read."""
        out = set(template_variables(self.prompt.user))
        if self.prompt.system:
            out |= template_variables(self.prompt.system)
        return frozenset(out)

    def _render(self, source: str, row: Mapping[str, Any], template: str) -> str:
        return render_template(source, row, template=template, row_index=row.get("_index"),
                               field_names=self.field_names)

    def messages(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        """``[{"role": "system", ...}?, {"role": "user", "content": ...}]`` for ``row``.

        Raises :class:`PromptError` naming the row index and field when a template variable is missing or null.
        """
        out: list[dict[str, str]] = []
        if self.prompt.system:
            out.append({"role": "system", "content": self._render(self.prompt.system, row, "prompt.system")})
        out.append({"role": "user", "content": self._render(self.prompt.user, row, "prompt.user")})
        return out

    def _need_renderer(self) -> Any:
        if self.renderer is None:
            raise RuntimeError("PromptBuilder was built without a renderer; pass one to build tokens")
        return self.renderer

    def model_input(self, row: Mapping[str, Any]) -> Any:
        """The generation prompt for ``row``: ``renderer.build_generation_prompt(messages)`` (a tinker.ModelInput)."""
        return self._need_renderer().build_generation_prompt(self.messages(row))

    def stop_sequences(self) -> list:
        """The renderer's stop sequences (strings or token ids), e.g. ``["\\n\\nUser:"]`` for role_colon."""
        return list(self._need_renderer().get_stop_sequences())

    def completion(self, row: Mapping[str, Any], completion_template: str) -> str:
        """The warm-up target assistant message for ``row`` (``training.warmup.completion`` rendered)."""
        return self._render(completion_template, row, "training.warmup.completion")

    def supervised_example(self, row: Mapping[str, Any], completion_template: str) -> tuple[Any, Any]:
        """``(tinker.ModelInput, weights)`` for supervised warm-up on ``row``.

        The conversation is the prompt messages plus an assistant message rendered from ``completion_template``;
        ``renderer.build_supervised_example(..., LAST_ASSISTANT_MESSAGE)`` puts weight 1 on the assistant
        message's tokens (and the stop sequence that ends it) and 0 on the prompt. ``weights`` is a 1-D float
        ``torch.Tensor`` with one entry per token of the ModelInput.
        """
        from tinker_cookbook.renderers import TrainOnWhat

        answer = {"role": "assistant", "content": self.completion(row, completion_template)}
        conversation = [*self.messages(row), answer]
        return self._need_renderer().build_supervised_example(
            conversation, train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE
        )

    def supervised_datum(self, row: Mapping[str, Any], completion_template: str, max_length: int | None = None) -> Any:
        """A ``tinker.Datum`` for the ``cross_entropy`` loss: inputs shifted right, ``target_tokens`` and
        ``weights`` shifted left (``tinker_cookbook.supervised.common.datum_from_model_input_weights``)."""
        from tinker_cookbook.supervised.common import datum_from_model_input_weights

        model_input, weights = self.supervised_example(row, completion_template)
        return datum_from_model_input_weights(model_input, weights, max_length=max_length)
