"""SS-VFNAS's training-sanity protocol at a scale, on one held-out split and never on test.

Before any federated cell at a scale is trusted:

* a pooled reference -- every party's features at one party, trained centrally (a one-party protocol: no message, no
  noise) with the hand-designed network family of the grid's baseline (one bottom per view, the linear top) and the
  retraining's optimiser and steps, one run per learning rate -- must beat, by a margin stated before the run,
* the trivial baselines: the training rows' majority class, and the label party trained alone on its own features
  (its own bottom and a linear top, the same sweep, its best point counted: the generous reading);
* and the search's architecture learning rate and steps, with the retraining's learning rate, are chosen from a small
  sweep of VFNAS-2 (no DP, one seed): search on the fit rows (w) and search-valid (alpha), retrain the derived networks
  as the grid does, score them.

Rows: the partition's test split is left out entirely; a stratified, seeded share of its train split is held out
(``held_out``: ``fedrepro.ssvfnas.phases.hold_out``, at the grid's fraction the very rows its cells are validated on)
and every score here is on it; the rest of train is the fit split, so the search sees fit + search-valid and every
trained network is fitted on fit + search-valid, as in the grid's cells. (Each party's feature scaling was fitted on
the whole train split, held-out rows included: means and spreads only.)

Each run's points are cached as JSON under a work folder, keyed by everything that shapes it, so an interrupted
sweep resumes run by run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import tempfile
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from fedrepro.config import Params
from fedrepro.code_closure import cell_code, code_digest
from fedrepro.device import configure
from fedrepro.io import read_json, write_json
from fedrepro.report.sanity import SanityResult, render_sanity
from fedrepro.seeding import derive_seed, seed_everything
from fedrepro.ssvfnas.cells import Cell
from fedrepro.ssvfnas.phases import (
    HELD_OUT,
    PartitionData,
    alpha_summary,
    build_supernets,
    build_top,
    derived_networks,
    hold_out,
    make_protocol,
    make_search,
    one_party,
    run_steps,
    validation_curve,
    validation_point,
)
from fedrepro.vfl.protocol import VerticalProtocol

METRIC = "accuracy"


# ----- the rows -----------------------------------------------------------------------------------------------
def sanity_data(data: PartitionData, held_out_fraction: float, seed: int) -> PartitionData:
    """``data`` with a stratified share of train moved to ``held_out`` (``hold_out``) and its test rows dropped."""
    held = hold_out(data, held_out_fraction, seed)
    return dataclasses.replace(held, splits={name: rows for name, rows in held.splits.items() if name != "test"})


def fitted_rows(data: PartitionData) -> torch.Tensor:
    """fit + search-valid: what every network here is trained on (the grid's retraining rows, less the held-out
    ones)."""
    return torch.cat([data.splits["train"], data.splits["valid"]]).sort().values


def majority_accuracy(data: PartitionData, scored: str = HELD_OUT) -> float:
    """Always answering the fitted rows' most frequent class (a tie goes to the lowest class id), scored on the
    ``scored`` rows: the held-out ones here, the test ones in the report's main table."""
    counts = torch.bincount(data.labels[fitted_rows(data)], minlength=data.classes)
    return float((data.labels[data.splits[scored]] == int(counts.argmax())).float().mean())


# ----- central training ------------------------------------------------------------------------------------------
def train_and_score(
    params: Params, protocol: VerticalProtocol, data: PartitionData, lr: float, eval_every: int, folder: Path
) -> list[dict[str, float]]:
    """Split training of ``protocol``'s fixed networks with the retraining's settings at ``lr`` on the fitted rows;
    every ``eval_every`` steps the held-out accuracy and the mean training loss since the previous point."""
    r = params.ssvfnas.retrain
    training = make_search(params, None, protocol, lr)
    run_steps(
        training,
        fitted_rows(data),
        None,
        r.batch_size,
        r.steps,
        lr,
        r.lr_min,
        eval_every,
        r.steps,
        folder,
        validation_point(protocol, data.splits[HELD_OUT]),
    )
    return [
        {"round": p["step"], "train_loss": p["train_loss"], "valid": p["valid_accuracy"]}
        for p in validation_curve(training.history)
    ]


