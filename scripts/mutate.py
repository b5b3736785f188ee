#!/usr/bin/env python3
"""Mutation testing of gputuned's core modules: does a test fail when the code is wrong?

For each module, every mutant is one small change to its code (a flipped comparison, ``and`` for
``or``, a dropped ``not``, a constant off by one, ``True`` for ``False``, a statement removed);
each runs against the unit tests that execute the line it changed, in a copy of the checkout,
until one fails (killed) or all pass (survived). Prints the kill rate per module and every
survivor; docs/dev/reliability.md ("Mutation testing") has the figures and how long it takes.

    .venv/bin/python scripts/mutate.py                       # the core modules, every mutant
    .venv/bin/python scripts/mutate.py gputuned/engine/revert.py --also tests/unit/test_revert.py
    .venv/bin/python scripts/mutate.py --list gputuned/cpulist.py   # the mutants, not run

Which tests execute a line comes from one coverage run of tests/unit with each test's node ID as
its context (cached in .mutation/, keyed by the contents of gputuned/ and tests/). ``--also``
adds tests to every mutant's run (new tests that the cache does not know yet). A mutant on a line
no unit test executes is a survivor ("not covered"). Mutants named in
scripts/mutate-equivalent/*.toml (each with why no test can tell it apart) are counted apart.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
CACHE = TOP / ".mutation"
EQUIVALENT = TOP / "scripts" / "mutate-equivalent"
#: A line run while pytest collected the tests (no test's context): a cached function first
#: called by a test module's import, for instance.
AT_COLLECTION = "<collection>"
LINES_FORMAT = 2  # .mutation/lines.json written by an older script is run again

#: The modules the promise rests on: revert, the journal, the planners' guards (with their
#: tables' models: the size and mode checks moved there from the tuners), CPU lists, the
#: setting classes and the daemon's placement.
CORE = (
    "gputuned/cpulist.py",
    "gputuned/tuners/pcie_payload.py",
    "gputuned/profile/tables/pcie_payload.py",
    "gputuned/engine/journal.py",
    "gputuned/profile/cpuresolve.py",
    "gputuned/tuners/irq.py",
    "gputuned/profile/tables/irq.py",
    "gputuned/engine/revert.py",
    "gputuned/settings/base.py",
    "gputuned/settings/cgroups.py",
    "gputuned/settings/files.py",
    "gputuned/settings/pcie.py",
    "gputuned/settings/processes.py",
    "gputuned/settings/sysfs.py",
    "gputuned/settings/threads.py",
    "gputuned/settings/irqbalance.py",
    "gputuned/settings/mounts.py",
    "gputuned/settings/registry.py",
    "gputuned/settings/unitcpu.py",
    "gputuned/settings/units.py",
    "gputuned/daemon/placing.py",
)

_FLIP_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_FLIP_BIN: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
}
#: Calls whose removal changes only what is logged: not mutated (the log is checked elsewhere).
_LOG_NAMES = ("log", "logger", "LOG")


@dataclass(frozen=True)
class Mutant:
    module: str  # path from the top, e.g. gputuned/engine/revert.py
    line: int
    where: str  # the enclosing function or class, dotted
    kind: str  # cmp, bool, not, const, bin, drop
    before: str
    after: str
    start: int  # offsets into the module's UTF-8 text
    end: int
    in_function: bool  # False: run once, when the module (or a class body) is imported
    after_note: str = ""  # " #2" for the second mutant of the same key

    @property
    def key(self) -> str:
        """Stable across unrelated edits (no line number): module, place and the change."""
        return f"{self.module}::{self.where}::{self.kind}::{self.before} -> {self.after}{self.after_note}"

    def apply(self, text: str) -> str:
        """``text`` with this change (offsets count UTF-8 bytes, as the parser's columns do)."""
        raw = text.encode()
        new = self.after if self.kind == "drop" else f"({self.after})"
        return (raw[: self.start] + new.encode() + raw[self.end :]).decode()


@dataclass
class Result:
    mutant: Mutant
    outcome: str  # killed, timeout, survived, not covered, error
    seconds: float
    tests: int
    detail: str = ""


@dataclass
class _Ctx:
    stack: list[str] = field(default_factory=list)


def _offsets(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line.encode()))
    return starts


