"""OpenSCENARIO 1.1+ expressions (``${...}``), evaluated by a parser of their grammar, never by Python's eval: numbers,
``true``/``false``, parameter references ``$name``, ``+ - * / %``, unary minus, comparisons (``== != < <= > >=``),
``not``/``and``/``or``, parentheses and the standard's functions (round, floor, ceil, sqrt, pow, sin, cos, tan, asin,
acos, atan, sign, abs, min, max). `evaluate` returns a number or a boolean; a malformed expression, an unknown
parameter or function, or a division by zero is a ValueError saying what.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Dict, List, Union

Value = Union[float, bool]
TOKEN = re.compile(r"\s*(?:(\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|\$([A-Za-z_][A-Za-z0-9_]*)|"
                   r"([A-Za-z_][A-Za-z0-9_]*)|(==|!=|<=|>=|[-+*/%()<>,]))")
FUNCTIONS: Dict[str, Callable] = {
    "round": lambda x: float(math.floor(x + 0.5)), "floor": lambda x: float(math.floor(x)),
    "ceil": lambda x: float(math.ceil(x)), "sqrt": math.sqrt, "pow": math.pow, "sin": math.sin, "cos": math.cos,
    "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "sign": lambda x: float((x > 0) - (x < 0)), "abs": abs, "min": min, "max": max}


def _tokens(text: str) -> List[tuple]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"unexpected {text[pos:].strip()[:10]!r}")
        number, param, word, op = m.groups()
        out.append(("num", float(number)) if number else ("param", param) if param else ("word", word) if word
                   else ("op", op))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, tokens: List[tuple], params: Dict[str, str]):
        self.t, self.i, self.params = tokens, 0, params

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else (None, None)

    def take(self, kind=None, value=None):
        tok = self.peek()
        if tok[0] is None or (kind and tok[0] != kind) or (value and tok[1] != value):
            raise ValueError(f"expected {value or kind}, found {tok[1] if tok[0] else 'the end'}")
        self.i += 1
        return tok

    def expression(self) -> Value:
        left = self.conjunction()
        while self.peek() == ("word", "or"):
            self.take()
            right = self.conjunction()
            left = bool(left) or bool(right)
        return left

    def conjunction(self) -> Value:
        left = self.negation()
        while self.peek() == ("word", "and"):
            self.take()
            right = self.negation()
            left = bool(left) and bool(right)
        return left

    def negation(self) -> Value:
        if self.peek() == ("word", "not"):
            self.take()
            return not bool(self.negation())
        return self.comparison()

    def comparison(self) -> Value:
        left = self.sum()
        ops = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
               "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}
        if self.peek()[0] == "op" and self.peek()[1] in ops:
            op = self.take()[1]
            return ops[op](left, self.sum())
        return left

    def sum(self) -> Value:
        left = self.product()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            right = self.product()
            left = _num(left) + _num(right) if op == "+" else _num(left) - _num(right)
        return left

    def product(self) -> Value:
        left = self.unary()
        while self.peek() in (("op", "*"), ("op", "/"), ("op", "%")):
            op = self.take()[1]
            right = _num(self.unary())
            if op != "*" and right == 0:
                raise ValueError("division by zero")
            left = _num(left) * right if op == "*" else _num(left) / right if op == "/" else math.fmod(_num(left),
                                                                                                        right)
        return left

    def unary(self) -> Value:
        if self.peek() == ("op", "-"):
            self.take()
            return -_num(self.unary())
        return self.primary()

    def primary(self) -> Value:
        kind, value = self.peek()
        if kind == "num":
            self.take()
            return value
        if kind == "param":
            self.take()
            if value not in self.params:
                raise ValueError(f"no parameter ${value} is declared")
            raw = self.params[value]
            if raw in ("true", "false"):
                return raw == "true"
            try:
                return float(raw)
            except ValueError:
                raise ValueError(f"${value} = {raw!r} is not a number") from None
        if kind == "op" and value == "(":
            self.take()
            inner = self.expression()
            self.take("op", ")")
            return inner
        if kind == "word" and value in ("true", "false"):
            self.take()
            return value == "true"
        if kind == "word" and value in FUNCTIONS:
            self.take()
            self.take("op", "(")
            args = [_num(self.expression())]
            while self.peek() == ("op", ","):
                self.take()
                args.append(_num(self.expression()))
            self.take("op", ")")
            try:
                return float(FUNCTIONS[value](*args))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{value}({', '.join(f'{a:g}' for a in args)}): {e}") from None
        raise ValueError(f"unexpected {value if kind else 'end'}")


def _num(v: Value) -> float:
    if isinstance(v, bool):
        raise ValueError("a boolean where a number is wanted")
    return v


def evaluate(text: str, params: Dict[str, str]) -> Value:
    """The value of an expression ``${...}`` with ``params`` (name -> value text)."""
    if not (text.startswith("${") and text.endswith("}")):
        raise ValueError("an expression is written ${...}")
    p = _Parser(_tokens(text[2:-1]), params)
    value = p.expression()
    if p.i != len(p.t):
        raise ValueError(f"unexpected {p.t[p.i][1]} after the expression")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the value is not finite")
    return value


def as_text(value: Value) -> str:
    """A value as an attribute's text (booleans as true/false, whole numbers without a fraction)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))
