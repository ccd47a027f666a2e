"""What split learning over the channel costs, and what the Gaussian mechanism's clipping costs, in SS-VFNAS.

1. Split vs un-split (issue target: <= 1.3x). The same bottom networks and top, the same initial weights, the
   same batches and per-party SGD (momentum, weight decay, gradient clipping per party) trained for the same
   steps: once through ``SplitTraining`` (every activation and returned gradient crosses the channel, which
   copies and counts it), once as one ordinary ``nn.Module`` with a single ``loss.backward()``. Both end at the
   same weights (printed as the largest difference), so the ratio is the protocol's overhead alone.
2. Clipping. SS-VFNAS clips what is *exchanged*: each sample's activation row N_j[i] and each sample's returned
   gradient row dL/dN_j[i]. These are per-sample already, so per-sample clipping is one norm per row and one
   multiply over the batch (``GaussianMechanism.clip_tensor``), with no per-sample parameter gradients
   (torch.func / opacus grad samplers are for DP-SGD on weights, which SS-VFNAS does not do). Printed: a split
   step with clipping only and with clipping + noise, against no mechanism; and the vectorised clip against a
   Python loop over samples, on one batch.

Data: scikit-learn's digits in halves (K = 2) and quarters (K = 4), the embedded SS-VFNAS views; bottoms are
the hand-designed conv baseline at the given width. One torch thread, as ``ssvfnas.threads``. Each timing is
the median of ``--repeats`` alternating runs.
Usage: python bench/bench_ssvfnas_split.py [--steps 200] [--batch 32] [--width 8] [--repeats 5]
"""

import argparse
import copy
import statistics
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedrepro.data.vertical import digits_halves, digits_quarters
from fedrepro.vfl.privacy import GaussianMechanism
from fedrepro.vfl.protocol import Party, VerticalProtocol
from fedrepro.vfl.search import SplitTraining, batch_at
from fedrepro.vfl.spaces import hand_designed

OUT_DIM, LR, MOMENTUM, WEIGHT_DECAY, GRAD_CLIP = 8, 0.05, 0.9, 3e-4, 5.0
CLIP_FORWARD, CLIP_BACKWARD, SIGMA = 5.0, 0.2, 1.0


def views(dataset) -> tuple[list[torch.Tensor], torch.Tensor]:
    features = [
        torch.tensor(frame.drop(columns=["sample_id"]).to_numpy(np.float32) / 16.0).reshape(-1, *shape)
        for frame, shape in zip(dataset.parties, dataset.shapes)
    ]
    return features, torch.tensor(dataset.labels, dtype=torch.long)


def networks(features: list[torch.Tensor], width: int, classes: int = 10) -> tuple[list[nn.Module], nn.Module]:
    torch.manual_seed(0)
    bottoms = [hand_designed("conv", x.shape[1], OUT_DIM, width=width) for x in features]
    return bottoms, nn.Linear(len(features) * OUT_DIM, classes)


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def run_split(features, labels, bottoms, top, steps, batch, mechanisms=(None, None)) -> tuple[float, list[nn.Module]]:
    bottoms, top = copy.deepcopy(bottoms), copy.deepcopy(top)
    label = len(features) - 1
    parties = [
        Party(k, x, b, labels if k == label else None, top if k == label else None)
        for k, (x, b) in enumerate(zip(features, bottoms))
    ]
    protocol = VerticalProtocol(
        parties, forward_mechanisms=mechanisms[0], backward_mechanism=mechanisms[1], split_sizes={"train": len(labels)}
    )
    training = SplitTraining(
        protocol, [sgd(p.weight_parameters()) for p in parties], [None] * len(parties), grad_clip=GRAD_CLIP
    )
    indices = torch.arange(len(labels))
    started = time.perf_counter()
    training.run(indices, indices, batch, steps)
    return time.perf_counter() - started, bottoms + [top]


class Unsplit(nn.Module):
    def __init__(self, bottoms: list[nn.Module], top: nn.Module) -> None:
        super().__init__()
        self.bottoms, self.top = nn.ModuleList(bottoms), top

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return self.top(torch.cat([b(x) for b, x in zip(self.bottoms, xs)], dim=1))


