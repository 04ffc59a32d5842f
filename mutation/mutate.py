"""``make mutation``: mutation testing of the broker's rules with cosmic-ray.

Each target in ``mutation/targets.toml`` names the modules whose rules it mutates and the
tests that must pin them (the conformance suite, the lifecycle tests, the Redis walk). For
every target this runs the tests once unmutated (they must pass and select at least one
test: a command that runs no test would "kill" every mutant), then lets cosmic-ray mutate
the modules one change at a time, in place, and run the tests against each. It prints
killed / survived per target and every survivor (file, line, operator), and exits 1 when
any target had fewer than ``--threshold`` percent (default 90) of its mutants killed.
``--sessions DIR`` keeps cosmic-ray's session files there; ``--report`` with it prints
the outcome of sessions already run (after a change to the ``equivalent`` lists).

Mutants marked ``# pragma: no mutate`` on their line are skipped (cosmic-ray's own
filter); every such pragma says why in a comment beside it. A survivor that changes
nothing anyone can observe (an equivalent mutant) is listed in its target's
``equivalent`` entries (the source line, the operator, and why) and reported apart,
not counted against the score: ``killed / (mutants - equivalent)``.

A target of ``kind = "lua"`` mutates the Lua scripts inside its modules' strings instead
(``mutation/lua.py``: cosmic-ray sees only Python); its equivalent entries name the Lua
line and a ``lua/`` operator, and ``--sessions`` keeps its results as ``<target>.jsonl``;
``--survivors`` runs only the survivors kept there again (once tests were added).

Not part of ``make test``: it runs the target's tests once per mutant.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from mutation import lua

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@dataclass(frozen=True, slots=True)
class Equivalent:
    """Survivors judged equivalent: the mutants of ``operator`` (a prefix of the
    operator's name) on the source line ``code`` (stripped), and why."""

    code: str
    operator: str
    why: str


@dataclass(frozen=True, slots=True)
class Target:
    """Modules to mutate and the test command that must kill their mutants."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    timeout: float
    equivalent: tuple[Equivalent, ...] = ()
    kind: str = "python"
    """``python`` (cosmic-ray) or ``lua`` (the scripts in the modules' strings)."""


@dataclass(frozen=True, slots=True)
class Survivor:
    """A mutant no test killed."""

    module: str
    line: int
    operator: str
    occurrence: int
    code: str
    """The mutated line of the unmutated source, stripped."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one target's run found."""

    target: Target
    killed: int
    survived: list[Survivor]
    skipped: int
    seconds: float
    equivalent: list[tuple[Survivor, Equivalent]]

    @property
    def total(self) -> int:
        """Mutants that ran and are not equivalent (skipped ones excluded)."""
        return self.killed + len(self.survived)

    @property
    def share(self) -> float:
        """Percent of ``total`` killed."""
        return 100.0 * self.killed / self.total if self.total else 100.0


def load_targets(path: Path) -> list[Target]:
    """Read ``targets.toml``: ``[[target]]`` tables with name, modules, tests, timeout."""
    data = tomllib.loads(path.read_text())
    return [
        Target(
            name=entry["name"],
            modules=tuple(entry["modules"]),
            tests=tuple(entry["tests"]),
            timeout=float(entry.get("timeout", 120)),
            kind=entry.get("kind", "python"),
            equivalent=tuple(
                Equivalent(e["code"].strip(), e["operator"], e["why"])
                for e in entry.get("equivalent", ())
            ),
        )
        for entry in data["target"]
    ]


def pytest_command(target: Target) -> list[str]:
    """The test run of one mutant: stop at the first failure, quiet, no cache."""
    return [str(BIN / "pytest"), "-x", "-q", "-p", "no:cacheprovider", *target.tests]


def check_baseline(target: Target) -> None:
    """The unmutated code must pass the target's tests, and at least one must run."""
    result = subprocess.run(
        pytest_command(target), cwd=ROOT, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-15:])
        raise SystemExit(
            f"mutation: the tests of target {target.name!r} do not pass unmutated "
            f"(exit {result.returncode}); fix them first:\n{tail}"
        )


def write_config(target: Target, where: Path) -> Path:
    """A cosmic-ray configuration for ``target``."""
    modules = ", ".join(f'"{ROOT / module}"' for module in target.modules)
    command = " ".join(pytest_command(target))
    config = where / f"{target.name}.toml"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = [{modules}]\n"
        f"timeout = {target.timeout}\n"
        "excluded-modules = []\n"
        f"test-command = '{command}'\n\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )
    return config


def run_target(target: Target, where: Path) -> Outcome:
    """Baseline, init, filter, exec and read back one target."""
    started = time.monotonic()
    check_baseline(target)
    if target.kind == "lua":
        found = [m for module in target.modules for m in lua.mutants(ROOT, module)]
        log = where / f"{target.name}.jsonl"
        log.unlink(missing_ok=True)
        results = lua.run(ROOT, found, pytest_command(target), target.timeout, log)
        return lua_outcome(target, results, time.monotonic() - started)
    config = write_config(target, where)
    session = where / f"{target.name}.sqlite"
    _tool("cosmic-ray", "init", str(config), str(session))
    _tool("cr-filter-pragma", str(session))
    skip_annotations(session)
    _tool("cosmic-ray", "exec", str(config), str(session))
    return read_session(target, session, time.monotonic() - started)


def _tool(name: str, *args: str) -> None:
    subprocess.run([str(BIN / name), *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def annotation_spans(module: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where ``module``'s type annotations are: a mutant there changes nothing that runs
    (every module has ``from __future__ import annotations``), so it is equivalent."""
    spans = []
    for node in ast.walk(ast.parse(module.read_text())):
        notes: list[ast.expr | None] = []
        if isinstance(node, ast.arg):
            notes.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            notes.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
        for note in notes:
            if note is not None and note.end_lineno is not None and note.end_col_offset is not None:
                spans.append(
                    ((note.lineno, note.col_offset), (note.end_lineno, note.end_col_offset))
                )
    return spans


def skip_annotations(session: Path) -> None:
    """Mark the mutants inside type annotations as skipped (equivalent mutants)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans: dict[Path, list[tuple[tuple[int, int], tuple[int, int]]]] = {}
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.work_items:
            for spec in item.mutations:
                module = Path(spec.module_path)
                if module not in spans:
                    spans[module] = annotation_spans(module)
                if any(
                    a <= tuple(spec.start_pos) and tuple(spec.end_pos) <= b
                    for a, b in spans[module]
                ):
                    db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))


def rerun_survivors(target: Target, where: Path) -> Outcome:
    """Run the survivors of a Lua target's kept log again (after tests were added: a
    kill stands, the tests only grew) and rewrite the log with their new results."""
    started = time.monotonic()
    check_baseline(target)
    log = where / f"{target.name}.jsonl"
    kept = lua.read_log(log)
    if len(current_results(target, kept)) < sum(len(lua.mutants(ROOT, m)) for m in target.modules):
        raise SystemExit(f"mutation: {target.name}'s modules changed since the run: run it whole")
    kept = current_results(target, kept)
    survivors = [r.mutant for r in kept if not r.killed]
    again = {
        r.mutant: r for r in lua.run(ROOT, survivors, pytest_command(target), target.timeout, None)
    }
    results = [again.get(r.mutant, r) for r in kept]
    log.write_text("".join(lua.record(r) for r in results))
    return lua_outcome(target, results, time.monotonic() - started)


def current_results(target: Target, kept: list[lua.Result]) -> list[lua.Result]:
    """The kept results of the mutants the target's modules make now, each described as
    now (a log may predate a change of the mutator's operators or descriptions)."""
    current = {m.key: m for module in target.modules for m in lua.mutants(ROOT, module)}
    return [replace(r, mutant=current[r.mutant.key]) for r in kept if r.mutant.key in current]


def lua_outcome(target: Target, results: list[lua.Result], seconds: float) -> Outcome:
    """Count the results of a Lua target's mutants."""
    survived: list[Survivor] = []
    equivalent: list[tuple[Survivor, Equivalent]] = []
    for r in results:
        if not r.killed:
            m = r.mutant
            survivor = Survivor(m.module, m.line, m.operator, m.occurrence, m.code)
            why = equivalent_of(target, survivor)
            if why is None:
                survived.append(survivor)
            else:
                equivalent.append((survivor, why))
    killed = sum(r.killed for r in results)
    return Outcome(target, killed, survived, 0, seconds, equivalent)


def equivalent_of(target: Target, survivor: Survivor) -> Equivalent | None:
    """The entry of ``target.equivalent`` that covers ``survivor``, if any."""
    return next(
        (
            e
            for e in target.equivalent
            if e.code == survivor.code and survivor.operator.startswith(e.operator)
        ),
        None,
    )


def read_session(target: Target, session: Path, seconds: float) -> Outcome:
    """Count the outcomes cosmic-ray recorded in ``session``."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    killed = skipped = 0
    survived: list[Survivor] = []
    equivalent: list[tuple[Survivor, Equivalent]] = []
    lines: dict[Path, list[str]] = {}
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                skipped += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                spec = item.mutations[0]
                module = Path(spec.module_path)
                if module not in lines:
                    lines[module] = module.read_text().splitlines()
                survivor = Survivor(
                    str(module.relative_to(ROOT)),
                    spec.start_pos[0],
                    spec.operator_name,
                    spec.occurrence,
                    lines[module][spec.start_pos[0] - 1].strip(),
                )
                why = equivalent_of(target, survivor)
                if why is None:
                    survived.append(survivor)
                else:
                    equivalent.append((survivor, why))
            else:
                # A mutant that hangs past the timeout counts as killed (cosmic-ray's rule):
                # the tests noticed that something changed.
                killed += 1
    return Outcome(target, killed, survived, skipped, seconds, equivalent)


def report(outcomes: list[Outcome]) -> float:
    """Print the table, the equivalent mutants and the survivors; return the lowest
    share killed of any target."""
    print(
        f"{'target':<22} {'mutants':>7} {'killed':>7} {'survived':>8} {'equiv':>6} "
        f"{'skipped':>7} {'killed%':>7} {'s':>6}"
    )
    for o in outcomes:
        print(
            f"{o.target.name:<22} {o.total:>7} {o.killed:>7} {len(o.survived):>8} "
            f"{len(o.equivalent):>6} {o.skipped:>7} {o.share:>7.1f} {o.seconds:>6.0f}"
        )
    total = sum(o.total for o in outcomes)
    killed = sum(o.killed for o in outcomes)
    share = 100.0 * killed / total if total else 100.0
    print(f"{'all':<22} {total:>7} {killed:>7} {total - killed:>8}   killed {share:.1f}%")
    for o in outcomes:
        for s, e in o.equivalent:
            print(f"  equivalent: {s.module}:{s.line} {s.operator} #{s.occurrence}: {e.why}")
        for s in o.survived:
            print(f"  survived: {s.module}:{s.line} {s.operator} #{s.occurrence}: {s.code}")
    return min((o.share for o in outcomes), default=100.0)


def main() -> None:
    """Run every target (or those named) and print killed / survived."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="target names (default: all)")
    parser.add_argument("--threshold", type=float, default=90.0)
    parser.add_argument(
        "--sessions",
        type=Path,
        help="keep cosmic-ray's session files (<target>.sqlite) in this directory",
    )
    parser.add_argument(
        "--report", action="store_true", help="only report the sessions kept in --sessions"
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="run only the survivors of the Lua targets' runs kept in --sessions again",
    )
    args = parser.parse_args()
    if (args.report or args.survivors) and args.sessions is None:
        parser.error("--report and --survivors read the sessions kept in --sessions DIR")
    targets = load_targets(ROOT / "mutation" / "targets.toml")
    unknown = set(args.targets) - {t.name for t in targets}
    if unknown:
        raise SystemExit(f"mutation: unknown target(s) {sorted(unknown)}")
    chosen = [t for t in targets if not args.targets or t.name in args.targets]
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    if args.report:
        kept = args.sessions.resolve()
        outcomes = [
            lua_outcome(t, current_results(t, lua.read_log(kept / f"{t.name}.jsonl")), 0.0)
            if t.kind == "lua"
            else read_session(t, kept / f"{t.name}.sqlite", 0.0)
            for t in chosen
        ]
    elif args.survivors:
        if any(t.kind != "lua" for t in chosen):
            parser.error("--survivors is for Lua targets only (name them)")
        outcomes = [rerun_survivors(t, args.sessions.resolve()) for t in chosen]
    elif args.sessions is not None:
        args.sessions.mkdir(parents=True, exist_ok=True)
        outcomes = [run_target(t, args.sessions.resolve()) for t in chosen]
    else:
        with tempfile.TemporaryDirectory(prefix="holdfast-mutation-") as tmp:
            outcomes = [run_target(t, Path(tmp)) for t in chosen]
    share = report(outcomes)
    sys.exit(0 if share >= args.threshold else 1)


if __name__ == "__main__":
    main()
