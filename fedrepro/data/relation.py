"""Relation-extraction corpora for FedCMC as one tidy table (client splits: ``label_skew``).

Every loader returns an ``RECorpus`` whose table follows ``schema.RE_COLUMNS``: the two relation arguments
are wrapped in ``<e1>..</e1>`` / ``<e2>..</e2>`` inside ``text`` (FedCMC adds these as tokens), so models
never need to know the source format. ``notes`` records what was used, dropped or carved.
"""

from __future__ import annotations

import csv
import difflib
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.data import schema
from fedrepro.data.schema import E1_CLOSE, E1_OPEN, E2_CLOSE, E2_OPEN, need_file, normalise_space
from fedrepro.errors import DataError

VALID_FRACTION = 0.1


@dataclass
class RECorpus:
    name: str
    table: pd.DataFrame
    classes: list[str]
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- helpers


def _subdir(raw_dir: Path | str, name: str) -> Path:
    """Accept either the mirror root (holding ``name/``) or the dataset folder itself."""
    raw_dir = Path(raw_dir)
    return raw_dir / name if (raw_dir / name).is_dir() else raw_dir


def mark(text: str, e1: tuple[int, int], e2: tuple[int, int]) -> str:
    """Insert the markers around two non-overlapping character spans (end exclusive)."""
    if e1[0] < e2[1] and e2[0] < e1[1]:
        raise ValueError(f"entity spans overlap: {e1} {e2}")
    pieces = [(e1, E1_OPEN, E1_CLOSE), (e2, E2_OPEN, E2_CLOSE)]
    for (start, end), open_, close in sorted(pieces, key=lambda p: -p[0][0]):  # right to left keeps offsets valid
        text = f"{text[:start]}{open_} {text[start:end]} {close}{text[end:]}"
    return normalise_space(text)


def _finish(name: str, rows: list[tuple], notes: list[str]) -> RECorpus:
    table = pd.DataFrame(rows, columns=list(schema.RE_COLUMNS))
    bad = sorted(set(table["split"]) - set(schema.SPLITS))
    if bad:
        raise DataError(f"{name}: field 'split' has {bad}; allowed {list(schema.SPLITS)}")
    if table["sentence_id"].duplicated().any():
        raise DataError(
            f"{name}: duplicate sentence_id, e.g. {table.loc[table['sentence_id'].duplicated(), 'sentence_id'].iloc[0]}"
        )
    table = schema.check_re_table(table, name)
    return RECorpus(name, table, sorted(table["label"].unique().tolist()), notes)


def carve_valid(groups: list[str], seed: int, fraction: float = VALID_FRACTION) -> set[str]:
    """Seeded choice of whole groups (abstracts/documents) for a validation split, so no group leaks."""
    ids = np.array(sorted(set(groups)), dtype=object)
    rng = np.random.default_rng(seed)
    n = max(1, int(round(fraction * len(ids))))
    return set(ids[rng.permutation(len(ids))[:n]].tolist())


# ----------------------------------------------------------------------------- PGR


