"""Launch scripts as people write them: the words of a script's launch command, its variables
expanded from the script's own plain assignments.

Read, never run: plain assignments (``GPUS_PER_NODE=8``, ``export X=...``), arrays (``ARGS=( ... )``,
``ARGS+=( ... )``), ``$X``, ``${X}``, ``${X:-default}`` (the default when the script does not assign
``X``: the environment is not read), ``"${ARGS[@]}"``, integer ``$(( ... ))``, and ``if`` blocks whose
tests compare strings (``[[ "$A" == "b" ]]``, ``-z``, ``-n``). A variable the script assigns in a way
this does not follow (inside a loop, a ``case``, a function, an ``if`` it cannot decide, from a
command's output or a positional argument without a default) stays ``$X`` in the words, and
:attr:`Script.unresolved` says why: the importer refuses it where it matters, naming it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"^(?:export\s+|declare\s+(?:-\w+\s+)?|local\s+|readonly\s+)?({_NAME})(\+?)=(.*)$", re.S)
_OPENERS = {"while": "done", "for": "done", "until": "done", "case": "esac"}
_ARITH: Mapping[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                                   ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
                                                   ast.Div: operator.floordiv, ast.Mod: operator.mod}

Value = str | list[str]
_UNSET = "not assigned in the script (the environment is not read)"


@dataclass
class Script:
    """A script read: its commands' words (launch commands and flag lines), the variables it
    assigns, why the others cannot be expanded, and the defaults its ``${X:-default}`` used."""

    commands: list[list[str]] = field(default_factory=list)
    variables: dict[str, Value] = field(default_factory=dict)
    unresolved: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)


def read_script(text: str) -> Script:
    """Every command line of ``text`` with its variables expanded (see the module docstring)."""
    out = Script()
    _run(_logical_lines(text), out)
    return out


def _logical_lines(text: str) -> list[str]:
    """Lines with continuations joined and an array's lines (``X=( ... )``) joined into one."""
    joined = re.sub(r"\\\r?\n", " ", text)
    lines: list[str] = []
    pending = ""
    for raw in joined.splitlines():
        line = raw.strip()
        if pending:
            pending += "\n" + line
            if _closes_array(line):
                lines.append(pending)
                pending = ""
            continue
        if re.match(rf"^(?:export\s+|declare\s+(?:-\w+\s+)?)?{_NAME}\+?=\(", line) and not _closes_array(line):
            pending = line
            continue
        lines.append(line)
    if pending:
        lines.append(pending)
    return lines


def _closes_array(line: str) -> bool:
    body = line.split("#", 1)[0].rstrip() if not line.startswith("#") else ""
    return body.endswith(")")


def _run(lines: list[str], out: Script) -> None:
    """Follow ``lines``: an active block assigns and collects commands; an inactive one with a reason
    (``why``: a loop, an undecidable test) marks what it assigns unresolved; a branch not taken is skipped."""
    active, why = True, ""
    stack: list[tuple[bool, str, bool, str]] = []  # enclosing (active, why), branch taken, undecidable why
    for line in lines:
        if not line or line.startswith("#"):
            continue
        head = line.split(None, 1)[0].rstrip(";")
        if head in ("if", *_OPENERS) and line.split()[-1] in ("fi", "done", "esac"):
            for name in re.findall(rf"(?:^|[;\s])({_NAME})\+?=", line):  # a one-line compound: not followed
                out.unresolved[name] = f"assigned inside the one-line `{head}` block"
                out.variables.pop(name, None)
            continue
        cond = re.sub(r";?\s*then\s*$", "", line.split(None, 1)[1]) if " " in line else ""
        if head == "if":
            stack.append((active, why, False, ""))
        if head in ("if", "elif") and stack:
            outer, outer_why, taken, undecided = stack[-1]
            decided = _condition(cond, out) if outer and not taken and not undecided else False
            if decided is None:
                undecided = f"assigned under `{head} {cond}`, which parplan cannot decide"
            stack[-1] = (outer, outer_why, taken or bool(decided), undecided)
            active, why = outer and bool(decided) and not undecided, undecided or outer_why
            continue
        if head == "else" and stack:
            outer, outer_why, taken, undecided = stack[-1]
            active, why = outer and not taken and not undecided, undecided or outer_why
            continue
        if head in ("fi", "done", "esac", "}") and stack:
            active, why = stack.pop()[:2]
            continue
        if head in _OPENERS or re.match(rf"^(function\s+)?{_NAME}\s*\(\)", line):
            stack.append((active, why, True, ""))
            active, why = False, why or f"assigned inside a `{head}` block"
            continue
        _statement(line, out, active, why)


