"""The Lua mutator of ``make mutation`` (``mutation/lua.py``): it mutates Lua code only
(never a docstring, Python code, a Lua comment or a Lua string), makes one change per
mutant, and always puts the module back. No Redis: the tests run on small modules
written here and on the Redis store's script modules read as text."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from mutation import lua
from mutation.mutate import ROOT, load_targets

MODULE = '''"""A docstring: if a < b and not c then redis.call('DEL', KEYS[1]) end"""

LIMIT = 1 if 2 < 3 and True else 0

SCRIPT = """
-- A comment: if a < b and not c then redis.call('DEL', KEYS[1]) end
local s = 'a < b and not c' .. "x == 1"
if a < b and not c then
  redis.call('DEL', KEYS[1])
end
"""
"""A docstring of SCRIPT: x == 1 or y ~= 0."""
'''


def write(tmp_path: Path, text: str) -> str:
    (tmp_path / "mod.py").write_text(text)
    return "mod.py"


def changed(tmp_path: Path, text: str) -> list[tuple[str, str, str]]:
    """(operator, what was replaced, replacement) of each mutant of ``text``."""
    module = write(tmp_path, text)
    return [
        (m.operator, text[m.start : m.end], m.replacement) for m in lua.mutants(tmp_path, module)
    ]


def constants(source: str) -> list[object]:
    """The constants of a Python module, in order."""
    return [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant)]


def script(lua_code: str) -> str:
    return f'X = """\n{lua_code}\n"""\n'


def test_only_the_lua_code_of_a_script_string_is_mutated(tmp_path: Path) -> None:
    # Docstrings, Python code, the Lua comment and the Lua string literals hold the
    # same operators: none of them is a mutation point.
    assert changed(tmp_path, MODULE) == [
        ("lua/ReplaceComparison_Lt_LtE", "<", "<="),
        ("lua/Replace_And_Or", "and", "or"),
        ("lua/RemoveNot", "not ", ""),
        ("lua/RemoveCall_DEL", "redis.call('DEL', KEYS[1])", "do end"),
    ]
    # Each names the script it is in (one line of Lua may be in several scripts).
    assert {m.code for m in lua.mutants(tmp_path, "mod.py")} == {
        "SCRIPT: if a < b and not c then",
        "SCRIPT: redis.call('DEL', KEYS[1])",
    }


def test_each_operator_makes_its_change(tmp_path: Path) -> None:
    code = "if a <= b or c > d and e >= f or g == h or i ~= j then x = k + 1 - 1 end"
    assert changed(tmp_path, script(code)) == [
        ("lua/ReplaceComparison_LtE_Lt", "<=", "<"),
        ("lua/Replace_Or_And", "or", "and"),
        ("lua/ReplaceComparison_Gt_GtE", ">", ">="),
        ("lua/Replace_And_Or", "and", "or"),
        ("lua/ReplaceComparison_GtE_Gt", ">=", ">"),
        ("lua/Replace_Or_And", "or", "and"),
        ("lua/ReplaceComparison_Eq_NotEq", "==", "~="),
        ("lua/Replace_Or_And", "or", "and"),
        ("lua/ReplaceComparison_NotEq_Eq", "~=", "=="),
        ("lua/Add1_Add0", "1", "0"),
        ("lua/Sub1_Sub0", "1", "0"),
    ]


def test_a_literal_0_or_1_is_mutated_only_where_it_is_compared(tmp_path: Path) -> None:
    # n + 1 > m: the 1 is the arithmetic operator's mutant only (Add1_Add0), not twice.
    code = "if n > 0 and 1 == m or n + 1 > m then redis.call('LRANGE', KEYS[1], 0, 1) end"
    assert [c for c in changed(tmp_path, script(code)) if c[0].startswith("lua/Number")] == [
        ("lua/Number0_1", "0", "1"),
        ("lua/Number1_0", "1", "0"),
    ]


def test_a_unary_minus_and_other_numbers_are_left_alone(tmp_path: Path) -> None:
    code = "for i = #ARGV, 1, -1 do x = y - 2 + 10 end\nredis.call('HINCRBY', k, f, -1)"
    assert [c[0] for c in changed(tmp_path, script(code))] == ["lua/RemoveCall_HINCRBY"]


def test_only_a_write_call_made_as_a_statement_is_removed(tmp_path: Path) -> None:
    code = (
        "local n = redis.call('INCR', KEYS[1])\n"
        "if redis.call('ZREM', KEYS[2], g) == 1 then\n"
        "  redis.call('LPUSH', KEYS[3], g)\n"
        "end\n"
        "redis.call('GET', KEYS[1])\n"
        "return redis.call('DEL', KEYS[4])\n"
    )
    removals = [c for c in changed(tmp_path, script(code)) if c[0].startswith("lua/RemoveCall")]
    assert removals == [("lua/RemoveCall_LPUSH", "redis.call('LPUSH', KEYS[3], g)", "do end")]


def test_a_removed_call_ends_at_its_own_closing_parenthesis(tmp_path: Path) -> None:
    code = "if x then redis.call('SET', k, f(a, (b)), 'PX', t) end"
    text = script(code)
    (mutant,) = [m for m in lua.mutants(tmp_path, write(tmp_path, text)) if m.replacement]
    assert lua.apply(text, mutant) == script("if x then do end end")


def test_mutants_of_the_redis_scripts_change_one_lua_code_spot_each() -> None:
    for module in ("broker/redis/scripts.py", "broker/redis/policy_scripts.py"):
        source = (ROOT / module).read_text()
        spans = lua.lua_spans(source)
        found = lua.find(module, source)
        before = constants(source)
        assert len(found) > 50
        assert len({(m.start, m.operator) for m in found}) == len(found)
        for mutant in found:
            assert any(a <= mutant.start and mutant.end <= b for a, b, _ in spans), mutant
            line_start = source.rfind("\n", 0, mutant.start) + 1
            assert "--" not in source[line_start : mutant.start], mutant
            # Python-wise the module is the same but for one string constant.
            after = constants(lua.apply(source, mutant))
            assert sum(a != b for a, b in zip(before, after, strict=True)) == 1, mutant


def test_the_module_is_restored_after_an_error_or_ctrl_c(tmp_path: Path) -> None:
    module = write(tmp_path, MODULE)
    path = tmp_path / module
    (mutant, *_) = lua.mutants(tmp_path, module)
    for error in (RuntimeError("a failing run"), KeyboardInterrupt()):
        with pytest.raises(type(error)), lua.mutated(tmp_path, mutant):
            assert path.read_text() == lua.apply(MODULE, mutant)
            raise error
        assert path.read_text() == MODULE


def test_a_run_sees_the_mutant_and_a_failure_or_a_timeout_kills_it(tmp_path: Path) -> None:
    module = write(tmp_path, MODULE)
    path = tmp_path / module
    mutant = next(m for m in lua.mutants(tmp_path, module) if m.operator == "lua/RemoveNot")
    # The "tests": fail when the module on disk is the mutant, pass when it is not.
    check = f"import sys; sys.exit(open({str(path)!r}).read() != {MODULE!r})"
    assert lua.run_one(tmp_path, mutant, [sys.executable, "-c", check], 30).killed
    assert path.read_text() == MODULE
    passing = [sys.executable, "-c", "pass"]
    assert not lua.run_one(tmp_path, mutant, passing, 30).killed
    hanging = [sys.executable, "-c", "import time; time.sleep(30)"]
    result = lua.run_one(tmp_path, mutant, hanging, 0.5)
    assert result.killed
    assert result.seconds < 10
    assert path.read_text() == MODULE


def test_a_run_log_reads_back_as_it_was_written(tmp_path: Path) -> None:
    module = write(tmp_path, MODULE)
    found = lua.mutants(tmp_path, module)[:2]
    log = tmp_path / "run.jsonl"
    results = lua.run(tmp_path, found, [sys.executable, "-c", "pass"], 30, log)
    assert lua.read_log(log) == results


def test_every_lua_target_names_modules_with_mutants() -> None:
    targets = [t for t in load_targets(ROOT / "mutation" / "targets.toml") if t.kind == "lua"]
    assert targets
    for target in targets:
        for module in target.modules:
            assert lua.mutants(ROOT, module), module


def test_a_kill_by_a_fixture_error_alone_stands_only_if_the_tests_fail_again(
    tmp_path: Path,
) -> None:
    module = write(tmp_path, MODULE)
    (mutant, *_) = lua.mutants(tmp_path, module)
    runs = tmp_path / "runs"
    # The "tests": an ERROR (a fixture's teardown) on their first run only.
    flaky = (
        f"import pathlib, sys; p = pathlib.Path({str(runs)!r}); first = not p.exists(); "
        "p.touch(); print('ERROR t.py::test_x - TimeoutError' if first else ''); "
        "sys.exit(1 if first else 0)"
    )
    assert not lua.run_one(tmp_path, mutant, [sys.executable, "-c", flaky], 30).killed
    # A captured log line at level ERROR is no failed test: the summary line is.
    failing = (
        "print('ERROR    holdfast.broker:x.py:1 a log line'); "
        "print('FAILED t.py::test_x - assert 1 == 2'); raise SystemExit(1)"
    )
    result = lua.run_one(tmp_path, mutant, [sys.executable, "-c", failing], 30)
    assert (result.killed, result.why) == (True, "FAILED t.py::test_x - assert 1 == 2")
