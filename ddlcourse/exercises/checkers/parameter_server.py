"""Checkers of notebooks/09_parameter_server.ipynb: the reference answers of its traffic questions, and the checkers
of the worker's push and pull and of the stale-synchronous server the learner builds."""
import math
import sys

import numpy as np

from ddlcourse.exercises.solutions.parameter_server import PS_VARIANTS, SSP_VARIANTS, ssp_server
from ddlcourse.experiments.param_server import traffic_model, train_ps
from ddlcourse.parallel.param_server import GRAD, PARAM
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise, raised


# Exercise 2: traffic, counted as the bytes each process SENDS per step (the notebook's one convention).
@exercise("ps_server_bytes", "count what the server sends per step: its updated parameters, P bytes, to each of "
          "the W workers (it receives as many gradients, but the notebook counts bytes sent)")
def ps_server_bytes(n_params: int, workers: int, bytes_per_param: int = 4) -> float:
    return traffic_model(n_params, workers + 1, 1, bytes_per_param)["server"]


@exercise("ps_servers_to_match", "S servers each send W P / S bytes per step; an allreduce rank among the same "
          "N = W + 1 processes sends 2 (N-1)/N P. Take the smallest whole S with W P / S <= 2 (N-1)/N P")
def ps_servers_to_match(n_params: int, workers: int, bytes_per_param: int = 4) -> int:
    m = traffic_model(n_params, workers + 1, 1, bytes_per_param)
    return math.ceil(m["server"] / m["ring"] - 1e-9)


# A tiny problem: every message stays far below MPI's eager limit, so a wrong variant cannot hang the check.
_PROBLEM = dict(n_train=48, dim=4, hidden=4, n_classes=3, seed=3)


class _SilentComm:
    """Accepts Send and Recv and moves nothing: runs the learner's function once without real messages."""

    def Send(self, buf, dest, tag=0):
        pass

    def Recv(self, buf, source, tag=0, status=None):
        pass

    def Isend(self, buf, dest, tag=0):
        from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
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


PS_HINTS = {
    "push_params": "the servers stepped with the parameters: push the gradient (grad[start:stop]), not params",
    "no_pull": "the workers never received the new parameters: Recv each server's shard into params[start:stop]",
    "first_slice": "every server got the same first slice: send grad[start:stop] of its own shard to server s",
}


@code_exercise("ps_push_pull", distributed=True, ranks=(4,))
def check_push_pull(fn, **_):
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

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
    wrong = {hint: train_ps(worker_exchange=PS_VARIANTS[kind], **kw)["params"] for kind, hint in PS_HINTS.items()}
    ans = train_ps(worker_exchange=fn, **kw)
    v = diagnose(ans["params"], ref["params"], wrong, rtol=1e-9, atol=1e-12, what="the servers' parameters")
    if v.ok and "worker_params" in ans:
        v = diagnose(ans["worker_params"], ref["worker_params"], {}, rtol=1e-9, atol=1e-12,
                     what="the parameters your worker pulled last")
    return v


# --------------------------------------------------------------------------- build it: a stale-synchronous server
SSP_HINTS = {
    "unbounded": "staleness bound not enforced: a fast worker ran more than s steps ahead of the slowest. Send it the "
                 "parameters only while its finished steps <= the slowest worker's + staleness",
    "strict": "the bound is off by one: a worker may be exactly `staleness` steps ahead of the slowest (<=, not <)",
    "twice": "a gradient was applied twice: apply it once, when it arrives, not at every visit",
    "pull_first": "pull before push: you sent the worker the parameters before applying the gradient it had just "
                  "pushed. Apply it first",
}
SSP_STOP = 13                                # the checker's "no more steps" to its workers


def _ssp_grad(w: int, p: np.ndarray) -> np.ndarray:
    """Worker w's gradient at p: least squares on its own data, 0.5 * |A_w p - b_w|^2 / 5."""
    g = np.random.default_rng([5, w])
    A, b = g.standard_normal((5, len(p))), g.standard_normal(5)
    return A.T @ (A @ p - b) / 5


