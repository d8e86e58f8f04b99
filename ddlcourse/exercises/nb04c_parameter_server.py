"""Exercises of notebooks/04c_parameter_server.ipynb."""
import numpy as np

from ddlcourse.parallel.param_server import GRAD, PARAM, push_pull, train_ps
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose

# A tiny problem: every message stays far below MPI's eager limit, so a wrong variant cannot hang the check.
_PROBLEM = dict(n_train=48, dim=4, hidden=4, n_classes=3, seed=3)


def _push_params(comm, grad, params, shards):
    """Mistake: pushes the parameters instead of the gradient."""
    return push_pull(comm, params.copy(), params, shards)


def _no_pull(comm, grad, params, shards):
    """Mistake: pushes the gradient but never receives the updated parameters (the server's answer is
    received into a scratch buffer, so the protocol completes)."""
    push_pull(comm, grad, np.empty_like(params), shards)
    return params


def _first_slice(comm, grad, params, shards):
    """Mistake: sends the first slice of the gradient to every server."""
    for s, (a, b) in enumerate(shards):
        comm.Send(np.ascontiguousarray(grad[:b - a]), dest=s, tag=GRAD)
    for s, (a, b) in enumerate(shards):
        comm.Recv(params[a:b], source=s, tag=PARAM)
    return params


class _SilentComm:
    """Accepts Send and Recv and moves nothing: runs the learner's function once without real messages."""

    def Send(self, buf, dest, tag=0):
        pass

    def Recv(self, buf, source, tag=0, status=None):
        pass

    def Isend(self, buf, dest, tag=0):
        from mpi4py import MPI
        return MPI.REQUEST_NULL

    def Get_rank(self):
        return 1

    def Get_size(self):
        return 2


def _dry_run(fn) -> str:
    """'' when ``fn`` runs on a silent communicator; else what went wrong (agreed by no rank yet)."""
    try:
        fn(_SilentComm(), np.zeros(4), np.zeros(4), [(0, 4)])
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your code"
    except Exception as e:
        return f"your function raised {type(e).__name__}: {e}"
    return ""


@code_exercise("ps_push_pull", distributed=True)
def check_push_pull(fn, **_):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    # The servers wait for the workers' messages: if the learner's function cannot run, say so on every rank
    # before any real message is sent (else the servers would wait for ever).
    problems = [p for p in comm.allgather(_dry_run(fn)) if p]
    if problems:
        return Verdict(False, problems[0])
    n_servers = 2 if comm.Get_size() >= 4 else 1
    kw = dict(steps=3, global_batch=12 if comm.Get_size() <= 4 else 24, lr=0.5, n_servers=n_servers, comm=comm,
              **_PROBLEM)
    ref = train_ps(**kw)
    wrong = {
        "the servers stepped with the parameters: push the gradient (grad[start:stop]), not params": train_ps(
            worker_exchange=_push_params, **kw)["params"],
        "the workers never received the new parameters: Recv each server's shard into params[start:stop]":
            train_ps(worker_exchange=_no_pull, **kw)["params"],
        "every server got the same first slice: send grad[start:stop] of its own shard to server s": train_ps(
            worker_exchange=_first_slice, **kw)["params"],
    }
    ans = train_ps(worker_exchange=fn, **kw)
    v = diagnose(ans["params"], ref["params"], wrong, rtol=1e-9, atol=1e-12, what="the servers' parameters")
    if v.ok and "worker_params" in ans:
        v = diagnose(ans["worker_params"], ref["worker_params"], {}, rtol=1e-9, atol=1e-12,
                     what="the parameters your worker pulled last")
    return v
