"""What one cell of a paper's grid costs at a given scale, counted before anything runs: its parameters, the tokens
it trains and scores on, the FLOPs of both, and the memory it needs on one GPU (issue 50: sizing the paper scale to
a GPU budget, and deciding how many cells share a GPU). Here are the conventions and the rules every paper counts by;
each paper's counts live in ``fedrepro/<paper>/costs.py`` (``FedMatchCosts``, ``FedCMCCosts``, ``SSVFNASCosts``), so
that a paper's stages depend on its own code alone. The models are built from the very code that trains them, so a
count follows the code: the text models on PyTorch's meta device (shapes, no weights), SS-VFNAS's small networks on
the CPU. Nothing here knows of DVC: the sizes of the data come in as counts (``*.from_mirror`` counts them).

Conventions, used throughout (what is one paper's own is in its module's docstring):

* **Sequence and token.** A text model's input is counted at its padded length, the model's maximum length
  (``model.max_length``, ``fedcmc.settings.max_length``): tokens = sequences x that length. The engine pads each batch
  to its own longest sequence, so this is an upper bound.
* **FLOPs** count a multiply-add as 2. A transformer of L layers of width d reading T tokens: N = the parameters every
  token passes through (all but the embedding tables, which are looked up, and the heads and pooler, which read one
  vector per sequence). Forward per token: 2N + 4.L.d.T (the attention scores QK^T and the weighted sum of V, 2.T.d
  each per layer); a training step is 3x the forward (the backward computes gradients of activations and of weights):
  6N + 12.L.d.T per token (Kaplan et al. 2020, "Scaling laws for neural language models", section 2.1, with attention
  over all T tokens both ways). A head costs 2 (forward) or 6 (training) FLOPs per parameter per sequence. Scoring
  (inference) is the forward alone. A model without attention layers (FedMatch's RE2 and ESIM) counts every
  non-embedding parameter per token (``model_shape``). Conv and MLP networks (SS-VFNAS's): the forward FLOPs of one
  sample are counted from the modules' parameters and the input's shape (``weight_flops``: each conv weight applies
  at every one of the H x W positions, which the spaces' stride-1 ops keep; each linear weight once), as torch's
  FlopCounterMode counts them; training is 3x the forward.
* **Bytes.** fp32 elements take 4 bytes, bf16 2. Weights, gradients and Adam's two moments are fp32 at both
  precisions (``train.precision: bf16`` is autocast); under bf16 autocast also keeps a bf16 copy of every weight a
  matmul reads. A training step's peak = weights + gradients of the trained parameters + optimiser state + the
  activations of one batch. Activations of a transformer layer (Korthikanti et al. 2022, "Reducing activation
  recomputation in large transformer models", arXiv 2205.05198, section 4.1): 16.s.b.h elements plus 2.a.s^2.b
  (attention probabilities and their dropout) at the precision, and 1-byte dropout masks of 2.s.b.h + a.s^2.b, for
  batch b, length s, width h and a heads; eager attention, so an upper bound where a fused attention kernel keeps
  no s^2 matrix. A network without attention layers: the bytes autograd saves in a forward measured on the CPU
  (``saved_bytes``), times the batch.
* **GPU memory of a cell** (``cell_gpu_memory``): the training peak plus what the federation keeps on the device
  between steps (the server's weights, the round's uploads, every client's private tensors and algorithm state, as
  ``bench/bench_memory.py`` sizes the engine's one-model design), times a safety margin, plus the CUDA context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

FP32 = 4
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
MASK_BYTES = 1
"""A dropout mask element (torch keeps a bool per element)."""
ADAM_MOMENTS = 2

GPU_SAFETY = 1.2
"""Margin on a cell's estimated GPU memory for what the estimate does not size: the caching allocator's fragmentation,
autocast's fp32 ops (softmax, LayerNorm) under bf16, the fused Adam's and the scoring passes' temporaries."""
CUDA_CONTEXT = 2**30
"""Bytes a process's CUDA context and the kernels of torch's GPU libraries (cuBLAS, cuDNN) take before any tensor."""


# ----- architectures of the papers' pretrained backbones ------------------------------------------------------------


