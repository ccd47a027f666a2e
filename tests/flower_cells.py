"""Runs tiny cells in the engine and on Flower's simulation and writes what each produced, for test_flower.py.

A separate process, because the tests start it inside a network namespace with only loopback up
(``loopback.py``): Ray and Flower then cannot reach anything but this machine. Each cell is trained by
both runtimes from the same recipe; the output holds their histories, channel logs, and digests of the
final global weights and of every client's private state.

Usage: python tests/flower_cells.py --out results.json --work DIR [--only CASE ...]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fedrepro.fl.algorithm import AlgorithmSettings  # noqa: E402
from fedrepro.fl.algorithms import REGISTRY  # noqa: E402
from fedrepro.fl.engine import EngineSettings  # noqa: E402
from fedrepro.fl.runtime import CellRecipe, build_runtime  # noqa: E402
from fedrepro.models.patches import PatchSpec  # noqa: E402
from toy import ToyQATask, relation_task  # noqa: E402

QA_SIZES = {"a": 8, "b": 6, "c": 4}
QA_ALGORITHMS = ("fedavg", "fedper", "fedmatch")
"""Beside the relation cell (which every algorithm runs): a QA cross-encoder with a private head (FedPer), a
patch inside its BERT (FedMatch), and each client scoring its own model, which on Flower happens on its node."""
CRASH_AFTER_ROUND = 1
RESUME_CASE = "resume/scaffold"


def federated_algorithms() -> list[str]:
    """Every registered algorithm that federates (the others never leave the process, on any runtime)."""
    return sorted(name for name, cls in REGISTRY.items() if cls.federated)


def all_cases() -> list[str]:
    return [f"relation/{name}" for name in federated_algorithms()] + [f"qa/{name}" for name in QA_ALGORITHMS] + [RESUME_CASE]


def recipe(case: str, rounds: int = 2) -> CellRecipe:
    """Every knob of every algorithm switched on, so each hook does real work; 2 of 3 clients per round."""
    family, algorithm = case.split("/")
    knobs = AlgorithmSettings(weighting="size", fedprox_mu=0.1, patch=PatchSpec("horizontal", "lr", size=8), moon_mu=1.0,
                              moon_projection_dim=8, fedcmc_mu=1.0, fedcmc_temperature=0.5, seed=0)
    relation = family in ("relation", "resume")
    settings = EngineSettings(rounds=rounds, local_epochs=1, clients_per_round=2, lr=1e-3, batch_size=8 if relation else 4,
                              warmup_fraction=0.1, max_grad_norm=1.0, seed=0, eval_every=1,
                              eval_split="test" if relation else "valid")
    build = relation_task if relation else functools.partial(ToyQATask, QA_SIZES)
    return CellRecipe(build_task=build, algorithm=algorithm, algorithm_settings=knobs, settings=settings,
                      fingerprint=f"{case}-{rounds}", threads=1)


def digest(tensor: torch.Tensor) -> str:
    raw = tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
    return f"{tensor.dtype}{tuple(tensor.shape)}:" + hashlib.sha256(raw).hexdigest()[:16]


def outcome(engine) -> dict:
    state = engine.state
    return {
        "history": state.history,
        "messages": [m.to_record() for m in engine.channel.messages],
        "scalars": [m.to_record() for m in engine.channel.scalars],
        "global": {name: digest(t) for name, t in state.global_weights.items()},
        "clients": {c: {name: digest(t) for name, t in s.items()} for c, s in state.client_states.items()},
        "steps": state.client_steps,
        "shared": engine.shared_names,
        "private": engine.private_names,
        "server_checkpoint_clients": sorted(p.name for p in (engine.checkpoint_dir / "latest" / "clients").iterdir()),
    }


class Crash(RuntimeError):
    """Stands for the server side dying mid-run."""


def crash_after_round(record: dict) -> None:
    if record["round"] == CRASH_AFTER_ROUND:
        raise Crash(f"server killed after round {CRASH_AFTER_ROUND}")


def run_case(case: str, work: Path) -> dict:
    if case == RESUME_CASE:
        return run_resume(work)
    result = {}
    for runtime in ("engine", "flower-simulation"):
        engine = build_runtime(recipe(case), runtime, work / case / runtime, progress=False)
        engine.run()
        result[runtime] = outcome(engine)
    return result


def run_resume(work: Path) -> dict:
    """SCAFFOLD (server and client state both) for 3 rounds on Flower: once straight through, and once with the
    server killed after round 1 and started again from its checkpoint, its nodes' states left where they were."""
    result = {}
    straight = build_runtime(recipe(RESUME_CASE, rounds=3), "flower-simulation", work / "resume" / "straight", progress=False)
    straight.run()
    result["straight"] = outcome(straight)
    folder = work / "resume" / "killed"
    killed = build_runtime(recipe(RESUME_CASE, rounds=3), "flower-simulation", folder, progress=False,
                           on_round_end=crash_after_round)
    try:
        killed.run()
        raise AssertionError("the crash did not stop the run")
    except Crash:
        pass
    resumed = build_runtime(recipe(RESUME_CASE, rounds=3), "flower-simulation", folder, progress=False)
    result["resumed_from_round"] = resumed.state.next_round
    resumed.run()
    result["resumed"] = outcome(resumed)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="cases to run (default: all)")
    args = parser.parse_args()
    results = {}
    for case in args.only or all_cases():
        results[case] = run_case(case, args.work)
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