def load_pgr(raw_dir: Path | str, corpus: str = "10_12_2018", seed: int = 0, folder: str = "pgr") -> RECorpus:
    """PGR TSV (gene = e1, phenotype = e2) from the character offsets; labels lower-cased to true/false.

    The 2018 corpus is the one with a (manually verified) test file; neither corpus has a validation split,
    so one is carved from train by abstract.
    """
    base = _subdir(raw_dir, folder) / f"{corpus}_corpus"
    files = {"train": base / "train.tsv", "test": base / "test.tsv"}
    rows, notes, fixed, dropped = [], [], 0, Counter()
    for split, path in files.items():
        if split == "test" and not path.is_file():
            continue
        with open(need_file(path), encoding="utf-8", newline="") as handle:
            records = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
        for i, rec in enumerate(records):
            text = rec["SENTENCE"]
            spans = []
            for ent, start, end in (
                ("GENE", "GENE_START_POSITION", "GENE_END_POSITION"),
                ("PHENOTYPE", "PHENOTYPE_START_POSITION", "PHENOTYPE_END_POSITION"),
            ):
                s, e = int(rec[start]), int(rec[end])
                if text[s:e].lower() != rec[ent].lower():  # offset points elsewhere: take the nearest mention
                    hits = [m.start() for m in re.finditer(re.escape(rec[ent]), text)]
                    if not hits:
                        spans = None
                        break
                    s = min(hits, key=lambda h: abs(h - s))
                    e, fixed = s + len(rec[ent]), fixed + 1
                spans.append((s, e))
            if spans is None:
                dropped["entity text not found"] += 1
                continue
            try:
                text = mark(text, spans[0], spans[1])
            except ValueError:
                dropped["gene and phenotype spans overlap"] += 1
                continue
            rows.append((f"pgr-{split}-{i:05d}", text, rec["RELATION"].strip().lower(), split, rec["FILE_ID"]))
        notes.append(f"{path.relative_to(base.parent)}: {len(records)} instances")
    if not rows:
        raise DataError(f"PGR: no instances read under {base}")
    valid_docs = carve_valid([r[4] for r in rows if r[3] == "train"], seed)
    rows = [
        (sid, text, label, "valid" if split == "train" and doc in valid_docs else split)
        for sid, text, label, split, doc in rows
    ]
    notes.append(f"PGR {corpus} corpus; e1 = gene, e2 = phenotype (from the TSV character offsets); labels true/false")
    notes.append(
        f"no validation split in PGR: {len(valid_docs)} train abstracts ({VALID_FRACTION:.0%}, seed={seed}) "
        "moved to valid"
    )
    if fixed:
        notes.append(f"{fixed} entity offset(s) did not match the entity text: nearest exact mention used")
    for why, n in dropped.items():
        notes.append(f"dropped {n} instance(s): {why}")
    return _finish("pgr", rows, notes)


# ----------------------------------------------------------------------------- ChemProt

CPR_FILES = {"train": "training.txt", "valid": "development.txt", "test": "test.txt"}
SCIBERT_FILES = {"train": "train.txt", "valid": "dev.txt", "test": "test.txt"}
# The BioCreative VI guidelines' grouping of the fine-grained relation types into the five evaluated CPR groups
CPR_GROUP_OF = {
    "UPREGULATOR": "CPR:3",
    "ACTIVATOR": "CPR:3",
    "INDIRECT-UPREGULATOR": "CPR:3",
    "DOWNREGULATOR": "CPR:4",
    "INHIBITOR": "CPR:4",
    "INDIRECT-DOWNREGULATOR": "CPR:4",
    "AGONIST": "CPR:5",
    "AGONIST-ACTIVATOR": "CPR:5",
    "AGONIST-INHIBITOR": "CPR:5",
    "ANTAGONIST": "CPR:6",
    "SUBSTRATE": "CPR:9",
    "PRODUCT-OF": "CPR:9",
    "SUBSTRATE_PRODUCT-OF": "CPR:9",
}
_TOKEN = re.compile(r"\w+|[^\w\s]")


def _read_cpr(path: Path) -> list[list[str]]:
    with open(need_file(path), encoding="utf-8") as handle:
        rows = [line.rstrip("\n").split("\t") for line in handle if line.strip()]
    bad = [i for i, r in enumerate(rows) if len(r) != 9]
    if bad:
        raise DataError(f"{path}: line {bad[0] + 1} has {len(rows[bad[0]])} fields; expected 9")
    return rows


def _nearest(tokens: list[str], index: int, word: str) -> int | None:
    """The token holding ``word`` (alone or hyphen-joined) closest to ``index``; else ``index`` if in range."""
    pattern = re.compile(rf"(?<![A-Za-z]){word}(?![A-Za-z])")
    hits = [k for k, t in enumerate(tokens) if pattern.search(t)]
    if hits:
        return min(hits, key=lambda k: (abs(k - index), k))
    return index if 0 <= index < len(tokens) else None


