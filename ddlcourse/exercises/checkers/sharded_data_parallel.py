"""Checkers of notebooks/19_sharded_data_parallel.ipynb: ZeRO-2's bytes per parameter, the ZeRO-1 step and a
ZeRO-3 (FSDP) layer (their references and typical mistakes are in
:mod:`ddlcourse.exercises.solutions.sharded_data_parallel`)."""
import numpy as np
import torch

from ddlcourse import dist
from ddlcourse.exercises.solutions.sharded_data_parallel import ZERO1_VARIANTS
from ddlcourse.memory import SavedTensors
from ddlcourse.parallel import sharded
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose, exercise, raised


@exercise("zero2_bytes_per_param", "parameters stay whole (4 bytes); gradients (4) and Adam state (8) are split over N")
def zero2_bytes_per_param(world_size: int) -> float:
    return 4 + 12 / world_size


# --------------------------------------------------------------------------- coding exercise: the ZeRO-1 step
ZERO1_HINTS = {      # the checker runs the wrong step of each kind on the ranks (ZERO1_VARIANTS)
    "sum": "the gradient on its owner is the sum over the ranks: divide it by world (the mean, as serial "
           "training on the whole batch has)",
    "no_broadcast": "the parameters a rank does not own are stale: after its step each owner must broadcast its "
                    "parameters to the other ranks",
    "all_step": "every rank stepped every parameter, so every rank keeps optimizer state for all of them (DDP's "
                "memory, not ZeRO-1's): set the gradient of a parameter you do not own to None before "
                "optimizer.step(); the optimizer then skips it and never allocates its state",
    "local": "each owner stepped with its own rank's gradient only: first reduce (sum) every gradient to its "
             "owner, and divide it there by world",
}


