"""No import runs back up: each module of loaderdoctor imports only from its own layer and the layers below it
(docs/ARCHITECTURE.md draws them). A module of a layer not listed here fails too: a new folder takes a place.
Nor does a module import what another folder keeps private (a name or module beginning with '_')."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import loaderdoctor

PACKAGE = Path(loaderdoctor.__file__).parent
# Bottom to top: a folder (or a module beside the folders) is read by the layers above it, never by those below.
LAYERS: list[set[str]] = [
    {"_version", "errors", "plain"},
    {"host"},
    {"loader", "scenarios"},
    {"workers"},
    {"tap"},
    {"targets"},
    {"recording"},
    {"rules"},
    {"probe", "guard"},
    {"report"},
    {"tune", "scale"},
    {"kinds"},
    {"history"},
    {"render"},
    {"watch", "saved"},
    {"integrations", "job"},
    {"check", "commands", "lightning", "huggingface"},
    {"cli", "startup", "__init__", "__main__"},
]
LAYER_OF = {part: number for number, parts in enumerate(LAYERS) for part in parts}


def _part(module: str) -> str:
    """The folder or top module of a module's dotted name: 'loaderdoctor.tap.iterator' -> 'tap'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path, package: Path) -> str:
    relative = path.relative_to(package.parent).with_suffix("")
    return ".".join(relative.parts)


Import = ast.Import | ast.ImportFrom


def _modules(package: Path) -> Iterator[tuple[str, list[Import]]]:
    """Each module of `package` by its dotted name, with every import it holds (in functions too)."""
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        yield _module_name(path, package), [node for node in ast.walk(tree) if isinstance(node, Import)]


def _imported(node: Import) -> list[str]:
    """The modules of loaderdoctor an import names ('from loaderdoctor import x' names loaderdoctor.x)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "loaderdoctor"]
    if node.level or not node.module or node.module.split(".")[0] != "loaderdoctor":
        return []
    if node.module == "loaderdoctor":
        return [f"{node.module}.{alias.name}" for alias in node.names]
    return [node.module]


def imports_running_back_up(package: Path = PACKAGE) -> list[str]:
    """Each import of a module of `package` from a layer above its own, as 'importer -> imported'."""
    found = []
    for importer, imports in _modules(package):
        own = LAYER_OF.get(_part(importer))
        if own is None:
            found.append(f"{importer}: its folder or module is in no layer")
            continue
        for name in (name for node in imports for name in _imported(node)):
            layer = LAYER_OF.get(_part(name))
            if layer is None or layer > own:
                found.append(f"{importer} -> {name}")
    return found


# The one private module every folder may import: the version the build writes.
PRIVATE_FOR_ALL = {"loaderdoctor._version"}


def _private(name: str) -> bool:
    """Whether a dotted name has a private part: '_common' has, '__version__' and '__init__' have not."""
    return any(part.startswith("_") and not part.endswith("__") for part in name.split("."))


def private_imports(package: Path = PACKAGE) -> list[str]:
    """Each import of a private module or name (one beginning with '_') from another folder or top module than
    the importer's own, as 'importer -> imported': what is private is for its own folder only."""
    found = []
    for importer, imports in _modules(package):
        for node in imports:
            names = _imported(node)
            if isinstance(node, ast.ImportFrom) and names == [node.module]:
                names += [f"{node.module}.{alias.name}" for alias in node.names if _private(alias.name)]
            for name in names:
                if _private(name) and _part(name) != _part(importer) and name not in PRIVATE_FOR_ALL:
                    found.append(f"{importer} -> {name}")
    return found


def test_no_import_runs_back_up():
    assert imports_running_back_up() == []


def test_an_import_from_a_layer_above_is_caught(tmp_path):
    fake = tmp_path / "loaderdoctor"
    (fake / "plain").mkdir(parents=True)
    (fake / "plain" / "words.py").write_text("from loaderdoctor.report import Finding\nimport loaderdoctor.plain\n")
    (fake / "report.py").write_text("from loaderdoctor.plain.words import plural\n")
    (fake / "newfolder").mkdir()
    (fake / "newfolder" / "thing.py").write_text("")
    assert imports_running_back_up(fake) == [
        "loaderdoctor.newfolder.thing: its folder or module is in no layer",
        "loaderdoctor.plain.words -> loaderdoctor.report",
    ]


