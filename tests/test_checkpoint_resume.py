"""The case checkpointer on a run's ranks: rank 0 chooses the checkpoint and every rank resumes from it, even when
a rank's own listing of the folder is older (an NFS client caches a directory's listing for 30-60 s)."""
import json

from helpers import run_ranks


def test_every_rank_resumes_from_the_epoch_rank_0_chose(tmp_path):
    out = json.loads(run_ranks(2, "checkpoint_resume_older_listing", tmp_path / "ckpt").stdout.strip().splitlines()[-1])
    assert out["own"] == [2, 1], out                       # rank 1's own listing really is older
    assert out["loaded"] == [2, 2] and out["same_weights"] == [True, True], out
    assert out["extra"] == [{"note": "after epoch 2"}] * 2, out
    assert out["raised"] == [True, True], out              # rank 1 alone could not read it: both stop