def run_unsplit(features, labels, bottoms, top, steps, batch) -> tuple[float, list[nn.Module]]:
    model = Unsplit(copy.deepcopy(bottoms), copy.deepcopy(top))
    # the label party's optimizer holds its bottom and the top, as in the split run
    groups = [list(b.parameters()) for b in model.bottoms[:-1]] + [
        list(model.bottoms[-1].parameters()) + list(model.top.parameters())
    ]
    optimizers = [sgd(g) for g in groups]
    indices = torch.arange(len(labels))
    started = time.perf_counter()
    for step in range(steps):
        rows = batch_at(indices, batch, step, 0, "train")
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model([x[rows] for x in features]), labels[rows]).backward()
        for group, optimizer in zip(groups, optimizers):
            nn.utils.clip_grad_norm_(group, GRAD_CLIP)
            optimizer.step()
    return time.perf_counter() - started, list(model.bottoms) + [model.top]


def max_difference(a: list[nn.Module], b: list[nn.Module]) -> float:
    return max((p - q).abs().max().item() for m, n in zip(a, b) for p, q in zip(m.parameters(), n.parameters()))


def clip_in_a_loop(mechanism: GaussianMechanism, x: torch.Tensor) -> torch.Tensor:
    """The slow way, for comparison only: one norm and one multiply per sample."""
    return torch.stack([row * min(1.0, mechanism.clip / (row.norm().item() + 1e-6)) for row in x])


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{args.steps} steps, batch {args.batch}, conv baseline width {args.width}, 1 thread, median of {args.repeats}"
    )
    for dataset in (digits_halves(), digits_quarters()):
        features, labels = views(dataset)
        bottoms, top = networks(features, args.width)
        k = len(features)
        clip_only = (GaussianMechanism(CLIP_FORWARD, 0.0), GaussianMechanism(CLIP_BACKWARD, 0.0))
        noised = (GaussianMechanism(CLIP_FORWARD, SIGMA), GaussianMechanism(CLIP_BACKWARD, SIGMA))
        timings: dict[str, list[float]] = {"unsplit": [], "split": [], "split+clip": [], "split+clip+noise": []}
        for _ in range(args.repeats):
            seconds, unsplit_nets = run_unsplit(features, labels, bottoms, top, args.steps, args.batch)
            timings["unsplit"].append(seconds)
            seconds, split_nets = run_split(features, labels, bottoms, top, args.steps, args.batch)
            timings["split"].append(seconds)
            timings["split+clip"].append(
                run_split(features, labels, bottoms, top, args.steps, args.batch, clip_only)[0]
            )
            timings["split+clip+noise"].append(
                run_split(features, labels, bottoms, top, args.steps, args.batch, noised)[0]
            )
        median = {name: statistics.median(values) for name, values in timings.items()}
        print(f"\n{dataset.name} (K = {k}, {len(labels)} samples)")
        for name, seconds in median.items():
            print(f"  {name:<17} {1000 * seconds / args.steps:7.2f} ms/step")
        print(
            f"  split / unsplit: {median['split'] / median['unsplit']:.2f}x   (target <= 1.3x; "
            f"final weights differ by at most {max_difference(split_nets, unsplit_nets):.1e})"
        )
        print(
            f"  clipping cost:   {median['split+clip'] / median['split']:.2f}x a split step without DP; "
            f"clip + noise {median['split+clip+noise'] / median['split']:.2f}x"
        )
    rows = torch.randn(args.batch, OUT_DIM)
    mechanism = GaussianMechanism(CLIP_FORWARD, 0.0)
    vectorised = median_time(lambda: [mechanism.clip_tensor(rows) for _ in range(1000)], args.repeats) / 1000
    looped = median_time(lambda: [clip_in_a_loop(mechanism, rows) for _ in range(100)], args.repeats) / 100
    assert torch.allclose(clip_in_a_loop(mechanism, rows), mechanism.clip_tensor(rows), atol=1e-6)
    print(
        f"\nper-sample clip of a {args.batch}x{OUT_DIM} batch: vectorised {1e6 * vectorised:.1f} us, "
        f"Python loop over samples {1e6 * looped:.1f} us ({looped / vectorised:.0f}x slower)"
    )


if __name__ == "__main__":
    main()