def _is_log_call(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and _is_log_target(node.value)
    )


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _changes(node: ast.AST) -> list[tuple[str, ast.AST | str]]:
    """The mutants of one node: (kind, the node's replacement)."""
    out: list[tuple[str, ast.AST | str]] = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            flip = _FLIP_CMP.get(type(op))
            if flip is not None:
                new = ast.Compare(node.left, list(node.ops), list(node.comparators))
                new.ops[i] = flip()
                out.append(("cmp", new))
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(("bool", ast.BoolOp(other, list(node.values))))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not", node.operand))
    elif isinstance(node, ast.BinOp) and type(node.op) in _FLIP_BIN and not _is_str_format(node):
        out.append(("bin", ast.BinOp(node.left, _FLIP_BIN[type(node.op)](), node.right)))
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        out.append(("const", ast.Constant(not node.value)))
    elif isinstance(node, ast.Constant) and isinstance(node.value, int):
        out.append(("const", ast.Constant(node.value + 1)))
    if isinstance(node, ast.stmt) and _droppable(node):
        out.append(("drop", "pass"))
    return out


#: Fields never mutated: annotations and decorators (types and registration, not behaviour).
_SKIP_FIELDS = ("returns", "annotation", "decorator_list", "type_params", "type_comment")


def mutants_of(module: str) -> list[Mutant]:
    """Every mutant of ``module`` (a path from the top), in source order."""
    text = (TOP / module).read_text()
    raw = text.encode()
    starts = _offsets(text)
    out: list[Mutant] = []

    def visit(node: ast.AST, where: str, in_function: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            where = f"{where}.{node.name}" if where else node.name
        is_def = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        inner = in_function or is_def
        if isinstance(node, ast.If) and _type_checking(node.test):
            return
        for kind, new in _changes(node):
            a = starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
            b = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
            after = new if isinstance(new, str) else ast.unparse(new)
            before = " ".join(raw[a:b].decode().split())
            if " ".join(after.split()) != before:
                line = node.lineno  # type: ignore[attr-defined]
                out.append(Mutant(module, line, where, kind, before, after, a, b, in_function))
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Call) and _is_log_target(node)):
            return  # message text, and what is logged
        for name, value in ast.iter_fields(node):
            if name not in _SKIP_FIELDS:
                # A def's defaults, decorators and annotations run when the def does (at
                # import, for a module's functions), its body when it is called.
                runs_inside = inner if name == "body" or not is_def else in_function
                for child in value if isinstance(value, list) else [value]:
                    if isinstance(child, ast.AST):
                        visit(child, where, runs_inside)

    for node in ast.parse(text).body:
        if isinstance(node, ast.Import | ast.ImportFrom) or _is_docstring(node):
            continue
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            continue
        visit(node, "", False)
    # The same change in the same place twice (``compare=False, hash=False``): number the later
    # ones, so that each key names one mutant.
    seen: dict[str, int] = {}
    for i, mu in enumerate(out):
        n = seen[mu.key] = seen.get(mu.key, 0) + 1
        if n > 1:
            out[i] = dataclasses.replace(mu, after_note=f" #{n}")
    return out


def _type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _is_str_format(node: ast.BinOp) -> bool:
    return any(
        isinstance(side, ast.Constant) and isinstance(side.value, str)
        for side in (node.left, node.right)
    )


def _is_log_target(node: ast.Call) -> bool:
    fn = node.func
    return (
        isinstance(fn, ast.Attribute)
        and isinstance(fn.value, ast.Name)
        and fn.value.id in _LOG_NAMES
    )


def _is_prose(node: ast.stmt) -> bool:
    """``what = "a sentence for the docs"``: text for people, checked by the docs' tests."""
    return (
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and " " in node.value.value
    )


