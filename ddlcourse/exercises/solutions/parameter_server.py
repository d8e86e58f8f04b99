"""Reference solutions of notebooks/09_parameter_server.ipynb: a worker's push and pull, and the stale-synchronous
server, as a learner writes them, and each with one typical mistake (what their checkers,
:mod:`ddlcourse.exercises.checkers.parameter_server`, must name)."""
import numpy as np

from ddlcourse.parallel.param_server import GRAD, PARAM, push_pull
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: push and pull
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


PS_VARIANTS = {"push_params": _push_params, "no_pull": _no_pull, "first_slice": _first_slice}


@reference("ps_push_pull", mistakes=[(_push_params, "push the gradient"), (_no_pull, "never received"),
                                     (_first_slice, "same first slice")])
def ps_push_pull(comm, grad, params, shards):
    """The reference a learner would write (the package's ``param_server.push_pull``)."""
    for s, (a, b) in enumerate(shards):
        comm.Send(np.ascontiguousarray(grad[a:b]), dest=s, tag=GRAD)      # push my gradient's shard to server s
    for s, (a, b) in enumerate(shards):
        comm.Recv(params[a:b], source=s, tag=PARAM)                        # pull server s's updated shard
    return params


# --------------------------------------------------------------------------- build it: a stale-synchronous server
def ssp_server(comm, params, steps, staleness, lr, order):
    """The reference a learner would write: rank 0 serves the workers 1..W with a bounded staleness."""
    W = comm.Get_size() - 1
    done = [0] * (W + 1)                     # gradients applied, per worker rank (index 0, the server, unused)
    out = [False] * (W + 1)                  # the worker holds parameters and owes a gradient
    grad = np.empty_like(params)
    while min(done[1:]) < steps:
        for w in order:
            if out[w]:                                                   # push: receive and apply its gradient
                comm.Recv(grad, source=w, tag=GRAD)
                params -= lr * grad
                done[w] += 1
                out[w] = False
            if done[w] < steps and done[w] <= min(done[1:]) + staleness:   # pull, within the bound
                comm.Send(params, dest=w, tag=PARAM)
                out[w] = True
    return params


def _ssp_variant(bound=True, strict=False, every_visit=False, pull_first=False):
    """The stale-synchronous server with one typical mistake (each keeps the message protocol: none hangs)."""
    def server(comm, params, steps, staleness, lr, order):
        W = comm.Get_size() - 1
        done = [0] * (W + 1)
        out = [False] * (W + 1)
        grad = np.zeros_like(params)
        while min(done[1:]) < steps:
            for w in order:
                pushed = out[w]
                if pushed:
                    comm.Recv(grad, source=w, tag=GRAD)
                    if not pull_first and not every_visit:
                        params -= lr * grad
                    done[w] += 1
                    out[w] = False
                ahead = done[w] - min(done[1:])
                if done[w] < steps and (not bound or (ahead < staleness if strict else ahead <= staleness)):
                    comm.Send(params, dest=w, tag=PARAM)
                    out[w] = True
                if (pushed and pull_first) or every_visit:
                    params -= lr * grad
        return params
    return server


SSP_VARIANTS = {
    "unbounded": _ssp_variant(bound=False),
    "strict": _ssp_variant(strict=True),
    "twice": _ssp_variant(every_visit=True),
    "pull_first": _ssp_variant(pull_first=True),
}

reference("ssp_server", mistakes=[
    (SSP_VARIANTS["unbounded"], "bound not enforced"), (SSP_VARIANTS["strict"], "off by one"),
    (SSP_VARIANTS["twice"], "applied twice"), (SSP_VARIANTS["pull_first"], "pull before push")])(ssp_server)
