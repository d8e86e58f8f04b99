"""Notebook 05's build-it exercise beyond what tests/test_build_it.py runs (the reference accepted, each registered
mistake named, the template 'not written yet'): a learner's MyDDP with another bucketing rule passes, one that
forgets to reset its counts is named; a class defined in a notebook reaches the engines of a cluster; lab 1
trains with it."""
import pytest

from helpers import check_on_ranks, run_ranks


def test_my_ddp_checker_beyond_the_registered_mistakes():
    check_on_ranks(3, "exercises_data_parallel_my_ddp")


@pytest.mark.slow
def test_lab1_trains_with_my_ddp(tmp_path):
    import json

    import numpy as np
    p = run_ranks(2, "exercises_data_parallel_lab1_my_ddp", env={"DDLCOURSE_RESULTS": str(tmp_path)})
    out = json.loads(p.stdout.split("JSON")[1])
    for k in (0, 1):                                         # segmentation and autoencoder losses
        assert np.allclose(out["mine"][k], out["one"][k], rtol=1e-4), out


SHIP = '''
import torch
import torch.distributed as tdist


class MyDDP(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb=25, group=None):
        super().__init__()                  # a closure cell holding the class: ipyparallel's own canning recursed
        self.module = module
        raise NotImplementedError

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
'''


@pytest.mark.slow
def test_a_notebook_class_reaches_the_engines(capsys):
    """A class defined in a notebook (module __main__) that calls super() and uses the notebook's imports
    (``tdist``) gets to the engines, for check_code and for lab 1's training runs."""
    import inspect

    from ddlcourse import cluster
    from ddlcourse.exercises.solutions import data_parallel as ex
    from ddlcourse.selfcheck import check_code, use_checked

    template, full = {"__name__": "__main__"}, {"__name__": "__main__"}
    exec(SHIP, template)
    exec("import torch\nimport torch.distributed as tdist\n" + inspect.getsource(ex.MyDDP), full)
    assert template["MyDDP"].__module__ == full["MyDDP"].__module__ == "__main__"
    with cluster.MPICluster(n=2) as c:
        assert not check_code("my_ddp", template["MyDDP"], cluster=c)
        assert use_checked("my_ddp", template["MyDDP"], cluster=c) is ex.MyDDP
        assert use_checked("my_ddp", full["MyDDP"], cluster=c) is full["MyDDP"]
        assert c.view.apply_sync(getattr, full["MyDDP"], "__qualname__") == ["MyDDP", "MyDDP"]
    out = capsys.readouterr().out
    assert "[my_ddp] not yet (rank 0 and others): not written yet" in out
    assert "the lab runs on the package's reference" in out and "[my_ddp] the lab runs on your MyDDP" in out