class _SimWorkers:
    """Rank 0's view of W workers, simulated in one process: ``Send(params, dest=w, tag=PARAM)`` makes worker w
    compute its gradient at those parameters, ``Recv(buf, source=w, tag=GRAD)`` hands it over. Raises (with the
    reason) where the real workers would wait for ever or answer out of turn."""

    def __init__(self, W: int, limit: int = 10_000):
        self.W, self.pending, self.pulls, self.calls, self.limit = W, {}, [0] * (W + 1), 0, limit
        self.rank, self.size = 0, W + 1

    def Get_size(self):
        return self.W + 1

    def Get_rank(self):
        return 0

    def _tick(self, peer):
        self.calls += 1
        if self.calls > self.limit:
            raise RuntimeError(f"more than {self.limit} messages: does your loop stop once every worker is done?")
        if not (isinstance(peer, (int, np.integer)) and 1 <= peer <= self.W):
            raise ValueError(f"the workers are ranks 1..{self.W}, you addressed rank {peer}")

    def Send(self, buf, dest, tag=0):
        self._tick(dest)
        if tag != PARAM:
            raise ValueError(f"send the parameters with tag ps.PARAM ({PARAM}), not {tag}")
        if dest in self.pending:
            raise RuntimeError(f"you sent worker {dest} new parameters before receiving the gradient it owes you")
        self._fits(buf, f"worker {dest} receives the parameters into", "you sent")
        self.pending[dest] = _ssp_grad(int(dest), np.array(buf, dtype=np.float64))
        self.pulls[dest] += 1

    def Recv(self, buf, source, tag=0, status=None):
        self._tick(source)
        if tag != GRAD:
            raise ValueError(f"receive the gradients with tag ps.GRAD ({GRAD}), not {tag}")
        if source not in self.pending:
            raise RuntimeError(f"you wait for a gradient from worker {source}, which holds no parameters to work on: "
                               "on the ranks that waits for ever")
        self._fits(buf, f"worker {source} sends its gradient as", "you receive it into")
        buf[...] = self.pending.pop(source)

    @staticmethod
    def _fits(buf, theirs: str, yours: str) -> None:
        """The workers send and receive float64 arrays of the parameters' size: a buffer of another size or dtype
        would be a truncated message or garbage on the ranks."""
        arr, size = np.asarray(buf), len(_ssp_start())
        if arr.dtype != np.float64 or arr.size != size:
            raise ValueError(f"{theirs} {size} float64, and {yours} {arr.size} {arr.dtype}: a message must fit its "
                             "receive (same dtype, as many elements)")


def _ssp_cases(W: int) -> list:
    """(steps, staleness, order): worker 1 fast; then every worker equally often, the last one slow."""
    fast = [1, 1, 1] + list(range(2, W + 1))
    slow = [w for w in range(1, W) for _ in range(2)] + [W]
    return [(4, 1, fast), (5, 2, fast), (4, 1, slow)]


def _ssp_start(P: int = 6) -> np.ndarray:
    return np.random.default_rng(4).standard_normal(P)


def _line_limited(call, limit: int = 200_000):
    """``call()``, stopped with an error after ``limit`` lines of Python: a loop that never ends (the bound can never
    be met, no message is sent) then says so instead of keeping the rank busy for ever."""
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] > limit:
                raise RuntimeError("your server loops without end: can every worker always make progress? (the "
                                   "slowest worker must always be allowed to pull)")
        return local

    old = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local)
    try:
        return call()
    finally:
        sys.settrace(old)


def _ssp_simulated(fn, W: int) -> tuple[np.ndarray, list]:
    """Every case's final parameters with ``fn`` on simulated workers, and the pulls each worker got."""
    outs, pulls = [], []
    for steps, s, order in _ssp_cases(W):
        sim = _SimWorkers(W)
        outs.append(np.array(_line_limited(lambda: fn(sim, _ssp_start(), steps, s, 0.1, list(order))),
                             dtype=np.float64))
        pulls.append(sim.pulls[1:])
    return np.concatenate(outs), pulls


