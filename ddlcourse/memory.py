"""Where training memory goes: parameters, gradients, optimizer state and activations, predicted and measured.

For a model with ``P`` parameters in fp32, trained with Adam::

    parameters   4 P bytes
    gradients    4 P bytes
    Adam state   8 P bytes (two moments; SGD with momentum: 4 P; plain SGD: 0)
    activations  what the forward pass saves for backward: grows with batch size and with the input's size
                 (an image of side n: n^2, a 3-D volume: n^3) -- usually the largest part

* :func:`predict` computes the first three from the parameter count, and *estimates* the activations as the
  outputs of all leaf layers (one tensor per layer, from a forward pass without autograd).
* :func:`measure` runs one real training step and measures each part: tensors' storages for parameters,
  gradients and optimizer state; for activations, a ``torch.autograd.graph.saved_tensors_hooks`` pair sees
  every tensor autograd keeps for backward (each storage counted once). On CUDA it also reports
  ``torch.cuda.max_memory_allocated`` of the step.
* Activation checkpointing (Chen et al., 2016) keeps only the inputs of ``segments`` chunks of a
  ``nn.Sequential`` and recomputes the rest during backward: :func:`checkpointed`.
* Mixed precision: under ``torch.autocast`` (bf16 on CPU, bf16/fp16 on GPU) matmuls and convolutions save
  16-bit inputs, about halving the activations; the fp32 master weights stay.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from ddlcourse.device import synchronize
from ddlcourse.models.small import MLP

OPT_STATE_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2}   # fp32 tensors of the parameter's size


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_optimizer(name: str, params, lr: float = 1e-3):
    if name not in OPT_STATE_PER_PARAM:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPT_STATE_PER_PARAM)}")
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9 if name == "momentum" else 0.0)


def estimate_activations(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the outputs of all leaf modules for input ``x`` (the naive "one tensor per layer" estimate)."""
    total = [0]

    def hook(_m, _inp, out):
        if torch.is_tensor(out):
            total[0] += out.numel() * out.element_size()

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return total[0]


def predict(model: nn.Module, x: torch.Tensor, optimizer: str = "adam") -> dict:
    """Predicted bytes of parameters, gradients, optimizer state (exact for fp32) and activations (estimate)."""
    P = n_params(model)
    out = dict(params=4 * P, grads=4 * P, optimizer=4 * P * OPT_STATE_PER_PARAM[optimizer],
               activations=estimate_activations(model, x))
    out["total"] = sum(out.values())
    return out


class SavedTensors:
    """The course's one saved-tensor meter: what autograd keeps for backward inside ``with``.

    The rule, the same everywhere (notebooks 14, 17, 20 and 21, the labs, the planner, the layout calculator):

    * a saved tensor costs its own bytes, once: saved twice, or as two views of the same bytes (a reshape, a
      transpose), it counts once; a slice counts its slice (a pipeline's micro-batches are slices of one batch);
    * every tensor on the storages of ``skip`` is left out: pass the parameters (they exist anyway; a ``Linear``
      saves a transposed *view* of its weight) and, where wanted, the input batch;
    * on the meta device, where every storage's address is 0, the storage object itself identifies it (the meter
      holds it, so its identity stays unique), so a 512^3 cube is measured without allocating it;
    * ``weights``: 16-bit copies of these weights that autocast makes and autograd keeps are counted apart, in
      ``weight_copies``, not in ``bytes``;
    * ``track_live=True`` also follows the release: ``live`` is what autograd still holds (it drops as backward
      frees saved tensors) and ``peak`` the most it held at once since :meth:`reset` (pipeline schedules).

    ``bytes`` (``mb`` in MiB) is everything saved, ``largest`` the largest saved tensor, ``sizes`` maps each
    saved tensor (storage, offset, bytes) to its bytes. :meth:`add` counts tensors by hand (the planner counts the batch whether or not it is saved)::

        with memory.SavedTensors(skip=model.parameters()) as saved:
            loss = loss_fn(model(x), y)
        print(f"{saved.mb:.1f} MiB saved for backward")
    """

    def __init__(self, skip=(), weights=(), track_live: bool = False):
        self._held: dict = {}                   # key -> storage (keeps meta storages' ids unique)
        self._skip = {self._storage(t) for t in skip}
        self.weights = [w.detach() for w in weights]
        self.sizes: dict = {}
        self.weight_copies = 0
        self.track_live = track_live
        self._refs: dict = {}
        self.live = self.peak = 0

    def _storage(self, t):
        """What identifies ``t``'s storage: its address, or on meta (address 0) the storage object."""
        st = t.untyped_storage()
        if st.device.type == "meta":
            self._held.setdefault(("meta", id(st)), st)
            return ("meta", id(st))
        return st.data_ptr()

    def add(self, *tensors) -> None:
        """Count ``tensors`` (their storages, once) as if autograd had saved them."""
        for t in tensors:
            self._count(t)

    def _count(self, t):
        storage = self._storage(t)
        nbytes = t.numel() * t.element_size()
        if storage in self._skip or nbytes == 0:
            return None
        key = (storage, t.storage_offset() * t.element_size(), nbytes)
        if key not in self.sizes:
            if t.dtype in (torch.bfloat16, torch.float16) and self._is_weight_copy(t):
                self.weight_copies += nbytes
                self._skip.add(storage)
                return None
            self.sizes[key] = nbytes
        return key

    def _is_weight_copy(self, t) -> bool:
        for w in self.weights:
            for cand in (w, w.t()) if w.dim() == 2 else (w,):
                if cand.shape == t.shape and torch.equal(cand.to(t.dtype), t):
                    return True
        return False

    def _pack(self, t):
        key = self._count(t)
        if not self.track_live or key is None:
            return t
        return _Held(t, self, key)

    @staticmethod
    def _unpack(h):
        return h.tensor if isinstance(h, _Held) else h

    def _hold(self, key):
        if not self._refs.get(key):
            self._refs[key] = 0
            self.live += self.sizes[key]
            self.peak = max(self.peak, self.live)
        self._refs[key] += 1

    def _release(self, key):
        self._refs[key] -= 1
        if not self._refs[key]:
            del self._refs[key]
            self.live -= self.sizes[key]

    def reset(self) -> None:
        """Start a new peak from what is held now (and forget the storages counted so far)."""
        self.sizes = {k: v for k, v in self.sizes.items() if self._refs.get(k)}
        self.peak = self.live

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())

    @property
    def largest(self) -> int:
        return max(self.sizes.values(), default=0)

    @property
    def mb(self) -> float:
        return self.bytes / 2 ** 20


