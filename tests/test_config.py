"""Params validation: one line naming the key, the bad value and what is allowed; scale presets fill nulls."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedrepro.config import load_params, parse_params, read_raw_params
from fedrepro.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
RAW = read_raw_params(ROOT / "params.yaml")


def with_change(path: str, value):
    raw = copy.deepcopy(RAW)
    *parents, last = path.split(".")
    target = raw
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return raw


def test_defaults_are_valid_and_filled_from_the_scale():
    params = parse_params(RAW)
    assert params.scale == "embedded"
    assert params.train.rounds == RAW["scales"]["embedded"]["train"]["rounds"]
    assert params.model.backbone == "tiny"


def test_switching_scale_moves_every_null_key():
    params = parse_params(with_change("scale", "cpu"))
    assert params.model.backbone == "minilm"
    assert params.data.max_questions_per_client == RAW["scales"]["cpu"]["data"]["max_questions_per_client"]


def test_a_scale_fills_a_per_client_mapping_and_a_name_that_is_no_client_is_refused():
    raw = with_change("scales.cpu.mine.client_max_triples", {"bioasq": 500})
    raw["scale"] = "cpu"
    raw["data"]["source"] = "mirror"
    params = parse_params(raw)
    assert params.mine.client_max_triples == {"bioasq": 500}
    assert params.data.client_train_questions == RAW["scales"]["cpu"]["data"]["client_train_questions"] == {"fiqa": 200}
    raw["scales"]["cpu"]["data"]["client_train_questions"] = {"fiqaa": 200}
    with pytest.raises(
        ConfigError,
        match=r"data.client_train_questions names \['fiqaa'\], which are no QA collection "
        r"or embedded domain; allowed \['privacyqa', 'bioasq', 'fiqa', 'insuranceqa', "
        r"'medquad', 'life-insurance'",
    ):
        parse_params(raw)


def test_an_explicit_value_wins_over_the_scale():
    assert parse_params(with_change("train.rounds", 3)).train.rounds == 3


@pytest.mark.parametrize(
    "flags, cap, expected",
    [
        (["avx2"], None, "fp32"),  # emulated bf16: 11-25x slower than fp32 (bench/bench_bf16_speed.py)
        (["avx2", "avx512f", "avx512_bf16"], None, "bf16"),
        (["avx2", "avx512f", "avx512_bf16", "amx_bf16"], None, "bf16"),
        (
            ["avx2", "avx512f", "avx512_bf16"],
            "AVX2",
            "fp32",
        ),  # another machine's kernels, as bench_isa_spread selects them
        (["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "AVX512_CORE_BF16", "bf16"),
    ],
)
def test_auto_precision_is_bf16_only_where_the_cpu_has_bf16_instructions(monkeypatch, flags, cap, expected):
    import fedrepro.hardware as hardware

    monkeypatch.setattr(hardware, "_cpu", lambda: ("test cpu", flags))
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    else:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert parse_params(with_change("train.precision", "auto")).train.precision == expected
    assert parse_params(with_change("train.precision", "bf16")).train.precision == "bf16"  # an explicit choice stays


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (
            "fedmatch.table2",
            ["fedmatch_h_lr", "fedmatch_x_lr"],
            "fedmatch.table2 lists ['fedmatch_x_lr'], which fedmatch.methods does not run",
        ),
        ("fedmatch.settings.fidelity", "authors", "fedmatch.settings.fidelity = 'authors'"),
        ("model.keep_layers", -1, "model.keep_layers = -1"),
        ("train.lr", -0.1, "train.lr = -0.1"),
        ("train.clients_per_round", 9, "train.clients_per_round = 9: more than the 5 clients; allowed 0 (all) .. 5"),
        (
            "fedmatch.settings.clients_sampled",
            9,
            "fedmatch.settings.clients_sampled = 9: more than the 5 clients; allowed 1 .. 5",
        ),
        ("mine.backend", "lucene", "mine.backend = 'lucene'"),
        (
            "data.own_files",
            {"clinic_guest.csv": "0" * 64},
            "'clinic_guest.csv': expected a relative path under data.mirror, collection folder first",
        ),
        (
            "data.own_files",
            {"fate_vfl/../../etc/passwd": "0" * 64},
            "'fate_vfl/../../etc/passwd': expected a relative path",
        ),
        (
            "partition.collections",
            ["fiqa", "bank_faq"],
            "partition.collections.1 = 'bank_faq': allowed ['insuranceqa', "
            "'medquad', 'bioasq', 'fiqa', 'privacyqa'], or a collection of your own "
            "named in data.qa_layouts",
        ),
        (
            "data.qa_layouts",
            {"bank_faq": "stackexchange"},
            "data.qa_layouts.bank_faq = 'stackexchange': Input should be "
            "'insuranceqa', 'medquad', 'bioasq', 'fiqa' or 'privacyqa'",
        ),
        (
            "data.re_corpora",
            ["pgr", "my_genes"],
            "data.re_corpora.1 = 'my_genes': allowed ['pgr', 'chemprot_cpr5', "
            "'chemprot_cpr_groups', 'chemprot_scibert', 'i2b2'], or a corpus of your own",
        ),
        (
            "data.own_files",
            {"fate_vfl/clinic_hetero_guest.csv": "ABC"},
            "'fate_vfl/clinic_hetero_guest.csv': 'ABC' is no sha256; expected 64 lowercase hex digits",
        ),
        ("scale", "huge", "scale = 'huge'"),
        ("train.local_epochs", KeyError, "train.local_epochs is missing"),
        ("train.learning_rate", 0.1, "train.learning_rate is not a known key"),
        (
            "train.runtime",
            "ray",
            "train.runtime = 'ray': Input should be 'engine', 'flower-simulation' or 'flower-deployment'",
        ),
        ("train.reply_timeout", 0, "train.reply_timeout = 0: Input should be greater than 0"),
        ("train.run_timeout", -1, "train.run_timeout = -1: Input should be greater than 0"),
        (
            "train.silo_local",
            True,
            "train.silo_local = True: needs train.runtime flower-simulation or flower-deployment",
        ),
    ],
)
def test_bad_params_name_the_key_and_value(path, value, expected):
    with pytest.raises(ConfigError) as error:
        parse_params(with_change(path, value))
    message = str(error.value)
    assert expected in message and "\n" not in message


@pytest.mark.parametrize(
    "path, build",
    [
        ("fedmatch.methods", "fedrepro.fedmatch.cells:table_cells"),
        ("fedmatch.sweeps.data_ratio_methods", "fedrepro.fedmatch.cells:sweep_cells"),
        ("fedcmc.sweeps.vectors", "fedrepro.fedcmc.cells:all_cells"),
        ("ssvfnas.methods", "fedrepro.ssvfnas.cells:all_cells"),
    ],
)
def test_a_papers_method_names_are_checked_by_its_own_cells_when_its_grid_is_built(path, build):
    """config imports no paper's method list (every stage would depend on all three papers); the paper's cells
    module refuses an unknown name, naming the key, its position and what is allowed."""
    import importlib

    *parents, last = path.split(".")
    names = RAW
    for key in parents:
        names = names[key]
    names = [*names[last], "nonesuch"]
    params = parse_params(with_change(path, names))
    module, function = build.split(":")
    with pytest.raises(ConfigError) as error:
        getattr(importlib.import_module(module), function)(params)
    assert str(error.value).startswith(f"params: {path}.{len(names) - 1} = 'nonesuch': allowed [")


@pytest.mark.parametrize("key, layouts", [("qa_layouts", {"bank_faq": "fiqa"}), ("re_layouts", {"my_genes": "pgr"})])
def test_own_layouts_at_the_embedded_source_are_refused_not_silently_ignored(key, layouts):
    raw = with_change(f"data.{key}", layouts)
    with pytest.raises(ConfigError) as error:
        parse_params(raw)
    assert str(error.value) == (
        f"params: data.{key} = {layouts!r}: applies only with data.source mirror or "
        f"official (the embedded source prepares only its own data); set data.source: mirror, or "
        f"data.{key}: {{}}"
    )
    raw["data"]["source"] = "mirror"
    assert getattr(parse_params(raw).data, key) == layouts


def write_params(folder: Path, raw: dict) -> None:
    """``raw`` (``read_raw_params``' form) as a project's params.yaml and scales/<scale>.yaml files."""
    (folder / "scales").mkdir(parents=True, exist_ok=True)
    for scale, presets in raw["scales"].items():
        (folder / "scales" / f"{scale}.yaml").write_text(yaml.safe_dump(presets))
    (folder / "params.yaml").write_text(yaml.safe_dump({k: v for k, v in raw.items() if k != "scales"}))


def test_presets_come_from_the_scale_files_and_an_old_scales_key_is_refused(tmp_path):
    write_params(tmp_path, with_change("scales.embedded.train.rounds", 7))
    assert load_params(tmp_path / "params.yaml").train.rounds == 7
    (tmp_path / "scales" / "embedded.yaml").unlink()
    with pytest.raises(ConfigError, match=r"^params: scales/embedded.yaml is missing or empty"):
        load_params(tmp_path / "params.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(RAW))  # the layout before the presets had files of their own
    with pytest.raises(ConfigError, match=r"params.yaml: scales: the presets now live in scales/<scale>.yaml"):
        load_params(tmp_path / "params.yaml")
    write_params(tmp_path, with_change("scales.embedded.train.roundz", 7))
    with pytest.raises(ConfigError, match=r"^params: scales/embedded.yaml: train.roundz names no key of params.yaml$"):
        load_params(tmp_path / "params.yaml")


def test_a_stage_with_bad_params_exits_nonzero_in_one_line_and_writes_nothing(tmp_path):
    write_params(tmp_path, with_change("train.lr", -1))
    result = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "acquire.py")], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "train.lr = -1" in result.stderr
    assert not (tmp_path / "data").exists()


def test_the_layouts_a_users_data_may_follow_are_the_loaders_there_are():
    from fedrepro.config import QA_LAYOUTS, RE_LAYOUTS
    from fedrepro.data.prepare import RE_LOADERS
    from fedrepro.data.qa_collections import LOADERS

    assert set(QA_LAYOUTS) == set(LOADERS) and set(RE_LAYOUTS) == set(RE_LOADERS)
