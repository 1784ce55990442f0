"""A generated module with the runtime it imports inlined, so that it imports nothing of
indexattn: `indexattn compile SPEC --standalone`, `spec.standalone_source`. The definitions the
module calls, and those they call, are read from runtime/lib.py as they stand (never a copy)
and bound to the module's name for the runtime, `rt`: the module's own lines are the imported
form's, byte for byte. Reads the file: no torch is imported here."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LIB = Path(__file__).with_name("lib.py")
NAMESPACE = "from types import SimpleNamespace"


@dataclass(frozen=True)
class Definition:
    """One top-level statement of runtime/lib.py: a function, a class or a knob."""

    name: str
    text: str  # its lines in the file, with the comment lines right above it
    reads: frozenset[str]  # every name it reads


@cache
def definitions() -> tuple[dict[str, Definition], dict[str, str]]:
    """runtime/lib.py's definitions by name, in the file's order, and its imports: the name
    each import binds, and its line."""
    source = LIB.read_text(encoding="utf-8")
    lines = source.splitlines()
    found: dict[str, Definition] = {}
    imports: dict[str, str] = {}
    for node in ast.parse(source).body:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        while first > 1 and lines[first - 2].startswith("#"):
            first -= 1
        text = "\n".join(lines[first - 1 : node.end_lineno])
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports |= {(a.asname or a.name).split(".")[0]: text for a in node.names}
            continue
        name = _defined(node)
        if name is not None:
            reads = frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
            found[name] = Definition(name, text, reads)
    return found, imports


def _defined(node: ast.stmt) -> str | None:
    """The name a top-level statement defines; None for the module's docstring."""
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    return None


def standalone(source: str) -> str:
    """`source` with its import of the runtime replaced by the definitions it uses; a module
    that imports no runtime, as it is. A ValueError where a module-level name of `source` is
    one of those definitions' (a spec named `by_blocks`): rename the spec."""
    tree = ast.parse(source)
    found = [
        (node, alias.asname or alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == __package__
        for alias in node.names
        if alias.name == LIB.stem
    ]
    if not found:
        return source
    ((node, alias),) = found
    defined, imports = definitions()
    called = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == alias
    }
    unknown = sorted(called - defined.keys())
    if unknown:
        raise ValueError(f"the runtime defines no {', '.join(unknown)}")
    used = _closure(called, defined)
    clash = sorted(_module_names(tree) & (used | {"SimpleNamespace"}))
    if clash:
        raise ValueError(
            f"the standalone module would define {', '.join(clash)} twice: the module's and "
            "the runtime's; give the spec another name"
        )
    present = set(source.splitlines())
    needed = {imports[name] for d in used for name in defined[d].reads if name in imports}
    lines = [NAMESPACE, *(line for line in dict.fromkeys(imports.values()) if line in needed)]
    lines = [line for line in lines if line not in present]
    inlined = [d.text for d in defined.values() if d.name in used]
    bound = ", ".join(f"{name}={name}" for name in sorted(called))
    namespace = f"{alias} = SimpleNamespace({bound})  # the runtime's, as the module calls it"
    text = "\n".join(lines) + "\n\n\n" + "\n\n\n".join([*inlined, namespace])
    rows = source.splitlines(keepends=True)
    head, tail = "".join(rows[: node.lineno - 1]), "".join(rows[node.end_lineno :])
    return head + text + "\n" + tail


def _closure(names: set[str], defined: dict[str, Definition]) -> set[str]:
    """The definitions `names` are, and every definition they read, directly or not."""
    out, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo += [n for n in defined[name].reads if n in defined]
    return out


def _module_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out