def published_config(backbone: str):
    """The architecture of a hub backbone the papers name, written out from its published ``config.json`` (the hub
    cannot be reached here, and only the shape is needed); None for any other name."""
    from transformers import BertConfig, DistilBertConfig

    # https://huggingface.co/google-bert/bert-base-uncased/blob/main/config.json
    if backbone == "bert-base-uncased":
        return BertConfig(
            vocab_size=30522,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
            type_vocab_size=2,
        )
    # https://huggingface.co/distilbert/distilbert-base-uncased/blob/main/config.json
    if backbone == "distilbert-base-uncased":
        return DistilBertConfig(
            vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512
        )
    return None


def encoder_config(backbone: str, tiny: dict, param: str):
    """The config ``fedrepro.models.backbone.build_encoder`` would build ``backbone`` from: the published one, the tiny
    BERT's, or a local (or cached) model's own config."""
    from transformers import AutoConfig, BertConfig

    if backbone == "tiny":
        return BertConfig(
            vocab_size=tiny["vocab_size"],
            hidden_size=tiny["hidden"],
            num_hidden_layers=tiny["layers"],
            num_attention_heads=tiny["heads"],
            intermediate_size=tiny["intermediate"],
        )
    config = published_config(backbone)
    if config is None:
        from fedrepro.models.backbone import pretrained_source

        config = AutoConfig.from_pretrained(pretrained_source(backbone, param))
    return config


@dataclass(frozen=True)
class Transformer:
    layers: int
    hidden: int
    heads: int


def transformer_shape(config) -> Transformer:
    """L, d and the heads of a BERT-family config (BERT's and DistilBERT's own names for them)."""
    get = lambda *names: next(getattr(config, n) for n in names if hasattr(config, n))  # noqa: E731
    return Transformer(
        get("num_hidden_layers", "n_layers"), get("hidden_size", "dim"), get("num_attention_heads", "n_heads")
    )


def meta_encoder(
    backbone: str, vocab_size: int, tiny: dict, max_length: int, keep_layers: int, param: str
) -> nn.Module:
    """``build_encoder``'s encoder on the meta device: the tiny BERT without a pooler, a pretrained one as
    ``AutoModel`` loads it (BERT with its pooler), its embeddings grown to the tokenizer, cut to ``keep_layers``."""
    from transformers import AutoModel, BertModel

    config = encoder_config(backbone, tiny, param)
    if keep_layers:
        setattr(config, "n_layers" if hasattr(config, "n_layers") else "num_hidden_layers", keep_layers)
    config.vocab_size = max(config.vocab_size, vocab_size)
    with torch.device("meta"):
        if backbone == "tiny":
            config.max_position_embeddings = max(max_length, 64)
            return BertModel(config, add_pooling_layer=False)
        return AutoModel.from_config(config)


# ----- a model's parameters, as the FLOP and memory rules read them -------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    total: int
    trained: int
    """Parameters with gradients: what Adam keeps two moments of."""
    per_token: int
    """N of the FLOP rule: every parameter but the embedding tables and the per-sequence heads."""
    per_sequence: int
    """The heads (and BERT's pooler): read one vector per sequence."""
    private: int
    """Never leave a client: the engine keeps them per client between rounds."""
    transformer: Transformer | None
    """None for a model without attention layers (RE2, ESIM)."""

    @property
    def shared(self) -> int:
        return self.total - self.private


def model_shape(model: nn.Module, is_private: Callable[[str], bool]) -> ModelShape:
    """Counts of ``model`` (built, adapted by its algorithm): a model with an ``encoder`` (the cross-encoder, the
    relation classifier) reads its heads once per sequence; one without (the matchers) counts everything per token."""
    params = dict(model.named_parameters())
    embedded = {
        f"{m}.{n}" if m else n
        for m, module in model.named_modules()
        if isinstance(module, nn.Embedding)
        for n, _ in module.named_parameters()
    }
    encoder = getattr(model, "encoder", None)
    config = getattr(encoder, "config", None)
    if config is not None:
        heads = [n for n in params if not n.startswith("encoder.") or n.startswith("encoder.pooler.")]
    else:
        heads = []
    count = lambda names: sum(params[n].numel() for n in names)  # noqa: E731
    total = count(params)
    return ModelShape(
        total=total,
        trained=sum(p.numel() for p in params.values() if p.requires_grad),
        per_token=total - count(embedded) - count(heads),
        per_sequence=count(heads),
        private=count(n for n in params if is_private(n)),
        transformer=transformer_shape(config) if config is not None else None,
    )


