"""Reference solutions of notebooks/19_sharded_data_parallel.ipynb: the ZeRO-1 step and a ZeRO-3 (FSDP) layer, and
each with one typical mistake (what its checker, :mod:`ddlcourse.exercises.checkers.sharded_data_parallel`, must
name)."""
import torch

from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: the ZeRO-1 step
def _zero1_variant(kind: str):
    """Typical wrong ZeRO-1 steps ``(params, owner, rank, world, optimizer)`` (every rank makes the same calls)."""
    import torch
    import torch.distributed as tdist

    def step(params, owner, rank, world, optimizer):
        for p, o in zip(params, owner):
            if kind == "all_step":                          # DDP: every rank gets the mean of every gradient
                tdist.all_reduce(p.grad)
                p.grad /= world
                continue
            if kind != "local":
                tdist.reduce(p.grad, o, op=tdist.ReduceOp.SUM)
            if o == rank:
                if kind not in ("sum", "local"):
                    p.grad /= world
            elif kind != "no_drop":
                p.grad = None                               # not mine: the optimizer skips it, keeps no state
        optimizer.step()
        if kind in ("all_step", "no_broadcast"):
            return
        with torch.no_grad():
            for p, o in zip(params, owner):
                tdist.broadcast(p, o)
    return step


# The checker runs each of these on the ranks to name the learner's mistake (keyed as its ZERO1_HINTS).
ZERO1_VARIANTS = {kind: _zero1_variant(kind) for kind in ("sum", "no_broadcast", "all_step", "local")}


def zero1_step(params, owner, rank, world, optimizer):
    """One ZeRO-1 step on this rank, after loss.backward() on this rank's share of the batch."""
    import torch
    import torch.distributed as tdist
    for p, o in zip(params, owner):
        tdist.reduce(p.grad, dst=o)        # the sum of every rank's gradient, on its owner only
        if o == rank:
            p.grad /= world                # the mean: serial training on the whole batch
        else:
            p.grad = None                  # not mine: the optimizer skips it and keeps no state for it
    optimizer.step()
    with torch.no_grad():
        for p, o in zip(params, owner):
            tdist.broadcast(p, src=o)      # the owner's updated values, to every rank


# The fragments are the checker's hints (ZERO1_HINTS) up to their first colon.
reference("zero1_step", mistakes=[
    (ZERO1_VARIANTS["sum"], "the gradient on its owner is the sum over the ranks"),
    (ZERO1_VARIANTS["no_broadcast"], "the parameters a rank does not own are stale"),
    (ZERO1_VARIANTS["all_step"], "every rank stepped every parameter, so every rank keeps optimizer state for all "
                                 "of them (DDP's memory, not ZeRO-1's)"),
    (ZERO1_VARIANTS["local"], "each owner stepped with its own rank's gradient only")])(zero1_step)


