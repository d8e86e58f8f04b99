"""test_sharded_clipping_and_scaler: clipping a tensor + sequence parallel block on its shards: only the global
norm (replicated weights once) gives the serial norm and clipped gradients; asserts on every rank."""
import torch.distributed as tdist
from ddlcourse import dist
from ddlcourse.experiments import sequence as sequence_exp
from ddlcourse.models import transformer as T
dist.init()
t = tdist.get_world_size()
d = sequence_exp.clipping_on_shards(T.TransformerConfig(vocab=11, seq_len=4 * t, dim=16 * t, n_heads=2 * t, n_layers=1))
assert d["right"]["grad_diff"] < 1e-6 and abs(d["right"]["norm"] - d["serial_norm"]) < 1e-5 * d["serial_norm"], d
assert d["local"]["grad_diff"] > 1e-4 and d["local"]["norm"] < d["serial_norm"], d      # its own shards only
assert d["summed"]["grad_diff"] > 1e-4 and d["summed"]["norm"] > d["serial_norm"], d    # replicated ones t times
norms = [None] * t
tdist.all_gather_object(norms, d["local"]["norm"])
assert len(set(norms)) == t, norms                                                     # a factor per rank
dist.shutdown()   # before exit: gloo may abort at interpreter exit with a live process group
