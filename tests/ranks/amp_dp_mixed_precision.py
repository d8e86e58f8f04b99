"""test_amp: data-parallel mixed precision on every rank; rank 0 prints what each way sent, its zero gradients
and the dtype of the parameters' gradients."""
from ddlcourse import dist, amp

info = dist.init()
res = amp.dp_mixed_precision(steps=2, global_batch=4096)
if info.rank == 0:
    print('SENT', [res[w]['sent'] for w in amp.DP_WAYS])
    print('ZERO', [res[w]['zero_grad_fraction'] for w in amp.DP_WAYS])
    print('DTYPE', {res[w]['param_grad_dtype'] for w in amp.DP_WAYS})
# DDP's wrappers sit in reference cycles: left to the interpreter's exit they are torn down after
# the process group and gloo can abort ('terminate called without an active exception', seen in CI)
dist.shutdown()
