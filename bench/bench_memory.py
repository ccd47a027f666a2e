"""Peak memory (RSS) of one FedMatch H+LR cell against the bound of the engine's one-model design.

The engine keeps one model; between rounds each client keeps only its private tensors, the server one
copy of the shared weights, and during aggregation the k uploads of the round. The bound is that plus what
training needs around it, each term sized from the run: gradients and Adam's two moments, the round's broadcast
copy and the new aggregate, the tokenised data, and the RSS of the imported libraries (measured right after the
imports). The run happens in this process; its peak is ``ru_maxrss``. The check allows 25% slack for what
cannot be sized from outside (activations, autocast copies, allocator caches).
For contrast: holding a full model per client, as the authors' code does, needs T x model bytes.

Reads DIR/params.yaml, DIR/data/mined and DIR/data/tokenizer (outputs of the fedmatch_mine and fedmatch_tokenizer
stages).
Usage: python bench/bench_memory.py [--project DIR] [--scale cpu] [--rounds 2] [--max-triples 120]
"""

import argparse
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import capped_engine, load_cell_params  # noqa: E402

MIB = 2**20
SLACK = 1.25


def peak_rss() -> int:
    """This process's peak resident set size in bytes (ru_maxrss is in KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    baseline = peak_rss()  # right after the imports: torch, transformers, pandas, fedrepro
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path("."), help="folder with params.yaml and data/ (default .)")
    parser.add_argument("--scale", default="cpu", help="overrides params.yaml's scale (default cpu)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the cell (default 2)")
    parser.add_argument("--max-triples", type=int, default=120, help="training triples kept per client (default 120)")
    args = parser.parse_args()
    params = load_cell_params(args.project, args.scale, rounds=args.rounds)
    with tempfile.TemporaryDirectory() as folder:
        engine = capped_engine(params, args.project, args.max_triples, Path(folder))
        built = peak_rss()
        engine.run()
        peak = peak_rss()
    memory, clients = engine.memory_bytes(), len(engine.task.client_ids)
    trainable = sum(p.numel() * p.element_size() for p in engine.model.parameters() if p.requires_grad)
    uploads = max(engine.channel.round_bytes(r)["up"] for r in range(args.rounds))
    k = len(engine.sample_clients(0))
    shared = memory["server_shared"]
    # Built: baseline + data + one model + the server's copy + the clients' initial private tensors.
    data = built - baseline - memory["model"] - shared - memory["private_per_client_max"]
    terms = [
        ("backbone: one model, every parameter", memory["model"]),
        ("gradients: 1 x trainable", trainable),
        ("Adam state: 2 x trainable bytes", 2 * trainable),
        (
            f"private state: T = {clients} clients x {memory['private_per_client_max'] / MIB:.2f} MiB",
            memory["private_all_clients"],
        ),
        ("server's shared weights, the round's broadcast copy and the new aggregate: 3 x shared", 3 * shared),
        (f"uploads held during aggregation: k = {k} x {uploads / k / MIB:.1f} MiB", uploads),
        ("data: parquet tables, tokeniser, tokenised pairs (RSS after build - baseline - models)", data),
        ("overhead: RSS of the imported libraries, before data and model", baseline),
    ]
    bound = sum(size for _, size in terms)
    print(
        f"FedMatch H+LR, scale {params.scale} ({params.model.backbone}, {params.model.keep_layers or 'all'} layers, "
        f"{params.train.precision}), {args.rounds} rounds, {clients} clients x <= {args.max_triples} triples"
    )
    for label, size in terms:
        print(f"  {label:<88} {size / MIB:8.1f} MiB")
    print(f"  {'bound':<88} {bound / MIB:8.1f} MiB")
    print(
        f"peak RSS of the run: {peak / MIB:.1f} MiB = {peak / bound:.2f} x bound; peak <= bound x {SLACK}: "
        f"{'yes' if peak <= bound * SLACK else 'NO'} (limit {bound * SLACK / MIB:.1f} MiB; "
        "the slack is for what is not sized: bf16 autocast weight copies, one batch's activations, Adam's temporaries, "
        "memory the allocators keep)"
    )
    print(
        f"contrast, a full model per client (the authors' code): T x model = {clients} x {memory['model'] / MIB:.1f} "
        f"MiB = {clients * memory['model'] / MIB:.1f} MiB, against {memory['private_all_clients'] / MIB:.1f} MiB of "
        "private state here"
    )


if __name__ == "__main__":
    main()