@code_exercise("zero1_step", distributed=True, ranks=(2, 3))
def check_zero1_step(fn, steps: int = 3, **_) -> Verdict:
    """On every rank, after ``loss.backward()`` on the rank's share of the batch: ``fn(params, owner, rank, world,
    optimizer)`` makes one ZeRO-1 step. ``owner[i]`` is the rank that owns ``params[i]`` (``sharded.assign_owners``);
    ``optimizer`` was built over all the parameters, as in DDP, and creates a parameter's state at its first step.
    After ``steps`` steps the parameters must equal serial training on the whole batch (SGD with momentum, which,
    unlike Adam, shows a summed gradient) and each rank must keep optimizer state only for the parameters it owns."""
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch import nn

    info = dist.init()
    r, n = tdist.get_rank(), tdist.get_world_size()
    g = torch.Generator().manual_seed(12)
    X = torch.randn(steps, 4 * n, 6, generator=g, dtype=torch.float64).to(info.device)   # (step, global batch, in)
    Y = torch.randn(steps, 4 * n, 2, generator=g, dtype=torch.float64).to(info.device)

    def build():
        m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).to(info.device, torch.float64)
        gen = torch.Generator().manual_seed(3)             # the same weights on every rank, whatever the global seed
        with torch.no_grad():
            for q in m.parameters():
                q.copy_(0.5 * torch.randn(q.shape, generator=gen, dtype=torch.float64))
        return m

    def make_optimizer(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    serial = build()
    opt = make_optimizer(serial.parameters())
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        F.mse_loss(serial(X[s]), Y[s]).backward()
        opt.step()
    params = list(serial.parameters())
    owner = sharded.assign_owners(params, n)
    ref = np.concatenate([np.asarray(q.detach().cpu(), dtype=float).reshape(-1) for q in params]
                         + [[float(o == r) for o in owner]])

    def run(f):
        m = build()
        ps = list(m.parameters())
        opt = make_optimizer(ps)
        for s in range(steps):
            for q in ps:
                q.grad = None
            F.mse_loss(m(X[s, 4 * r:4 * (r + 1)]), Y[s, 4 * r:4 * (r + 1)]).backward()   # this rank's share
            f(ps, list(owner), r, n, opt)
        has_state = [float(bool(opt.state.get(q))) for q in ps]
        return np.concatenate([np.asarray(q.detach().cpu(), dtype=float).reshape(-1) for q in ps] + [has_state])

    mistakes = {hint: run(ZERO1_VARIANTS[kind]) for kind, hint in ZERO1_HINTS.items()}
    return diagnose(run(fn), ref, mistakes, rtol=1e-9, atol=1e-12,
                    what=f"rank {r}'s parameters and optimizer-state flags")


# --------------------------------------------------------------------------- coding exercise: a ZeRO-3 (FSDP) layer
_SHARD_HINTS = {
    "all_reduce": "you all-reduced the whole gradient: every rank then holds all of it, which ZeRO-3 is there "
                  "to avoid; reduce-scatter it (torch.distributed.reduce_scatter) so each rank receives only its "
                  "shard's sum",
    "gather": "you all-gathered whole gradients: every rank then holds every rank's gradient, world times more "
              "than ZeRO-3 lets it hold; reduce-scatter the gradient (torch.distributed.reduce_scatter) so each "
              "rank receives only its shard's sum (the only all-gather of ZeRO-3 is of the parameter shards)",
    "sum": "the shard's gradient is the sum over the ranks: divide it by world (the mean, as serial training on "
           "the whole batch has)",
    "keep": "the full weight stays alive after forward",
    "floor": "when P is not divisible by world, pad the flat parameters with zeros to a multiple of world (every "
             "shard has ceil(P / world) numbers) and drop the padding after the all-gather",
    "view": "your shard is a view of the full flat vector",
}


class _Collectives:
    """Counts the calls of torch.distributed's collectives while it is active (the learner's, not the checker's),
    and keeps the largest tensor a rank gave to an all-gather (``gathered``: numbers)."""
    NAMES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor")

    def __enter__(self):
        import torch.distributed as tdist
        self.calls, self.saved, self.gathered = {}, {n: getattr(tdist, n) for n in self.NAMES}, 0

        def counted(name, f):
            def call(*a, **k):
                self.calls[name] = self.calls.get(name, 0) + 1
                if name.startswith("all_gather"):
                    given = k.get("tensor", k.get("input_tensor", a[1] if len(a) > 1 else None))
                    self.gathered = max(self.gathered, given.numel() if given is not None else 0)
                return f(*a, **k)
            return call
        for n, f in self.saved.items():
            setattr(tdist, n, counted(n, f))
        return self

    def __exit__(self, *exc):
        import torch.distributed as tdist
        for n, f in self.saved.items():
            setattr(tdist, n, f)


def _storage_numel(t) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def _kept_by_autograd(y) -> int:
    """The largest storage (in numbers) that the graph of ``y`` holds in custom functions' ``ctx`` attributes."""
    biggest, todo, seen = 0, [y.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        try:
            attrs = vars(node)
        except TypeError:                               # a C++ node: its saved tensors went through the hooks
            attrs = {}
        for v in attrs.values():
            if isinstance(v, torch.Tensor):
                biggest = max(biggest, _storage_numel(v))
        todo.extend(f for f, _ in node.next_functions)
    return biggest


def _train_sharded(cls, W, b, X, Y, rank, world, lr):
    """Train ``cls(W, b, rank, world)`` with SGD on this rank's rows of each step's batch. Returns a dict: the
    outputs and input gradients (one vector), the layer's parameters, the collectives called, the largest
    storage autograd kept in forward and what the layer holds."""
    import torch.nn.functional as F

    rows = slice(rank * X.shape[1] // world, (rank + 1) * X.shape[1] // world)
    out = dict(vec=[], kept=0, held=0)
    with _Collectives() as coll:
        layer = cls(W.clone(), b.clone(), rank, world)
        params = list(layer.parameters())
        opt = torch.optim.SGD(params, lr=lr)
        for s in range(X.shape[0]):
            opt.zero_grad(set_to_none=True)
            x = X[s, rows].clone().requires_grad_(True)
            with SavedTensors(skip=[x]) as saved:         # the input is the caller's, not kept by the layer
                y = layer(x)
            out["kept"] = max([out["kept"], _kept_by_autograd(y)] + [b // x.element_size() for b in saved.sizes.values()])
            out["held"] = max(out["held"], sum(_storage_numel(t) for m in layer.modules()
                                              for t in list(vars(m).values()) + list(m._buffers.values())
                                              if isinstance(t, torch.Tensor)))
            F.mse_loss(y, Y[s, rows]).backward()
            opt.step()
            out["vec"] += [y.detach().reshape(-1), x.grad.reshape(-1)]
    out["params"], out["calls"], out["gathered"] = params, coll.calls, coll.gathered
    out["vec"] = torch.cat(out["vec"]).cpu().numpy()
    return out


def _serial_sharded(W, b, X, Y, rank, world, lr, scale=1.0):
    """Serial training of the full layer on the whole batch (``scale``: the gradient multiplied, as summing
    over the ranks does): this rank's outputs and input gradients, and the final flat parameters."""
    import torch.nn.functional as F

    W, b = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
    rows = slice(rank * X.shape[1] // world, (rank + 1) * X.shape[1] // world)
    vec = []
    for s in range(X.shape[0]):
        x = X[s, rows].clone().requires_grad_(True)
        y = x @ W.T + b
        gx, = torch.autograd.grad(F.mse_loss(y, Y[s, rows]), x)
        vec += [y.detach().reshape(-1), gx.reshape(-1)]
        gW, gb = torch.autograd.grad(F.mse_loss(X[s] @ W.T + b, Y[s]), (W, b))
        with torch.no_grad():
            W -= lr * scale * gW
            b -= lr * scale * gb
    return torch.cat(vec).cpu().numpy(), torch.cat([W.detach().reshape(-1), b.detach()]).cpu().numpy()


def _judge_sharded(res, W, b, X, Y, rank, world, lr) -> Verdict:
    import torch.distributed as tdist

    P, n_w = W.numel() + b.numel(), W.numel()
    size = -(-P // world)
    params = res["params"]
    numels = [q.numel() for q in params]
    if sum(numels) >= P:
        return Verdict(False, f"{_SHARD_HINTS['keep']}: the layer holds {sum(numels)} parameter numbers, all "
                              f"P = {P} of them; keep only its shard of ceil(P / world) = {size} as its parameter")
    if numels != [size]:
        return Verdict(False, f"the layer's parameters have {numels} numbers; it must hold one, its flat shard of "
                              f"ceil(P / world) = {size} numbers (P = {P}, world = {world}); {_SHARD_HINTS['floor']}")
    shard = params[0]
    if _storage_numel(shard) > size:
        return Verdict(False, f"{_SHARD_HINTS['view']}: its storage holds {_storage_numel(shard)} numbers, which "
                              f"stay alive with it; .clone() your piece so that the layer keeps only {size}")
    pieces = [torch.empty_like(shard) for _ in range(world)]
    tdist.all_gather(pieces, shard.detach().contiguous())
    full = torch.cat(pieces)
    ans = np.concatenate([res["vec"], full[:P].cpu().numpy()])
    ref = np.concatenate(_serial_sharded(W, b, X, Y, rank, world, lr))
    wrong = np.concatenate(_serial_sharded(W, b, X, Y, rank, world, lr, scale=world))
    v = diagnose(ans, ref, {_SHARD_HINTS["sum"]: wrong}, rtol=1e-9, atol=1e-12,
                 what="the outputs, input gradients and trained parameters")
    if not v.ok:
        return v
    if res["calls"].get("all_reduce"):
        return Verdict(False, _SHARD_HINTS["all_reduce"])
    if res["gathered"] > size:
        return Verdict(False, f"{_SHARD_HINTS['gather']} (a rank gave {res['gathered']} numbers to an all-gather; "
                              f"a shard has {size})")
    if res["kept"] >= n_w:
        return Verdict(False, f"{_SHARD_HINTS['keep']}: autograd keeps a tensor of {res['kept']} numbers for "
                              f"backward (the weight has {n_w}); save the shard and gather the weight again in "
                              "backward (a torch.autograd.Function)")
    if res["held"] >= n_w:
        return Verdict(False, f"{_SHARD_HINTS['keep']}: the layer keeps tensors of {res['held']} numbers beside "
                              f"its shard (the weight has {n_w}); let the gathered weight go when forward returns")
    return Verdict(True)


@code_exercise("sharded_linear", distributed=True, ranks=(2, 3))
def check_sharded_linear(cls, steps: int = 3, lr: float = 0.1, **_) -> Verdict:
    """On every rank: ``cls(weight, bias, rank, world)`` is a ZeRO-3 Linear layer (see
    :class:`ddlcourse.exercises.solutions.sharded_data_parallel.ShardedLinear`). Trained with SGD for ``steps``
    steps on each rank's share of the batch, it must give the outputs, input gradients and (gathered) parameters
    of serial training of the full layer on the whole batch. Run on two layers: one whose P = out*in + out is a
    multiple of world and one (7 x 12, P = 91) whose P is not, so a missing padding shows. It must hold one
    parameter of ceil(P / world) numbers with its own storage, reduce-scatter the gradient (not all-reduce it),
    and keep no full weight alive after forward."""
    import torch.distributed as tdist

    info = dist.init()
    r, n = tdist.get_rank(), tdist.get_world_size()

    def inputs(out_f, in_f, seed):
        g = torch.Generator().manual_seed(seed)
        t = [torch.randn(*s, generator=g, dtype=torch.float64) for s in
             [(out_f, in_f), (out_f,), (steps, 3 * n, in_f), (steps, 3 * n, out_f)]]
        return [0.5 * u.to(info.device) if i < 2 else u.to(info.device) for i, u in enumerate(t)]

    uneven, even = inputs(7, 12, 21), inputs(n, 5, 22)            # P = 91 (not divisible by 2, 3, 4); P = 6n
    try:
        res_u = _train_sharded(cls, *uneven, r, n, lr)
    except NotImplementedError:
        raise
    except Exception as e:                                         # the learner's code, on the uneven layer
        res_u = e
        raised(e)
    res_e = _train_sharded(cls, *even, r, n, lr)
    v = _judge_sharded(res_e, *even, r, n, lr)
    if v.ok and isinstance(res_u, Exception):
        v = Verdict(False, f"right when P is a multiple of world, but with P = 91 your layer raised "
                           f"{type(res_u).__name__}: {res_u}. {_SHARD_HINTS['floor']}")
    elif v.ok:
        v = _judge_sharded(res_u, *uneven, r, n, lr)
        if not v.ok and _SHARD_HINTS["floor"] not in v.message and not any(
                h.split(":")[0] in v.message for h in _SHARD_HINTS.values()):
            v = Verdict(False, f"right when P is a multiple of world, not with P = 91: {v.message}. "
                               f"{_SHARD_HINTS['floor']}")
    return agreed(v)