def _load_cpr_groups(base: Path) -> tuple[list[tuple], list[str]]:
    """Markers go on the anonymised ``chemical``/``gene`` tokens. The published token indices often point at
    another word (not recomputed after anonymisation), so the nearest token of the right kind is used; a mention
    nested inside the other (no such token left) keeps the published index.
    """
    rows, notes, moved, dropped = [], [], Counter(), 0
    for split, fname in CPR_FILES.items():
        records = _read_cpr(base / fname)
        for i, (label, _, _, chem, gene, sentence, *_ids) in enumerate(records):
            tokens = sentence.split(" ")
            c, g = _nearest(tokens, int(chem), "chemical"), _nearest(tokens, int(gene), "gene")
            if c is None or g is None or c == g:
                dropped += 1
                continue
            moved["chemical"] += c != int(chem)
            moved["gene"] += g != int(gene)
            tokens[c] = f"{E1_OPEN} {tokens[c]} {E1_CLOSE}"
            tokens[g] = f"{E2_OPEN} {tokens[g]} {E2_CLOSE}"
            rows.append((f"chemprot-{split}-{i:05d}", " ".join(tokens), label, split))
        notes.append(f"{fname}: {len(records)} candidate pairs")
    notes.append(
        "CPR-group version (Liu et al. 2018 preprocessing): labels CPR:3/4/5/6/9 + NA; mentions are "
        "anonymised to the words 'chemical'/'gene'; e1 = chemical, e2 = gene"
    )
    notes.append(
        f"published token index not on a 'chemical'/'gene' word: nearest such word used for "
        f"{moved['chemical']} chemical and {moved['gene']} gene argument(s); {dropped} pair(s) dropped "
        "(both arguments on one token)"
    )
    return rows, notes


def _entity_types(base: Path) -> dict[str, list[tuple[list[str], Counter]]]:
    """Per split, the anonymised CPR-group sentences (tokens) with a rare-word index to find them again."""
    out = {}
    for split, fname in CPR_FILES.items():
        path = base / fname
        if not path.is_file():
            continue
        sentences = sorted({r[5] for r in _read_cpr(path)})
        out[split] = [_TOKEN.findall(s.lower()) for s in sentences]
    return out


def _align_types(
    tokens: list[str], e1: tuple[int, int], e2: tuple[int, int], anon: list[str]
) -> tuple[str, str] | None:
    """Types of the two marked token runs, read from the aligned anonymised sentence (None if unclear)."""
    seq, where = [], {}
    i = 0
    while i < len(tokens):
        for tag, (s, e) in (("\0e1", e1), ("\0e2", e2)):
            if i == s:
                where[tag] = len(seq)
                seq.append(tag)
                i = e
                break
        else:
            seq.append(tokens[i])
            i += 1
    types = {}
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, seq, anon, autojunk=False).get_opcodes():
        for tag, pos in where.items():
            if op == "replace" and i1 <= pos < i2:
                kinds = {t for t in anon[j1:j2] if t in ("chemical", "gene")}
                if i2 - i1 == j2 - j1 and anon[j1 + pos - i1] in ("chemical", "gene"):  # same length: pair by position
                    kinds = {anon[j1 + pos - i1]}
                if len(kinds) == 1:
                    types[tag] = kinds.pop()
    if len(types) == 2 and types["\0e1"] != types["\0e2"]:
        return types["\0e1"], types["\0e2"]
    return None


