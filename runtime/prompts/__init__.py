"""Prompts: a dataset row -> the conversation the model sees -> tokens.

The user message and the optional system message are Jinja2 templates over the row's fields, rendered in a
sandbox with ``StrictUndefined``: a template variable the row lacks is an error (:class:`PromptError`), never an
empty string. A field whose value is ``None`` (an empty cell, a JSON ``null``) is an error too.

The sandbox (:func:`make_environment`) is ``jinja2.sandbox.SandboxedEnvironment`` (no Python internals:
``__class__``, ``cycler.__init__``, ...) bounded in time and size through its hooks, so no template can hang a
run or exhaust memory:

- every render has a deadline of :data:`RENDER_TIMEOUT_S`, checked at each loop iteration (every ``for`` loop's
  iterable is wrapped when the template is compiled), attribute access, call and intercepted operator;
- output is at most :data:`MAX_RENDER_CHARS` characters, and so is any string or list an operator, filter or
  method builds (``'a' * 10**8``, ``x ~ x`` doubling, ``center(10**8)``, ``'%100000000d'|format(1)``);
- ``**`` refuses results over :data:`MAX_POWER_DIGITS` digits (``9**(n*10**8)``), ``lipsum`` over 100
  paragraphs or 1,000 words each, ``batch``/``slice`` over :data:`MAX_RENDER_ITEMS` pieces; ``range`` keeps the
  sandbox's ``MAX_RANGE`` (100,000);
- brackets and blocks nest at most :data:`MAX_TEMPLATE_NESTING` levels and the syntax tree
  :data:`MAX_TEMPLATE_DEPTH`; a template too complex to compile (or a macro recursing too deeply) is a
  PromptError, never a RecursionError.

The conversation then goes through the spec's renderer (``tinker_cookbook.renderers``), which turns it into a
``tinker.ModelInput`` and names the stop sequences, exactly as a Tinker cookbook recipe does.
"""

from __future__ import annotations

import functools
import math
import re
import threading
import time
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment
from jinja2.visitor import NodeTransformer

from sailrl.spec.errors import DataError, SailrlError
from sailrl.spec.messages import did_you_mean_text

__all__ = [
    "MAX_RENDER_CHARS",
    "MAX_RENDER_ITEMS",
    "MAX_TEMPLATE_DEPTH",
    "MAX_TEMPLATE_NESTING",
    "RENDER_TIMEOUT_S",
    "PromptBuilder",
    "PromptError",
    "with_tool_declaration",
    "make_environment",
    "parse_template",
    "render_template",
    "template_variables",
]

#: Seconds one template may take to render one row.
RENDER_TIMEOUT_S = 0.5
#: Most characters a rendered template, or any string built while rendering, may have.
MAX_RENDER_CHARS = 2_000_000
#: Most items of a list built while rendering (batch, slice, list repetition).
MAX_RENDER_ITEMS = 100_000
#: Most digits of a number ``**`` may produce.
MAX_POWER_DIGITS = 10_000
#: Deepest nesting of brackets, and separately of blocks ({% if %}, {% for %}, ...), in a template.
MAX_TEMPLATE_NESTING = 20
#: Deepest syntax tree of a template (a chain of filters or operators nests one level per link); compiling
#: grows with the cube of it (``benchmarks/limits.md``).
MAX_TEMPLATE_DEPTH = 40


class PromptError(DataError):
    """A row cannot be turned into a prompt.

    ``row_index``: the row's source index (``_index``) when known; ``field``: the missing or empty field when
    that is the problem; ``template``: which template ("prompt.user", "prompt.system", "training.warmup.completion").
    ``kind``: what went wrong -- "syntax" (does not parse or compile), "missing-field", "null-field",
    "forbidden" (the sandbox refused an attribute or call), "limit" (time, size or nesting), or "failed" (an
    expression or filter raised on this row's values). ``str(exc)`` is one plain-words sentence.
    """

    code = "E121"

    def __init__(self, message: str, *, row_index: int | None = None, field: str | None = None,
                 template: str | None = None, kind: str = "failed") -> None:
        super().__init__(message)
        self.row_index = row_index
        self.field = field
        self.template = template
        self.kind = kind