# ----- the rules ------------------------------------------------------------------------------------------------


def forward_flops(shape: ModelShape, length: int) -> float:
    """FLOPs of one forward pass over one sequence of ``length`` tokens (module docstring)."""
    t = shape.transformer
    attention = 4 * t.layers * t.hidden * length if t is not None else 0
    return length * (2 * shape.per_token + attention) + 2 * shape.per_sequence


def training_flops(shape: ModelShape, length: int) -> float:
    """FLOPs of one sequence through a training step: 3x its forward (6N + 12.L.d.T per token)."""
    return 3 * forward_flops(shape, length)


def transformer_activation_bytes(t: Transformer, length: int, batch: int, precision: str) -> int:
    """Activations a training step keeps for its backward in every layer (Korthikanti et al. 2022, section 4.1,
    their 34.s.b.h + 5.a.s^2.b bytes at 16 bits, with the element size as a parameter)."""
    s, b, h, a = length, batch, t.hidden, t.heads
    elements = 16 * s * b * h + 2 * a * s * s * b
    masks = 2 * s * b * h + a * s * s * b
    return t.layers * (DTYPE_BYTES[precision] * elements + MASK_BYTES * masks)


def saved_bytes(run: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd saves for the backward while ``run()`` computes a forward (each saved tensor once
    per save, so an upper bound where two saves share storage), on one thread: the forwards measured are of tiny
    networks, which two threads on a busy machine ran 20-60x slower (the caller's thread count is restored)."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            run()
    finally:
        torch.set_num_threads(threads)
    return total


def weight_flops(module: nn.Module, positions: int) -> int:
    """Forward FLOPs per sample of the convolutions and linear layers of a network whose convolutions all keep their
    input's ``positions`` (H x W; SS-VFNAS's spaces: every op has stride 1 and same padding): 2 per weight per output
    position of a convolution, 2 per weight of a linear layer (the layer after the pooling). Pooling, normalisation
    and the mixed ops' weighted sums are elementwise and left out, as FlopCounterMode leaves them."""
    convs = sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Conv2d))
    linears = sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))
    return 2 * (convs * positions + linears)


# ----- memory ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """Bytes of one cell on its device (module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    federation: int
    """Kept between steps besides the one model: the server's weights and state, the round's broadcast copy, new
    aggregate and uploads, every client's private tensors and algorithm state."""

    @property
    def peak(self) -> int:
        """A training step's peak: weights + gradients + optimiser state + one batch's activations."""
        return self.weights + self.gradients + self.optimizer + self.activations


def cell_gpu_memory(memory: Memory) -> int:
    """Bytes to reserve on a GPU for one cell: its training peak and its federation's resident tensors, times
    ``GPU_SAFETY``, plus ``CUDA_CONTEXT`` (each cell is its own process). How many cells share a GPU: its memory
    divided by this."""
    return math.ceil((memory.peak + memory.federation) * GPU_SAFETY) + CUDA_CONTEXT


@dataclass(frozen=True)
class AlgorithmState:
    """What an algorithm keeps besides FedAvg's, in copies of the shared weights (from each one's module in
    ``fedrepro/fl/algorithms``), and the extra forward passes it runs per training sample."""

    extra_forwards: int = 0
    """MOON: the round's global and the client's previous model each rerun the batch (no gradients)."""
    client_copies: int = 0
    """Per client: MOON's previous model, SCAFFOLD's control variate c_k, FedDyn's gradient state g_k."""
    server_copies: int = 1
    """The server's shared weights, and SCAFFOLD's c or FedDyn's h beside them."""
    upload_copies: int = 1
    """SCAFFOLD uploads its control-variate delta beside its weights."""