def _ssp_worker(comm) -> int:
    """A real worker: receive parameters, send back the gradient at them, until the checker says stop."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    p, st, n = np.empty(len(_ssp_start())), MPI.Status(), 0
    while True:
        comm.Recv(p, source=0, tag=MPI.ANY_TAG, status=st)
        if st.Get_tag() == SSP_STOP:
            return n
        comm.Send(_ssp_grad(comm.Get_rank(), p), dest=0, tag=GRAD)
        n += 1


def _ssp_on_ranks(fn, comm) -> tuple[np.ndarray | None, str, list]:
    """Rank 0 serves with ``fn``, the other ranks are workers, every case; (params, error, pulls) on rank 0."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    W, outs, err, pulls = comm.Get_size() - 1, [], "", []
    for steps, s, order in _ssp_cases(W):
        sub = comm.Dup()                     # a message left unreceived cannot reach the next case
        if comm.Get_rank() == 0:
            try:
                outs.append(np.array(fn(sub, _ssp_start(), steps, s, 0.1, list(order)), dtype=np.float64))
            except Exception as e:           # noqa: BLE001 -- told to every rank, then the workers are stopped
                err = err or raised(e)
            for w in range(1, W + 1):
                sub.Send(np.zeros(len(_ssp_start())), dest=w, tag=SSP_STOP)
            pulls.append(None)
        else:
            pulls.append(_ssp_worker(sub))
        sub.Barrier()
        if comm.Get_rank() == 0:             # gradients your server never received: drop them before Free
            st = MPI.Status()
            while sub.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st):
                sub.Recv(bytearray(st.Get_count(MPI.BYTE)), source=st.Get_source(), tag=st.Get_tag())
        sub.Free()
    every = comm.gather(pulls, root=0)
    if comm.Get_rank() == 0:
        pulls = [[every[w][c] for w in range(1, W + 1)] for c in range(len(_ssp_cases(W)))]
    return (np.concatenate(outs) if outs and not err else None), err, pulls


@code_exercise("ssp_server", distributed=True, ranks=(3, 4))
def check_ssp_server(fn, **_):
    """Rank 0 runs ``fn`` as the server, the other ranks are the checker's workers, on three deterministic visit
    orders: the final parameters must equal the reference's, and every worker must take exactly ``steps`` steps.
    First a dry run on simulated workers, so that a server that would wait for ever says why instead."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = MPI.COMM_WORLD
    W = comm.Get_size() - 1
    verdict = None
    if comm.Get_rank() == 0:
        try:
            _ssp_simulated(fn, W)
        except NotImplementedError:
            verdict = (False, "not written yet: replace the `raise NotImplementedError` with your code")
        except Exception as e:               # noqa: BLE001 -- said on every rank
            verdict = (False, raised(e))
    verdict = comm.bcast(verdict, root=0)
    if verdict is not None:
        return Verdict(*verdict)
    ans, err, pulls = _ssp_on_ranks(fn, comm)
    if comm.Get_rank() == 0:
        # the package has no stale-synchronous server: the reference solution's, on the same simulated workers
        ref, ref_pulls = _ssp_simulated(ssp_server, W)
        if err:
            verdict = (False, err)
        else:
            wrong = {hint: _ssp_simulated(SSP_VARIANTS[kind], W)[0] for kind, hint in SSP_HINTS.items()}
            v = diagnose(ans, ref, wrong, rtol=1e-12, atol=1e-14, what="the server's final parameters")
            if v.ok and pulls != ref_pulls:
                v = Verdict(False, f"each worker takes exactly `steps` steps; the workers got {pulls} pulls in the "
                                   "three "
                                   f"runs, expected {ref_pulls}")
            verdict = (v.ok, v.message)
    return Verdict(*comm.bcast(verdict, root=0))
