"""Every mistake in params.yaml found before any work, all at once: the first stage (``stages/check.py``) and the
``fedrepro check`` command (``fedrepro.commands``) run it.

A stage that met a mistake only when it needed the key would stop after the stages before it had run (an unknown
algorithm in ``fedcmc.methods`` once surfaced after every FedMatch stage had trained; a hub backbone at paper scale
offline after seven minutes and 446 MB of data). So this checks, in one pass:

- every key and value ``config.Params`` validates (one line per problem, not the first only);
- every name a list holds: FedMatch's methods, FedCMC's algorithms, vector rules and corpora (the sweeps' too),
  SS-VFNAS's methods, FedMatch's QA collections;
- every algorithm's knobs (``params.yaml``'s ``algorithms``) against its Settings, and FedMatch's patch as its methods
  build it;
- every backbone: loadable offline or from the hub (``models.backbone.check_loadable``, one probe, no retries);
- every file of the user's own (``data.own_files``) present in the mirror (its checksum is acquire's to verify).

Each problem is one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedrepro.config import QA_LAYOUTS, Params, fill_from_scale, read_raw_params, validation_lines
from fedrepro.errors import ConfigError
from fedrepro.fedcmc.methods import VECTORS
from fedrepro.fedmatch.methods import METHODS as FEDMATCH_METHODS
from fedrepro.fl import algorithms
from fedrepro.io import write_json
from fedrepro.models.backbone import check_loadable
from fedrepro.models.patches import PatchSpec
from fedrepro.ssvfnas.methods import METHODS as SSVFNAS_METHODS

EMBEDDED_CORPORA = ("synthetic-re",)
"""The relation corpora the embedded source prepares (``data.prepare``)."""
CHECKED = ["params and their values", "names in lists", "algorithm knobs", "backbones", "own files"]
"""What a passed check vouches for: the check stage's whole output, the same for every valid params.yaml."""


def check_params(params_file: str | Path = "params.yaml", out: str | Path | None = "data/check.json") -> None:
    """Raise one ConfigError listing every problem of ``params_file`` (with its scale's presets); else write ``out``
    (the check stage's output; None writes nothing)."""
    found = problems(read_raw_params(params_file))
    if found:
        raise ConfigError(
            f"{len(found)} problem(s) in {params_file}, each with its key, value and what is allowed "
            "(nothing was run):\n  " + "\n  ".join(found)
        )
    if out is not None:
        write_json(Path(out), {"checked": CHECKED})


def problems(raw: dict[str, Any]) -> list[str]:
    """Every problem of ``raw`` (``config.read_raw_params``' dict), one line each; empty when the run may start."""
    try:
        filled = fill_from_scale(raw)
    except ConfigError as error:  # no scale to read the other keys by
        return [str(error)]
    found = []
    try:
        Params.model_validate(filled)
    except ValidationError as error:
        found += validation_lines(error)
    found += _name_problems(filled)
    found += _knob_problems(filled.get("algorithms"))
    found += _patch_problems(filled)
    found += _backbone_problems(filled)
    found += _own_file_problems(filled.get("data") or {})
    return list(dict.fromkeys(found))  # a name checked both by config and here is said once


def _at(group: dict[str, Any], key: str) -> Any:
    """The value at a dotted ``key``, None where a step of it is missing or no group."""
    value: Any = group
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _unknown(key: str, names: Any, allowed: list[str], what: str = "") -> list[str]:
    """A line for each of ``names`` (a list, or one name) that ``allowed`` lacks."""
    if isinstance(names, str):
        return [] if names in allowed else [f"params: {key} = {names!r}{what}; allowed {allowed}"]
    if not isinstance(names, list):
        return []  # a wrong type: config's line says so
    return [
        f"params: {key}.{index} = {name!r}{what}; allowed {allowed}"
        for index, name in enumerate(names)
        if name not in allowed
    ]


