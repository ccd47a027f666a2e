"""Where a pretrained backbone comes from: a local directory a user saved, and one clear line when nothing can load
it."""

import shutil

import pytest
import torch

from fedrepro.errors import ConfigError
from fedrepro.models.backbone import build_encoder, check_loadable, load_tokenizer, minilm_path


def test_a_local_directory_backbone_loads_the_saved_model(tmp_path):
    """The paper scale's route for a user with their own copy of the weights: model.backbone names the directory."""
    saved = tmp_path / "my weights" / "minilm"
    shutil.copytree(minilm_path(), saved)
    tokenizer, packaged = load_tokenizer(str(saved)), load_tokenizer("minilm")
    text = "Is my dental work covered?"
    assert tokenizer(text)["input_ids"] == packaged(text)["input_ids"]
    local = build_encoder(str(saved), len(tokenizer), keep_layers=2, param="fedcmc.settings.backbone")
    reference = build_encoder("minilm", len(packaged), keep_layers=2)
    assert len(local.encoder.layer) == 2
    for (name, value), (_, expected) in zip(local.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(value, expected), name


def test_a_directory_without_a_saved_model_is_refused_naming_the_param(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"fedcmc.settings.backbone = '.*empty': the directory has no config.json"):
        check_loadable(str(tmp_path / "empty"), "fedcmc.settings.backbone")


def test_a_path_that_does_not_exist_is_refused_with_the_ways_out():
    with pytest.raises(
        ConfigError,
        match=r"model.backbone = './no-such-weights': no such directory; use a directory "
        r"holding a saved copy .* 'minilm' .* or 'tiny'",
    ):
        check_loadable("./no-such-weights")


def test_an_unreachable_hub_name_stops_in_one_line_naming_param_value_and_ways_out(monkeypatch):
    """Without the hub, transformers retries for about 50 s and raises a raw OSError twice; the probe asks once."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens, refused at once
    with pytest.raises(ConfigError) as caught:
        load_tokenizer("fedrepro-tests/never-cached-model", param="fedcmc.settings.backbone")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "params: fedcmc.settings.backbone = 'fedrepro-tests/never-cached-model' is no local "
        "directory, the hub at http://127.0.0.1:9 did not answer"
    )
    assert "'minilm'" in message and "'tiny'" in message


def test_hub_offline_mode_refuses_an_uncached_name_without_asking_the_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://fedrepro-tests.invalid")
    with pytest.raises(
        ConfigError,
        match=r"model.backbone = 'fedrepro-tests/offline-model' is no local directory, "
        r"HF_HUB_OFFLINE is set",
    ):
        build_encoder("fedrepro-tests/offline-model", 100)


def test_tiny_is_built_not_loaded():
    check_loadable("tiny")