def _statement(line: str, out: Script, active: bool, why: str) -> None:
    m = _ASSIGN.match(line)
    if m is not None:
        name, append, rest = m.groups()
        if not active:
            if why:  # a branch not taken assigns nothing
                out.unresolved[name] = why
                out.variables.pop(name, None)
            return
        end = _first_word_end(rest)
        if not rest.startswith("(") and rest[end:].strip():  # NAME=value command ...: the command's own
            if active:
                words = [w for w in _words(rest[end:], out) if w]
                if words:
                    out.commands.append(words)
            return
        _assign(name, append == "+", rest, out)
        return
    if active and not line.startswith(("set ", "cd ", "echo ", "mkdir ", "source ", ". ", "unset ", "exit")):
        words = [w for w in _words(line, out) if w]  # an empty "${A[@]}" is no word
        if words:
            out.commands.append(words)


def _first_word_end(text: str) -> int:
    """The index where the shell word at the start of ``text`` ends (quotes and escapes followed)."""
    quote, i = "", 0
    while i < len(text):
        c = text[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c.isspace() or c == ";":
            return i
        i += 1
    return i


def _assign(name: str, append: bool, rest: str, out: Script) -> None:
    if rest.startswith("("):
        body = rest[1:rest.rfind(")")] if ")" in rest else rest[1:]
        items = [w for ln in body.splitlines() for w in _words(ln.strip(), out, split=False)]
        old = out.variables.get(name, []) if append else []
        out.variables[name] = (list(old) if isinstance(old, list) else [old]) + items
    else:
        words = _words(rest, out, split=False)
        value = words[0] if words else ""
        old = out.variables.get(name, "") if append else ""
        out.variables[name] = (old if isinstance(old, str) else " ".join(old)) + value
    out.unresolved.pop(name, None)


def _condition(cond: str, out: Script) -> bool | None:
    """The value of string tests joined by ``||`` / ``&&``; None when a part is not a string test."""
    result: bool | None = None
    op = ""
    for part in re.split(r"(\|\||&&)", cond):
        part = part.strip()
        if part in ("||", "&&"):
            op = part
            continue
        m = re.fullmatch(r"\[\[?\s*(.*?)\s*\]?\]", part)
        if m is None:
            return None
        words = [_unset_as_empty(w, out) for w in _words(m.group(1), out, split=False)]
        if any(w.startswith("$") for w in words):
            return None
        if len(words) == 3 and words[1] in ("==", "=", "!="):
            value = (words[0] == words[2]) == (words[1] != "!=")
        elif len(words) in (1, 2) and words[0] in ("-z", "-n"):
            value = (len(words) == 1 or not words[1]) == (words[0] == "-z")
        else:
            return None
        result = value if result is None else (result or value if op == "||" else result and value)
    return result


def _unset_as_empty(word: str, out: Script) -> str:
    """A test's operand: a variable neither the script nor a default sets is empty, as in a shell
    started without it (said in :attr:`Script.defaults`)."""
    name = word[1:]
    if word.startswith("$") and out.unresolved.get(name) == _UNSET:
        del out.unresolved[name]
        out.defaults[name] = ""
        return ""
    return word


def _words(text: str, out: Script, *, split: bool = True) -> list[str]:
    """Shell words of ``text`` with expansions; ``split``: unquoted expansions split into words (off
    for an assignment's value and an array's items, where bash keeps each item as written)."""
    words: list[str] = []
    cur: list[str] = []
    started = False
    i, n = 0, len(text)
    quote = ""
    while i < n:
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = ""
            else:
                cur.append(c)
            i += 1
            continue
        if c == "$":
            value, i = _expansion(text, i, out)
            if isinstance(value, list) and quote == "":
                parts = [p for v in value for p in (v.split() if split else [v])]
            elif isinstance(value, list):
                parts = value
            else:
                parts = value.split() if split and quote == "" else [value]
            if len(parts) > 1 or (isinstance(value, list) and quote):
                words.extend(["".join(cur) + parts[0], *parts[1:-1]] if parts else [])
                cur = [parts[-1]] if parts and len(parts) > 1 else []
                started = bool(cur)
            elif parts:
                cur.append(parts[0])
                started = True
            continue
        if quote == '"':
            if c == '"':
                quote = ""
            elif c == "\\" and i + 1 < n and text[i + 1] in '"\\$`':
                cur.append(text[i + 1])
                i += 1
            else:
                cur.append(c)
            i += 1
            continue
        if c in "'\"":
            quote, started = c, True
        elif c == "\\" and i + 1 < n:
            cur.append(text[i + 1])
            started = True
            i += 1
        elif c.isspace() or c == ";":
            if started or cur:
                words.append("".join(cur))
            cur, started = [], False
        elif c == "#" and not started and not cur:
            while i < n and text[i] != "\n":
                i += 1
            continue
        else:
            cur.append(c)
            started = True
        i += 1
    if started or cur:
        words.append("".join(cur))
    return words


def _expansion(text: str, i: int, out: Script) -> tuple[Value, int]:
    """The value of the expansion at ``text[i] == "$"`` and the index after it."""
    rest = text[i + 1:]
    if rest.startswith("(("):
        end = text.find("))", i)
        if end < 0:
            return "$", i + 1
        return _arithmetic(text[i + 3:end], out), end + 2
    if rest.startswith("("):
        end = text.find(")", i)
        out.unresolved.setdefault(text[i:end + 1], "a command's output")
        return text[i:end + 1], (end + 1 if end > 0 else len(text))
    if rest.startswith("{"):
        end = text.find("}", i)
        if end < 0:
            return "$", i + 1
        inner = text[i + 2:end]
        m = re.fullmatch(rf"({_NAME}|\d+)(\[[@*]\])?(?::?-(.*))?", inner, re.S)
        if m is None:
            return text[i:end + 1], end + 1
        return _lookup(m.group(1), m.group(3), out), end + 1
    m = re.match(rf"({_NAME}|\d)", rest)
    if m is None:
        return "$", i + 1
    return _lookup(m.group(1), None, out), i + 1 + m.end()


def _lookup(name: str, default: str | None, out: Script) -> Value:
    if name in out.variables:
        return out.variables[name]
    if name in out.unresolved:
        return f"${name}"
    if default is not None:
        words = _words(default, out, split=False)
        value = words[0] if words else ""
        out.defaults[name] = value
        return value
    if name.isdigit() or name == "PWD":
        out.unresolved[name] = "a positional argument of the script" if name.isdigit() else "the working directory"
        return f"${name}"
    out.unresolved[name] = _UNSET
    return f"${name}"


def _arithmetic(expr: str, out: Script) -> str:
    """An integer ``$(( ... ))`` over plain numbers and assigned variables."""
    words = _words(expr, out, split=False)
    text = "".join(words)
    try:
        return str(_eval(ast.parse(text, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError):
        out.unresolved.setdefault(f"$(({expr}))", "an arithmetic expansion of values the script does not assign")
        return f"$(({expr}))"


def _eval(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        return _ARITH[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("not an integer expression")
