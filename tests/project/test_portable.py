"""The repository's Python runs where fcntl does not (issue 51: benchmarks/scaling.py and
tests/models/test_models_families.py locked their output files with `fcntl.flock`, POSIX's;
filelock, which ships with torch, locks on every platform)."""

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POSIX_LOCKS = {"fcntl"}


def imports(source: str) -> set[str]:
    """The top-level modules a file's source imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def tracked() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True)
    return [ROOT / line for line in listed.stdout.splitlines()]


def test_no_file_imports_fcntl():
    files = tracked()
    assert len(files) > 100  # the listing saw the repository
    found = [str(p.relative_to(ROOT)) for p in files if imports(p.read_text("utf-8")) & POSIX_LOCKS]
    assert found == [], "lock with filelock.FileLock, which runs everywhere"


def test_twin_an_import_of_fcntl_inside_a_function_is_found():
    planted = "def write(path):\n    import fcntl\n    from filelock import FileLock\n"
    assert imports(planted) & POSIX_LOCKS == {"fcntl"}
    assert not imports("from filelock import FileLock\n") & POSIX_LOCKS
