"""Each stage's fedrepro deps in dvc.yaml are its script's import closure (``fedrepro.code_closure``), no more and
no less: a module the stage cannot run is no dep (editing it reruns nothing), one it can is.

    python scripts/stage_deps.py           # list the stages whose deps differ from their closure (exit 1 if any)
    python scripts/stage_deps.py --write   # rewrite those deps in dvc.yaml (comments and everything else kept)

A folder stands for its modules where the closure holds every module under it; a module that is prose alone (a
package's ``__init__`` with its docstring) is no dep; deps that are no Python module
(``fedrepro/data/checksums.json``: data a stage reads) are declared by hand and kept as they are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedrepro.code_closure import import_closure, runs_nothing  # noqa: E402

PACKAGE = ROOT / "fedrepro"


def stage_definitions(document) -> dict:
    """stage name -> its definition."""
    return dict(document["stages"])


def script_of(stage) -> Path:
    return ROOT / str(stage["cmd"]).split()[1]


def closure_deps(script: Path) -> list[str]:
    """The script's fedrepro modules as dvc.yaml deps: a folder where every module under it is in the closure."""
    closure = {file for file in import_closure(script) if PACKAGE in file.parents and not runs_nothing(file)}
    deps = []

    def cover(folder: Path) -> None:
        modules = {file for file in folder.rglob("*.py") if not runs_nothing(file)}
        others = [p for p in folder.rglob("*") if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts]
        if folder != PACKAGE and modules and modules <= closure and not others:
            deps.append(str(folder.relative_to(ROOT)))
            return
        deps.extend(str(file.relative_to(ROOT)) for file in sorted(folder.glob("*.py")) if file in closure)
        for child in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"):
            if any(file in closure for file in child.rglob("*.py")):
                cover(child)

    cover(PACKAGE)
    return deps


def wanted_deps(stage) -> list[str]:
    """The stage's deps with its fedrepro modules replaced by its closure's: the script first, then the modules, then
    the rest (data files, upstream outputs) in their order."""
    old = [str(dep) for dep in stage.get("deps", [])]
    script = str(script_of(stage).relative_to(ROOT))
    by_hand = [
        dep
        for dep in old
        if dep != script and not (dep.startswith("fedrepro/") and ((ROOT / dep).is_dir() or dep.endswith(".py")))
    ]
    return [script, *closure_deps(script_of(stage)), *by_hand]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite dvc.yaml's deps that differ")
    args = parser.parse_args()
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    path = ROOT / "dvc.yaml"
    document = yaml.load(path.read_text())
    differing = []
    for name, stage in stage_definitions(document).items():
        wanted = wanted_deps(stage)
        if [str(dep) for dep in stage.get("deps", [])] != wanted:
            differing.append(name)
            if args.write:
                stage["deps"].clear()
                stage["deps"].extend(wanted)
    if args.write and differing:
        with path.open("w") as handle:
            yaml.dump(document, handle)
    for name in differing:
        print(f"{name}: deps {'rewritten' if args.write else 'differ from its import closure'}")
    sys.exit(1 if differing and not args.write else 0)


if __name__ == "__main__":
    main()