class _Held:
    """One saved tensor (``track_live``): its storage counts as held until autograd drops it."""

    def __init__(self, t, meter: SavedTensors, key):
        self.tensor, self.meter, self.key = t, meter, key
        meter._hold(key)

    def __del__(self):
        self.meter._release(self.key)


def _storage_bytes(ts) -> int:
    seen, total = set(), 0
    for t in ts:
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def measure(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn=None, optimizer: str = "adam",
            autocast: bool = False, exclude_input: bool = True) -> dict:
    """One real training step; measured bytes of each part (see the module docstring).

    ``autocast=True`` runs the forward in bf16 autocast (CPU and CUDA); the 16-bit copies of the weights that
    autocast keeps for backward are reported apart as ``autocast_weight_copies`` (not in ``total``).
    ``exclude_input``: do not count the input batch among the activations (it exists anyway).
    """
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    dev = x.device
    opt = make_optimizer(optimizer, model.parameters())
    opt.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    # weights saved for backward are parameters, not activations; the input batch exists anyway
    meter = SavedTensors(skip=[*model.parameters(), *([x] if exclude_input else [])],
                         weights=[p for p in model.parameters() if p.dim() > 1])
    with meter, torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    params = list(model.parameters())
    out = dict(params=_storage_bytes(params), grads=_storage_bytes(p.grad for p in params if p.grad is not None),
               optimizer=_storage_bytes(v for st in opt.state.values() for v in st.values()
                                        if torch.is_tensor(v) and v.dim() > 0),
               activations=meter.bytes)
    out["total"] = sum(out.values())
    out["autocast_weight_copies"] = meter.weight_copies     # 16-bit weight copies kept for backward
    out["cuda_peak"] = (torch.cuda.max_memory_allocated(dev) - base) if dev.type == "cuda" else None
    return out


class Checkpointed(nn.Module):
    """A ``nn.Sequential`` run with activation checkpointing in ``segments`` chunks (same parameters).

    Each checkpointed chunk keeps only its input; torch's ``checkpoint_sequential`` runs the *last* chunk
    normally. About ``sqrt(n_layers)`` chunks minimises the total (Chen et al., 2016); too many chunks keep
    every layer's input and save nothing.
    """

    def __init__(self, seq: nn.Sequential, segments: int):
        super().__init__()
        if not 1 <= segments <= len(seq):
            raise ValueError(f"segments must be between 1 and the {len(seq)} layers, got {segments}")
        self.seq, self.segments = seq, segments

    def forward(self, x):
        # reentrant checkpointing saves each segment's input through autograd, so the meter sees it;
        # it needs an input that requires grad for the parameters to get gradients
        if not x.requires_grad:
            x = x.detach().requires_grad_(True)
        return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=True)


def checkpointed(seq: nn.Sequential, segments: int) -> Checkpointed:
    return Checkpointed(seq, segments)


# --------------------------------------------------------------------------- models for the notebook
def conv_net(in_ch: int = 1, width: int = 16, depth: int = 4, n_classes: int = 3, ndim: int = 2) -> nn.Sequential:
    """``depth`` blocks conv3-ReLU at full resolution, then global pooling and a linear head (2-D or 3-D)."""
    Conv = nn.Conv2d if ndim == 2 else nn.Conv3d
    Pool = nn.AdaptiveAvgPool2d if ndim == 2 else nn.AdaptiveAvgPool3d
    layers, c = [], in_ch
    for _ in range(depth):
        layers += [Conv(c, width, 3, padding=1), nn.ReLU()]
        c = width
    layers += [Pool(1), nn.Flatten(), nn.Linear(width, n_classes)]
    return nn.Sequential(*layers)


def mlp(dim: int = 64, hidden: int = 256, depth: int = 4, n_classes: int = 4) -> nn.Sequential:
    return MLP(dim, n_classes, hidden=hidden, depth=depth)


def activation_sweep(sizes, ndim: int = 3, batch: int = 1, width: int = 8, depth: int = 3, seed: int = 0) -> list[dict]:
    """Measured activation bytes of :func:`conv_net` against the input side length (2-D or 3-D)."""
    rows = []
    for n in sizes:
        torch.manual_seed(seed)
        model = conv_net(1, width, depth, ndim=ndim)
        x = torch.randn(batch, 1, *([n] * ndim))                 # (batch, 1, n, n[, n])
        y = torch.zeros(batch, dtype=torch.long)
        m = measure(model, x, y, optimizer="sgd")
        rows.append(dict(size=n, voxels=n ** ndim, activations=m["activations"], params=m["params"]))
    return rows


def format_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(b) < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
