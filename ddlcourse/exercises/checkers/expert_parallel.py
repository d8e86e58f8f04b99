"""Checkers of notebooks/22_expert_parallel.ipynb: the router, against the package's, and the dispatch and combine
of an expert-parallel layer, against the serial MoE layer (their references and typical mistakes are in
:mod:`ddlcourse.exercises.solutions.expert_parallel`)."""
import torch
import torch.distributed as tdist
import torch.nn.functional as F

from ddlcourse import dist
from ddlcourse.exercises.solutions.expert_parallel import ROUTE_VARIANTS
from ddlcourse.models.transformer import route as _route
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose


# --------------------------------------------------------------------------- the router
def _summary(out):
    """Kept gate weight per (token, expert): the routing decision as one comparable array."""
    experts, gates, keep = out[0], out[1], out[2]
    n, E = experts.shape[0], 8
    w = torch.zeros(n, E, dtype=torch.float64)
    w.scatter_add_(1, experts, (gates * keep).double())
    return w.numpy()


ROUTE_HINTS = {   # the checker routes with the wrong router of each kind (ROUTE_VARIANTS) to name the mistake
    "no_capacity": "no capacity limit: an expert keeps at most `capacity` tokens; the rest are dropped (keep=False)",
    "no_renormalise": "the gates are not renormalised: divide the top-k probabilities by their sum",
    "token_major": "wrong priority: serve every token's first choice before any second choice (choice-major order)",
}


@code_exercise("moe_route")
def check_route(fn, **_):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(24, 8, generator=g) + 2.0 * torch.randn(1, 8, generator=g)   # a skewed router
    ref = _route(logits, 2, 5)
    ans = fn(logits, 2, 5)
    wrong = {hint: _summary(ROUTE_VARIANTS[kind](logits, 2, 5)) for kind, hint in ROUTE_HINTS.items()}
    return diagnose(_summary(ans), _summary(ref), wrong, what="the kept gate weights per token and expert")


# --------------------------------------------------------------------------- build it: dispatch and combine
HINTS = {
    "counts": "the counts are not exchanged: rank {src} sends {sent} rows to rank {dst}, which expects {expected}. "
              "Exchange the counts first (all_to_all_single of the counts); what a rank receives is what the others "
              "send it, not what it sends",
    "expert_id": "the tokens are sent to the expert id, not to the rank of the expert: split sizes need one entry "
                 "per rank ({n}), got {got}; the rank that holds expert e is e // experts_per_rank",
    "order": "the original order is not restored: the rows come back in the order you sent them (sorted by "
             "destination); put row k back at token order[k]",
    "wrong_rank": "rank {r} was asked to run local expert {j}, but it holds only experts 0 .. {last}: the "
                  "tokens went to the wrong rank",
    "bad_size": "an all_to_all_single buffer does not match its split sizes: {what}",
}


class _ExchangeError(RuntimeError):
    """A mistake seen in an all_to_all_single call, the same on every rank (no rank waits for ever)."""


