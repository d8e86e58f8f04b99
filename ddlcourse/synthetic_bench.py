"""A synthetic-data throughput benchmark, in the spirit of Horovod's ``pytorch_synthetic_benchmark.py``.

Random images and labels that never change, so only the model, the gradient exchange and the
hardware are measured (no data loading). It reports images per second per rank and in total.

From the command line, on 1, 2, ... ranks::

    mpiexec -n 2 python -m ddlcourse synthetic-bench --model smallcnn --batch-size 32 --backend ddp
    srun -n 8 python -m ddlcourse synthetic-bench --model resnet --image-size 224 --backend horovod

From a notebook, on every engine: ``c.run(synthetic_bench.run, model="smallcnn", batch_size=32)``;
``group=`` runs it on a subgroup (``dist.subgroup(k)``) to get 1-, 2-, 4-rank points from one cluster.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ddlcourse.device import now
from ddlcourse.models.small import MLP, SmallCNN
from ddlcourse import dist
from ddlcourse.parallel.data_parallel import average_gradients, broadcast_parameters, wrap

MODELS = ("mlp", "smallcnn", "resnet")


BACKENDS = ("ddp", "horovod", "allreduce", "none")


class _Block(nn.Module):
    """The basic residual block of ResNet-18/34 (He et al. 2016)."""

    def __init__(self, ci: int, co: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(ci, co, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(co)
        self.c2 = nn.Conv2d(co, co, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(co)
        self.skip = nn.Sequential() if stride == 1 and ci == co else nn.Sequential(
            nn.Conv2d(ci, co, 1, stride, bias=False), nn.BatchNorm2d(co))

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))


STEMS = ("imagenet", "cifar")


class TinyResNet(nn.Module):
    """A ResNet-18-shaped network (4 stages of 2 blocks) whose width is a parameter.

    ``stem="imagenet"`` is ResNet-18's own stem (He et al. 2016): a 7x7 convolution with stride 2 and a 3x3
    max-pool with stride 2, so the blocks see a quarter of the image's side (224 -> 56); at ``width=64`` the
    network is ResNet-18. ``stem="cifar"`` is the stride-1 3x3 stem used for small (32x32) images; on a large
    image it keeps every block at full resolution and its activations grow 16-fold.
    """

    def __init__(self, in_ch: int = 3, n_classes: int = 10, width: int = 16, stem: str = "imagenet"):
        super().__init__()
        if stem == "imagenet":
            self.stem = nn.Sequential(nn.Conv2d(in_ch, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))   # (batch, width, H/4, W/4)
        elif stem == "cifar":
            self.stem = nn.Sequential(nn.Conv2d(in_ch, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU())                          # (batch, width, H, W)
        else:
            raise ValueError(f"unknown stem {stem!r}; choose one of {', '.join(STEMS)}")
        blocks, ci = [], width
        for i, co in enumerate([width, 2 * width, 4 * width, 8 * width]):
            blocks += [_Block(ci, co, 1 if i == 0 else 2), _Block(co, co, 1)]
            ci = co
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(ci, n_classes)

    def forward(self, x):                                  # x: (batch, in_ch, H, W)
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


IMAGENET_STEM_FROM = 64     # images of at least this side get ResNet's strided ImageNet stem


def build_model(name: str, image_size: int, width: int = 16, n_classes: int = 10) -> nn.Module:
    """``mlp``, ``smallcnn`` or ``resnet`` for square RGB images of side ``image_size``.

    ``resnet`` takes the ImageNet stem (stride 4 before the blocks) for images of side >= 64, the CIFAR stem
    (stride 1) for smaller ones, as the ResNet paper does for its ImageNet and CIFAR-10 networks.
    """

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), MLP(3 * image_size * image_size, n_classes, hidden=8 * width, depth=3))
    if name == "smallcnn":
        return SmallCNN(in_ch=3, n_classes=n_classes, width=width)
    if name == "resnet":
        return TinyResNet(3, n_classes, width, stem="imagenet" if image_size >= IMAGENET_STEM_FROM else "cifar")
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def run(model: str = "smallcnn", batch_size: int = 32, image_size: int = 32, width: int = 16,
        backend: str = "ddp", num_warmup_batches: int = 2, batches_per_iter: int = 3, num_iters: int = 5,
        fp16_allreduce: bool = False, n_ranks: int | None = None, group=None, lr: float = 0.01,
        n_classes: int = 10) -> dict | None:
    """Train ``model`` on one fixed random batch per rank and time it. Runs on every rank.

    ``batch_size`` is the per-rank (micro) batch. ``n_ranks=k`` runs on the first k ranks only (the
    others return None at once), so one cluster gives the 1-, 2-, 4-rank points; ``group`` instead
    takes an explicit ``torch.distributed`` group that every calling rank belongs to. Returns, on the ranks that took part, a dict with
    ``img_sec_rank`` (mean, and ``img_sec_rank_ci``: 1.96 standard deviations over iterations) and
    ``img_sec_total`` (per-rank rate times the number of ranks, as Horovod reports); None elsewhere.
    """

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if batch_size < 1 or num_iters < 1 or batches_per_iter < 1:
        raise ValueError("batch_size, num_iters and batches_per_iter must all be >= 1")
    info = dist.init(horovod=(backend == "horovod"))
    if backend == "horovod" and group is not None:
        raise ValueError("the horovod backend spans all ranks; pass group=None or use backend='ddp'")
    if n_ranks is not None:
        if backend == "horovod" and n_ranks != info.world_size:
            raise ValueError("the horovod backend spans all ranks; use backend='ddp' for n_ranks < world size")
        comm, group = dist.subgroup(n_ranks)
        if comm is None:
            return None
    world = torch.distributed.get_world_size(group)
    torch.manual_seed(42)                                  # the same initial model on every rank
    net = build_model(model, image_size, width, n_classes).to(info.device)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    if backend != "none" and world > 1:
        net, opt = wrap(net, opt, backend=backend, group=group,
                        compression="fp16" if fp16_allreduce else "none")
    g = torch.Generator().manual_seed(dist.seed_for_rank(7, info.rank))   # drawn on the CPU: the same on any device
    data = torch.randn(batch_size, 3, image_size, image_size, generator=g).to(info.device)
    target = torch.randint(0, n_classes, (batch_size,), generator=g).to(info.device)

    def benchmark_step():
        opt.zero_grad()
        loss = F.cross_entropy(net(data), target)
        loss.backward()
        opt.step()

    for _ in range(num_warmup_batches):
        benchmark_step()
    rates = []
    for _ in range(num_iters):
        t0 = now(info.device)
        for _ in range(batches_per_iter):
            benchmark_step()
        rates.append(batch_size * batches_per_iter / (now(info.device) - t0))
    mean, ci = float(np.mean(rates)), float(1.96 * np.std(rates))
    return dict(rank=info.rank, world_size=world, model=model, backend=backend, batch_size=batch_size,
                img_sec_rank=mean, img_sec_rank_ci=ci, img_sec_total=mean * world,
                device=str(info.device), n_params=sum(p.numel() for p in net.parameters()))


def summarize(results: list) -> dict:
    """Combine the per-rank dicts of :func:`run` (Nones dropped): mean rate per rank and the summed total."""
    rs = [r for r in results if r]
    if not rs:
        raise ValueError("no rank returned a result")
    per_rank = float(np.mean([r["img_sec_rank"] for r in rs]))
    return dict(world_size=rs[0]["world_size"], img_sec_rank=per_rank,
                img_sec_total=float(sum(r["img_sec_rank"] for r in rs)), model=rs[0]["model"],
                backend=rs[0]["backend"], batch_size=rs[0]["batch_size"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddlcourse synthetic-bench",
                                description="Synthetic-data throughput benchmark (images/s per rank and total)")
    p.add_argument("--model", default="smallcnn", choices=MODELS)
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--width", type=int, default=16, help="channels of the first layer")
    p.add_argument("--backend", default="ddp", choices=BACKENDS)
    p.add_argument("--fp16-allreduce", action="store_true", help="Horovod fp16 gradient compression")
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=int, default=3)
    p.add_argument("--num-iters", type=int, default=5)
    a = p.parse_args(argv)
    from mpi4py import MPI

    res = run(model=a.model, batch_size=a.batch_size, image_size=a.image_size, width=a.width,
              backend=a.backend, num_warmup_batches=a.num_warmup_batches,
              batches_per_iter=a.num_batches_per_iter, num_iters=a.num_iters, fp16_allreduce=a.fp16_allreduce)
    allres = MPI.COMM_WORLD.gather(res, root=0)
    if dist.rank() == 0:
        s = summarize(allres)
        print(f"Model: {a.model}  backend: {a.backend}  batch size per rank: {a.batch_size}  "
              f"ranks: {s['world_size']}  device: {res['device']}")
        print(f"Img/sec per rank: {res['img_sec_rank']:.1f} +-{res['img_sec_rank_ci']:.1f}")
        print(f"Total img/sec on {s['world_size']} rank(s): {s['img_sec_total']:.1f}")
    dist.shutdown()
    return 0


# --------------------------------------------------------------------------- laws and the step breakdown (notebook 13)
def amdahl_speedup(n, serial_fraction: float):
    """Amdahl (1967), fixed problem: S(N) = 1 / (f + (1 - f) / N)."""
    n = np.asarray(n, dtype=float)
    return 1.0 / (serial_fraction + (1 - serial_fraction) / n)


def gustafson_speedup(n, serial_fraction: float):
    """Gustafson (1988), problem grows with N: S(N) = N - f (N - 1)."""
    n = np.asarray(n, dtype=float)
    return n - serial_fraction * (n - 1)


def fit_serial_fraction(ns, speedups, law: str = "amdahl") -> float:
    """The serial fraction f in [0, 1] that best fits measured speedups (least squares on a fine grid)."""
    fs = np.linspace(0, 1, 10001)
    fn = amdahl_speedup if law == "amdahl" else gustafson_speedup if law == "gustafson" else None
    if fn is None:
        raise ValueError(f"law must be 'amdahl' or 'gustafson', got {law!r}")
    s = np.asarray(speedups, dtype=float)
    err = [np.sum((fn(ns, f) - s) ** 2) for f in fs]
    return float(fs[int(np.argmin(err))])


def step_breakdown(n_ranks: int, batch_size: int = 16, image_size: int = 32, width: int = 16,
                   model: str = "smallcnn", steps: int = 5) -> dict | None:
    """Mean seconds per step on the first ``n_ranks`` ranks, split into compute (forward, backward, update),
    idle (waiting at a barrier for the slowest rank) and communication (the gradient allreduce).
    Runs on every rank; None on the ranks left out."""

    info = dist.init()
    comm, group = dist.subgroup(n_ranks)
    if comm is None:
        return None
    dev = info.device
    torch.manual_seed(42)
    net = build_model(model, image_size, width).to(dev)
    broadcast_parameters(net, group=group)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(dist.seed_for_rank(7, info.rank))
    x = torch.randn(batch_size, 3, image_size, image_size, generator=g).to(dev)   # (batch, 3, H, W)
    t = torch.randint(0, 10, (batch_size,), generator=g).to(dev)
    parts = np.zeros(3)
    for i in range(steps + 1):
        t0 = now(dev)
        opt.zero_grad()
        F.cross_entropy(net(x), t).backward()
        t1 = now(dev)                                # backward has finished on the device, not just been queued
        comm.Barrier()                                 # the wait for the slowest rank is idle time
        t2 = now(dev)
        average_gradients(net, group)
        t3 = now(dev)
        opt.step()
        t4 = now(dev)
        if i:                                          # the first step warms up
            parts += [(t1 - t0) + (t4 - t3), t2 - t1, t3 - t2]
    parts /= steps
    return dict(compute=float(parts[0]), idle=float(parts[1]), communication=float(parts[2]))
