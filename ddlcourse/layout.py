"""Sizing a layout: memory per rank and bytes sent per step for a transformer on a DP x TP x PP x CP x EP grid.

    from ddlcourse import layout
    m = layout.PRESETS["7B"]
    lay = layout.Layout(dp=8, tp=4, pp=2, zero=1, recompute="full", micro_batch=1, n_micro=16)
    layout.memory_per_rank(m, lay, layout.MIXED)      # bytes: params, grads, optimizer, activations, total
    layout.comm_per_step(m, lay, layout.MIXED)        # bytes this rank sends: dp, tp, pp, cp, ep

What it assumes (the course's implementations, and Megatron-LM's conventions):

* The ``dp * cp`` ranks of one (tp, pp) position hold the same dense weights; experts are split over ``ep``
  ranks carved out of them (``ep`` divides ``dp * cp``). ZeRO stage 1/2/3 shards optimizer state / + gradients
  / + parameters over those replicas.
* Tensor parallelism splits attention heads and the MLP's hidden features (Megatron); ``sp=True`` also splits
  the norms' activations along the sequence.
* Pipeline parallelism splits the layers evenly; 1F1B keeps ``min(pp, n_micro)`` micro-batches in flight on the
  first stage (the worst one). Embedding and head are counted on every stage (an upper bound).
* Activations per layer are those the autograd of :class:`ddlcourse.models.transformer.Block` saves (see
  :func:`activation_bytes_per_layer`); ``recompute="full"`` keeps only each layer's input, plus one layer's
  activations while it is recomputed; ``recompute="selective"`` recomputes only the attention core (Korthikanti
  et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023, arXiv 2205.05198, Sec. 4.2
  and Table 2): it drops the ``s x s`` terms and keeps the rest.
* ``Model.flash=True`` (the default of the 7B/70B presets, as real runs use FlashAttention: Dao et al., NeurIPS
  2022) keeps no ``s x s`` scores or mask, only the attention output and a log-sum-exp per row and head.
  Models built with :meth:`Model.from_config` (the course's small transformer) keep ``flash=False``.
* ZeRO-2/3 with pipeline parallelism is refused (see :class:`Layout`).
* Collectives are counted as the ring algorithm sends them (:mod:`ddlcourse.parallel.traffic`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ddlcourse.hardware import GPUS, LINKS
from ddlcourse.memory import SavedTensors


@dataclass(frozen=True)
class Model:
    n_layers: int
    dim: int
    n_heads: int
    vocab: int
    seq_len: int
    ffn: int                        # the MLP's hidden size
    n_experts: int = 0              # 0: dense
    top_k: int = 1
    capacity_factor: float = 1.25
    kv_heads: int | None = None     # grouped-query attention (None: as many as n_heads)
    mlp_matrices: int = 2           # 2: fc1, fc2 (GELU); 3: SwiGLU (Llama)
    biases: bool = True
    learned_pos: bool = True        # learned position embeddings (this course's model); False: RoPE
    flash: bool = False             # FlashAttention: no s x s scores kept (only the output and log-sum-exp per row)

    @property
    def kv_dim(self) -> int:
        return self.dim // self.n_heads * (self.kv_heads or self.n_heads)

    def attention_params(self) -> int:
        h, kv = self.dim, self.kv_dim
        return 2 * h * h + 2 * h * kv + (2 * h + 2 * kv if self.biases else 0)

    def expert_params(self) -> int:
        """One MLP (one expert)."""
        return self.mlp_matrices * self.dim * self.ffn + ((self.ffn * (self.mlp_matrices - 1) + self.dim)
                                                          if self.biases else 0)

    def layer_params(self) -> tuple[int, int]:
        """(dense, expert) parameters of one block: attention, norms, router | the MLP or all experts."""
        norms = 2 * 2 * self.dim if self.biases else 2 * self.dim
        router = self.dim * self.n_experts
        experts = self.expert_params() * max(1, self.n_experts)
        return self.attention_params() + norms + router, experts

    def embedding_params(self) -> int:
        """Token and position embeddings, final norm and the output head (not tied)."""
        return (self.vocab * self.dim + (self.seq_len * self.dim if self.learned_pos else 0)
                + (2 if self.biases else 1) * self.dim + self.vocab * self.dim + (self.vocab if self.biases else 0))

    def params(self) -> int:
        d, e = self.layer_params()
        return self.n_layers * (d + e) + self.embedding_params()

    @classmethod
    def from_config(cls, cfg) -> "Model":
        """The :class:`ddlcourse.models.transformer.TransformerConfig` of the course's small model."""
        return cls(n_layers=cfg.n_layers, dim=cfg.dim, n_heads=cfg.n_heads, vocab=cfg.vocab, seq_len=cfg.seq_len,
                   ffn=cfg.hidden, n_experts=cfg.n_experts, top_k=cfg.top_k if cfg.n_experts else 1,
                   capacity_factor=cfg.capacity_factor)