def _checked_all_to_all(real, world):
    """``all_to_all_single`` that first compares every rank's split sizes (over MPI) and raises the same
    :class:`_ExchangeError` on every rank when they do not fit together."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        n = world
        mine = (list(output_split_sizes) if output_split_sizes is not None else None,
                list(input_split_sizes) if input_split_sizes is not None else None,
                int(output.shape[0]) if output.dim() else 1, int(input.shape[0]) if input.dim() else 1)
        every = MPI.COMM_WORLD.allgather(mine)
        for r, (out_s, in_s, out_len, in_len) in enumerate(every):
            for s in (out_s, in_s):
                if s is not None and len(s) != n:
                    raise _ExchangeError(HINTS["expert_id"].format(n=n, got=len(s)))
            if out_s is None and out_len % n or in_s is None and in_len % n:
                raise _ExchangeError(HINTS["expert_id"].format(n=n, got=f"a tensor of {max(out_len, in_len)} "
                                                                          "counts on rank " + str(r)))
            if out_s is not None and sum(out_s) != out_len or in_s is not None and sum(in_s) != in_len:
                raise _ExchangeError(HINTS["bad_size"].format(what=f"on rank {r}, {out_len} output rows for "
                                     f"splits {out_s}, {in_len} input rows for splits {in_s}"))
        for src, (_, in_s, _, in_len) in enumerate(every):
            for dst, (out_s, _, out_len, _) in enumerate(every):
                sent = in_s[dst] if in_s is not None else in_len // n
                expected = out_s[src] if out_s is not None else out_len // n
                if sent != expected:
                    raise _ExchangeError(HINTS["counts"].format(src=src, sent=sent, dst=dst, expected=expected))
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
    return all_to_all_single


def _experts(n_experts, d, device):
    g = torch.Generator().manual_seed(44)
    w = torch.randn(n_experts, d, d, generator=g, dtype=torch.float64) / d ** 0.5
    b = torch.randn(n_experts, d, generator=g, dtype=torch.float64)
    return w.to(device), b.to(device)


def _run(fn, x, expert_of, per_rank, w, b, rank):
    """``fn`` with this rank's local experts; returns (output, what went wrong in the experts' calls or None)."""
    seen = []

    def expert_fn(j, rows):
        if not 0 <= j < per_rank:
            seen.append(HINTS["wrong_rank"].format(r=rank, j=j, last=per_rank - 1))
            return torch.zeros_like(rows)          # go on: the other ranks wait for this one's rows
        e = rank * per_rank + j
        return torch.tanh(rows @ w[e] + b[e])

    real = tdist.all_to_all_single
    tdist.all_to_all_single = _checked_all_to_all(real, tdist.get_world_size())
    try:
        return _with_imports(fn)(x.clone(), expert_of.clone(), per_rank, expert_fn), (seen[0] if seen else None)
    finally:
        tdist.all_to_all_single = real


@code_exercise("moe_dispatch_combine", distributed=True)
def check_moe_dispatch_combine(fn, **_):
    """On every rank: ``fn`` on this rank's tokens (a different number on every rank, a skewed routing, so the
    splits are uneven) must give each token its own expert's output, as the serial MoE layer does."""
    info = dist.init()
    r, n, dev = tdist.get_rank(), tdist.get_world_size(), info.device
    per_rank, d = 2, 6
    E = n * per_rank
    g = torch.Generator().manual_seed(100 + r)
    n_tok = 4 + E + 3 + 2 * r
    x = torch.randn(n_tok, d, generator=g, dtype=torch.float64).to(dev)
    favourite = torch.tensor([(r + 1) % E] * 4)                 # a skewed router: every rank's favourite expert
    expert_of = torch.cat([favourite, torch.arange(E), torch.randint(0, E, (n_tok - 4 - E,), generator=g)])
    expert_of = expert_of[torch.randperm(n_tok, generator=g)].to(dev)
    w, b = _experts(E, d, dev)
    ref = torch.tanh(torch.einsum("nd,nde->ne", x, w[expert_of]) + b[expert_of])     # the serial MoE layer
    try:
        ans, problem = _run(fn, x, expert_of, per_rank, w, b, r)
    except _ExchangeError as e:
        return Verdict(False, str(e))
    if problem:
        v_ = Verdict(False, problem)
    elif not isinstance(ans, torch.Tensor) or ans.shape != ref.shape:
        v_ = Verdict(False, f"return a tensor of shape {tuple(ref.shape)}, not "
                     + (str(tuple(ans.shape)) if isinstance(ans, torch.Tensor) else type(ans).__name__))
    else:
        ans, ref = ans.detach().to("cpu", torch.float64), ref.cpu()
        v_ = diagnose(ans.numpy(), ref.numpy(), {}, rtol=1e-9, atol=1e-12, what=f"rank {r}'s output")
        if not v_.ok and _same_rows(ans, ref):
            v_ = Verdict(False, HINTS["order"])
    return agreed(v_)


def _same_rows(ans, ref):
    """The same rows in another order."""
    dist_ = torch.cdist(ans, ref)
    return bool((dist_.min(1).values < 1e-9).all() and (dist_.min(0).values < 1e-9).all())



def _with_imports(fn):
    """On an engine, a function from the notebook looks its globals up in the engine's namespace, where the
    notebook's imports are missing: give it the modules the template imports (names already there are kept)."""
    g = getattr(fn, "__globals__", None)
    if isinstance(g, dict):
        for name, mod in (("torch", torch), ("tdist", tdist), ("F", F)):
            g.setdefault(name, mod)
    return fn
