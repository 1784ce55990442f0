"""Stages as rooms: no import cycle in the package, counting imports inside functions and
those only for type checking (a cycle there is a cycle in the design)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "indexattn"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that the file imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            submodules = {f"{source}.{a.name}" for a in node.names} & modules
            found |= submodules or {source}  # `from . import ir`: the module ir alone
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports(path, set(files)) for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_a_cycle_is_seen():
    edges = graph()
    steps, plan = "indexattn.lower.program.steps", "indexattn.lower.planner.plan"
    edges[steps] = edges[steps] | {plan}
    assert any(plan in c and steps in c for c in cycles(edges))


def reaches(edges: dict[str, set[str]], source: str, target: str) -> bool:
    """Whether a module of package `source` imports one of `target`, directly or not."""
    inside = lambda name, package: name == package or name.startswith(package + ".")  # noqa: E731
    seen, todo = set(), [m for m in edges if inside(m, source)]
    while todo:
        module = todo.pop()
        if inside(module, target):
            return True
        if module not in seen:
            seen.add(module)
            todo += edges.get(module, ())
    return False


def test_running_a_spec_imports_no_view():
    """The runtime runs specs; what shows them (views/) is joined to it above both, in
    indexattn/spec.py. The twin: one view imported by the runtime is seen."""
    edges = graph()
    assert not reaches(edges, "indexattn.runtime", "indexattn.views")
    edges["indexattn.runtime.module"] |= {"indexattn.views.latex"}
    assert reaches(edges, "indexattn.runtime", "indexattn.views")


# The lowering stage's rooms, each above those before it: the program's values and facts,
# the planner that makes a program, the passes that take and return one, the printers that
# print it, and the pipeline that runs them all (lower/__init__.py). A module imports its own
# room and the rooms before it, never one after.
ROOMS = (
    "indexattn.lower.program",
    "indexattn.lower.planner",
    "indexattn.lower.program.passes",
    "indexattn.lower.printers",
    "indexattn.lower",
)
# The compiler's stages, which the parallel plans and strategies read and never the reverse.
STAGES = ("indexattn.notation", "indexattn.ir", "indexattn.lower", "indexattn.ops")


def room(module: str) -> int | None:
    inside = [k for k, r in enumerate(ROOMS) if module == r or module.startswith(r + ".")]
    return max(inside, key=lambda k: len(ROOMS[k])) if inside else None


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports from a room of the lowering stage into a room after it."""
    return sorted(
        (a, b)
        for a, bs in edges.items()
        for b in bs
        if room(a) is not None and room(b) is not None and room(b) > room(a)
    )


def test_no_import_back_up():
    assert upward(graph()) == []


def test_an_import_back_up_is_seen():
    edges = graph()
    steps, codegen = "indexattn.lower.program.steps", "indexattn.lower.printers.codegen"
    passes = "indexattn.lower.program.passes.hoist"
    edges[steps] = edges[steps] | {codegen}
    edges[passes] = edges[passes] | {"indexattn.lower.printers.naming"}
    assert upward(edges) == [(passes, "indexattn.lower.printers.naming"), (steps, codegen)]


def test_the_stages_import_no_parallel_plan():
    """The parallel plans read the IR; the stages never read them (the runtime and the
    command line, above both, offer them). The twin: one such import is seen."""
    edges = graph()
    assert not any(reaches(edges, stage, "indexattn.parallel") for stage in STAGES)
    edges["indexattn.ir.check"] |= {"indexattn.parallel.shard"}
    assert reaches(edges, "indexattn.ir", "indexattn.parallel")