def _name_problems(filled: dict[str, Any]) -> list[str]:
    data = filled.get("data") or {}
    federated = sorted(name for name, algorithm in algorithms.REGISTRY.items() if algorithm.federated)
    source = data.get("source")
    corpora = list(EMBEDDED_CORPORA) if source == "embedded" else list(data.get("re_corpora") or [])
    corpus_why = (
        " (the embedded source prepares only the synthetic corpus)"
        if source == "embedded"
        else " (no corpus data.re_corpora prepares)"
    )
    collections = list(QA_LAYOUTS) + list(data.get("qa_layouts") or {})
    lines = []
    for key in ("fedmatch.methods", "fedmatch.sweeps.data_ratio_methods"):
        lines += _unknown(key, _at(filled, key), sorted(FEDMATCH_METHODS))
    for key in ("fedcmc.methods", "fedcmc.sweeps.methods", "fedcmc.sweeps.subset_methods"):
        lines += _unknown(key, _at(filled, key), federated, " is no federated algorithm")
    lines += _unknown("fedcmc.sweeps.vectors", _at(filled, "fedcmc.sweeps.vectors"), list(VECTORS))
    for key in ("fedcmc.datasets", "fedcmc.sweeps.dataset", "fedcmc.sweeps.subset_dataset"):
        lines += _unknown(key, _at(filled, key), corpora, corpus_why)
    lines += _unknown("ssvfnas.methods", _at(filled, "ssvfnas.methods"), sorted(SSVFNAS_METHODS))
    if source != "embedded":
        lines += _unknown(
            "partition.collections",
            _at(filled, "partition.collections"),
            collections,
            " is no public QA collection nor one of yours in data.qa_layouts",
        )
    return lines


def _knob_problems(entries: Any) -> list[str]:
    """Each algorithm's knobs checked on their own, so that every wrong one is listed."""
    if not isinstance(entries, dict):
        return []
    lines = []
    for name, knobs in entries.items():
        try:
            algorithms.algorithm_settings(name, {name: knobs if isinstance(knobs, dict) else {}})
        except ConfigError as error:
            lines.append(str(error))
    return lines


def _patch_problems(filled: dict[str, Any]) -> list[str]:
    """FedMatch's patch as its methods build it (``models.patches.PatchSpec``): a PAL patch's heads must divide its
    size. One line per problem, naming the methods it stops."""
    size, heads = _at(filled, "fedmatch.settings.patch_size"), _at(filled, "fedmatch.settings.patch_heads")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (size, heads)):
        return []  # a wrong type or range: config's line says so
    stopped: dict[str, list[str]] = {}
    for method in _at(filled, "fedmatch.methods") or []:
        recipe = FEDMATCH_METHODS.get(method) if isinstance(method, str) else None
        if recipe is None or recipe.insertion is None:
            continue
        try:
            PatchSpec(recipe.insertion, recipe.structure, size, heads)
        except ValueError as error:
            stopped.setdefault(str(error), []).append(method)
    return [f"params: fedmatch.settings.patch_{error} (for {', '.join(methods)})" for error, methods in stopped.items()]


def _backbone_problems(filled: dict[str, Any]) -> list[str]:
    lines = []
    for key in ("model.backbone", "fedcmc.settings.backbone"):
        backbone = _at(filled, key)
        if isinstance(backbone, str) and backbone:
            try:
                check_loadable(backbone, key)
            except ConfigError as error:
                lines.append(str(error))
    return lines


def _own_file_problems(data: dict[str, Any]) -> list[str]:
    files, mirror = data.get("own_files"), data.get("mirror")
    if not isinstance(files, dict) or not files or not isinstance(mirror, str):
        return []
    return [
        f"params: data.own_files names {path!r}, but {Path(mirror) / path} does not exist; put the file there or "
        "correct the path (relative to data.mirror)"
        for path in files
        if not (Path(mirror) / path).is_file()
    ]