def _droppable(node: ast.stmt) -> bool:
    """Statements whose removal leaves valid code and changes what it does."""
    if _is_docstring(node) or _is_log_call(node) or _is_prose(node):
        return False
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Call | ast.Await)
    return isinstance(
        node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Raise | ast.Continue | ast.Break
    ) and not (isinstance(node, ast.AnnAssign) and node.value is None)


# ---- which tests execute which line ---------------------------------------------------------

_PLUGIN = """
import coverage, pytest

@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    try:
        return (yield)
    finally:
        if cov is not None:
            cov.switch_context("")
"""


def _sha(module: str) -> str:
    return hashlib.sha256((TOP / module).read_bytes()).hexdigest()[:16]


def line_tests(modules: list[str], refresh: bool) -> dict[str, dict[int, set[str]]]:
    """{module: {line: test node IDs}} from one coverage run of tests/unit.

    Cached in .mutation/lines.json with each module's hash: still good while the modules asked
    for are unchanged (tests added since are not in it: name them with ``--also``)."""
    cached = CACHE / "lines.json"
    if cached.exists() and not refresh:
        data = json.loads(cached.read_text())
        if all(
            m in data and data[m]["sha"] == _sha(m) and data[m].get("format") == LINES_FORMAT
            for m in modules
        ):
            return {m: {int(k): set(v) for k, v in data[m]["lines"].items()} for m in modules}
    CACHE.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cov-", dir=CACHE))
    try:
        (work / "covctx.py").write_text(_PLUGIN)
        rc = work / ".coveragerc"
        rc.write_text(f"[run]\nsource = {TOP / 'gputuned'}\ndata_file = {work / 'cov.db'}\n")
        t0 = time.monotonic()
        print("coverage: running tests/unit once, with each test's node ID as its context ...")
        env = dict(os.environ, PYTHONPATH=f"{work}{os.pathsep}{TOP}")
        proc = subprocess.run(
            [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", "-q",
             "-p", "no:cacheprovider", "-p", "covctx", "tests/unit"],
            cwd=TOP, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            sys.exit(
                f"the unit tests fail before any mutation:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
            )
        print(f"coverage: {time.monotonic() - t0:.0f} s")
        import coverage

        cov = coverage.Coverage(data_file=str(work / "cov.db"))
        cov.load()
        data = cov.get_data()
        out: dict[str, dict[str, object]] = {}
        for m in sorted(set(modules) | set(CORE)):
            lines: dict[str, list[str]] = {}
            for line, ctxs in (data.contexts_by_lineno(str(TOP / m)) or {}).items():
                # "" is no test: collection, when test modules are imported (a cached
                # function first called there); kept as AT_COLLECTION.
                tests = sorted(c or AT_COLLECTION for c in set(ctxs))
                if tests:
                    lines[str(line)] = tests
            out[m] = {"sha": _sha(m), "lines": lines, "format": LINES_FORMAT}
        cached.write_text(json.dumps(out))
    finally:  # an interrupted pass leaves no folder behind
        shutil.rmtree(work, ignore_errors=True)
    return {
        m: {int(k): set(v) for k, v in out[m]["lines"].items()}  # type: ignore[attr-defined]
        for m in modules
    }


# ---- running a mutant -----------------------------------------------------------------------


def _copy_checkout(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=TOP, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in files:
        if not rel:
            continue
        src = TOP / rel
        dst = dest / rel
        if src.is_symlink():  # the trees' sysfs links (to folders, too) stay links
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(os.readlink(src))
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def _run_one(work: Path, m: Mutant, tests: list[str], timeout: float) -> tuple[str, float, str]:
    path = work / m.module
    original = path.read_text()
    # Byte code is cached per worker (imports are most of a short run), but never the mutated
    # module's: a same-size mutant written within the second would pass the cache's check.
    prefix = work / ".pycache"
    pyc = prefix / path.parent.relative_to("/")
    try:
        path.write_text(m.apply(original))
        for stale in pyc.glob(f"{path.stem}.*.pyc"):
            stale.unlink()
        t0 = time.monotonic()
        argfile = work / ".mutant-tests"
        argfile.write_text("\n".join(tests) + "\n")
        env = dict(os.environ, PYTHONPATH=str(work), PYTHONHASHSEED="0")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(prefix)
        # A killed mutant is a failed test, whose tmp_path the unit suite keeps (in /dev/shm,
        # tests/unit/conftest.py): a thousand of them would fill memory. pytest's own
        # folders on disk keep the last three runs only.
        env["GPUTUNED_TEST_SCRATCH"] = "disk"
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             "--no-header", "-o", "addopts=", f"@{argfile}"],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return "timeout", time.monotonic() - t0, ""
        secs = time.monotonic() - t0
        if proc.returncode == 0:
            return "survived", secs, ""
        failed = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        # 1: a test failed; 2 or 4 with ERROR lines: a test module no longer imports (the
        # same tests passed unmutated, so the mutant broke them).
        if proc.returncode == 1 or (proc.returncode in (2, 4) and failed):
            return "killed", secs, failed[0] if failed else ""
        return "error", secs, out[-400:]
    finally:
        path.write_text(original)
        for stale in pyc.glob(f"{path.stem}.*.pyc"):
            stale.unlink()


def _toml_of(module: str) -> Path:
    """scripts/mutate-equivalent/<module>.toml: gputuned/tuners/irq.py -> tuners.irq.toml."""
    return EQUIVALENT / (".".join(Path(module).with_suffix("").parts[1:]) + ".toml")


def _declared_tests(module: str) -> list[str]:
    """The module file's ``also``: tests of what runs at import where coverage does not see it
    (a pydantic model's field declarations are run inside pydantic, when a profile is loaded,
    not at a line of the module): run first for every mutant outside a function."""
    f = _toml_of(module)
    return list(tomllib.loads(f.read_text()).get("also", [])) if f.is_file() else []


def _equivalents() -> dict[str, str]:
    """{mutant key: why no test can tell it from the original}, one file per module."""
    out: dict[str, str] = {}
    for f in sorted(EQUIVALENT.glob("*.toml")):
        for e in tomllib.loads(f.read_text()).get("equivalent", []):
            out[e["mutant"]] = e["why"]
    return out


def _select(
    all_mutants: dict[str, list[Mutant]],
    equivalent: dict[str, str],
    covered: dict[str, dict[int, set[str]]],
    also: list[str],
) -> tuple[list[tuple[Mutant, list[str]]], list[Result]]:
    """Each mutant's tests (the named ones first), or its result when none run."""
    jobs: list[tuple[Mutant, list[str]]] = []
    results: list[Result] = []
    for m, ms in all_mutants.items():
        # A line run at import (a module's or class's constant) is credited to whichever test
        # imported the module first: every test that runs any line of it may depend on that
        # line, and the module's declared tests first.
        every = set().union(*covered[m].values()) - {AT_COLLECTION}
        declared = [t for t in _declared_tests(m) if t not in also]
        for mu in ms:
            if mu.key in equivalent:
                results.append(Result(mu, "equivalent", 0.0, 0, equivalent[mu.key]))
                continue
            own = covered[m].get(mu.line, set()) if mu.in_function else every
            if AT_COLLECTION in own:  # first run while tests were collected: any may rely on it
                own = every
            first = also + ([] if mu.in_function else declared)
            tests = first + sorted(own - set(first))  # the named tests first: -x stops at one
            if not tests:
                results.append(Result(mu, "not covered", 0.0, 0))
                continue
            jobs.append((mu, tests))
    return jobs, results


def run(args: argparse.Namespace) -> int:
    modules = args.modules or list(CORE)
    for m in modules:
        if not (TOP / m).is_file():
            sys.exit(f"{m}: no such module (give paths from the top of the checkout)")
    all_mutants = {m: mutants_of(m) for m in modules}
    if args.list:
        for m, ms in all_mutants.items():
            for mu in ms:
                print(f"{m}:{mu.line}: {json.dumps(mu.key)}")
            print(f"{m}: {len(ms)} mutant(s)")
        return 0
    equivalent = _equivalents()
    t_start = time.monotonic()
    covered = line_tests(modules, args.refresh)
    also = list(args.also or [])
    jobs, results = _select(all_mutants, equivalent, covered, also)
    print(f"{sum(len(v) for v in all_mutants.values())} mutant(s) in {len(modules)} module(s); "
          f"{len(jobs)} to run on {args.jobs} worker(s)", flush=True)  # fmt: skip
    workers = [Path(tempfile.mkdtemp(prefix="mutant-")) for _ in range(args.jobs)]
    try:
        for w in workers:
            _copy_checkout(w)
        free = list(workers)
        done = 0

        def one(mu: Mutant, tests: list[str]) -> Result:
            w = free.pop()
            try:
                outcome, secs, detail = _run_one(w, mu, tests, args.timeout)
            finally:
                free.append(w)
            return Result(mu, outcome, secs, len(tests), detail)

        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for res in pool.map(lambda j: one(*j), jobs):
                results.append(res)
                done += 1
                if res.outcome in ("survived", "error") or args.verbose:
                    mu = res.mutant
                    print(f"  {res.outcome}: {mu.module}:{mu.line} [{mu.kind}] {mu.before} -> "
                          f"{mu.after} ({res.tests} test(s), {res.seconds:.1f} s)", flush=True)  # fmt: skip
                if done % 25 == 0:
                    print(f"  ... {done}/{len(jobs)} run, {time.monotonic() - t_start:.0f} s",
                          flush=True)  # fmt: skip
    finally:
        for w in workers:
            shutil.rmtree(w, ignore_errors=True)
    return report(results, modules, time.monotonic() - t_start, args)


def report(results: list[Result], modules: list[str], secs: float, args: argparse.Namespace) -> int:
    rows = []
    worst = 100.0
    for m in modules:
        mine = [r for r in results if r.mutant.module == m]
        killed = sum(r.outcome in ("killed", "timeout") for r in mine)
        equiv = sum(r.outcome == "equivalent" for r in mine)
        counted = len(mine) - equiv
        rate = 100.0 * killed / counted if counted else 100.0
        worst = min(worst, rate)
        rows.append((m, killed, counted, equiv, rate))
    survivors = [r for r in results if r.outcome in ("survived", "not covered", "error")]
    if args.json:
        print(json.dumps({
            "seconds": round(secs, 1),
            "modules": [{"module": m, "killed": k, "counted": c, "equivalent": e,
                         "rate": round(r, 1)} for m, k, c, e, r in rows],
            "survivors": [{"mutant": r.mutant.key, "line": r.mutant.line,
                           "outcome": r.outcome} for r in survivors],
        }, indent=2))  # fmt: skip
    else:
        print("\nSurvivors:" if survivors else "\nNo survivors.")
        for r in sorted(survivors, key=lambda r: (r.mutant.module, r.mutant.line)):
            mu = r.mutant
            print(f"  {mu.module}:{mu.line} {r.outcome}\n    mutant = {json.dumps(mu.key)}")
        print(f"\n{'module':<36} {'killed':>7} {'of':>5} {'equiv':>6} {'rate':>7}")
        for m, k, c, e, r in rows:
            print(f"{m:<36} {k:>7} {c:>5} {e:>6} {r:>6.1f}%")
        total_k = sum(r[1] for r in rows)
        total_c = sum(r[2] for r in rows)
        print(f"{'all':<36} {total_k:>7} {total_c:>5} {sum(r[3] for r in rows):>6} "
              f"{100.0 * total_k / max(total_c, 1):>6.1f}%")  # fmt: skip
        print(f"mutate: {secs:.0f} s on {args.jobs} worker(s)")
    return 0 if worst >= args.goal else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="module paths (default: the core modules)")
    ap.add_argument("--also", action="append", help="tests to run for every mutant too")
    ap.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    ap.add_argument("--refresh", action="store_true", help="run the coverage pass again")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    # A timeout counts as a kill (a mutant that loops for ever): generous, so that a slow run on a
    # busy machine is not one.
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    ap.add_argument("--goal", type=float, default=90.0, help="exit 1 below this kill rate")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every mutant's outcome")
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
