"""The training-sanity protocol's table, shared by the three papers.

Before any federated cell is trusted at a scale, a pooled (centralised) reference trained on the same capped
data must beat the trivial baselines of its task by a margin stated in advance, and the scale's learning rate
and rounds (or steps) are chosen on the validation split, never on test. Each paper's ``sanity`` module trains
the sweep and scores the baselines; this module picks the setting and writes the one table format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedrepro.fl.health import RULE, cell_health
from fedrepro.io import write_json


@dataclass
class SanityResult:
    paper: str
    metric: str
    """The validation metric the choice is made on (higher is better)."""
    margin: float
    """How far (absolute, in the metric's units) the chosen reference must beat the best trivial baseline."""
    sweep: pd.DataFrame
    """One row per (setting, evaluation point): the setting's columns, ``round`` (or step), ``train_loss``,
    ``valid``."""
    settings: list[str]
    """The columns of ``sweep`` that make a setting (e.g. ``lr``)."""
    baselines: dict[str, float]
    """Trivial baselines' validation scores, by name."""
    notes: list[str] = field(default_factory=list)
    reference: str = "A pooled (centralised) reference, trained on the same capped data as the federated cells,"
    """Who was trained, as the table's first sentence says it."""
    averaged: list[str] = field(default_factory=list)
    """Setting columns the choice averages over instead of choosing (a federated reference's alphas: one lr must
    serve every alpha, so it is chosen on the mean best validation score, and an lr that diverged at any is out)."""

    def settings_table(self) -> pd.DataFrame:
        """One row per setting: its best validation point, and its health by the shared rule."""
        rows = []
        for key, group in self.sweep.groupby(self.settings, sort=True):
            key = key if isinstance(key, tuple) else (key,)
            group = group.sort_values("round")
            health = cell_health(group["train_loss"].tolist(), group["valid"].tolist())
            best = group.loc[group["valid"].idxmax()] if group["valid"].notna().any() else None
            rows.append(
                {
                    **dict(zip(self.settings, key)),
                    "best valid": float(best["valid"]) if best is not None else math.nan,
                    "at round": int(best["round"]) if best is not None else None,
                    "first loss": float(group["train_loss"].iloc[0]),
                    "last loss": float(group["train_loss"].iloc[-1]),
                    "health": health.label,
                }
            )
        return pd.DataFrame(rows)

    def choice(self) -> dict:
        """The setting (and round) with the best validation score among those that did not diverge; with
        ``averaged`` columns, the rest of the setting with the best mean over them (its round: the latest best)."""
        table = self.settings_table()
        chosen = [k for k in self.settings if k not in self.averaged]
        if self.averaged:
            table = (
                table.groupby(chosen, sort=True)
                .agg(
                    **{
                        "best valid": ("best valid", "mean"),
                        "at round": ("at round", "max"),
                        "health": ("health", lambda labels: "diverged" if (labels == "diverged").any() else "sound"),
                    }
                )
                .reset_index()
            )
        sound = table[table["health"] != "diverged"]
        if sound.empty or sound["best valid"].isna().all():
            return {}
        best = sound.loc[sound["best valid"].idxmax()]
        return {**{k: best[k] for k in chosen}, "round": int(best["at round"]), "valid": float(best["best valid"])}

    def verdict(self) -> dict:
        choice = self.choice()
        name, value = max(self.baselines.items(), key=lambda kv: kv[1])
        reference = choice.get("valid", math.nan)
        margin = reference - value if choice else None  # no sound setting: no reference to measure a margin of
        return {
            "choice": choice,
            "best_baseline": name,
            "best_baseline_valid": value,
            "margin_required": self.margin,
            "margin": margin,
            "passed": margin is not None and margin >= self.margin,
        }


def _markdown(table: pd.DataFrame, settings: list[str]) -> str:
    """Setting values as written in params (5e-05, not a 4-decimal 0.0001 that hides which lr it was), scores to 4
    decimals, round numbers as integers."""

    def cell(column: str, value) -> str:
        if isinstance(value, float) and not pd.isna(value):
            return f"{value:g}" if column in settings else f"{value:.4f}"
        return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)

    shown = pd.DataFrame({c: [cell(c, v) for v in table[c]] for c in table.columns})
    return shown.to_markdown(index=False, disable_numparse=True)


def render_sanity(result: SanityResult) -> str:
    verdict = result.verdict()
    baselines = pd.DataFrame(
        [{"trivial baseline": k, f"valid {result.metric}": v} for k, v in result.baselines.items()]
    )
    lines = [
        f"# {result.paper}: training-sanity protocol",
        "",
        f"{result.reference} for each setting of a small sweep; the setting is chosen on the validation split's "
        f"{result.metric} (never on test"
        + (
            f"; one setting for every {', '.join(result.averaged)}, on the mean of their best scores"
            if result.averaged
            else ""
        )
        + f"), and the chosen reference must beat the best trivial baseline by at least {result.margin:g} (stated "
        "before the run).",
        "",
        f"Health rule (every cell of every report): {RULE}.",
        "",
        "## Sweep (best validation point per setting)",
        "",
        _markdown(result.settings_table(), result.settings),
        "",
        "## Trivial baselines (validation)",
        "",
        _markdown(baselines, []),
        "",
        "## Choice",
        "",
    ]
    if verdict["choice"]:
        chosen = ", ".join(f"{k} = {v}" for k, v in verdict["choice"].items() if k != "valid")
        lines.append(f"- Chosen: {chosen} (valid {result.metric} {verdict['choice']['valid']:.4f}).")
    else:
        lines.append("- No setting trained soundly: nothing can be chosen.")
    margin = "none (nothing chosen)" if verdict["margin"] is None else f"{verdict['margin']:+.4f}"
    lines.append(
        f"- Margin over the best trivial baseline ({verdict['best_baseline']}, "
        f"{verdict['best_baseline_valid']:.4f}): {margin}, required {result.margin:+.4f}: "
        f"**{'passed' if verdict['passed'] else 'FAILED'}**."
    )
    lines += [f"- {note}" for note in result.notes]
    lines += ["", "## Every evaluation point", "", _markdown(result.sweep.astype({"round": int}), result.settings), ""]
    return "\n".join(lines)


def write_sanity(result: SanityResult, folder: Path) -> dict:
    """sanity.md (the table), sanity.csv (every point) and sanity.json (the choice and the verdict)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    result.sweep.to_csv(folder / "sanity.csv", index=False, float_format="%.6g")
    (folder / "sanity.md").write_text(render_sanity(result))
    verdict = result.verdict()
    write_json(
        folder / "sanity.json",
        {
            **verdict,
            "metric": result.metric,
            "baselines": result.baselines,
            "choice": {k: (v.item() if hasattr(v, "item") else v) for k, v in verdict["choice"].items()},
        },
    )
    return verdict