def _load_scibert(base: Path, cpr_base: Path) -> tuple[list[tuple], list[str]]:
    """SciBERT JSON lines; ``<< >>`` wraps the earlier argument and ``[[ ]]`` the later one, whatever their type,
    so each sentence is aligned to the anonymised CPR-group copy (same BioCreative split) to tell chemical from gene.
    """
    anon = _entity_types(cpr_base) if cpr_base.is_dir() else {}
    rows, notes, stats, pending = [], [], Counter(), []
    lexicon: dict[str, Counter] = defaultdict(Counter)
    for split, fname in SCIBERT_FILES.items():
        with open(need_file(base / fname), encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
        candidates = anon.get(split, [])
        df = Counter(t for toks in candidates for t in set(toks))
        index = defaultdict(list)
        for j, toks in enumerate(candidates):
            for t in set(toks):
                if len(t) > 2 and df[t] <= 50 and t not in ("chemical", "gene"):
                    index[t].append(j)
        for i, rec in enumerate(records):
            text = rec["text"]
            a = text.index("<< ")
            a_end = text.index(" >>", a + 3)
            b = text.index("[[ ", a_end)
            b_end = text.index(" ]]", b + 3)
            plain = text[:a] + text[a + 3 : a_end] + text[a_end + 3 : b] + text[b + 3 : b_end] + text[b_end + 3 :]
            span_a = (a, a_end - 3)
            span_b = (b - 6, b_end - 9)
            kinds = None
            if candidates:
                matches = list(_TOKEN.finditer(plain.lower()))
                tokens = [m.group() for m in matches]
                run = lambda s: tuple(k for k, m in enumerate(matches) if s[0] <= m.start() < s[1])  # noqa: E731
                ra, rb = run(span_a), run(span_b)
                votes = Counter(j for t in set(tokens) for j in index.get(t, ()))
                # ties go to the earlier candidate: most_common breaks them by insertion order, which set(tokens)
                # makes hash order, so without this a run's typing depended on PYTHONHASHSEED (132 of ChemProt's
                # 10,065 sentences flipped their argument types between runs)
                for j, _ in sorted(votes.items(), key=lambda item: (-item[1], item[0]))[:3]:
                    if ra and rb:
                        kinds = _align_types(tokens, (ra[0], ra[-1] + 1), (rb[0], rb[-1] + 1), candidates[j])
                    if kinds:
                        break
            names = (plain[span_a[0] : span_a[1]].lower(), plain[span_b[0] : span_b[1]].lower())
            if kinds:
                for name, kind in zip(names, kinds):
                    lexicon[name][kind] += 1
            pending.append(
                (f"chemprot-scibert-{split}-{i:05d}", plain, span_a, span_b, names, kinds, rec["label"], split)
            )
        notes.append(f"{fname}: {len(records)} relation instances (positives only)")
    for sid, plain, span_a, span_b, names, kinds, label, split in pending:
        how = "aligned"
        if kinds is None:  # second pass: a mention typed elsewhere in the corpus decides
            how = "unresolved"
            for k, name in enumerate(names):
                votes = lexicon.get(name)
                if votes and votes["chemical"] != votes["gene"]:
                    kind = max(votes, key=votes.get)
                    other = "gene" if kind == "chemical" else "chemical"
                    kinds, how = ((kind, other) if k == 0 else (other, kind)), "lexicon"
                    break
        if kinds == ("gene", "chemical"):
            span_a, span_b = span_b, span_a
        stats[how] += 1
        rows.append((sid, mark(plain, span_a, span_b), label, split))
    notes.append(
        "SciBERT version: 13 fine-grained labels; '<< >>' / '[[ ]]' mark argument order, not type: "
        "types taken from the aligned CPR-group sentence, then e1 = chemical, e2 = gene"
    )
    notes.append(
        f"entity types: {stats['aligned']} from the aligned sentence, {stats['lexicon']} from the same mention "
        f"typed elsewhere, {stats['unresolved']} unresolved (kept in text order: e1 = '<<' argument)"
    )
    return rows, notes


def _group_cpr5(rows: list[tuple], notes: list[str], folder: Path) -> tuple[list[tuple], list[str]]:
    """SciBERT's fine-grained labels mapped to their CPR group: the paper's ChemProt task (5 relation types, positive
    pairs only, about 10k sentences), without the 77% no-relation candidates of the CPR-group version."""
    unknown = sorted({label for *_, label, _ in rows} - set(CPR_GROUP_OF))
    if unknown:
        raise DataError(f"{folder}: field 'label' has {unknown}; expected one of {sorted(CPR_GROUP_OF)}")
    grouped = [
        (sid.replace("chemprot-scibert-", "chemprot-cpr5-"), text, CPR_GROUP_OF[label], split)
        for sid, text, label, split in rows
    ]
    return grouped, [
        *notes,
        "fine-grained labels grouped into CPR:3/4/5/6/9 (BioCreative VI guidelines), positives only",
    ]


def load_chemprot(raw_dir: Path | str, version: str = "cpr_groups", folder: str = "chemprot") -> RECorpus:
    """ChemProt in one of its derived sentence-level versions (original BioCreative files not available):
    ``cpr_groups`` (CPR groups + NA candidates), ``scibert`` (13 fine-grained labels), ``cpr5`` (SciBERT's
    positives in the five CPR groups, the paper's task)."""
    root = _subdir(raw_dir, folder)
    cpr_base = root / "cpr_groups_att-chemprot"
    if version == "cpr_groups":
        rows, notes = _load_cpr_groups(cpr_base)
    elif version in ("scibert", "cpr5"):
        rows, notes = _load_scibert(root / "scibert", cpr_base)
        if version == "cpr5":
            rows, notes = _group_cpr5(rows, notes, root / "scibert")
    else:
        raise DataError(f"chemprot: version={version!r}; allowed 'cpr_groups', 'scibert', 'cpr5'")
    return _finish(f"chemprot-{version}", rows, notes)


# ----------------------------------------------------------------------------- i2b2 2010

_I2B2 = re.compile(r'c="(.*)" (\d+):(\d+) (\d+):(\d+)\|\|r="([^"]+)"\|\|c="(.*)" (\d+):(\d+) (\d+):(\d+)\s*$')


def _i2b2_docs(folder: Path, split: str, rows: list, dropped: Counter) -> int:
    n = 0
    for rel in sorted((folder / "rel").glob("*.rel")):
        txt = need_file(folder / "txt" / f"{rel.stem}.txt")
        lines = txt.read_text(encoding="utf-8").split("\n")
        for k, line in enumerate(rel.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            m = _I2B2.match(line)
            if not m:
                raise DataError(f'{rel}: line {k + 1} is not \'c=".." L:T L:T||r=".."||c=".." L:T L:T\'')
            _, l1, s1, l1e, e1, label, _, l2, s2, l2e, e2 = m.groups()
            if len({l1, l1e, l2, l2e}) != 1:
                dropped["concepts on different lines"] += 1
                continue
            tokens = lines[int(l1) - 1].split()
            if max(int(e1), int(e2)) >= len(tokens):
                raise DataError(f"{rel}: line {k + 1} points past the end of {txt.name} line {l1}")
            spans = {int(s1): (E1_OPEN, int(e1), E1_CLOSE), int(s2): (E2_OPEN, int(e2), E2_CLOSE)}
            out, i = [], 0
            while i < len(tokens):
                if i in spans:
                    open_, end, close = spans[i]
                    out += [open_, *tokens[i : end + 1], close]
                    i = end + 1
                else:
                    out.append(tokens[i])
                    i += 1
            if len([t for t in out if t in schema.ENTITY_MARKERS]) != 4:
                dropped["overlapping concepts"] += 1
                continue
            rows.append((f"i2b2-{split}-{rel.stem}-{k:04d}", " ".join(out), label, split, rel.stem))
            n += 1
    return n


def load_i2b2(dir: Path | str, seed: int = 0) -> RECorpus:
    """i2b2/VA 2010 relations (DUA data, supplied by the user): ``txt/*.txt`` + ``rel/*.rel``, either flat or in
    ``train/`` and ``test/`` folders. e1 = first concept, e2 = second; only annotated (positive) pairs.
    """
    base = Path(dir)
    if not base.is_dir():
        raise DataError(f"i2b2 2010 data not found at {base} (DUA data, not shipped): skipping i2b2")
    folders = {s: base / s for s in schema.SPLITS if (base / s / "rel").is_dir()} or {"train": base}
    if not any((f / "rel").is_dir() for f in folders.values()):
        raise DataError(f"i2b2 2010: no rel/ folder under {base}; expected txt/NAME.txt and rel/NAME.rel")
    rows, dropped, notes = [], Counter(), []
    for split, folder in folders.items():
        n = _i2b2_docs(folder, split, rows, dropped)
        notes.append(f"{split}: {n} relations from {folder}")
    carve = [s for s in ("valid", "test") if s not in folders]
    for split in carve:  # whole documents, seeded, so no note leaks into two splits
        docs = carve_valid([r[4] for r in rows if r[3] == "train"], seed + (split == "test"))
        rows = [(a, b, c, split if d == "train" and doc in docs else d, doc) for a, b, c, d, doc in rows]
        notes.append(
            f"no {split} folder: {len(docs)} train documents ({VALID_FRACTION:.0%}, seed={seed}) moved to {split}"
        )
    for why, n in dropped.items():
        notes.append(f"dropped {n} relation(s): {why}")
    notes.append("positive pairs only (negatives would need the concept files)")
    return _finish("i2b2", [r[:4] for r in rows], notes)


# ----------------------------------------------------------------------------- synthetic default

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _words(rng: np.random.Generator, n: int) -> list[str]:
    words: list[str] = []
    seen = set()
    while len(words) < n:
        w = "".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 4))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def synthetic_relations(
    n_sentences: int = 2000, n_classes: int = 5, seed: int = 0, vocab_size: int = 400, signal: float = 0.85
) -> RECorpus:
    """Seeded, learnable but not trivial relation corpus (no real RE corpus ships with a package).

    Each class owns 3 trigger words; the text between the entities holds one trigger of the true class with
    probability ``signal`` (otherwise one of another class), shared distractor words and noise; classes are
    Zipf-skewed (p_c proportional to 1/(c+1)); split 80/10/10.
    """
    if n_classes < 2 or n_sentences < 10:
        raise DataError(f"synthetic_relations: n_classes={n_classes}, n_sentences={n_sentences}; need >= 2 and >= 10")
    rng = np.random.default_rng(seed)
    words = _words(rng, vocab_size + 3 * n_classes + 8)
    triggers = [words[3 * c : 3 * c + 3] for c in range(n_classes)]
    distract = words[3 * n_classes : 3 * n_classes + 8]
    vocab = words[3 * n_classes + 8 :]
    entities = vocab[: max(20, vocab_size // 5)]
    classes = [f"rel{c}" for c in range(n_classes)]
    probs = 1.0 / np.arange(1, n_classes + 1)
    probs /= probs.sum()
    labels = rng.choice(n_classes, size=n_sentences, p=probs)
    splits = np.array(["train"] * n_sentences, dtype=object)
    order = rng.permutation(n_sentences)
    splits[order[: n_sentences // 10]] = "valid"
    splits[order[n_sentences // 10 : n_sentences // 5]] = "test"
    rows = []
    for i, c in enumerate(labels):
        source = c if rng.random() < signal else rng.choice([k for k in range(n_classes) if k != c])
        middle = [str(rng.choice(triggers[source]))] + list(rng.choice(distract, size=int(rng.integers(1, 3))))
        middle += list(rng.choice(vocab, size=int(rng.integers(0, 4))))
        middle = [middle[k] for k in rng.permutation(len(middle))]
        e1 = " ".join(rng.choice(entities, size=int(rng.integers(1, 3))))
        e2 = " ".join(rng.choice(entities, size=int(rng.integers(1, 3))))
        pre = " ".join(rng.choice(vocab, size=int(rng.integers(0, 6))))
        post = " ".join(rng.choice(vocab, size=int(rng.integers(0, 6))))
        text = normalise_space(f"{pre} {E1_OPEN} {e1} {E1_CLOSE} {' '.join(middle)} {E2_OPEN} {e2} {E2_CLOSE} {post}")
        rows.append((f"syn-{i:06d}", text, classes[c], str(splits[i])))
    notes = [
        f"synthetic relation corpus (seed={seed}): {n_sentences} sentences, {n_classes} Zipf-skewed classes, "
        f"vocabulary {vocab_size} invented words; one class trigger word between <e1> and <e2> "
        f"(true class with p={signal}, else another class), plus shared distractors and noise; split 80/10/10"
    ]
    return _finish("synthetic-re", rows, notes)


# ----------------------------------------------------------------------------- statistics


def re_statistics(corpus: RECorpus) -> pd.DataFrame:
    """One row per split: sentence and class counts, then one column per class."""
    table = corpus.table
    counts = pd.crosstab(table["split"], table["label"]).reindex(columns=corpus.classes, fill_value=0)
    stats = pd.DataFrame({"sentences": counts.sum(axis=1), "classes": (counts > 0).sum(axis=1)})
    out = pd.concat([stats, counts], axis=1)
    out = out.reindex([s for s in schema.SPLITS if s in out.index])
    out.index.name, out.columns.name = "split", None
    return out.reset_index()