class _RenderLimit(SailrlError):
    """Raised inside rendering when a limit is reached (turned into a PromptError of kind "limit")."""


_state = threading.local()  # .deadline: time.monotonic() value the current render must finish by


def _tick() -> None:
    deadline = getattr(_state, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise _RenderLimit(f"took longer than {RENDER_TIMEOUT_S:g} s to render (templates are limited to "
                           f"{RENDER_TIMEOUT_S:g} s a row)")


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, str) and len(value) > MAX_RENDER_CHARS:
        raise _RenderLimit(f"{what} would build a text of {len(value):,} characters (the limit is "
                           f"{MAX_RENDER_CHARS:,})")
    if isinstance(value, list | tuple | dict | set) and len(value) > MAX_RENDER_ITEMS:
        raise _RenderLimit(f"{what} would build {len(value):,} items (the limit is {MAX_RENDER_ITEMS:,})")
    return value


def _too_long(n: float, what: str) -> None:
    if n > MAX_RENDER_CHARS:
        raise _RenderLimit(f"{what} would build a text of about {int(n):,} characters (the limit is "
                           f"{MAX_RENDER_CHARS:,})")


def _size(x: Any) -> int:
    return len(x) if isinstance(x, str | list | tuple) else 0


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\d+|\*)?(?:\.(\d+|\*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")


def _format_widths(fmt: str) -> int:
    """The largest width or precision a %- or {}-format string asks for (0 when none)."""
    widths = [int(w) for m in _PERCENT_SPEC.finditer(fmt) for w in m.groups() if w and w.isdigit()]
    widths += [int(w) for m in _BRACE_SPEC.finditer(fmt) for w in re.findall(r"\d+", m.group(1))]
    return max(widths, default=0)


def _check_format(fmt: Any, args: Iterable[Any], what: str) -> None:
    if isinstance(fmt, str):
        _too_long(_format_widths(fmt), what)
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool):
            _too_long(a, what)


class _Bounded(NodeTransformer):
    """Wraps every for-loop iterable in a deadline-checking iterator and every ``~`` in a size-checked join."""

    def __init__(self, environment: jinja2.Environment) -> None:
        self.environment = environment

    def _filter(self, node: nodes.Node, name: str, lineno: int) -> nodes.Filter:
        f = nodes.Filter(node, name, [], [], None, None, lineno=lineno)
        f.set_environment(self.environment)
        return f

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = self._filter(node.iter, "_sailrl_loop", node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        items = nodes.List(node.nodes, lineno=node.lineno)
        items.set_environment(self.environment)
        return self._filter(items, "_sailrl_concat", node.lineno)


def _loop(value: Any) -> Any:
    _tick()
    for i, item in enumerate(value):
        if not i & 255:
            _tick()
        yield item


def _concat(values: list[Any]) -> str:
    parts = [str(v) for v in values]
    _too_long(sum(map(len, parts)), "'~'")
    return "".join(parts)


def _bounded_filter(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _tick()
        values = [a for a in args if not isinstance(a, Context | nodes.EvalContext | jinja2.Environment)]
        what = f"the filter '{name}'"
        first = values[0] if values else None
        rest = values[1:]
        if name == "center":
            width = kwargs.get("width", rest[0] if rest else 80)
            if isinstance(width, int):
                _too_long(width, what)
        elif name == "indent":
            width = kwargs.get("width", rest[0] if rest else 4)
            lines = first.count("\n") + 1 if isinstance(first, str) else 1
            _too_long(_size(first) + lines * (width if isinstance(width, int) else _size(width)), what)
        elif name == "format":
            _check_format(first, [*rest, *kwargs.values()], what)
        elif name == "replace" and isinstance(first, str) and len(rest) >= 2:
            old, new = str(rest[0]), str(rest[1])
            count = first.count(old) if old else len(first) + 1
            _too_long(len(first) + count * max(len(new) - len(old), 0), what)
        elif name in ("batch", "slice"):
            pieces = kwargs.get("linecount" if name == "batch" else "slices", rest[0] if rest else 0)
            if isinstance(pieces, int) and pieces > MAX_RENDER_ITEMS:
                raise _RenderLimit(f"{what} asks for {pieces:,} pieces (the limit is {MAX_RENDER_ITEMS:,})")
        return _check_size(fn(*args, **kwargs), what)

    return wrapper


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 -- jinja's names
    if n > 100 or max > 1000:
        raise _RenderLimit(f"lipsum(n={n}, max={max}) asks for too much text (at most 100 paragraphs of 1,000 "
                           "words)")
    return jinja2.utils.generate_lorem_ipsum(n=n, html=html, min=min, max=max)


class _BoundedSandbox(SandboxedEnvironment):
    """``SandboxedEnvironment`` whose operators, calls, attribute lookups and filters respect the render limits."""

    intercepted_binops = frozenset({"**", "*", "+", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        what = f"'{operator}'"
        if operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            digits = right * math.log10(abs(left))
            if digits > MAX_POWER_DIGITS:
                raise _RenderLimit(f"'**' would build a number of about {digits:,.0f} digits (the limit is "
                                   f"{MAX_POWER_DIGITS:,})")
        elif operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and _is_int(times):
                    if isinstance(seq, str):
                        _too_long(len(seq) * times, what)
                    elif len(seq) * times > MAX_RENDER_ITEMS:
                        raise _RenderLimit(f"'*' would build {len(seq) * times:,} items (the limit is "
                                           f"{MAX_RENDER_ITEMS:,})")
        elif operator == "+" and isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
            total = _size(left) + _size(right)
            if isinstance(left, str):
                _too_long(total, what)
            elif total > MAX_RENDER_ITEMS:
                raise _RenderLimit(f"'+' would build {total:,} items (the limit is {MAX_RENDER_ITEMS:,})")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, right if isinstance(right, tuple) else [right], what)
        return _check_size(super().call_binop(context, operator, left, right), what)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _tick()
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str):
            what = f"'.{getattr(obj, '__name__', 'method')}()'"
            for a in [*args, *kwargs.values()]:
                if _is_int(a):
                    _too_long(a, what)
            if getattr(obj, "__name__", "") == "replace" and len(args) >= 2:
                old, new = str(args[0]), str(args[1])
                count = owner.count(old) if old else len(owner) + 1
                _too_long(len(owner) + count * max(len(new) - len(old), 0), what)
            if getattr(obj, "__name__", "") == "join" and args:
                _check_size(args[0], what)
        result = super().call(context, obj, *args, **kwargs)
        if isinstance(owner, list | dict | set):
            _check_size(owner, "a method call")  # append / extend / update growing a container
        return _check_size(result, "a call")

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format(fmt, [*args, *kwargs.values()], "'.format()'")
            return _check_size(wrapped(*args, **kwargs), "'.format()'")

        return checked


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@lru_cache(maxsize=1)
def make_environment() -> SandboxedEnvironment:
    """The one Jinja2 environment used for every user template: sandboxed, bounded, ``StrictUndefined``.

    ``keep_trailing_newline`` is False (Jinja2's default): a YAML block scalar's final newline is dropped.
    Templates compiled by :func:`parse_template` get the loop and ``~`` limits; the operator, call, attribute
    and filter limits hold for every template of this environment.
    """
    env = _BoundedSandbox(undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
    env.filters["_sailrl_loop"] = _loop
    env.filters["_sailrl_concat"] = _concat
    env.globals["lipsum"] = _lipsum
    return env


_OPEN_BLOCKS = frozenset({"for", "if", "macro", "call", "filter", "with", "block", "autoescape"})
_DUNDER = re.compile(r"__\w*")


def _nesting_problem(env: jinja2.Environment, source: str) -> tuple[str, int] | None:
    """(problem, line) when brackets or blocks in ``source`` nest deeper than MAX_TEMPLATE_NESTING."""
    brackets = blocks = 0
    after_block_begin = False
    for lineno, kind, value in env.lex(source):  # raw tokens: ("operator", "("), ("whitespace", " "), ...
        if kind == "whitespace":
            continue
        if kind == "operator" and value in "([{":
            brackets += 1
            if brackets > MAX_TEMPLATE_NESTING:
                return f"brackets are nested more than {MAX_TEMPLATE_NESTING} levels deep", lineno
        elif kind == "operator" and value in ")]}":
            brackets = max(brackets - 1, 0)
        elif kind == "block_begin":
            after_block_begin = True
            continue
        elif after_block_begin and kind == "name":
            if value in _OPEN_BLOCKS:
                blocks += 1
                if blocks > MAX_TEMPLATE_NESTING:
                    return (f"blocks ({{% {value} %}} ...) are nested more than {MAX_TEMPLATE_NESTING} levels deep",
                            lineno)
            elif value.startswith("end"):
                blocks = max(blocks - 1, 0)
        after_block_begin = False
    return None


def forbidden_names(ast: nodes.Template) -> list[str]:
    """Attribute names in ``ast`` the sandbox always refuses: ``x.__class__``, ``x._private``, ``x['__init__']``."""
    found = []
    for node in ast.find_all((nodes.Getattr, nodes.Getitem)):
        if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
            found.append(node.attr)
        elif (isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const)
              and isinstance(node.arg.value, str) and _DUNDER.fullmatch(node.arg.value)):
            found.append(node.arg.value)
    return list(dict.fromkeys(found))


def parse_template(source: str) -> nodes.Template:
    """A fresh Jinja2 syntax tree of ``source`` (nesting checked first).

    Raises ``jinja2.TemplateSyntaxError`` when it does not parse, and :class:`PromptError` (kind "limit") when it
    nests deeper than :data:`MAX_TEMPLATE_NESTING` or is too complex for the parser.
    """
    env = make_environment()
    problem = _nesting_problem(env, source)
    if problem is not None:
        raise PromptError(f"the template is too deeply nested: {problem[0]} (line {problem[1]})", kind="limit")
    try:
        ast = env.parse(source)
    except (RecursionError, MemoryError):
        raise PromptError("the template is too complex to parse (nested too deeply)", kind="limit") from None
    if _tree_depth(ast) > MAX_TEMPLATE_DEPTH:
        raise PromptError(f"the template's expressions nest more than {MAX_TEMPLATE_DEPTH} levels deep (e.g. a chain "
                          f"of {MAX_TEMPLATE_DEPTH} filters); split it up", kind="limit")
    return ast


def _tree_depth(ast: nodes.Node) -> int:
    best, stack = 0, [(ast, 1)]
    while stack:
        node, depth = stack.pop()
        best = max(best, depth)
        stack.extend((child, depth + 1) for child in node.iter_child_nodes())
    return best


@lru_cache(maxsize=256)
def _compile(source: str) -> jinja2.Template:
    env = make_environment()
    ast = _Bounded(env).visit(parse_template(source))
    try:
        return env.from_string(ast)
    except (RecursionError, MemoryError, SyntaxError) as exc:  # SyntaxError: Python's own nesting limits
        raise PromptError(f"the template is too complex to compile ({type(exc).__name__}: nested too deeply)",
                          kind="limit") from None


@lru_cache(maxsize=256)
def template_variables(source: str) -> frozenset[str]:
    """Names a template reads from its context (the row's fields), e.g. ``{"question"}``.

    Jinja2 globals (``range``, ``dict``, ``namespace`` ...) and names the template assigns itself are excluded.
    Raises ``jinja2.TemplateSyntaxError`` on a template that does not parse (or whose filters do not exist), and
    :class:`PromptError` (kind "limit") on one nested too deeply.
    """
    env = make_environment()
    try:
        names = meta.find_undeclared_variables(parse_template(source))
    except (RecursionError, MemoryError):
        raise PromptError("the template is too complex to compile (nested too deeply)", kind="limit") from None
    return frozenset(n for n in names if n not in env.globals)


def render_template(source: str, fields: Mapping[str, Any], *, template: str = "prompt.user",
                    row_index: int | None = None, field_names: Iterable[str] | None = None) -> str:
    """Render one user template over ``fields``, within the limits of the module docstring.

    Raises :class:`PromptError` when a variable the template uses is missing from ``fields`` or is ``None``
    (with a did-you-mean among ``field_names``), when the template does not parse, when the sandbox refuses
    something, when a limit is reached, or when rendering fails (a filter error on this row's values).
    """
    where = f"row {row_index}: " if row_index is not None else ""

    def fail(message: str, kind: str, **kw: Any) -> PromptError:
        return PromptError(f"{where}{template} {message}", row_index=row_index, template=template, kind=kind, **kw)

    try:
        variables = template_variables(source)
    except jinja2.TemplateSyntaxError as exc:
        raise fail(f"is not a valid template: {exc.message} (line {exc.lineno})", "syntax") from None
    except PromptError as exc:
        raise fail(f"cannot be used: {exc}", exc.kind) from None
    known = sorted(field_names) if field_names is not None else sorted(k for k in fields if not k.startswith("_"))
    for name in sorted(variables):
        if name not in fields:
            raise fail(f"uses {{{{ {name} }}}} but the row has no field '{name}'"
                       f"{did_you_mean_text(name, known)} (fields: {', '.join(known) or 'none'})",
                       "missing-field", field=name)
        if fields[name] is None:
            raise PromptError(f"{where}field '{name}' is empty (null), and {template} uses {{{{ {name} }}}}",
                              row_index=row_index, field=name, template=template, kind="null-field")
    try:
        compiled = _compile(source)
    except PromptError as exc:
        raise fail(f"cannot be used: {exc}", exc.kind) from None
    previous = getattr(_state, "deadline", None)
    _state.deadline = time.monotonic() + RENDER_TIMEOUT_S
    try:
        out: list[str] = []
        size = 0
        for chunk in compiled.generate(**fields):
            size += len(chunk)
            if size > MAX_RENDER_CHARS:
                raise _RenderLimit(f"renders more than {MAX_RENDER_CHARS:,} characters")
            out.append(chunk)
        return "".join(out)
    except _RenderLimit as exc:
        raise fail(f"{exc}", "limit") from None
    except jinja2.UndefinedError as exc:  # e.g. {{ row.missing_attr }}; an unsafe attribute is a SecurityError
        raise PromptError(f"{where}{template}: {exc.message}", row_index=row_index, template=template,
                          kind="failed") from None
    except SecurityError as exc:
        raise fail(f"tried something the sandbox forbids: {exc}", "forbidden") from None
    except RecursionError:
        raise fail("recursed too deeply (a macro or recursive loop that calls itself without end)", "limit") from None
    except MemoryError:
        raise fail("ran out of memory while rendering", "limit") from None
    except Exception as exc:  # noqa: BLE001 -- a filter or expression failed on this row's values
        raise fail(f"failed on this row: {type(exc).__name__}: {exc}", "failed") from None
    finally:
        _state.deadline = previous


def with_tool_declaration(renderer: Any, messages: list[dict[str, Any]],
                          tool_specs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` with the tools declared as the renderer declares them
    (``renderer.create_conversation_prefix_with_tools(tool_specs, system)``: the system message, if any, goes into
    the declaration); ``messages`` unchanged when there are no tools. The one prompt an episode's first turn, the
    warm-up and the length checks all use."""
    if not tool_specs:
        return list(messages)
    msgs = [dict(m) for m in messages]
    system = str(msgs.pop(0)["content"]) if msgs and msgs[0]["role"] == "system" else ""
    return list(renderer.create_conversation_prefix_with_tools(list(tool_specs), system)) + msgs


class PromptBuilder:
    """Builds the model's conversation, tokens and stop sequences for a dataset row.

    ``prompt``: the spec's :class:`~sailrl.spec.schema.PromptSpec`. ``renderer``: a ``tinker_cookbook``
    renderer (may be ``None`` when only :meth:`messages` is needed, e.g. to check rows at load time).
    ``field_names``: the names the spec declares (for did-you-mean hints in errors). ``tool_specs``: the
    episode's tools (``environment.tools``, each a cookbook ``ToolSpec``): :meth:`conversation`, and so the
    tokens of :meth:`model_input` and the warm-up's :meth:`supervised_example`, declare them as an episode's first
    turn does.
    """

    def __init__(self, prompt: Any, renderer: Any = None, *, field_names: Iterable[str] | None = None,
                 tool_specs: list[dict[str, Any]] | None = None) -> None:
        self.prompt = prompt
        self.renderer = renderer
        self.field_names = list(field_names) if field_names is not None else None
        self.tool_specs = list(tool_specs) if tool_specs else None

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

    def conversation(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        """:meth:`messages` with the tools declared (:func:`with_tool_declaration`), as the model first sees them."""
        if not self.tool_specs:
            return list(self.messages(row))
        return with_tool_declaration(self._need_renderer(), self.messages(row), self.tool_specs)

    def model_input(self, row: Mapping[str, Any]) -> Any:
        """The generation prompt for ``row``: ``renderer.build_generation_prompt(conversation)`` (a
        tinker.ModelInput)."""
        return self._need_renderer().build_generation_prompt(self.conversation(row))

    def stop_sequences(self) -> list:
        """The renderer's stop sequences (strings or token ids), e.g. ``["\\n\\nUser:"]`` for role_colon."""
        return list(self._need_renderer().get_stop_sequences())

    def completion(self, row: Mapping[str, Any], completion_template: str) -> str:
        """The warm-up target assistant message for ``row`` (``training.warmup.completion`` rendered)."""
        return self._render(completion_template, row, "training.warmup.completion")

    def supervised_example(self, row: Mapping[str, Any], completion_template: str) -> tuple[Any, Any]:
        """``(tinker.ModelInput, weights)`` for supervised warm-up on ``row``.

        The conversation is the prompt messages (with the tools declared, for a spec with tools: the prompt of an
        episode's first turn) plus an assistant message rendered from ``completion_template``;
        ``renderer.build_supervised_example(..., LAST_ASSISTANT_MESSAGE)`` puts weight 1 on the assistant
        message's tokens (and the stop sequence that ends it) and 0 on the prompt. ``weights`` is a 1-D float
        ``torch.Tensor`` with one entry per token of the ModelInput.
        """
        # lazy: tinker_cookbook's renderers take seconds (torch); validate imports this module, never a datum
        from tinker_cookbook.renderers import TrainOnWhat

        answer = {"role": "assistant", "content": self.completion(row, completion_template)}
        conversation = [*self.conversation(row), answer]
        return self._need_renderer().build_supervised_example(
            conversation, train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE
        )

    def supervised_datum(self, row: Mapping[str, Any], completion_template: str, max_length: int | None = None) -> Any:
        """A ``tinker.Datum`` for the ``cross_entropy`` loss: inputs shifted right, ``target_tokens`` and
        ``weights`` shifted left (``tinker_cookbook.supervised.common.datum_from_model_input_weights``)."""
        from tinker_cookbook.supervised.common import datum_from_model_input_weights  # lazy: the same

        model_input, weights = self.supervised_example(row, completion_template)
        return datum_from_model_input_weights(model_input, weights, max_length=max_length)
