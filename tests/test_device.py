"""``train.device``: resolved with the params, an absent GPU refused in one line naming the key, and the engine's
device path (model, batches, kept state, checkpoints) exercised on the CPU through the same code a GPU runs."""

import pytest
import torch

from fedrepro import device as devices
from fedrepro.config import parse_params
from fedrepro.errors import ConfigError
from fedrepro.fl.engine import Engine, EngineSettings
from test_config import with_change
from toy import ToyTask, make_algorithm


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    """A machine without NVIDIA's driver, whatever this one has."""
    monkeypatch.setattr(devices, "DRIVER", tmp_path / "no-driver")


def test_auto_is_the_cpu_where_there_is_no_gpu_and_cpu_stays(no_gpu):
    assert devices.resolve_device("auto") == "cpu"
    assert devices.resolve_device("cpu") == "cpu"
    assert parse_params(with_change("train.device", "auto")).train.device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("setting", ["cuda", "cuda:1"])
def test_asking_for_a_gpu_that_is_not_there_stops_at_the_params_naming_the_key(setting):
    with pytest.raises(ConfigError) as raised:
        parse_params(with_change("train.device", setting))
    message = str(raised.value)
    assert "train.device" in message and repr(setting) in message and "no GPU" in message
    assert "\n" not in message.strip()


@pytest.mark.parametrize("setting", ["gpu", "cuda:", "CPU", "cuda:x"])
def test_a_device_that_is_no_setting_is_refused_with_what_is_allowed(setting):
    with pytest.raises(ConfigError, match=r"train\.device.*expected auto, cpu, cuda or cuda:N"):
        parse_params(with_change("train.device", setting))


def test_batches_of_any_shape_go_to_the_device_and_the_rest_stays():
    batch = {"ids": torch.ones(2, dtype=torch.long), "pair": (torch.zeros(1), [torch.ones(1)]), "name": "q1"}
    moved = devices.to_device(batch, torch.device("meta"))
    assert moved["ids"].device.type == "meta" and moved["pair"][0].device.type == "meta"
    assert isinstance(moved["pair"], tuple) and moved["pair"][1][0].device.type == "meta"
    assert moved["name"] == "q1"


@pytest.mark.parametrize("raw", ["0", "1.5", "half"])
def test_a_gpu_share_outside_zero_to_one_is_refused(monkeypatch, raw):
    monkeypatch.setenv(devices.GPU_SHARE_ENV, raw)
    with pytest.raises(ConfigError, match=devices.GPU_SHARE_ENV):
        devices.gpu_share("cuda")
    assert devices.gpu_share("cpu") == 0.0, "a CPU cell asks for no GPU"


def test_a_cpu_cell_asks_ray_for_no_gpu_and_a_gpu_cell_for_its_share(monkeypatch, no_gpu):
    pytest.importorskip("flwr", reason="Flower is not installed here (the GPU check's image has none)")
    from fedrepro.fl.flower.common import ray_backend_config

    monkeypatch.delenv("FEDREPRO_STAGE_RAY", raising=False)
    assert ray_backend_config(1)["client_resources"] == {"num_cpus": 1, "num_gpus": 0.0}
    assert ray_backend_config(1)["init_args"]["num_gpus"] == 0, "no driver: Ray need not look for GPUs"
    monkeypatch.setenv(devices.GPU_SHARE_ENV, "0.5")
    assert ray_backend_config(2, "cuda")["client_resources"] == {"num_cpus": 2, "num_gpus": 0.5}


def _engine(tmp_path, device: str) -> Engine:
    settings = EngineSettings(
        rounds=2,
        local_epochs=1,
        clients_per_round=0,
        lr=0.05,
        batch_size=4,
        warmup_fraction=0.0,
        max_grad_norm=1.0,
        seed=3,
        device=device,
    )
    return Engine(ToyTask({"a": 12, "b": 8}), make_algorithm("scaffold"), settings, tmp_path, "run", progress=False)


def test_the_engine_keeps_model_weights_and_client_state_on_its_device_and_resumes_there(tmp_path):
    """SCAFFOLD keeps a control variate per client and one on the server: all of it lives where the model does, also
    after a resume from the checkpoint (written from the CPU, read onto the device)."""
    engine = _engine(tmp_path, "cpu")
    engine.run()
    device = torch.device("cpu")
    assert all(p.device == device for p in engine.model.parameters())
    tensors = [
        *engine.state.global_weights.values(),
        *(t for s in engine.state.client_states.values() for t in s.values()),
    ]
    assert tensors and all(t.device == device for t in tensors)
    resumed = _engine(tmp_path, "cpu")
    assert resumed.state.next_round == 2
    assert all(t.device == device for t in resumed.state.global_weights.values())
    assert all(torch.equal(resumed.state.global_weights[n], t) for n, t in engine.state.global_weights.items())


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (scripts/gpu_check.sh runs these on one)")


@GPU
@pytest.mark.parametrize("algorithm", ["scaffold", "fedprox", "fedavg"])
def test_on_a_gpu_every_tensor_lives_there_and_a_run_repeats_bit_for_bit(tmp_path, algorithm):
    finals = []
    for attempt in (1, 2):
        settings = EngineSettings(
            rounds=2,
            local_epochs=1,
            clients_per_round=0,
            lr=0.05,
            batch_size=4,
            warmup_fraction=0.0,
            max_grad_norm=1.0,
            seed=3,
            device="cuda",
        )
        engine = Engine(
            ToyTask({"a": 12, "b": 8}),
            make_algorithm(algorithm),
            settings,
            tmp_path / str(attempt),
            "run",
            progress=False,
        )
        engine.run()
        assert all(p.is_cuda for p in engine.model.parameters())
        assert all(t.is_cuda for t in engine.state.global_weights.values())
        finals.append({name: tensor.cpu() for name, tensor in engine.state.global_weights.items()})
    assert all(torch.equal(finals[0][name], finals[1][name]) for name in finals[0])


@GPU
def test_on_a_gpu_auto_is_the_gpu_and_bf16_follows_its_capability():
    from fedrepro.hardware import resolve_precision

    device = devices.resolve_device("auto")
    assert device == "cuda"
    expected = "bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp32"
    assert resolve_precision("auto", device) == expected