def test_no_module_imports_what_another_folder_keeps_private():
    assert private_imports() == []


def test_an_import_of_another_folders_private_module_or_name_is_caught(tmp_path):
    fake = tmp_path / "loaderdoctor"
    for folder in ("rules", "history"):
        (fake / folder).mkdir(parents=True)
    (fake / "_version.py").write_text("__version__ = '1'\n")
    (fake / "rules" / "_common.py").write_text("MIB = 2**20\n")
    (fake / "rules" / "memory.py").write_text("from loaderdoctor.rules._common import MIB\n")  # its own folder's
    (fake / "rules" / "finding.py").write_text("def _severity(): ...\n")
    (fake / "history" / "changes.py").write_text(  # the import lines history held before the pieces moved
        "from loaderdoctor.rules._common import MIB, WARNING_TIME_SHARE, percent\n"
        "from loaderdoctor.rules import _common\n"
        "import loaderdoctor.rules._common\n"
        "from loaderdoctor.rules.finding import Finding, _severity\n"
        "from loaderdoctor._version import __version__\n"
        "from loaderdoctor import startup as _startup\n"
    )
    assert private_imports(fake) == [
        "loaderdoctor.history.changes -> loaderdoctor.rules._common",
        "loaderdoctor.history.changes -> loaderdoctor.rules._common",
        "loaderdoctor.history.changes -> loaderdoctor.rules._common",
        "loaderdoctor.history.changes -> loaderdoctor.rules.finding._severity",
    ]


def _import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of `package` to the modules of it that it imports (in functions too; a folder's name stands
    for its __init__)."""
    modules = {name for name, _ in _modules(package)}
    graph: dict[str, set[str]] = {}
    for importer, imports in _modules(package):
        importer = importer.removesuffix(".__init__")
        names = set()
        for node in imports:
            for name in _imported(node):
                # 'from loaderdoctor.tap import a' imports the module loaderdoctor.tap.a, not the folder's __init__
                submodules = [f"{name}.{alias.name}" for alias in getattr(node, "names", [])]
                names |= {module for module in submodules if module in modules or f"{module}.__init__" in modules}
                if not isinstance(node, ast.ImportFrom) or len(names & set(submodules)) < len(submodules):
                    names.add(name)
        graph[importer] = {name for name in names if name in modules or f"{name}.__init__" in modules} - {importer}
    return graph


def import_loops(package: Path = PACKAGE) -> list[list[str]]:
    """The groups of modules that import each other round in a loop (Tarjan's strongly connected components of
    more than one module), each sorted."""
    graph = _import_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                loops.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(loops)


def test_the_one_import_loop_is_the_job_hooks():
    # job/hook.py loads by its path with the standard library only, and hands a process to job/process.py, which
    # reads the hook's names back: the one loop docs/ARCHITECTURE.md names.
    assert import_loops() == [["loaderdoctor.job.hook", "loaderdoctor.job.process"]]


def test_an_import_loop_is_found(tmp_path):
    fake = tmp_path / "loaderdoctor"
    (fake / "tap").mkdir(parents=True)
    (fake / "tap" / "a.py").write_text("from loaderdoctor.tap.b import x\n")
    (fake / "tap" / "b.py").write_text("def f():\n    import loaderdoctor.tap.c\n")
    (fake / "tap" / "c.py").write_text("from loaderdoctor.tap import a\n")
    (fake / "tap" / "d.py").write_text("from loaderdoctor.tap.a import y\n")
    assert import_loops(fake) == [["loaderdoctor.tap.a", "loaderdoctor.tap.b", "loaderdoctor.tap.c"]]


def test_the_integrations_and_the_job_read_only_the_core_not_each_other():
    graph = _import_graph()
    crossing = [
        f"{importer} -> {name}"
        for importer, names in graph.items()
        for name in names
        if {_part(importer), _part(name)} == {"integrations", "job"}
    ]
    assert crossing == []
