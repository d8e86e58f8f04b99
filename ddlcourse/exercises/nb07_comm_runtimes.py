"""Exercises of notebooks/07_comm_runtimes.ipynb."""
import types

import torch
import torch.distributed as tdist

from ddlcourse import dist
from ddlcourse.selfcheck import AllReduceSpy, Verdict, agreed, code_exercise


# --------------------------------------------------------------------------- build it: a compressing DDP hook
# No `from __future__ import annotations` here: DDP reads a hook's return annotation at run time.
def my_compress_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """The reference a learner would write: average the bucket over the group, sending buckets of at least
    ``state.min_bytes`` bytes as float16 and smaller ones as they are; log the bytes handed to the allreduce."""
    import torch
    import torch.distributed as tdist
    buf = bucket.buffer()                                  # the bucket's flat float32 gradients
    world = tdist.get_world_size(state.process_group)
    if buf.numel() * buf.element_size() < state.min_bytes:
        msg = buf.div_(world)                              # small: compression saves too little to pay
    else:
        msg = buf.to(torch.float16).div_(world)            # half the bytes; divide first, as DDP's default hook
    state.bytes_sent.append(msg.numel() * msg.element_size())
    fut = tdist.all_reduce(msg, group=state.process_group, async_op=True).get_future()

    def unpack(f):
        buf.copy_(f.value()[0])                            # back into the bucket, as float32
        return buf
    return fut.then(unpack)


def _hook_variant(divide=True, copy_back=True, blocking=False, count="message", threshold=True):
    """my_compress_hook with one typical mistake."""
    def hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
        buf = bucket.buffer()
        world = tdist.get_world_size(state.process_group)
        small = threshold and buf.numel() * buf.element_size() < state.min_bytes
        msg = buf if small else buf.to(torch.float16)
        if divide:
            msg.div_(world)
        state.bytes_sent.append({"message": msg.numel() * msg.element_size(),
                                 "bucket": buf.numel() * buf.element_size(), "numel": msg.numel()}[count])
        if blocking:
            tdist.all_reduce(msg, group=state.process_group)
            buf.copy_(msg)
            fut = torch.futures.Future()
            fut.set_result(buf)
            return fut
        fut = tdist.all_reduce(msg, group=state.process_group, async_op=True).get_future()

        def unpack(f):
            if copy_back:
                buf.copy_(f.value()[0])
            return buf
        return fut.then(unpack)
    return hook


_H_SUM = "times too large"
_H_LOCAL = "copy the all-reduced values back"
_H_BLOCKING = "waits for the allreduce inside the hook"
_H_BYTES = "bytes of the float32 bucket"
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


@code_exercise("ddp_compress_hook", distributed=True, solution=my_compress_hook, ranks=(2, 3), mistakes=[
    (_hook_variant(divide=False), _H_SUM),
    (_hook_variant(copy_back=False), _H_LOCAL),
    (_hook_variant(blocking=True), _H_BLOCKING),
    (_hook_variant(count="bucket"), _H_BYTES),
    (_hook_variant(count="numel"), "numbers, not bytes"),
    (_hook_variant(threshold=False), _H_THRESHOLD),
])
def check_compress_hook(fn, **_):
    """On every rank: ``fn`` registered as the communication hook of DDP on a 3-layer MLP (float32, a bucket cap
    of 1 KiB), two backward passes on this rank's share of two global batches, with ``state.min_bytes`` 0 (every
    bucket compressed), 2048 (the small bucket of the last layer sent as it is) and 2**40 (none compressed). The
    gradients must match plain DDP's to within float16 rounding, every message must have the right dtype, and
    ``state.bytes_sent`` must list each message's bytes."""
    info = dist.init(horovod=False)
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