ALGORITHM_STATE = {
    "moon": AlgorithmState(extra_forwards=2, client_copies=1),
    "scaffold": AlgorithmState(client_copies=1, server_copies=2, upload_copies=2),
    "feddyn": AlgorithmState(client_copies=1, server_copies=2),
}


def text_memory(
    shape: ModelShape, algorithm: str, precision: str, activations: int, clients: int, per_round: int, pooled: bool
) -> Memory:
    """A text cell's memory: the engine's one model (and MOON's two reference copies) with its gradients and Adam,
    one batch's activations, and the federation's resident tensors: the server's state plus the round's broadcast copy
    and new aggregate (2 x shared), ``per_round`` uploads, and every client's private tensors and algorithm state (a
    pooled run keeps one trainer's)."""
    state = ALGORITHM_STATE.get(algorithm, AlgorithmState())
    weights = FP32 * shape.total * (1 + state.extra_forwards)
    if precision == "bf16":
        weights += DTYPE_BYTES["bf16"] * (shape.per_token + shape.per_sequence) * (1 + state.extra_forwards)
    federation = FP32 * shape.shared * (state.server_copies + 2 + per_round * state.upload_copies)  # 0 unless federated
    federation += FP32 * (1 if pooled else clients) * (shape.private + state.client_copies * shape.shared)
    return Memory(weights, FP32 * shape.trained, FP32 * ADAM_MOMENTS * shape.trained, activations, federation)


# ----- one cell's cost ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellCost:
    name: str
    run: str
    """What makes two cells one training run, which the cell store trains once (a figure's point that is a table's
    cell): the cell's name where no two cells of the grid share a run."""
    parameters: int
    """Every parameter of the cell's model (all parties' networks for SS-VFNAS)."""
    trained: int
    train_tokens: dict[str, int]
    """Per client (SS-VFNAS: per phase): sequences x padded length x rounds x local epochs."""
    eval_tokens: int
    """Scored without gradients: each evaluated round's FIT sample and valid set (and FedCMC's test), the final test."""
    train_flops: float
    eval_flops: float
    memory: Memory

    @property
    def flops(self) -> float:
        return self.train_flops + self.eval_flops


# ----- GPUs -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPU:
    label: str
    memory: int
    """Bytes, the datasheet's GB (10^9)."""
    peak_tflops: dict[str, float]
    """Dense peak per precision: bf16 on the tensor cores, fp32 without TF32 (which ``fedrepro.device`` turns off)."""


GPUS = {  # NVIDIA's datasheets: H100 Tensor Core GPU (SXM5), H200 Tensor Core GPU (SXM),
    # A100 Tensor Core GPU (SXM4 80GB); the bf16 figures are the dense halves of the datasheets' "with sparsity" numbers
    "h100": GPU("H100 SXM5 80 GB", 80 * 10**9, {"bf16": 989.4, "fp32": 66.9}),
    "h200": GPU("H200 SXM 141 GB", 141 * 10**9, {"bf16": 989.4, "fp32": 66.9}),
    "a100": GPU("A100 SXM4 80 GB", 80 * 10**9, {"bf16": 312.0, "fp32": 19.5}),
}
ASSUMED_MFU = 0.35
"""Model-FLOP utilisation assumed for BERT-base-sized training: the achieved share of the GPU's dense peak."""


def gpu_hours(flops: float, tflops: float) -> float:
    """Hours one GPU needs for ``flops`` at ``tflops`` achieved TFLOP/s."""
    return flops / (tflops * 1e12) / 3600


# ----- the engine's scoring schedule ----------------------------------------------------------------------------


def fit_sequences(fit_samples: int, batch_size: int, available: int) -> int:
    """Training samples the engine's ``FIT`` loss reads: the first ceil(fit_samples / batch) batches (0: all)."""
    return available if fit_samples == 0 else min(available, math.ceil(fit_samples / batch_size) * batch_size)


def evaluated_rounds(rounds: int, eval_every: int) -> int:
    """Rounds the engine scores: every ``eval_every``-th (0: none; the test is scored after training anyway)."""
    return rounds // eval_every if eval_every else 0


def cap(count: int, limit: int) -> int:
    """``count`` under a cap of ``limit`` (0: none)."""
    return min(count, limit) if limit else count