# Llama-2-like shapes (SwiGLU, no biases, RoPE; the 70B uses grouped-query attention with 8 KV heads), trained with
# FlashAttention (flash=True; ``dataclasses.replace(m, flash=False)`` for the attention that keeps its scores)
PRESETS = {
    "7B": Model(n_layers=32, dim=4096, n_heads=32, vocab=32000, seq_len=4096, ffn=11008, mlp_matrices=3,
                biases=False, learned_pos=False, flash=True),
    "70B": Model(n_layers=80, dim=8192, n_heads=64, vocab=32000, seq_len=4096, ffn=28672, kv_heads=8,
                 mlp_matrices=3, biases=False, learned_pos=False, flash=True),
}


@dataclass(frozen=True)
class Precision:
    param: int        # bytes per parameter of the weights used in forward/backward
    grad: int         # bytes per gradient
    optimizer: int    # bytes per parameter of optimizer state (Adam m, v; plus fp32 master weights if any)
    act: int          # bytes per activation element


FP32 = Precision(param=4, grad=4, optimizer=8, act=4)          # what the course's CPU ranks run
MIXED = Precision(param=2, grad=2, optimizer=12, act=2)        # bf16 weights/grads, fp32 master + Adam (ZeRO paper)


@dataclass(frozen=True)
class Layout:
    """A DP x TP x PP x CP x EP grid and how a step runs on it.

    ``recompute``: ``"none"``; ``"full"`` (keep each layer's input, recompute the whole layer in backward);
    ``"selective"`` (recompute only the attention core, the ``s x s`` part; Korthikanti et al. 2023).

    ZeRO-2 and ZeRO-3 with ``pp > 1`` are refused: in a pipeline each stage runs its micro-batches' backwards
    one after the other and accumulates their gradients; ZeRO-2/3 keep only a shard of the gradients, so they
    must reduce-scatter every micro-batch's gradients (and ZeRO-3 gather the weights for every micro-batch's
    forward and backward), ``n_micro`` times the data-parallel bytes of ZeRO-1, over the nodes, for a pipeline
    that needs many micro-batches to shrink its bubble. DeepSpeed's pipeline engine refuses them for this reason
    (``PipelineEngine.__init__``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"); ZeRO-1 with a
    pipeline is what Megatron-LM's distributed optimizer and DeepSpeed's pipeline engine run.
    """
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0                 # 0, 1, 2 or 3
    recompute: str = "none"       # "none", "selective" or "full"
    sp: bool = False              # sequence parallelism with tensor parallelism
    micro_batch: int = 1          # sequences per micro-batch
    n_micro: int = 1              # micro-batches per step (gradient accumulation / pipeline)

    def __post_init__(self):
        for k in ("dp", "tp", "pp", "cp", "ep", "micro_batch", "n_micro"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1:
                raise ValueError(f"{k} must be a positive integer, got {getattr(self, k)!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {self.recompute!r}")
        if self.zero >= 2 and self.pp > 1:
            raise ValueError(
                f"zero={self.zero} with pp={self.pp} is refused: a pipeline accumulates each stage's gradients over "
                f"its micro-batches, and ZeRO-2/3 keep only a shard of them, so every micro-batch would "
                f"reduce-scatter its gradients (ZeRO-3 also all-gathers the weights twice per micro-batch): "
                f"n_micro times the data-parallel traffic. DeepSpeed's pipeline engine supports ZeRO stage 0/1 "
                f"only; use zero=1 with pp > 1, or zero=2/3 without a pipeline")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep={self.ep} must divide dp*cp={self.dp * self.cp} (experts are split over data ranks)")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batch * self.n_micro


def check_fits(model: Model, lay: Layout) -> None:
    """Raise ``ValueError`` with the reason when the layout cannot split this model."""
    problems = []
    if model.n_heads % lay.tp or (model.kv_heads or model.n_heads) % lay.tp:
        problems.append(f"heads ({model.n_heads}, kv {model.kv_heads or model.n_heads}) not divisible by tp={lay.tp}")
    if model.ffn % lay.tp:
        problems.append(f"ffn {model.ffn} not divisible by tp={lay.tp}")
    if model.n_layers % lay.pp:
        problems.append(f"{model.n_layers} layers not divisible by pp={lay.pp}")
    if model.seq_len % (2 * lay.cp) and lay.cp > 1:
        problems.append(f"seq_len {model.seq_len} not divisible by 2*cp={2 * lay.cp} (zig-zag)")
    if lay.ep > 1 and (not model.n_experts or model.n_experts % lay.ep):
        problems.append(f"ep={lay.ep} needs a number of experts divisible by it (model has {model.n_experts})")
    if problems:
        raise ValueError("layout does not fit the model: " + "; ".join(problems))


# --------------------------------------------------------------------------- activations
def attention_scores(seq_len: int, cp: int) -> int:
    """Attention scores one rank computes (and autograd keeps) per head and sequence: ``s**2`` without context
    parallelism; with zig-zag ring attention every rank's ``(s/2cp)**2 * (2cp + 1)``."""
    if cp == 1:
        return seq_len * seq_len
    c = seq_len // (2 * cp)
    return c * c * (2 * cp + 1)


def activation_bytes_per_layer(model: Model, lay: Layout, act: int = 4) -> float:
    """Bytes autograd keeps for one block and one micro-batch on one rank (no recomputation, or selective).

    Per token of this rank (``s_loc = s / cp``), the block keeps: the norms' inputs and outputs (4h), q, k, v and
    the attention output (4h, or 2h + 2 kv_dim), the MLP's hidden before and after the nonlinearity
    (``mlp_matrices`` x ffn); plus the softmax output (heads x scores); plus small terms (the norms' mean and
    1/std in fp32, the causal mask as bytes). Tensor parallelism divides the head and hidden parts by ``tp``;
    ``sp`` divides the norms' inputs and statistics too (the gathered norm output feeding the column layers stays
    whole, as :class:`ddlcourse.parallel.sequence.TensorParallelBlock` keeps it).
    With context parallelism the keys and values of the other ranks' blocks are kept too; and when a rank holds
    more than one sequence and more than one head, every block of scores it computes keeps its own copy of the
    query run (``matmul`` folds batch and heads into one dimension, which ``q``'s (batch, tokens, heads) layout
    cannot give as a view) instead of ``q`` itself: ``2cp + 1`` runs of ``s_loc / 2`` tokens instead of ``s_loc``.

    The ``s x s`` terms (softmax output, mask, the query-run copies) are the attention core. ``model.flash``
    (FlashAttention, Dao et al., NeurIPS 2022, Sec. 3.1) keeps none of them: its backward recomputes the scores
    from q, k, v, the output and one log-sum-exp per row and head (fp32), which are kept instead (with ``cp > 1``
    the ring's per-block row statistics already stand for it). ``lay.recompute == "selective"`` drops them too
    (Korthikanti et al., MLSys 2023, Table 2: ``34sbh + 5as^2b`` per layer without parallelism, ``34sbh/t`` with
    tensor and sequence parallelism and selective recomputation; our per-token terms count what the course's
    block saves, not their ``34``). With ``recompute == "full"`` it is the one layer kept while it is recomputed.
    """
    b, s_loc, h, t = lay.micro_batch, model.seq_len // lay.cp, model.dim, lay.tp
    tokens = b * s_loc
    norms = (2 * h / t + 2 * h) if lay.sp else 4 * h                  # ln in (x2) sharded with sp; ln out whole
    attn = (2 * h + 2 * model.kv_dim) / t
    mlp = model.mlp_matrices * model.ffn / t if not model.n_experts else model.top_k * model.mlp_matrices * model.ffn / t
    per_token = norms + attn + mlp
    core = not model.flash and lay.recompute != "selective"             # the s x s attention core is kept
    scores = model.n_heads / t * b * attention_scores(model.seq_len, lay.cp) if core else 0.0
    remote_kv = (lay.cp - 1) * tokens * 2 * model.kv_dim / t             # K/V blocks received over the ring
    stats = 2 * 2 * tokens / (t if lay.sp else 1) * 4                    # two norms: mean and 1/std, fp32
    if lay.cp == 1:
        ring, mask = 0.0, (s_loc * s_loc if core else 0)                  # bool mask of the full attention
    else:   # ring attention's running output o and sum l, a rescale factor per block, masks of the diagonal blocks
        rows = b * model.n_heads / t * s_loc
        ring, mask = tokens * h / t + rows * lay.cp, (2 * (s_loc // 2) ** 2 if core else 0)
        if core and b > 1 and model.n_heads // t > 1:                             # a query-run copy per block of scores
            blocks = attention_scores(model.seq_len, lay.cp) / (s_loc // 2) ** 2   # 2cp + 1 (zig-zag runs)
            ring += (blocks / 2 - 1) * tokens * h / t                     # in place of q, counted in attn
    lse = 4 * b * model.n_heads / t * s_loc if model.flash and lay.cp == 1 else 0.0    # fp32, a row per head
    return act * (tokens * per_token + scores + remote_kv + ring) + stats + mask + lse


def memory_per_rank(model: Model, lay: Layout, prec: Precision = FP32) -> dict:
    """Bytes on the busiest rank (first pipeline stage): params, grads, optimizer, activations, total."""
    check_fits(model, lay)
    dense_l, expert_l = model.layer_params()
    layers = model.n_layers // lay.pp
    replicas = lay.dp * lay.cp                                            # ranks holding the same dense weights
    dense = (layers * dense_l + model.embedding_params()) / lay.tp
    experts = layers * expert_l / (lay.tp * (lay.ep if model.n_experts else 1))
    expert_replicas = replicas // lay.ep if model.n_experts else replicas

    def sharded(n_dense, n_expert, stage):
        if lay.zero >= stage:
            return n_dense / replicas + n_expert / expert_replicas
        return n_dense + n_expert

    out = dict(params=prec.param * sharded(dense, experts, 3), grads=prec.grad * sharded(dense, experts, 2),
               optimizer=prec.optimizer * sharded(dense, experts, 1))
    per_layer = activation_bytes_per_layer(model, lay, prec.act)
    in_flight = min(lay.pp, lay.n_micro) if lay.pp > 1 else 1
    if lay.recompute == "full":
        h_loc = model.dim / (lay.tp if lay.sp else 1)
        kept = layers * lay.micro_batch * model.seq_len / lay.cp * h_loc * prec.act
        out["activations"] = in_flight * kept + per_layer
    else:
        out["activations"] = in_flight * layers * per_layer
    out["total"] = sum(out.values())
    return out


# --------------------------------------------------------------------------- communication
def _ring(kind_factor: float, n: int, nbytes: float) -> float:
    return kind_factor * (n - 1) / n * nbytes if n > 1 else 0.0


def comm_per_step(model: Model, lay: Layout, prec: Precision = FP32) -> dict:
    """Bytes one rank sends in one training step (all micro-batches), by parallelism; and ``total``.

    dp, with ``N`` data-parallel replicas, ``n = n_micro`` and ``Psi`` this rank's bytes of weights (ring
    collectives, ``(N-1)/N * Psi`` sent per all-gather or reduce-scatter):

    * ZeRO-0: the gradients are accumulated locally over the micro-batches and all-reduced once per step
      (DDP with ``no_sync``): ``2 (N-1)/N Psi``.
    * ZeRO-1: the full gradients are accumulated locally, reduce-scattered once, and the updated weights
      all-gathered once: the same ``2 (N-1)/N Psi``.
    * ZeRO-2: a rank keeps only its shard of the gradients, so every micro-batch's gradients are reduce-scattered
      in its backward; the updated weights are all-gathered once: ``(n + 1) (N-1)/N Psi``.
    * ZeRO-3: every micro-batch all-gathers the weights for its forward and again for its backward, and
      reduce-scatters its gradients: ``3 n (N-1)/N Psi``. For one micro-batch that is ``3 Psi``, 1.5 times data
      parallelism's ``2 Psi`` (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
      Models", SC 2020, Sec. 7.2.2). With recomputation the backward's all-gather serves the recomputed forward
      too (PyTorch FSDP keeps a unit's gathered weights from its recomputation to its backward), so it is not
      counted twice.

    Why gradients are reduce-scattered per micro-batch, not once per step: :func:`memory_per_rank` gives ZeRO-2/3
    ranks only ``1/N`` of the gradients, which leaves no room to accumulate whole gradients over the
    micro-batches. That is FSDP's default and DeepSpeed's ZeRO-2/3 behaviour. Accumulating them whole (FSDP's
    ``no_sync``) would send ``(2n + 1) (N-1)/N Psi`` with ZeRO-3, at the price of the whole gradients in memory,
    which this calculator does not model. ZeRO-2/3 with ``pp > 1`` are refused (:class:`Layout`).

    tp: two all-reduces forward and two backward per layer (or the same volume of all-gathers and
    reduce-scatters with sp; full recomputation repeats the forward ones, selective recomputation adds none, the
    attention core has no tensor-parallel collective); pp: activations forward and their gradients backward at
    each stage boundary; cp: the K/V blocks passed ``cp-1`` times forward and their gradients ``cp-1`` times
    backward (one more forward pass with full or selective recomputation); ep: dispatch and combine all_to_all,
    forward and backward, for tokens kept by capacity.
    """
    check_fits(model, lay)
    dense_l, expert_l = model.layer_params()
    layers = model.n_layers // lay.pp
    replicas = lay.dp * lay.cp
    dense = (layers * dense_l + model.embedding_params()) / lay.tp
    experts = layers * expert_l / (lay.tp * (lay.ep if model.n_experts else 1))
    expert_replicas = replicas // lay.ep if model.n_experts else replicas
    n = lay.n_micro
    # (gradient reduce-scatters, weight all-gathers) per step; an all-reduce is one of each
    rs, ag = {0: (1, 1), 1: (1, 1), 2: (n, 1), 3: (n, 2 * n)}[lay.zero]
    per_weight = rs * prec.grad + ag * prec.param                        # bytes sent per weight before (N-1)/N
    dp = _ring(per_weight, replicas, dense) + _ring(per_weight, expert_replicas, experts)

    tokens = lay.micro_batch * model.seq_len / lay.cp                     # per micro-batch on this rank
    act = tokens * model.dim * prec.act                                   # one activation tensor, whole
    n_fwd = 2 if lay.recompute == "full" else 1                          # forward passes of the whole layer
    tp = lay.n_micro * layers * (2 * n_fwd + 2) * _ring(2.0, lay.tp, act)
    pp = lay.n_micro * 2 * act / (lay.tp if lay.sp else 1) if lay.pp > 1 else 0.0
    kv = tokens * 2 * model.kv_dim / lay.tp * prec.act
    n_ring = 2 if lay.recompute in ("full", "selective") else 1          # forward passes of the attention core
    cp = lay.n_micro * layers * (n_ring + 1) * (lay.cp - 1) * kv
    ep = 0.0
    if model.n_experts and lay.ep > 1:
        kept = min(1.0, model.capacity_factor)                           # uniform routing: no drop when cf >= 1
        rows = tokens * model.top_k * kept * (lay.ep - 1) / lay.ep
        ep = lay.n_micro * layers * (2 * n_fwd + 2) * rows * model.dim / lay.tp * prec.act
    out = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    out["total"] = sum(out.values())
    return out


def with_changes(lay: Layout, **kw) -> Layout:
    return replace(lay, **kw)


def candidates(model: Model, world: int, global_batch: int, prec: Precision = MIXED, memory_limit: float = 80e9,
               gpus_per_node: int = 8, micro_batch: int = 1) -> list[dict]:
    """Every layout of ``world`` ranks (tp within a node) that fits the model and ``memory_limit`` bytes per rank,
    sorted by the bytes they send across nodes (dp, pp, cp) and then in total. ZeRO-3 only without a pipeline
    (see :class:`Layout`); selective recomputation only where it changes something (``model.flash`` is False)."""
    out = []
    for tp in (1, 2, 4, 8):
        if tp > gpus_per_node:
            continue
        for pp in (1, 2, 4, 8, 16):
            for cp in (1, 2, 4):
                if world % (tp * pp * cp):
                    continue
                dp = world // (tp * pp * cp)
                if global_batch % (dp * micro_batch):
                    continue
                for zero in ((0, 1, 3) if pp == 1 else (0, 1)):
                    for recompute in ("none", "full") if model.flash else ("none", "selective", "full"):
                        lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, recompute=recompute, sp=tp > 1,
                                     micro_batch=micro_batch, n_micro=global_batch // (dp * micro_batch))
                        try:
                            mem = memory_per_rank(model, lay, prec)
                        except ValueError:
                            continue
                        if mem["total"] > memory_limit:
                            continue
                        comm = comm_per_step(model, lay, prec)
                        out.append(dict(layout=lay, memory=mem, comm=comm,
                                        inter_node=comm["dp"] + comm["pp"] + comm["cp"]))
    return sorted(out, key=lambda d: (d["inter_node"], d["comm"]["total"]))


# --------------------------------------------------------------------------- measuring what the formulas predict
def saved_activations(*modules) -> SavedTensors:
    """The bytes autograd saves inside the block, each storage once, the modules' parameters left out
    (a ``Linear`` saves a transposed *view* of its weight: same storage, no new memory)::

        with layout.saved_activations(block) as saved:
            y = block(x, pos)
        saved.bytes
    """
    return SavedTensors(skip=[p for m in modules for p in m.parameters()])


# --------------------------------------------------------------------------- ZeRO and a rough step time
def model_state_bytes(n_params: float, replicas: int, zero: int, prec: Precision = MIXED) -> dict:
    """Bytes of parameters, gradients and optimizer state per rank for ``n_params`` parameters held by
    ``replicas`` data-parallel ranks: ZeRO stage 1 shards the optimizer state over them, stage 2 the gradients
    too, stage 3 the parameters too (Rajbhandari et al. 2020). The dense part of :func:`memory_per_rank`."""
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {zero!r}")
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a positive integer, got {replicas!r}")

    def share(stage):
        return n_params / replicas if zero >= stage else n_params

    return dict(params=prec.param * share(3), grads=prec.grad * share(2), optimizer=prec.optimizer * share(1))


def step_seconds(model: Model, lay: Layout, prec: Precision = MIXED, flops: float = GPUS["H100-SXM"].bf16_flops,
                 mfu: float = 0.4, intra_bw: float = GPUS["H100-SXM"].nvlink,
                 inter_bw: float = LINKS["NDR IB"].per_direction) -> dict:
    """A rough time per step, to compare layouts (not to predict a run): compute ``6 * params * tokens`` over
    the ranks at ``mfu`` of ``flops`` (full recomputation adds a forward: 8 instead of 6; selective
    recomputation without FlashAttention adds the attention core's forward, ``4 * s * h`` per token and layer;
    with FlashAttention it adds nothing, the kernel's backward recomputes the scores anyway), stretched by the
    pipeline bubble ``(pp - 1) / n_micro``; tensor-parallel bytes over ``intra_bw`` (NVLink, inside a node),
    data-, pipeline- and context-parallel bytes over ``inter_bw`` (InfiniBand, between nodes), with no overlap.
    The defaults are an H100 SXM's dense BF16 FLOP/s and NVLink bandwidth per direction and one NDR InfiniBand
    port per GPU, per direction (:mod:`ddlcourse.hardware`)."""
    tokens = lay.global_batch * model.seq_len
    factor = 8 if lay.recompute == "full" else 6
    work = factor * model.params() * tokens
    if lay.recompute == "selective" and not model.flash:
        work += 4 * model.seq_len * model.dim * model.n_layers * tokens
    compute = work / (lay.world * flops * mfu)
    bubble = compute * (lay.pp - 1) / lay.n_micro
    comm = comm_per_step(model, lay, prec)
    intra = comm["tp"] / intra_bw
    inter = (comm["dp"] + comm["pp"] + comm["cp"] + comm["ep"]) / inter_bw
    return dict(compute=compute, bubble=bubble, intra_node=intra, inter_node=inter,
                total=compute + bubble + intra + inter)
