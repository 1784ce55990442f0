"""The standalone modules of tests/test_standalone.py, run where indexattn cannot be imported:
`python standalone_worker.py CASES OUT`. CASES (torch.save) holds, per spec, its standalone
source, function name, knobs and call; OUT gets each one's outputs and gradients (`run`), and,
under "imported", the error an imported form meets here."""

import sys

import torch


def run(function, args, kwargs):
    """The outputs of one call, and the gradients of a fixed weighting of the float outputs
    by each float argument: what the test compares, bit for bit."""
    leaves = [a.detach().requires_grad_() if a.is_floating_point() else a for a in args]
    outs = function(*leaves, **kwargs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    floats = [o for o in outs if o.requires_grad]
    grads = []
    if floats:
        loss = sum(
            (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum()
            for o in floats
        )
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        grads = torch.autograd.grad(loss, wanted, allow_unused=True)
    return [o.detach() for o in outs] + [g for g in grads if g is not None]


def load(source: str, name: str, knobs: dict) -> dict:
    """The module's namespace, the knobs it defines set."""
    namespace: dict = {}
    exec(compile(source, name, "exec"), namespace)  # the test's own generated code
    namespace.update({k: v for k, v in knobs.items() if k in namespace})
    return namespace


class NoIndexattn:
    """An import finder that refuses indexattn and everything in it."""

    def find_spec(self, name, path=None, target=None):
        if name == "indexattn" or name.startswith("indexattn."):
            raise ModuleNotFoundError(f"No module named {name!r} (standalone_worker.py)")
        return None


def main(cases: str, out: str) -> None:
    torch.set_num_threads(1)
    found = {}
    for name, (source, function, knobs, args, kwargs) in torch.load(cases).items():
        try:
            found[name] = run(load(source, name, knobs)[function], args, kwargs)
        except ImportError as error:  # the imported form's twin
            found[name] = type(error).__name__
    torch.save(found, out)


if __name__ == "__main__":
    sys.meta_path.insert(0, NoIndexattn())
    main(*sys.argv[1:])
