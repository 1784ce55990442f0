"""Indices a spec leaves undeclared because a tensor fixes their range: an index alone on an
axis of an input, param or buffer ranges over that axis, a size of its own named after it
(`n_τ` for τ, `n_τ'` for τ'). An `index` line, where written, wins."""

from __future__ import annotations

from ..notation import syntax as ast


def implied(doc: ast.Document) -> dict[str, ast.IndexName]:
    """Each undeclared index whose range a declaration fixes, with the place that fixes it:
    the first axis of an input, param or buffer that holds it, or an index of its family (the
    same letter, primes aside: τ, τ', τ''), alone. `input Q_<τa>` fixes τ, τ' and a;
    `param W_<(μa)i>` only i (a fused axis fixes only a product)."""
    declared = {n.glyph for s in doc.statements if isinstance(s, ast.IndexDecl) for n in s.names}
    fixed: dict[str, ast.IndexName] = {}
    for stmt in doc.statements:
        if isinstance(stmt, ast.TensorDecl):
            for axis in stmt.ref.axes:
                if isinstance(axis, ast.IndexName) and axis.glyph not in declared:
                    fixed.setdefault(family(axis.glyph), axis)
    glyphs = {n.glyph for s in doc.statements for n in nodes(s) if isinstance(n, ast.IndexName)}
    return {g: fixed[family(g)] for g in sorted(glyphs - declared) if family(g) in fixed}


def family(glyph: str) -> str:
    """τ for τ, τ' and τ'': indices one range serves unless an index line says otherwise."""
    return glyph.rstrip("'")


def size_name(glyph: str, taken: set[str]) -> str:
    """The size of an implied index and its family: `n_` and its letter (`n_τ` for τ and τ'),
    made distinct from every name the spec declares by further `n_`s."""
    name = "n_" + family(glyph)
    while name in taken:
        name = "n_" + name
    return name


def grouped_in(doc: ast.Document, glyph: str) -> ast.TensorDecl | None:
    """The first declaration that holds the index only inside a group: where a reader may
    think its range is fixed, though a fused axis fixes only the product."""
    for stmt in doc.statements:
        if isinstance(stmt, ast.TensorDecl):
            for axis in stmt.ref.axes:
                if isinstance(axis, ast.Group) and any(
                    isinstance(i, ast.IndexName) and i.glyph == glyph for i in axis.items
                ):
                    return stmt
    return None


def written(doc: ast.Document) -> set[str]:
    """Every name the spec declares or defines otherwise: tensors, scalars and the sizes its
    index lines name (a bare `n_a` in an equation is the implied size itself, not taken)."""
    names: set[str] = set()
    for stmt in doc.statements:
        if isinstance(stmt, (ast.TensorDecl, ast.Equation)):
            names.add((stmt.ref if isinstance(stmt, ast.TensorDecl) else stmt.lhs).name)
        elif isinstance(stmt, ast.ScalarDecl):
            names.add(stmt.name)
        elif isinstance(stmt, ast.IndexDecl):
            names |= {n.name for n in ast.walk(stmt.size) if isinstance(n, ast.Name)}
            names |= {n.glyph for n in stmt.names}
    return names


def items(ref: ast.Ref, plain: bool = True):
    """The items of a reference's axes, groups opened; `plain`: its index names only."""
    for axis in ref.axes:
        for item in axis.items if isinstance(axis, ast.Group) else (axis,):
            if not plain or isinstance(item, ast.IndexName):
                yield item


def nodes(stmt: ast.Statement):
    """Every expression node, reference and index name of a statement, positions included."""
    roots = {
        ast.Equation: lambda s: (s.lhs, s.rhs),
        ast.TensorDecl: lambda s: (s.ref,),
        ast.IndexDecl: lambda s: (*s.names, s.size),
        ast.ScalarDecl: lambda s: (s.value,),
    }.get(type(stmt), lambda s: ())(stmt)
    stack = list(roots)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.Ref):
            stack += [i for i in items(node, plain=False) if isinstance(i, ast.IndexName)]
            stack += [i.expr for i in items(node, plain=False) if isinstance(i, ast.Computed)]
        elif isinstance(node, ast.Call):
            stack += [*node.over, *node.args]
        elif not isinstance(node, ast.IndexName):
            stack += ast.children(node)
