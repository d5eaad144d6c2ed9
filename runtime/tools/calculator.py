"""The built-in ``calculator`` tool: exact arithmetic read by a safe parser (``ast``), never ``eval``.

An expression is parsed with ``ast.parse(mode="eval")`` and only these nodes are evaluated: numbers (integers,
decimals, scientific notation), ``+ - * / // % **``, unary ``+``/``-`` and parentheses. Every number becomes a
:class:`fractions.Fraction`, so ``0.1 + 0.2`` is exactly ``3/10`` and ``1/3 * 3`` is ``1``. Anything else (a
name, a call, an attribute, a string, a comparison) is refused with a plain reason.

Bounded: at most :data:`MAX_EXPRESSION_CHARS` characters and :data:`MAX_NODES` syntax nodes; ``**`` needs an
integer exponent of at most :data:`MAX_EXPONENT` in size and a result of at most :data:`MAX_DIGITS` digits;
every intermediate numerator and denominator stays under :data:`MAX_DIGITS` digits. So no expression can take
long or fill memory.

The answer: an integer (``42``), or an exact fraction with its decimal value (``7/3 = 2.333333333333``).
"""

from __future__ import annotations

import ast
import math
from fractions import Fraction
from typing import Any

from sailrl.spec.errors import SailrlError

__all__ = ["MAX_DIGITS", "MAX_EXPONENT", "MAX_EXPRESSION_CHARS", "CalculatorError", "calculate", "evaluate",
           "format_value", "SPEC"]

MAX_EXPRESSION_CHARS = 500
MAX_NODES = 400
MAX_EXPONENT = 10_000
MAX_DIGITS = 1_000
_DECIMALS = 12

#: The tool as the model sees it (a cookbook ``ToolSpec``: name, description, JSON Schema of the arguments).
SPEC: dict[str, Any] = {
    "name": "calculator",
    "description": "Exact arithmetic. Write an expression with numbers, + - * / // % ** and parentheses, e.g. "
                   "(12 + 30) * 2 / 7. Returns the exact result (a fraction and its decimal value when not whole).",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "The arithmetic expression."}},
        "required": ["expression"],
    },
}


class CalculatorError(SailrlError, ValueError):
    """The expression cannot be evaluated; ``str(exc)`` says why in plain words."""

    code = "E133"


_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}
_OTHER_OPS = {ast.Invert: "~", ast.Not: "not", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&",
              ast.BitOr: "|", ast.BitXor: "^", ast.MatMult: "@"}


def _digits(q: Fraction) -> int:
    return max(len(str(abs(q.numerator))), len(str(q.denominator)))


def _checked(q: Fraction) -> Fraction:
    if _digits(q) > MAX_DIGITS:
        raise CalculatorError(f"a number in the calculation has more than {MAX_DIGITS} digits")
    return q


def _number(value: Any) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError(f"{value!r} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("the number is too large")
        # repr gives the shortest text that reads back as this float: 0.1 -> Fraction(1, 10), not 0.1's binary
        return _checked(Fraction(repr(value)))
    return _checked(Fraction(value))


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1:
        raise CalculatorError("** needs a whole-number exponent (roots are not exact)")
    e = exp.numerator
    if abs(e) > MAX_EXPONENT:
        raise CalculatorError(f"the exponent {e} is larger than {MAX_EXPONENT}")
    if base == 0 and e < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    size = _digits(base) * abs(e)
    if base not in (0, 1, -1) and size > MAX_DIGITS * 2:
        raise CalculatorError(f"the result would have more than {MAX_DIGITS} digits")
    return _checked(base ** e)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        return _number(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left), _eval(node.right)
        op = type(node.op)
        if op is ast.Add:
            return _checked(a + b)
        if op is ast.Sub:
            return _checked(a - b)
        if op is ast.Mult:
            return _checked(a * b)
        if op is ast.Pow:
            return _power(a, b)
        if b == 0:
            raise CalculatorError("division by zero")
        if op is ast.Div:
            return _checked(a / b)
        if op is ast.FloorDiv:
            return Fraction(a // b)
        return _checked(a % b)
    what = {ast.Name: "a name", ast.Call: "a function call", ast.Attribute: "an attribute",
            ast.Compare: "a comparison", ast.BoolOp: "and/or", ast.Subscript: "indexing", ast.List: "a list",
            ast.Tuple: "a tuple", ast.Set: "a set", ast.Dict: "a dict", ast.IfExp: "if/else",
            ast.Lambda: "lambda", ast.JoinedStr: "an f-string"}.get(type(node))
    if isinstance(node, (ast.UnaryOp, ast.BinOp)):  # an operator outside + - * / // % ** (~, not, <<, &, @ ...)
        what = f"the operator {_OTHER_OPS.get(type(node.op), type(node.op).__name__)}"
    raise CalculatorError(f"the calculator does arithmetic only ({' '.join(_BINOPS.values())} and parentheses); "
                          f"{what or type(node).__name__} is not allowed")


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``. Raises :class:`CalculatorError` (never anything else) when it cannot."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be text, e.g. \"12 * (3 + 4)\"")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/").replace(",", "")
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"{expression.strip()[:80]!r} is not an arithmetic expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"the expression has more than {MAX_NODES} parts")
    try:
        return _eval(tree)
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None


def format_value(q: Fraction) -> str:
    """``42``, ``-3``, or ``7/3 = 2.333333333333`` (the decimal rounded to 12 places)."""
    if q.denominator == 1:
        return str(q.numerator)
    whole, rest = divmod(abs(q.numerator) * 10**_DECIMALS, q.denominator)
    if 2 * rest >= q.denominator:
        whole += 1
    sign = "-" if q < 0 else ""
    int_part, frac_part = divmod(whole, 10**_DECIMALS)
    dec = f"{sign}{int_part}.{frac_part:0{_DECIMALS}d}".rstrip("0").rstrip(".")
    return f"{q.numerator}/{q.denominator} = {dec}"


def calculate(expression: str) -> str:
    """The calculator tool's answer for ``expression`` (see :func:`format_value`); raises CalculatorError."""
    return format_value(evaluate(expression))