def vfnas2_search(params: Params, data: PartitionData, seed: int, folder: Path) -> dict[str, Any]:
    """VFNAS-2 without DP on fit (w) and search-valid (alpha): each party's derived genotype and the alpha summary."""
    ss = params.ssvfnas
    cell = Cell("vfnas2", data.summary["dataset"], data.parties, 0.0, 0.0, seed)
    bottoms = build_supernets(params, data, seed)
    alpha_init = [b.alphas.detach().clone() for b in bottoms]
    train, valid = data.splits["train"], data.splits["valid"]
    protocol = make_protocol(
        params,
        cell,
        data,
        bottoms,
        build_top(params, data, seed, "search"),
        seed,
        {"train": len(train), "val": len(valid)},
    )
    search = make_search(params, cell.rule, protocol, ss.search.lr)
    run_steps(
        search,
        train,
        valid,
        ss.search.batch_size,
        ss.search.steps,
        ss.search.lr,
        ss.search.lr_min,
        ss.search.steps,
        ss.search.steps,
        folder,
    )
    alpha = alpha_summary(bottoms, alpha_init, alpha_init)
    return {"alpha": {k: v for k, v in alpha.items() if k != "parties"}, "genotypes": [b.genotype() for b in bottoms]}


def retrain_derived(
    params: Params, data: PartitionData, seed: int, genotypes: list[dict], eval_every: int, folder: Path
) -> dict[str, Any]:
    """The derived networks retrained from scratch on fit + search-valid like the grid's (no DP); the held-out
    points."""
    cell = Cell("vfnas2", data.summary["dataset"], data.parties, 0.0, 0.0, seed)
    rows = fitted_rows(data)
    retrain = make_protocol(
        params,
        cell,
        data,
        derived_networks(params, data, seed, genotypes),
        build_top(params, data, seed, "retrain"),
        derive_seed(seed, "retrain"),
        {"train": len(rows)},
    )
    return {"points": train_and_score(params, retrain, data, params.ssvfnas.retrain.lr, eval_every, folder)}


# ----- the sweep ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SanitySettings:
    """What the protocol sweeps and how it scores (all chosen before the run)."""

    lrs: tuple[float, ...]
    """learning rates of the pooled reference and of the label party alone (the retraining's steps and schedule)"""
    arch_lrs: tuple[float, ...]
    search_steps: tuple[int, ...]
    retrain_lrs: tuple[float, ...]
    """the retraining's learning rates in VFNAS-2's sweep (derived networks; the baseline is retrained the same way)"""
    margin: float
    """accuracy the pooled reference (and VFNAS-2's chosen setting) must beat max(majority, label party alone) by"""
    held_out_fraction: float = 0.25
    eval_every: int = 50
    seed: int = 0


