"""Pull the Python program out of a model's reply.

Replies come in every shape: reasoning first (``<think>…</think>``), one fenced block or several
(the kernel in one, ``ModelNew`` in the next; a draft and then a fixed version), ``~~~`` fences,
a final fence the model never closed (cut at max tokens), or no fences at all. The rule: find the
block that defines the required names (the last one, when the model revised its answer), add the
earlier blocks that define what it uses but does not define, and return it only if it parses.
"""

from __future__ import annotations

import ast
import builtins
import re
import textwrap
from dataclasses import dataclass

_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
_CODE_START = re.compile(r"^(import |from \S+ import |class |def |async def |@)")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_NON_PYTHON = frozenset(
    {
        "cuda",
        "cu",
        "cpp",
        "c++",
        "c",
        "h",
        "hpp",
        "bash",
        "sh",
        "shell",
        "console",
        "text",
        "json",
        "yaml",
        "diff",
        "makefile",
        "cmake",
        "ptx",
        "output",
    }
)
_BUILTINS = frozenset(dir(builtins))
_MAX_TRIMS = 64


@dataclass(frozen=True)
class _Block:
    code: str
    tree: ast.Module
    defines: frozenset[str]
    uses: frozenset[str]  # names read but bound nowhere in the block (nor builtins)


def extract_code(reply: str, required_names: tuple[str, ...] = ("ModelNew",)) -> str | None:
    """The program in ``reply`` that defines every name in ``required_names``, or None."""
    text = _strip_reasoning(reply.replace("\r\n", "\n"))
    fenced = _fenced_blocks(text)
    blocks = [b for b in (_parse(code) for code in fenced) if b is not None]
    if not fenced:
        unfenced = _parse(_from_first_code_line(text))
        blocks = [unfenced] if unfenced else []
    return _assemble(blocks, required_names)


def _strip_reasoning(text: str) -> str:
    text = _THINK.sub("", text)
    # Templates that open <think> in the prompt leave only the closing tag in the reply.
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text


def _fenced_blocks(text: str) -> list[str]:
    """Contents of the fenced blocks that may be Python; an unterminated last block runs to the end."""
    blocks: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening["fence"], opening["info"].lower().lstrip(".")
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body: list[str] = []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            body.append(lines[i])
            i += 1
        i += 1
        if info not in _NON_PYTHON:
            blocks.append(textwrap.dedent("\n".join(body)))
    return blocks


def _from_first_code_line(text: str) -> str:
    lines = text.split("\n")
    for start, line in enumerate(lines):
        if _CODE_START.match(line):
            return "\n".join(lines[start:])
    return text


def _parse(code: str) -> _Block | None:
    """The block, parsed; prose after the code (or a cut-off tail) is trimmed at the first syntax error."""
    lines = code.strip("\n").split("\n")
    for _ in range(_MAX_TRIMS):
        source = "\n".join(lines).rstrip() + "\n"
        if not source.strip():
            return None
        try:
            tree = ast.parse(source)
        except SyntaxError as err:
            cut = (err.lineno or len(lines)) - 1
            if cut <= 0:
                return None  # prose from the first line: not a program
            lines = lines[:cut] if cut < len(lines) else lines[:-1]
            continue
        if not tree.body:
            return None
        return _Block(source, tree, frozenset(_top_level_names(tree)), frozenset(_free_names(tree)))
    return None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _free_names(tree: ast.Module) -> set[str]:
    """Names read somewhere and bound nowhere in the block (a rough scope-free view, enough to join blocks)."""
    bound, read = set(_top_level_names(tree)), set[str]()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound - _BUILTINS


def _assemble(blocks: list[_Block], required: tuple[str, ...]) -> str | None:
    """The last block defining all required names (else the last definer of each), plus the
    blocks that define what those use; in reply order."""
    if not blocks:
        return None
    complete = [i for i, b in enumerate(blocks) if set(required) <= b.defines]
    if complete:
        chosen = {complete[-1]}
    else:
        chosen = set()
        for name in required:
            definers = [i for i, b in enumerate(blocks) if name in b.defines]
            if not definers:
                return None
            chosen.add(definers[-1])
    while True:
        defined = set().union(*(blocks[i].defines for i in chosen))
        missing = set().union(*(blocks[i].uses for i in chosen)) - defined
        # Prefer the nearest earlier block (helpers precede their use), then later ones.
        anchor = max(chosen)
        order = [i for i in range(anchor - 1, -1, -1)] + list(range(anchor + 1, len(blocks)))
        helper = next((i for i in order if i not in chosen and blocks[i].defines & missing), None)
        if helper is None:
            break
        chosen.add(helper)
    source = "\n\n".join(blocks[i].code.rstrip() for i in sorted(chosen)) + "\n"
    try:
        ast.parse(source)
    except SyntaxError:  # pragma: no cover - joined parsed blocks stay parseable
        return None
    return source
