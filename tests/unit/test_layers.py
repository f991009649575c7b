"""No import runs back up: each module of loaderdoctor imports only from its own layer and the layers below it
(docs/ARCHITECTURE.md draws them). A module of a layer not listed here fails too: a new folder takes a place."""

from __future__ import annotations

import ast
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
    {"target"},
    {"recording"},
    {"rules"},
    {"probe", "guard"},
    {"report"},
    {"tune", "scale"},
    {"history"},
    {"render"},
    {"watch", "saved"},
    {"check", "commands", "lightning"},
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


def imports_running_back_up(package: Path = PACKAGE) -> list[str]:
    """Each import of a module of `package` from a layer above its own, as 'importer -> imported'."""
    found = []
    for path in sorted(package.rglob("*.py")):
        importer = _module_name(path, package)
        own = LAYER_OF.get(_part(importer))
        if own is None:
            found.append(f"{importer}: its folder or module is in no layer")
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "loaderdoctor":
                names = (
                    [f"{node.module}.{alias.name}" for alias in node.names]
                    if node.module == "loaderdoctor"
                    else [node.module]
                )
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.split(".")[0] == "loaderdoctor"]
            else:
                continue
            for name in names:
                layer = LAYER_OF.get(_part(name))
                if layer is None or layer > own:
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
