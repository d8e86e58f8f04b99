"""test_integrity: the same global batches on 1 and 4 ranks against the serial run, with and without
(synchronised) batch norm, and each loss-integrity mistake; rank 0 prints the largest differences as JSON."""
import json
from ddlcourse import dist, integrity as I
cfg = dict(n_samples=202, global_batch=32, epochs=2)
ref = I.serial(**cfg)
ref_bn = I.serial(batchnorm=True, **cfg)
r1 = I.run(1, **cfg)   # collective: every rank calls it; ranks 1-3 get None
out = {
    "k1": I.max_difference(r1, ref) if dist.rank() == 0 else None,
    "k4": I.max_difference(I.run(4, **cfg), ref),
    "k4_syncbn": I.max_difference(I.run(4, batchnorm=True, **cfg), ref_bn),
}
for m in ("sum_grads", "mean_of_means", "sampler_padding", "sampler_drop_last", "same_aug_seed"):
    out[m] = I.max_difference(I.run(4, m, **cfg), ref)
out["per_rank_bn"] = I.max_difference(I.run(4, "per_rank_bn", batchnorm=True, **cfg), ref_bn)
out["steps"] = len(ref)
dist.shutdown()
if dist.rank() == 0:
    print(json.dumps(out))
