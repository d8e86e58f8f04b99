"""Checkers of notebooks/07_comm_runtimes.ipynb: the compressing DDP communication hook the learner builds, checked
against plain DDP (its gradients, the dtype of every message, the bytes it logs)."""
import types

import torch

from ddlcourse import dist
from ddlcourse.selfcheck import AllReduceSpy, Verdict, agreed, code_exercise


# --------------------------------------------------------------------------- build it: a compressing DDP hook
# No `from __future__ import annotations` here: DDP reads a hook's return annotation at run time, and the checker
# registers the learner's hook wrapped in one of its own.
_H_BLOCKING = "waits for the allreduce inside the hook"
_H_THRESHOLD = "min_bytes"
_BUCKET_CAP_MB = 1024 / 2 ** 20       # 1 KiB: once DDP rebuilds its buckets, the last layer's make a small one


def _hook_model(device):
    torch.manual_seed(4)
    L = torch.nn.Linear
    return torch.nn.Sequential(L(16, 64), torch.nn.Tanh(), L(64, 64), torch.nn.Tanh(), L(64, 4)).to(device)


def _hook_grads(fn, min_bytes, X, y, r, n, device, spy=None):
    """Two backward passes of DDP (world group) with ``fn`` as its communication hook (None: DDP's own), on this
    rank's share of two global batches (DDP rebuilds its buckets after the first). Returns (the flat gradients
    of each pass, the state, the buckets the hook saw as (bytes, numel) per call)."""
    model = _hook_model(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=_BUCKET_CAP_MB)
    state = types.SimpleNamespace(process_group=None, min_bytes=min_bytes, bytes_sent=[])
    seen = []
    if fn is not None:
        def watched(st, bucket) -> torch.futures.Future[torch.Tensor]:
            buf = bucket.buffer()
            seen.append((buf.numel() * buf.element_size(), buf.numel()))
            if spy is not None:
                spy.watching = True
            try:
                return fn(st, bucket)
            finally:
                if spy is not None:
                    spy.watching = False
        ddp.register_comm_hook(state, watched)
    grads = []
    for step in range(2):
        mine = torch.arange(step * 6 * n, (step + 1) * 6 * n, device=device)[r::n]
        model.zero_grad()
        torch.nn.functional.cross_entropy(ddp(X[mine]), y[mine]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).cpu().double())
    return grads, state, seen


def _local_grads(X, y, r, n, device):
    """This rank's own gradients (no communication) of the same two passes."""
    model = _hook_model(device)
    out = []
    for step in range(2):
        mine = torch.arange(step * 6 * n, (step + 1) * 6 * n, device=device)[r::n]
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(X[mine]), y[mine]).backward()
        out.append(torch.cat([p.grad.flatten() for p in model.parameters()]).cpu().double())
    return out


def _close(a, b, scale, tol):
    return a.shape == b.shape and bool(((a - b).abs() <= tol * scale).all())


def _verdict_one(fn, min_bytes, X, y, r, n, device, ref, local) -> Verdict:
    """One run of the learner's hook with ``state.min_bytes = min_bytes``, judged on this rank."""
    with AllReduceSpy() as spy:
        grads, state, seen = _hook_grads(fn, min_bytes, X, y, r, n, device, spy)
    where = f"with state.min_bytes = {min_bytes}"
    for step, (got, want, own) in enumerate(zip(grads, ref, local)):
        scale = float(want.abs().max())
        if _close(got, want, scale, 2e-3):
            continue
        if _close(got, n * want, n * scale, 2e-3):
            return Verdict(False, f"{where}, pass {step}: the gradients are {n} times too large ({n} ranks): divide "
                                  "the message by the world size before the allreduce (DDP's default hook does)")
        if _close(got, own, scale, 2e-3) or _close(got, own / n, scale, 2e-3):
            return Verdict(False, f"{where}, pass {step}: the gradients are this rank's own: copy the all-reduced "
                                  "values back into the bucket's buffer (buffer.copy_(fut.value()[0])) in the "
                                  "callback, and return the buffer")
        err = float((got - want).abs().max())
        return Verdict(False, f"{where}, pass {step}: the gradients differ from plain DDP's by up to {err:.3g}, more "
                              "than float16 rounding explains")
    if spy.blocking or spy.waits:
        return Verdict(False, f"your hook {_H_BLOCKING} (all_reduce without async_op=True, or work.wait()): DDP "
                              "goes on with backward while the bucket travels only if the hook returns at once; "
                              "return the future of an async_op=True allreduce, continued with .then(...)")
    for (nbytes, numel), (dtype, sent) in zip(seen, spy.sent if len(spy.sent) == len(seen) else []):
        big = nbytes >= min_bytes
        if big and dtype != torch.float16:
            return Verdict(False, f"{where}: a bucket of {nbytes} bytes (at least state.min_bytes) went out as "
                                  f"{dtype}: send it as torch.float16")
        if not big and dtype == torch.float16:
            return Verdict(False, f"{where}: a bucket of {nbytes} bytes, smaller than state.{_H_THRESHOLD}, was "
                                  "compressed: send small buckets as they are (float32)")
    want = [numel * (2 if nbytes >= min_bytes else 4) for nbytes, numel in seen]
    got = list(state.bytes_sent)
    if got != want:
        hint = ""
        if len(got) != len(want):
            hint = f"it holds {len(got)} entries for {len(want)} calls of the hook: append one per call"
        elif got == [numel for _, numel in seen]:
            hint = "you counted numbers, not bytes: multiply by element_size()"
        elif got == [nbytes for nbytes, _ in seen]:
            hint = "you counted the bytes of the float32 bucket, not of the message you all-reduced"
        elif any(g != w and nb < min_bytes for g, w, (nb, _) in zip(got, want, seen)):
            hint = (f"a bucket smaller than state.{_H_THRESHOLD} is sent as float32, 4 bytes a number; "
                    "did your hook compress it anyway?")
        return Verdict(False, f"{where}: state.bytes_sent is {got[:6]}{'...' if len(got) > 6 else ''}, expected "
                              f"{want[:6]}{'...' if len(want) > 6 else ''} (bytes of each message this rank "
                              f"all-reduced, one entry per call): {hint}")
    return Verdict(True)


@code_exercise("ddp_compress_hook", distributed=True, ranks=(2, 3))
def check_compress_hook(fn, **_):
    """On every rank: ``fn`` registered as the communication hook of DDP on a 3-layer MLP (float32, a bucket cap
    of 1 KiB), two backward passes on this rank's share of two global batches, with ``state.min_bytes`` 0 (every
    bucket compressed), 2048 (the small bucket of the last layer sent as it is) and 2**40 (none compressed). The
    gradients must match plain DDP's to within float16 rounding, every message must have the right dtype, and
    ``state.bytes_sent`` must list each message's bytes."""
    info = dist.init()
    r, n, dev = info.rank, info.world_size, info.device
    g = torch.Generator().manual_seed(31)
    X = torch.randn(12 * n, 16, generator=g).to(dev)
    y = torch.randint(0, 4, (12 * n,), generator=g).to(dev)
    ref, _, _ = _hook_grads(None, 0, X, y, r, n, dev)
    local = _local_grads(X, y, r, n, dev)
    for min_bytes in (0, 2048, 1 << 40):
        v = agreed(_verdict_one(fn, min_bytes, X, y, r, n, dev, ref, local))
        if not v.ok:
            return v
    return Verdict(True)
