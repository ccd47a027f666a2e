"""The data statistics report: FedQA's Table 1 shape for the QA clients, and the RE and vertical tables."""

from __future__ import annotations

import pandas as pd


def _table(rows: dict[str, list[dict]], first: str) -> str:
    frames = [pd.DataFrame(records).assign(**{first: name}) for name, records in rows.items()]
    if not frames:
        return "(none)"
    frame = pd.concat(frames, ignore_index=True)
    leading = [first] + [c for c in ("split", "party") if c in frame.columns]
    columns = leading + [c for c in frame.columns if c not in leading]
    return frame[columns].fillna(0).to_markdown(index=False, floatfmt=".1f")


def render_statistics(source: str, scale: str, stats: dict, partition: dict, mined: dict) -> str:
    clients = []
    for client, info in partition["clients"].items():
        for split in ("train", "valid", "test"):
            clients.append(
                {
                    "client": client,
                    "split": split,
                    "questions used": info["questions"].get(split, 0),
                    "mined negatives": mined[client]["negatives"].get(split, 0),
                    "evaluation pool": "-" if split == "train" else mined[client]["eval_pool"],
                }
            )
    lines = [
        "# Data statistics",
        "",
        f"Written by the `data_statistics` stage from the prepared data (source `{source}`, scale `{scale}`).",
        "",
        "## QA collections as prepared (all questions, before caps)",
        "",
        "Lengths are mean whitespace tokens; answers are distinct gold answers.",
        "",
        _table(stats["qa"], "collection"),
        "",
        "## QA clients as used (after the caps of this scale)",
        "",
        "Caps on training questions per client (the largest client's cap, the others scaled in proportion): "
        + ", ".join(f"{client} {cap}" for client, cap in partition["caps"].items())
        + ". Training negatives are the mined "
        "(question, gold answer, negative) triples; evaluation negatives are the non-gold candidates.",
        "",
        pd.DataFrame(clients).to_markdown(index=False),
        "",
        "## Relation-extraction corpora (sentences per split and class)",
        "",
        *[_table({name: records}, "corpus") + "\n" for name, records in stats["re"].items()],
        "## Vertical (party-split) tables",
        "",
        _table(stats["vertical"], "set"),
        "",
    ]
    if stats["skipped"]:
        lines += ["## Skipped", ""] + [f"- {line}" for line in stats["skipped"]] + [""]
    lines += ["## What each loader used and dropped", ""]
    for name, notes in stats["notes"].items():
        lines += [f"- **{name}**: " + " ".join(notes)] if notes else []
    return "\n".join(lines) + "\n"
