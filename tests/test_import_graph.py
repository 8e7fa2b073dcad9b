"""The import graph of `src/swarmrl` points downwards (docs/architecture.md §5).

Every module is parsed with `ast` (nothing is imported) and each import becomes an arrow
from the module to the `swarmrl` module it names: `from swarmrl.a import b` points at
`swarmrl.a.b` when that is a module, else at `swarmrl.a`. What counts is what runs when
the module is imported: imports inside a function are lazy by design (`cli.py` imports
each command's code when it runs, the trainer its origin only with SHARDCAST on) and
are left out, and so are imports under `if TYPE_CHECKING:`, which never run. The graph
then has:
- no cycle;
- no arrow from one role's package to another's, except into the modules `ROLE_LIBRARIES`
  names, each with its reason;
- no arrow from the shared floor (every module that is neither a role's nor one of the
  `LAUNCHERS`, which start and watch the roles) into a role's package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROLES = ("inference", "validator", "trainer", "orchestrator", "shardcast")
ROLE_LIBRARIES = {
    "swarmrl.shardcast.client": (
        "the SHARDCAST download client: the worker and the validator fetch checkpoints "
        "with it (docs/shardcast.md); it imports nothing of the origin or the relays"
    ),
}
# The modules above the roles: they start the roles' processes and show what they report.
LAUNCHERS = (
    "swarmrl.__main__",
    "swarmrl.cli",
    "swarmrl.commands",
    "swarmrl.run",
    "swarmrl.display",
)


def module_files(src: Path, top: str) -> dict[str, Path]:
    """Every module of the package `top` under `src`, by dotted name."""
    modules = {}
    for path in sorted((src / top).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run on import: not function bodies nor `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from import_time_statements(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from import_time_statements(getattr(node, field, []))
        for handler in getattr(node, "handlers", []):
            yield from import_time_statements(handler.body)


def import_graph(src: Path, top: str = "swarmrl") -> dict[str, set[str]]:
    """Each module of `top` and the modules of `top` it imports when it is imported."""
    modules = module_files(src, top)

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in import_time_statements(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                targets.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    targets.add(owner(f"{base}.{alias.name}") or owner(base))
        graph[name] = {target for target in targets if target and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def role_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROLES else None


def is_launcher(module: str) -> bool:
    return any(module == top or module.startswith(top + ".") for top in LAUNCHERS)


def cross_role_arrows(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if role_of(source)
        and role_of(target) not in (None, role_of(source))
        and target not in ROLE_LIBRARIES
    )


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if not role_of(source) and not is_launcher(source) and role_of(target)
    )


def test_swarmrl_has_no_import_cycle():
    assert find_cycle(import_graph(SRC)) is None


def test_no_role_imports_another_role():
    assert cross_role_arrows(import_graph(SRC)) == []


def test_the_shared_floor_imports_no_role():
    assert upward_arrows(import_graph(SRC)) == []


def test_every_allowed_library_and_launcher_exists():
    modules = module_files(SRC, "swarmrl")
    assert set(ROLE_LIBRARIES) <= set(modules)
    assert set(LAUNCHERS) <= set(modules)


def test_the_checks_see_cycles_and_arrows_that_run_on_import(tmp_path):
    """A made-up package: each kind of arrow is found, and the lazy ones are not."""
    files = {
        "swarmrl/__init__.py": "",
        "swarmrl/rewards.py": "from swarmrl.inference import worker\n",
        "swarmrl/inference/__init__.py": "",
        "swarmrl/inference/worker.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from swarmrl.trainer import loss\n"
            "def later():\n    from swarmrl.validator import checks\n"
            "from ..validator.checks import CheckResult\n"
        ),
        "swarmrl/validator/__init__.py": "",
        "swarmrl/validator/checks.py": "try:\n    import swarmrl.rewards\nexcept ImportError:\n    pass\n",
        "swarmrl/trainer/__init__.py": "",
        "swarmrl/trainer/loss.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["swarmrl.inference.worker"] == {"swarmrl.validator.checks"}
    assert find_cycle(graph) == [
        "swarmrl.inference.worker",
        "swarmrl.validator.checks",
        "swarmrl.rewards",
        "swarmrl.inference.worker",
    ]
    assert cross_role_arrows(graph) == ["swarmrl.inference.worker -> swarmrl.validator.checks"]
    assert upward_arrows(graph) == ["swarmrl.rewards -> swarmrl.inference.worker"]
