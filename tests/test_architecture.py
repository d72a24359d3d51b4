"""The layout of docs/architecture.md holds: imports go only downward (no cycle between modules
or packages, counting imports inside functions and under TYPE_CHECKING), other packages and
scripts import a package's public names only, modules and functions stay short, and backend files
are named as they register. Every import is read from the source with `ast`, not from what is
imported."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "tuner"
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_TOP_LEVEL = 15


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(path: Path, name: str) -> list[tuple[str, str | None, int]]:
    """(module, imported name or None, line) for every import of tuner in the file, wherever it
    stands; a relative import is resolved against `name`."""
    found = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            if module == "tuner" or module.startswith("tuner."):
                found += [(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.startswith("tuner")]
    return found


def _target(module: str, imported: str | None) -> str:
    """The module an import reaches: the imported submodule, or the module it names."""
    if imported is not None and f"{module}.{imported}" in MODULES:
        return f"{module}.{imported}"
    while module not in MODULES:
        module = module.rpartition(".")[0]
    return module


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        for module, imported, _ in _imports(path, name):
            target = _target(module, imported)
            if target != name:
                edges[name].add(target)
    return edges


def _unit(module: str) -> str:
    """A module's package under tuner (`tuner.front`), or the module itself at the top."""
    return ".".join(module.split(".")[:2])


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    assert _cycles(_graph()) == []


def test_packages_import_only_downward():
    packages: dict[str, set[str]] = defaultdict(set)
    for name, targets in _graph().items():
        for target in targets:
            if _unit(name) != _unit(target) and target != "tuner":
                packages[_unit(name)].add(_unit(target))
    assert _cycles(packages) == []


def _listed(package: str) -> list[str] | None:
    """The names in a package's `__all__`, or None without one."""
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [element.value for element in node.value.elts]  # type: ignore[attr-defined]
    return None


def _public(package: str) -> set[str]:
    """What a package offers: the names in its `__all__`, and its modules."""
    modules = {m.rpartition(".")[2] for m in MODULES if m.rpartition(".")[0] == package}
    return set(_listed(package) or ()) | modules


def test_other_packages_and_scripts_use_only_public_names():
    sources = {**MODULES, **{f"scripts.{p.stem}": p for p in (REPO / "scripts").glob("*.py")}}
    reaching_in = []
    for name, path in sources.items():
        for module, imported, line in _imports(path, name):
            package = _unit(module)
            whole = package == "tuner"  # `import tuner`, for its location or version
            if whole or package == _unit(name) or MODULES[package].name != "__init__.py":
                continue
            if module != package or imported not in _public(package):
                where = f"{path.relative_to(REPO)}:{line}"
                reaching_in.append(f"{where} imports {imported} from {module}")
    assert reaching_in == []


def test_no_module_is_longer_than_the_limit():
    long = {
        str(p.relative_to(REPO)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_function_is_longer_than_the_limit():
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert long == []


def test_the_top_of_the_package_stays_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_serving_imports_nothing_of_tuner_above_the_registry_nor_pytorch():
    """A runtime's logged model is served where only its runtime is installed: importing
    `tuner.serving` (what its loader file imports) loads no other package of tuner, no PyTorch
    and no other heavy library."""
    import subprocess
    import sys

    code = "import sys, tuner.serving; print(sorted(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    modules = set(ast.literal_eval(loaded.stdout))
    # The package's exit handler (tuner.quick_exit, the standard library only) comes with it.
    assert {_unit(m) for m in modules if m.startswith("tuner.")} == {
        "tuner.errors",
        "tuner.quick_exit",
        "tuner.registry",
        "tuner.serving",
    }
    heavy = {"torch", "transformers", "omegaconf", "hydra", "optuna", "onnxruntime", "openvino"}
    assert {m.split(".")[0] for m in modules} & heavy == set()


def test_the_console_imports_nothing_of_tuner():
    assert _imports(MODULES["tuner.console"], "tuner.console") == []


def test_backend_files_are_named_as_they_register():
    from tuner.deploy import BACKENDS

    folder = PACKAGE / "deploy" / "backends"
    stems = {p.stem for p in folder.glob("*.py")} - {"__init__", "base"}
    names = set(BACKENDS.names())

    def names_of(stem: str) -> set[str]:
        return {n for n in names if n == stem or n.startswith(f"{stem}_")}

    assert {stem for stem in stems if not names_of(stem)} == set()
    # Every name is registered by the file that bears it, or by one whose name it extends.
    assert {n for n in names if not any(n in names_of(stem) for stem in stems)} == set()


PACKAGES = sorted(m for m in MODULES if m.count(".") == 1 and MODULES[m].name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_lists_its_public_names(package):
    import importlib

    listed = _listed(package)
    assert listed, f"{package} has no __all__"
    module = importlib.import_module(package)
    assert [name for name in listed if not hasattr(module, name)] == []
