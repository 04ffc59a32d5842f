"""Mutation of the Lua scripts embedded in Python modules (cosmic-ray mutates Python only).

The Redis store's scripts are triple-quoted string constants of ``broker/redis/*_scripts.py``
and ``scripts.py``. ``mutants`` finds the mutation points in the Lua code of those strings
(never in a Lua comment, a Lua string literal, a docstring or Python code), ``apply``
makes one of them at a time, and ``mutated`` rewrites the module on disk for the length of
a test run and always puts the original back (like cosmic-ray does with Python modules).

The operators: a comparison swapped for its neighbour (``<``/``<=``, ``>``/``>=``,
``==``/``~=``), ``+ 1`` and ``- 1`` made ``+ 0`` and ``- 0``, ``and``/``or`` swapped, a
``not`` dropped, a literal 0 or 1 compared with something made 1 or 0, and a
``redis.call`` of a write command made as a statement removed (``do end``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

COMPARISONS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "~=", "~=": "=="}
"""Each comparison and the neighbour it is swapped for."""

OPERATOR_NAMES = {"<": "Lt", "<=": "LtE", ">": "Gt", ">=": "GtE", "==": "Eq", "~=": "NotEq"}

_WRITES = "DECRBY DEL EXPIRE HDEL HINCRBY HSET INCR INCRBY LPUSH LREM LTRIM PEXPIRE RPUSH"
_WRITES += " PERSIST SET ZADD ZREM"
WRITES = frozenset(_WRITES.split())
"""Redis commands that change data: a statement calling one of them may be removed."""

_CONTINUES = "and or not = , ( { [ .. + - * / % < <= > >= == ~="
_CONTINUES += " return local if elseif while until in"
CONTINUES = frozenset(_CONTINUES.split())
"""Tokens after which the next line continues an expression (no statement starts there)."""

_TOKEN = re.compile(
    r"(?P<space>\s+)"
    r"|(?P<comment>--\[(?P<ceq>=*)\[.*?\](?P=ceq)\]|--[^\n]*)"
    r"|(?P<long>\[(?P<leq>=*)\[.*?\](?P=leq)\])"
    r"|(?P<string>'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")"
    r"|(?P<number>0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)"
    r"|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>\.\.\.|\.\.|==|~=|<=|>=|[-+*/%^#<>=(){}\[\];:,.])",
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class Token:
    """A Lua token: its kind (``number``, ``name``, ``op``, ``string``), its text, where
    it starts in the module's source and whether it is the first on its line."""

    kind: str
    text: str
    start: int
    first_on_line: bool


@dataclass(frozen=True, slots=True)
class Mutant:
    """One change to a module's source: ``text[start:end]`` becomes ``replacement``."""

    module: str
    start: int
    end: int
    replacement: str
    operator: str
    line: int
    occurrence: int
    """How many earlier mutants of this operator are on the same line."""
    code: str
    """The script (the constant it is a part of) and the line of the unmutated source,
    stripped: ``UNCLAIM: n = n + 1`` (one line of Lua may be in several scripts)."""

    @property
    def key(self) -> tuple[str, int, int, str, str]:
        """What the mutant changes, whatever its line's text: it names it across runs."""
        return (self.module, self.start, self.end, self.replacement, self.operator)


