"""Reference solutions of notebooks/07_comm_runtimes.ipynb: the compressing DDP communication hook as a learner
writes it, and with one typical mistake each (what its checker, :mod:`ddlcourse.exercises.checkers.comm_runtimes`,
must name)."""
import torch
import torch.distributed as tdist

from ddlcourse.selfcheck import reference


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


reference("ddp_compress_hook", mistakes=[
    (_hook_variant(divide=False), "times too large"),
    (_hook_variant(copy_back=False), "copy the all-reduced values back"),
    (_hook_variant(blocking=True), "waits for the allreduce inside the hook"),
    (_hook_variant(count="bucket"), "bytes of the float32 bucket"),
    (_hook_variant(count="numel"), "numbers, not bytes"),
    (_hook_variant(threshold=False), "min_bytes"),
])(my_compress_hook)