# --------------------------------------------------------------------------- coding exercise: a ZeRO-3 (FSDP) layer
class ShardedLinear(torch.nn.Module):
    """A Linear layer whose parameters are sharded over the ranks, as ZeRO-3 and FSDP do.

    weight (out, in) and bias (out,) are the same on every rank when the layer is built. They are flattened into
    one vector [weight.flatten(), bias] of P = out*in + out numbers, padded with zeros to a multiple of world,
    and rank r keeps only piece r, of ceil(P / world) numbers, as its one parameter. forward(x): x (batch, in)
    -> (batch, out), with the full weight gathered for the product and freed after it (gathered again in backward).
    Backward gives this rank's shard the mean over the ranks of its part of the gradient (a reduce-scatter).
    """

    class _Gathered(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, shard, layer):
            ctx.layer = layer
            ctx.save_for_backward(x, shard)            # the shard, never the full weight
            w, b = layer.gather(shard)
            return x @ w.T + b                         # w and b are freed when forward returns

        @staticmethod
        def backward(ctx, grad_out):
            import torch.distributed as tdist
            x, shard = ctx.saved_tensors
            layer = ctx.layer
            w, _ = layer.gather(shard)                 # gathered again, for the input's gradient
            grad_flat = torch.cat([(grad_out.T @ x).reshape(-1), grad_out.sum(0)])
            grad_flat = torch.nn.functional.pad(grad_flat, (0, shard.numel() * layer.world - layer.numel))
            grad_shard = torch.empty_like(shard)
            tdist.reduce_scatter(grad_shard, list(grad_flat.chunk(layer.world)))   # my piece of the sum
            return grad_out @ w, grad_shard / layer.world, None

    def __init__(self, weight, bias, rank, world):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.numel, self.world = weight.numel() + bias.numel(), world
        size = -(-self.numel // world)                 # ceil: every shard has the same size
        flat = torch.cat([weight.detach().reshape(-1), bias.detach()])
        flat = torch.nn.functional.pad(flat, (0, size * world - self.numel))
        self.shard = torch.nn.Parameter(flat[rank * size:(rank + 1) * size].clone())   # its own storage

    def gather(self, shard):
        import torch.distributed as tdist
        pieces = [torch.empty_like(shard) for _ in range(self.world)]
        tdist.all_gather(pieces, shard.detach().contiguous())
        full = torch.cat(pieces)
        n_w = self.out_features * self.in_features
        return full[:n_w].view(self.out_features, self.in_features), full[n_w:self.numel]

    def forward(self, x):
        return self._Gathered.apply(x, self.shard, self)


def _sharded_variant(kind: str):
    """ShardedLinear with one typical mistake: ``all_reduce`` (the whole gradient all-reduced, then sliced),
    ``gather_grads`` (every rank's whole gradient all-gathered and summed here),
    ``sum`` (no division by world), ``keep`` (the gathered weight kept for backward), ``floor`` (shards of
    P // world numbers: no padding), ``view`` (the shard a view of the full flat vector)."""
    import torch.distributed as tdist
    import torch.nn.functional as F

    class Variant(ShardedLinear):
        class _Gathered(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, shard, layer):
                ctx.layer = layer
                w, b = layer.gather(shard)
                ctx.save_for_backward(x, shard, w if kind == "keep" else shard)
                return x @ w.T + b

            @staticmethod
            def backward(ctx, grad_out):
                x, shard, kept = ctx.saved_tensors
                layer = ctx.layer
                w = kept if kind == "keep" else layer.gather(shard)[0]
                grad_flat = torch.cat([(grad_out.T @ x).reshape(-1), grad_out.sum(0)])
                grad_flat = F.pad(grad_flat, (0, shard.numel() * layer.world - grad_flat.numel()))
                if kind == "all_reduce":
                    tdist.all_reduce(grad_flat)
                    grad_shard = grad_flat.chunk(layer.world)[layer.rank].clone()
                elif kind == "gather_grads":                 # every rank's whole gradient, summed here
                    every = [torch.empty_like(grad_flat) for _ in range(layer.world)]
                    tdist.all_gather(every, grad_flat)
                    grad_shard = torch.stack(every).sum(0).chunk(layer.world)[layer.rank].clone()
                else:
                    grad_shard = torch.empty_like(shard)
                    tdist.reduce_scatter(grad_shard, list(grad_flat.chunk(layer.world)))
                return grad_out @ w, grad_shard if kind == "sum" else grad_shard / layer.world, None

        def __init__(self, weight, bias, rank, world):
            torch.nn.Module.__init__(self)
            self.out_features, self.in_features = weight.shape
            self.numel, self.world, self.rank = weight.numel() + bias.numel(), world, rank
            size = self.numel // world if kind == "floor" else -(-self.numel // world)
            flat = torch.cat([weight.detach().reshape(-1), bias.detach()])
            flat = F.pad(flat, (0, max(0, size * world - self.numel)))
            piece = flat[rank * size:(rank + 1) * size]
            self.shard = torch.nn.Parameter(piece if kind == "view" else piece.clone())

        def gather(self, shard):
            w, b = ShardedLinear.gather(self, shard)
            if kind == "floor" and b.numel() < self.out_features:   # the tail of the flat vector is on no rank
                raise RuntimeError(f"shape '[{self.out_features}]' is invalid for input of size {b.numel()}")
            return w, b

    Variant.__name__ = Variant.__qualname__ = f"ShardedLinear_{kind}"
    return Variant


# The fragments are the checker's hints (_SHARD_HINTS) up to their first colon.
reference("sharded_linear", mistakes=[
    (_sharded_variant("all_reduce"), "you all-reduced the whole gradient"),
    (_sharded_variant("gather_grads"), "you all-gathered whole gradients"),
    (_sharded_variant("sum"), "the shard's gradient is the sum over the ranks"),
    (_sharded_variant("keep"), "the full weight stays alive after forward"),
    (_sharded_variant("floor"), "when P is not divisible by world, pad the flat parameters with zeros to a multiple "
                                "of world (every shard has ceil(P / world) numbers) and drop the padding after the "
                                "all-gather"),
    (_sharded_variant("view"), "your shard is a view of the full flat vector")])(ShardedLinear)