def lua_spans(source: str) -> list[tuple[int, int, str]]:
    """Where the Lua is in a module: the insides of its triple-quoted string constants
    that are part of an assigned value (docstrings are statements of their own), each
    with the name it is assigned to."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    spans = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        name = ast.unparse(target)
        for part in ast.walk(node.value):
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                continue
            assert part.end_lineno is not None and part.end_col_offset is not None
            start = offsets[part.lineno - 1] + part.col_offset
            end = offsets[part.end_lineno - 1] + part.end_col_offset
            if source.startswith('"""', start) and source.endswith('"""', 0, end):
                spans.append((start + 3, end - 3, name))
    return sorted(spans)


def tokens(source: str, start: int, end: int) -> Iterator[Token]:
    """The Lua tokens of ``source[start:end]``, comments and blanks left out."""
    at, first = start, True
    while at < end:
        match = _TOKEN.match(source, at, end)
        if match is None:
            raise ValueError(f"no Lua token at offset {at}: {source[at : at + 20]!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind == "long":
            kind = "string"
        if kind in ("space", "comment"):
            first = first or "\n" in match.group()
        else:
            yield Token(kind, match.group(), at, first)
            first = False
        at = match.end()


def _call_end(source: str, toks: list[Token], i: int) -> int | None:
    """The end offset of the ``redis.call(...)`` starting at ``toks[i]``, if its first
    argument is a write command."""
    if [t.text for t in toks[i : i + 4]] != ["redis", ".", "call", "("] or i + 4 >= len(toks):
        return None
    if toks[i + 4].kind != "string" or toks[i + 4].text[1:-1].upper() not in WRITES:
        return None
    depth = 0
    for tok in toks[i + 3 :]:
        depth += {"(": 1, ")": -1}.get(tok.text, 0) if tok.kind == "op" else 0
        if depth == 0:
            return tok.start + 1
    return None


def _changes(source: str, toks: list[Token]) -> Iterator[tuple[int, int, str, str]]:
    """(start, end, replacement, operator) of every mutation point in ``toks``."""
    for i, tok in enumerate(toks):
        before = toks[i - 1] if i else None
        after = toks[i + 1] if i + 1 < len(toks) else None
        end = tok.start + len(tok.text)
        if tok.kind == "op" and tok.text in COMPARISONS:
            swap = COMPARISONS[tok.text]
            names = f"{OPERATOR_NAMES[tok.text]}_{OPERATOR_NAMES[swap]}"
            yield tok.start, end, swap, f"lua/ReplaceComparison_{names}"
        elif tok.kind == "op" and tok.text in ("+", "-") and after and after.text == "1":
            # Only a binary + or -: after an operand (a unary minus is part of a literal).
            operand = before is not None and before.text not in CONTINUES
            if operand and before and (before.kind in ("name", "number") or before.text in ")]"):
                sign = "Add" if tok.text == "+" else "Sub"
                yield after.start, after.start + 1, "0", f"lua/{sign}1_{sign}0"
        elif tok.kind == "name" and tok.text in ("and", "or"):
            swap = "or" if tok.text == "and" else "and"
            yield tok.start, end, swap, f"lua/Replace_{tok.text.title()}_{swap.title()}"
        elif tok.kind == "name" and tok.text == "not" and after is not None:
            yield tok.start, after.start, "", "lua/RemoveNot"
        elif tok.kind == "number" and tok.text in ("0", "1"):
            # A literal compared with something: elsewhere (an index, a Redis argument)
            # 0 and 1 are mostly the same to Lua (string.find's init) or plain breakage.
            # After a + or - it is the arithmetic operator's (one mutant, not two).
            compared = (before and before.text in COMPARISONS) or (
                after and after.text in COMPARISONS and not (before and before.text in "+-")
            )
            if compared:
                swap = "1" if tok.text == "0" else "0"
                yield tok.start, end, swap, f"lua/Number{tok.text}_{swap}"
        elif tok.text == "redis" and (
            (before is None or before.text in ("then", "do", "else"))
            or (tok.first_on_line and before.text not in CONTINUES)
        ):
            call_end = _call_end(source, toks, i)
            if call_end is not None:
                command = toks[i + 4].text[1:-1].upper()
                yield tok.start, call_end, "do end", f"lua/RemoveCall_{command}"


def mutants(root: Path, module: str) -> list[Mutant]:
    """Every mutant of the Lua in ``root / module``, in source order."""
    return find(module, (root / module).read_text())


def find(module: str, source: str) -> list[Mutant]:
    """Every mutant of the Lua in ``source``, the text of ``module``, in source order."""
    found: list[tuple[int, int, str, str, str]] = []
    for start, end, name in lua_spans(source):
        toks = list(tokens(source, start, end))
        found.extend((*change, name) for change in _changes(source, toks))
    lines = source.splitlines()
    seen: dict[tuple[int, str], int] = {}
    out = []
    for start, end, replacement, operator, name in sorted(found):
        line = source.count("\n", 0, start) + 1
        occurrence = seen.get((line, operator), 0)
        seen[(line, operator)] = occurrence + 1
        code = f"{name}: {lines[line - 1].strip()}"
        out.append(Mutant(module, start, end, replacement, operator, line, occurrence, code))
    return out


def apply(source: str, mutant: Mutant) -> str:
    """``source`` with ``mutant``'s one change made."""
    return source[: mutant.start] + mutant.replacement + source[mutant.end :]