def _cached(work: Path, name: str, key: dict[str, Any], run: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """``run``'s result from ``work/name.json`` if it was written for this very ``key``, else run it and write it."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    path = work / f"{name}.json"
    if path.exists() and read_json(path).get("key") == digest:
        return read_json(path)["result"]
    with tempfile.TemporaryDirectory() as checkpoints:
        result = run(Path(checkpoints))
    write_json(path, {"key": digest, "result": result})
    return result


SWEPT = ("arch_lr", "search_steps", "retrain_lr")
"""VFNAS-2's sweep: search.arch_lr, search.steps and retrain.lr of the scale's preset."""


def _variant(params: Params, arch_lr: float, steps: int, retrain_lr: float) -> Params:
    ss = params.ssvfnas
    search = ss.search.model_copy(update={"arch_lr": arch_lr, "steps": steps})
    retrain = ss.retrain.model_copy(update={"lr": retrain_lr})
    return params.model_copy(update={"ssvfnas": ss.model_copy(update={"search": search, "retrain": retrain})})


def preset(params: Params) -> tuple[float, int, float]:
    """The scale's current values of ``SWEPT``."""
    return params.ssvfnas.search.arch_lr, params.ssvfnas.search.steps, params.ssvfnas.retrain.lr


def sanity_partition(
    params: Params,
    data: PartitionData,
    settings: SanitySettings,
    work: Path,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[SanityResult, SanityResult]:
    """The pooled reference's table and VFNAS-2's architecture sweep for one partition (dataset-K), on ``train.device``
    as the grid's cells (``runs.run_cell``)."""
    configure(params.train.device)
    seed_everything(settings.seed, params.ssvfnas.threads)
    data = sanity_data(data, settings.held_out_fraction, params.data.seed)
    work = Path(work) / data.name
    work.mkdir(parents=True, exist_ok=True)
    base_key = {
        "ssvfnas": params.ssvfnas.model_dump(),
        "data_seed": params.data.seed,
        "partition": data.summary,
        "held_out": settings.held_out_fraction,
        "eval_every": settings.eval_every,
        "seed": settings.seed,
        "code": code_digest(cell_code(__name__, "engine")),
    }
    everyone, label = list(range(data.parties)), [data.label_party]
    runs: dict[str, list[dict]] = {"pooled": [], "label": []}
    for lr in settings.lrs:
        for run, parties in (("pooled", everyone), ("label", label)):
            progress(f"{data.name}: {run} lr {lr:g}")
            points = _cached(
                work,
                f"{run}-lr{lr:g}",
                {**base_key, "run": run, "lr": lr},
                lambda folder, parties=parties, lr=lr: {
                    "points": train_and_score(
                        params, one_party(params, data, parties, settings.seed), data, lr, settings.eval_every, folder
                    )
                },
            )["points"]
            runs[run] += [{"lr": lr, **p} for p in points]
    sweep, notes = [], []
    for arch_lr, steps, retrain_lr in itertools.product(settings.arch_lrs, settings.search_steps, settings.retrain_lrs):
        progress(f"{data.name}: VFNAS-2 arch lr {arch_lr:g}, {steps} search steps, retrain lr {retrain_lr:g}")
        variant = _variant(params, arch_lr, steps, retrain_lr)
        searched = _cached(
            work,
            f"vfnas2-arch{arch_lr:g}-steps{steps}",
            {**base_key, "run": "vfnas2", "arch_lr": arch_lr, "steps": steps},
            lambda folder, variant=variant: vfnas2_search(variant, data, settings.seed, folder),
        )
        result = _cached(
            work,
            f"vfnas2-arch{arch_lr:g}-steps{steps}-retrain{retrain_lr:g}",
            {**base_key, "run": "vfnas2-retrain", "genotypes": searched["genotypes"], "retrain_lr": retrain_lr},
            lambda folder, variant=variant: retrain_derived(
                variant, data, settings.seed, searched["genotypes"], settings.eval_every, folder
            ),
        )
        sweep += [dict(zip(SWEPT, (arch_lr, steps, retrain_lr)), **p) for p in result["points"]]
        if retrain_lr == settings.retrain_lrs[0]:  # the search does not depend on the retraining's lr
            a = searched["alpha"]
            notes.append(
                f"arch lr {arch_lr:g}, {steps} steps: entropy of softmax(α) {a['entropy_start']:.4f} -> "
                f"{a['entropy_end']:.4f} (uniform {a['entropy_uniform']:.4f}), α shift {a['max_shift']:.4f}, "
                f"{100 * a['parameter_free_edges']:.0f}% of the derived edges parameter-free."
            )
    alone_frame = pd.DataFrame(runs["label"])
    baselines = {
        "majority class": majority_accuracy(data),
        "label party alone (best lr and step)": float(alone_frame["valid"].max()),
    }
    rows_note = (
        f"Rows: fit {len(data.splits['train'])}, search-valid {len(data.splits['valid'])}, held-out "
        f"{len(data.splits[HELD_OUT])} (scored; one error = {100 / len(data.splits[HELD_OUT]):.2f} points); the "
        f"test split is not used. Seed {settings.seed}."
    )
    best_alone = alone_frame.loc[alone_frame["valid"].idxmax()]
    reference_notes = [
        rows_note,
        f"Pooled reference: the grid's hand-designed networks ({params.ssvfnas.retrain.baseline_depth}"
        f"-layer stacks, one per party's view) and a linear top, every party's features at one party, "
        f"{params.ssvfnas.retrain.steps} steps, batch {params.ssvfnas.retrain.batch_size}, SGD cosine to "
        f"{params.ssvfnas.retrain.lr_min:g}, no DP; 'round' is the step.",
        f"Label party alone: party {data.label_party}'s own network and features, the same sweep; its best "
        f"point ({best_alone['valid']:.4f} at lr {best_alone['lr']:g}, step {int(best_alone['round'])}) is its score.",
    ]
    sweep_notes = [
        rows_note,
        "VFNAS-2 (MiLeNAS), no DP: the search at each setting, then the derived networks retrained "
        f"from scratch at each retrain lr for {params.ssvfnas.retrain.steps} steps; 'round' is the retraining "
        "step.",
    ] + notes
    return (
        SanityResult(
            f"SS-VFNAS ({data.name}): pooled reference",
            METRIC,
            settings.margin,
            pd.DataFrame(runs["pooled"]),
            ["lr"],
            baselines,
            reference_notes,
        ),
        SanityResult(
            f"SS-VFNAS ({data.name}): VFNAS-2 architecture lr and search steps",
            METRIC,
            settings.margin,
            pd.DataFrame(sweep),
            list(SWEPT),
            baselines,
            sweep_notes,
        ),
    )


# ----- the choice and the files ------------------------------------------------------------------------------------
def arch_choice(
    sweeps: dict[str, SanityResult], current: tuple[float, int, float], tolerance: float
) -> tuple[pd.DataFrame, dict]:
    """One setting of ``SWEPT`` for every partition: the highest mean over partitions of the retrained networks'
    held-out accuracy at the last retraining step (what the grid reports); among the settings within ``tolerance`` of it
    (one seed: closer is noise), the current preset if it is one of them, else the fewest search steps, then the
    smallest arch lr, then the smallest retrain lr."""
    frames = []
    for name, result in sweeps.items():
        last = result.sweep.sort_values("round").groupby(list(SWEPT), sort=True).tail(1)
        frames.append(last.assign(partition=name))
    table = pd.concat(frames).pivot_table(index=list(SWEPT), columns="partition", values="valid").reset_index()
    table["search_steps"] = table["search_steps"].astype(int)
    table["mean"] = table[list(sweeps)].mean(axis=1)
    best = float(table["mean"].max())
    near = table[table["mean"] >= best - tolerance]
    keys = [(float(a), int(s), float(r)) for a, s, r in zip(near["arch_lr"], near["search_steps"], near["retrain_lr"])]
    chosen = current if current in keys else min(keys, key=lambda k: (k[1], k[0], k[2]))
    row = table[
        (table["arch_lr"] == chosen[0]) & (table["search_steps"] == chosen[1]) & (table["retrain_lr"] == chosen[2])
    ].iloc[0]
    return table, {
        **dict(zip(SWEPT, chosen)),
        "mean_valid": float(row["mean"]),
        "best_mean_valid": best,
        "tolerance": tolerance,
        "current": dict(zip(SWEPT, current)),
        "within_tolerance": [dict(zip(SWEPT, k)) for k in keys],
    }


def write_ssvfnas_sanity(
    results: dict[str, tuple[SanityResult, SanityResult]],
    settings: SanitySettings,
    current: tuple[float, int, float],
    tolerance: float,
    folder: Path,
    scale: str,
) -> dict:
    """sanity.md (every table, the protocol's shared format), sanity.csv (every point of every run) and sanity.json
    (each table's verdict and the architecture choice)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table, choice = arch_choice({name: pair[1] for name, pair in results.items()}, current, tolerance)
    verdicts = {name: {"reference": ref.verdict(), "vfnas2": sweep.verdict()} for name, (ref, sweep) in results.items()}
    summary = pd.DataFrame(
        [
            {
                "dataset-K": name,
                "majority": ref.baselines["majority class"],
                "label party alone": ref.baselines["label party alone (best lr and step)"],
                "pooled reference": v["reference"]["choice"].get("valid", math.nan),
                "margin": v["reference"]["margin"],
                "reference passed": v["reference"]["passed"],
                "VFNAS-2 best": v["vfnas2"]["choice"].get("valid", math.nan),
                "VFNAS-2 passed": v["vfnas2"]["passed"],
            }
            for (name, (ref, _)), v in zip(results.items(), verdicts.values())
        ]
    )
    lines = [
        f"# SS-VFNAS: training-sanity protocol at scale `{scale}`",
        "",
        f"Margin, stated before the run: the pooled reference (and VFNAS-2's best setting) must beat max(majority "
        f"class, label party alone) by at least {settings.margin:g} in held-out {METRIC} ({100 * settings.margin:g} "
        f"points). Every score is on a held-out {100 * settings.held_out_fraction:g}% of each partition's train split "
        f"(stratified, seeded by data.seed); the test split is never used. Learning rates of the reference and of the "
        f"label party alone: {', '.join(f'{x:g}' for x in settings.lrs)}; VFNAS-2 sweep: arch lr "
        f"{', '.join(f'{x:g}' for x in settings.arch_lrs)} x search steps {', '.join(map(str, settings.search_steps))} "
        f"x retrain lr {', '.join(f'{x:g}' for x in settings.retrain_lrs)}; seed {settings.seed}.",
        "",
        "## Summary",
        "",
        summary.to_markdown(index=False, floatfmt=".4f"),
        "",
        "## The architecture learning rate, search steps and retraining learning rate for this scale",
        "",
        "Held-out accuracy of VFNAS-2's retrained networks at the last retraining step, per partition, and their mean. "
        f"Rule (stated before the run): the best mean; among the settings within {tolerance:g} of it (one seed: closer "
        "is noise), the current preset if it is one, else the fewest search steps, then the smallest arch lr, then the "
        "smallest retrain lr.",
        "",
        _arch_markdown(table),
        "",
        f"- Chosen: arch lr {choice['arch_lr']:g}, {choice['search_steps']} search steps, retrain lr "
        f"{choice['retrain_lr']:g} (mean held-out accuracy {choice['mean_valid']:.4f}; best "
        f"{choice['best_mean_valid']:.4f}); current preset: arch lr {current[0]:g}, {current[1]} steps, retrain lr "
        f"{current[2]:g}.",
        "",
    ]
    for ref, sweep in results.values():
        for result in (ref, sweep):
            lines += [_demoted(render_sanity(result)), ""]
    (folder / "sanity.md").write_text("\n".join(lines).rstrip() + "\n")
    points = []
    for name, (ref, sweep) in results.items():
        points.append(ref.sweep.assign(partition=name, table="pooled reference"))
        points.append(sweep.sweep.assign(partition=name, table="vfnas2 sweep"))
    pd.concat(points, ignore_index=True).to_csv(folder / "sanity.csv", index=False, float_format="%.6g")
    out = _plain(
        {
            "scale": scale,
            "metric": METRIC,
            "margin": settings.margin,
            "partitions": verdicts,
            "arch_choice": choice,
            "baselines": {name: ref.baselines for name, (ref, _) in results.items()},
        }
    )
    write_json(folder / "sanity.json", out)
    return out


def _arch_markdown(table: pd.DataFrame) -> str:
    shown = table.copy()
    shown["arch_lr"] = shown["arch_lr"].map(lambda x: f"{x:g}")
    shown["search_steps"] = shown["search_steps"].map(str)
    shown["retrain_lr"] = shown["retrain_lr"].map(lambda x: f"{x:g}")
    for column in shown.columns[len(SWEPT) :]:
        shown[column] = shown[column].map(lambda x: f"{x:.4f}")
    return shown.to_markdown(index=False, disable_numparse=True)


def _demoted(markdown: str) -> str:
    """Every heading one level down, so each table's own page nests under this file's title."""
    return "\n".join("#" + line if line.startswith("#") else line for line in markdown.split("\n"))


def _plain(value: Any) -> Any:
    """numpy scalars to Python and a missing number (NaN: no sound setting to choose) to None, for JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and not math.isfinite(value) else value
