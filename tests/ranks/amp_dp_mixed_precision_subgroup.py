"""test_amp: two ranks of three train with the compress hook over their own group; the third takes no part."""
from ddlcourse import dist, amp

info = dist.init()
comm, group = dist.subgroup(2)
if group is not None:
    res = amp.dp_mixed_precision(steps=1, global_batch=512, group=group)
    if info.rank == 0:
        print('SENT', [res[w]['sent'] for w in amp.DP_WAYS])
dist.shutdown()