@contextmanager
def mutated(root: Path, mutant: Mutant) -> Iterator[None]:
    """The module rewritten with ``mutant`` for the length of the block; the original
    is written back however the block ends (an error, Ctrl-C, a SIGTERM)."""
    path = root / mutant.module
    original = path.read_bytes()

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # SIGTERM would end the process without unwinding: make it unwind like Ctrl-C.
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        path.write_text(apply(original.decode(), mutant))
        yield
    finally:
        path.write_bytes(original)
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True, slots=True)
class Result:
    """What one mutant's test run found: killed (the tests failed, or hung past the
    timeout, which counts as killed as in cosmic-ray), how long it took, and why
    (the first failing test pytest names, or ``timeout``)."""

    mutant: Mutant
    killed: bool
    seconds: float
    why: str = ""


def _clear_bytecode(path: Path) -> None:
    # A mutant of the same size written within the second of the last write would
    # leave a stale .pyc valid (its check is mtime and size): never let one be read.
    for cached in path.parent.glob(f"__pycache__/{path.stem}.*.pyc"):
        cached.unlink(missing_ok=True)


_SUMMARY = re.compile(r"^(?:FAILED|ERROR) \S+::\S+", re.MULTILINE)
"""A line of pytest's short summary (not a captured log line at level ERROR)."""


def _first_failure(output: str) -> str:
    """The first ``FAILED``/``ERROR`` line of pytest's summary ('' if none)."""
    match = _SUMMARY.search(output)
    return "" if match is None else output[match.start() : output.find("\n", match.start())]


def _run_tests(root: Path, command: list[str], timeout: float) -> tuple[bool, str]:
    """(failed, why) of one run of ``command``; its process group (the servers the
    tests started too) is ended after it, however it ends."""
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(
            command, cwd=root, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return True, "timeout"
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        output.seek(0)
        return code != 0, _first_failure(output.read()) if code else ""


def run_one(root: Path, mutant: Mutant, command: list[str], timeout: float) -> Result:
    """Run ``command`` (the tests) in ``root`` with ``mutant`` applied; the module is
    restored after. A kill by a fixture's ERROR alone (a server slow to stop on a busy
    machine, not a rule broken) is run once more and stands only if the tests fail again."""
    started = time.monotonic()
    with mutated(root, mutant):
        _clear_bytecode(root / mutant.module)
        killed, why = _run_tests(root, command, timeout)
        if killed and why.startswith("ERROR "):
            killed, again = _run_tests(root, command, timeout)
            why = f"{why}; again: {again}" if killed else ""
    _clear_bytecode(root / mutant.module)
    return Result(mutant, killed, time.monotonic() - started, why)


def run(
    root: Path, found: list[Mutant], command: list[str], timeout: float, log: Path | None
) -> list[Result]:
    """Every mutant in ``found``, one at a time; each result is printed to stderr and
    appended to ``log`` (JSON lines) as it comes, so an interrupted run keeps its part."""
    results = []
    for number, mutant in enumerate(found, 1):
        result = run_one(root, mutant, command, timeout)
        results.append(result)
        print(
            f"[{number}/{len(found)}] {'killed' if result.killed else 'SURVIVED'} "
            f"{result.seconds:5.1f}s {mutant.module}:{mutant.line} {mutant.operator} "
            f"{result.why}",
            file=sys.stderr,
            flush=True,
        )
        if log is not None:
            with log.open("a") as out:
                out.write(record(result))
    return results


def record(result: Result) -> str:
    """``result`` as a line of a run's log."""
    outcome = {"killed": result.killed, "seconds": result.seconds, "why": result.why}
    return json.dumps(asdict(result.mutant) | outcome) + "\n"


def read_log(log: Path) -> list[Result]:
    """The results ``run`` appended to ``log``."""
    results = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        killed, seconds, why = record.pop("killed"), record.pop("seconds"), record.pop("why")
        results.append(Result(Mutant(**record), bool(killed), float(seconds), str(why)))
    return results
