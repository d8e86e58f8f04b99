"""A rehearsal of a distributed check: the checker and the learner's code run on simulated ranks first, so that a
communication mistake is named in seconds and the learner's cluster never sees it.

The ranks are real processes (forked from the course's fork server: torch is already imported), one per rank of
the real check, running the very checker that then runs on the cluster, on the same inputs. Their MPI and
``torch.distributed`` calls go to a :class:`~ddlcourse.exercises.referee.Referee` in this process, which matches them
strictly (a send waits for its receive), so it sees at once:

* a **deadlock**: every rank that has not finished waits, and nothing can move (no 120 s timeout: the moment it
  happens); with each rank's pending call, and a hint for the pattern (everyone receives first, a ring of
  blocking sends, a cycle of waits, a rank that returned without sending);
* a message whose **size or dtype** does not fit its receive, and ranks that **disagree in a collective**, naming
  the ranks, the sizes and the dtypes;
* an **exception on one rank**, with the learner's line, while the others would have waited for it for ever;
* what the learner's code **sent and received**, which the checkers read to check the mechanism, not only the
  numbers (:func:`calls`: only point-to-point in a ring allreduce, buckets in backward order in DDP, ...).

:meth:`Rehearsal.timeline` draws what each rank did, with the first problem marked
(``selfcheck.show_timeline()`` in a notebook).
"""
from __future__ import annotations

import inspect
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from multiprocessing.connection import Listener, wait as wait_for

from ddlcourse.cluster import forkserver
from ddlcourse.cluster.processes import runtime_dir
from ddlcourse.exercises import simworld
from ddlcourse.exercises.referee import Op, Problem, Referee

TIMEOUT_S = 60.0          # a rehearsal that has not ended by then is stopped (a rank computing, not waiting)
START_S = 60.0            # the ranks connect within this (the first rehearsal of a process starts the fork server)
LAST: dict = {}           # the last rehearsal of this process (for selfcheck.show_timeline)


def calls() -> list[dict] | None:
    """On a simulated rank: this rank's calls from the learner's code so far (``kind``, ``name``, ``peer``,
    ``count``, ``dtype``, ``shape``, ``ctx``), for a checker that checks the mechanism; None on a real rank."""
    world = simworld.current()
    return None if world is None else world.learner_calls


# ------------------------------------------------------------------------------------------------- what travels
def learner_sources(fn) -> dict:
    """``{filename: {line: text}}`` of the learner's code: ``fn`` (a function or a class) and the helpers of its own
    module it uses, so that a rank that runs it can say which line made a call or raised."""
    out: dict = {}
    seen = set()

    def add(obj, depth):
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        funcs = [obj] if isinstance(obj, types.FunctionType) else \
            [v for v in vars(obj).values() if isinstance(v, (types.FunctionType, staticmethod, classmethod))] \
            if isinstance(obj, type) else []
        for f in funcs:
            f = getattr(f, "__func__", f)
            try:
                lines, start = inspect.getsourcelines(f)
            except (OSError, TypeError):
                continue
            code = f.__code__
            out.setdefault(code.co_filename, {}).update({start + i: line for i, line in enumerate(lines)})
            mod = getattr(f, "__module__", None)
            for name in _names(code):
                g = f.__globals__.get(name)
                if isinstance(g, (types.FunctionType, type)) and getattr(g, "__module__", None) == mod:
                    add(g, depth + 1)
        if isinstance(obj, type):
            for base in obj.__mro__[1:]:
                if base.__module__ == obj.__module__:
                    add(base, depth + 1)
    add(fn, 0)
    return out


def _names(code) -> set:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _learners_module(fn) -> types.ModuleType | None:
    """The module ``fn`` comes from when it is the learner's own file (not a notebook's ``__main__``, not the
    course's package, not an installed library): the ranks may not be able to import it, so it travels by value."""
    mod = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(mod, "__file__", None)
    if mod is None or path is None or mod.__name__ == "__main__" or mod.__name__.split(".")[0] == "ddlcourse":
        return None
    installed = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return None if any(os.path.abspath(path).startswith(p) for p in installed) else mod


def ship(fn) -> dict:
    """What a rank needs to run the learner's ``fn``: the function by value (cloudpickle: a helper defined in another
    notebook cell comes with it, and so does one from the learner's own module) and its source lines."""
    import cloudpickle  # lazy: only the checks that send code to ranks need it

    mod = _learners_module(fn)
    if mod is None:
        return {"fn": cloudpickle.dumps(fn), "sources": learner_sources(fn)}
    cloudpickle.register_pickle_by_value(mod)
    try:
        return {"fn": cloudpickle.dumps(fn), "sources": learner_sources(fn)}
    finally:
        cloudpickle.unregister_pickle_by_value(mod)


# ------------------------------------------------------------------------------------------------- the result
@dataclass
class Rehearsal:
    """The outcome of :func:`rehearse`: each finished rank's verdict, the problem that stopped it (None if none),
    the referee with every call (the trace), the seconds it took, and the ranks' output."""

    name: str
    n: int
    verdicts: dict = field(default_factory=dict)        # rank -> (ok, message), the ranks that finished
    problem: Problem | None = None
    referee: Referee | None = None
    seconds: float = 0.0
    output: dict = field(default_factory=dict)          # rank -> the tail of its stdout and stderr
    raised: dict = field(default_factory=dict)          # rank -> what its learner code raised (checker caught it)

    @property
    def ok(self) -> bool:
        return self.problem is None and len(self.verdicts) == self.n and all(ok for ok, _ in self.verdicts.values())

    @property
    def finished_cleanly(self) -> bool:
        """Every rank gave a verdict (right or wrong) and nothing stopped the rehearsal."""
        return self.problem is None and len(self.verdicts) == self.n

    def message(self, hints: dict | None = None) -> str:
        """What the learner reads: what happened, where each rank was, and what to do."""
        if self.finished_cleanly:
            bad = [(r, m) for r, (ok, m) in sorted(self.verdicts.items()) if not ok]
            if not bad:
                return f"correct on all {self.n} ranks"
            r, m = bad[0]
            return f"rank {r}{' and others' if len(bad) > 1 else ''}: {m}"
        p = self.problem
        raised = {r: m for r, (ok, m) in self.verdicts.items() if not ok and m.startswith("your function raised")}
        raised = {**self.raised, **raised}
        lines = []
        if p.kind == "deadlock" and raised:
            r, m = next(iter(sorted(raised.items())))
            lines.append(f"rank {r} {m[len('your function '):]}, and the other ranks wait for it for ever:")
            lines.append(p.message)
        elif raised:
            r, m = next(iter(sorted(raised.items())))
            lines.append(f"rank {r} {m[len('your function '):]}; the other ranks went on without it, and then:")
            lines.append(p.message)
        elif p.kind == "deadlock":
            lines.append("deadlock: every rank that has not finished waits for another, and nothing can move:")
            lines.append(p.message)
            lines.append(_deadlock_hint(self.referee, p, self.verdicts))
        else:
            lines.append(p.message)
        answered = {r: m for r, (ok, m) in self.verdicts.items() if r not in raised}
        for r, m in sorted(answered.items()):
            lines.append(f"  rank {r} had finished: {m or 'its part was right'}")
        extra = (hints or {}).get(p.kind)
        if extra:
            lines.append(extra)
        lines.append(f"(found in a rehearsal on {self.n} simulated ranks in {self.seconds:.1f} s; nothing ran on your "
                     "cluster. selfcheck.show_timeline() draws what each rank did.)")
        return "\n".join(line for line in lines if line)

    def timeline(self, ax=None, learner_only: bool = False):
        """A figure of what each rank did: one row per rank, one mark per call in the order the rank made it
        (sends, receives, collectives), a grey line joining the two ends of each message that arrived. Calls still
        waiting when the rehearsal stopped are labelled (what, with whom, how much) and a red dashed arrow points
        to the rank each waits for; the calls of the problem are red. ``learner_only``: the learner's calls only
        (the checker's are faded otherwise)."""
        import matplotlib.pyplot as plt   # lazy: only a learner who asks for the figure needs matplotlib
        from matplotlib.lines import Line2D

        ref = self.referee
        ops = [o for o in ref.ops if o.learner or not learner_only]
        if not ops:                           # the learner's calls could not be told apart (code with no source)
            ops = list(ref.ops)
        width = max([sum(o.rank == r for o in ops) for r in range(self.n)] + [1])
        if ax is None:
            _, ax = plt.subplots(figsize=(min(3.5 + 1.6 * width, 18), 1.0 * self.n + 1.6))
        bad = {(o.rank, o.seq) for o in (self.problem.ops if self.problem else [])}
        colours = {"send": "#4c72b0", "recv": "#55a868", "probe": "#55a868", "coll": "#8172b2"}
        xs = {}
        for r in range(self.n):
            for x, o in enumerate(o for o in ops if o.rank == r):
                xs[(o.rank, o.seq)] = x
                colour = "#c44e52" if (o.rank, o.seq) in bad else colours.get(o.kind, "#999999")
                ax.scatter([x], [r], marker={"send": ">", "recv": "<", "probe": "<"}.get(o.kind, "s"), s=150,
                           c=colour, edgecolors="#c44e52" if not o.done else colour, linewidths=2 if not o.done else 1,
                           alpha=1.0 if o.learner else 0.4, zorder=3)
                if not o.done or (o.rank, o.seq) in bad:
                    ax.annotate(_short(o), (x, r), textcoords="offset points", xytext=(0, 11), ha="center",
                                fontsize=7, color="#c44e52")
                elif o.kind == "coll" and o.learner:
                    ax.annotate(o.name, (x, r), textcoords="offset points", xytext=(0, 11), ha="center", fontsize=7)
        for o in ops:
            here = xs.get((o.rank, o.seq))
            if o.kind == "send" and o.match in xs:
                ax.plot([here, xs[o.match]], [o.rank, o.match[0]], color="#999999", lw=0.8, zorder=1)
            elif not o.done and o.kind in ("send", "recv", "probe") and o.peer >= 0 and here is not None:
                dx = 0.18 + 0.1 * (o.rank % 4)          # side by side when several ranks wait at one step
                ax.annotate("", xy=(here + dx, o.peer), xytext=(here + dx, o.rank), zorder=2,
                            arrowprops=dict(arrowstyle="->", color="#c44e52", ls="--", lw=1.2))
        ax.set_yticks(range(self.n), [f"rank {r}" for r in range(self.n)])
        ax.set_ylim(self.n - 0.4, -0.6)
        ax.set_xlim(-0.6, width - 0.2)
        ax.set_xticks(range(width))
        ax.set_xlabel("the rank's calls, in the order it made them", fontsize=8)
        legend = [Line2D([], [], marker=">", ls="", color=colours["send"], label="send"),
                  Line2D([], [], marker="<", ls="", color=colours["recv"], label="receive"),
                  Line2D([], [], marker="s", ls="", color=colours["coll"], label="collective"),
                  Line2D([], [], marker="o", ls="", mfc="white", mec="#c44e52", label="still waiting"),
                  Line2D([], [], ls="--", color="#c44e52", label="waits for that rank")]
        ax.legend(handles=legend, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        what = "no problem" if self.problem is None else self.problem.kind
        ax.set_title(f"{self.name} rehearsed on {self.n} ranks: {what}", fontsize=10)
        ax.figure.tight_layout()
        return ax.figure


def _short(o: Op) -> str:
    """A call in a few characters for the timeline, on two lines: ``Recv`` / ``<- 2 (3 float64)``."""
    what = f"{o.count} {o.dtype}" if o.dtype and o.dtype != "object" else "object"
    if o.kind in ("recv", "probe"):
        return f"{o.name}\n<- {'any' if o.peer < 0 else o.peer} ({what})"
    if o.kind == "send":
        return f"{o.name}\n-> {o.peer} ({what})"
    return f"{o.name}\n({what})"


def _deadlock_hint(ref: Referee, p: Problem, verdicts: dict) -> str:
    """What to do, for the pattern of waits the deadlock shows."""
    waiting = [o for o in p.ops]
    kinds = {"recv" if o.kind == "probe" else o.kind for o in waiting}      # a probe waits as a receive does
    finished = set(verdicts)
    if any(o.kind in ("send", "recv", "probe") and o.peer in finished for o in waiting):
        o = next(o for o in waiting if o.kind in ("send", "recv", "probe") and o.peer in finished)
        return (f"Rank {o.peer} returned while rank {o.rank} still waits for it: every message needs its receive, "
                "and every receive its message.")
    if kinds == {"recv"} and len({o.rank for o in waiting}) > 1:
        return ("Every rank waits to receive, and none sends: a receive waits until its message is there. Let the "
                "ranks send and receive at once (comm.Sendrecv, or Isend/Irecv then Waitall; batch_isend_irecv in "
                "torch), or let some ranks send first.")
    if kinds == {"send"} and all(o.name in ("Send", "send", "Ssend") for o in waiting):
        return ("Every rank waits in a blocking send: MPI may hold a Send until its receive is posted (on every real "
                "network it does for large messages), so ranks that all send first wait for each other. Use "
                "comm.Sendrecv, or Isend/Irecv and wait for both.")
    if "coll" in kinds and kinds != {"coll"}:
        return ("Some ranks wait in a collective and others in a send or receive: every rank must reach the same "
                "collectives in the same order, after the messages they wait for.")
    if kinds == {"coll"}:
        names = {o.name for o in waiting}
        return (f"The ranks wait in different collectives ({', '.join(sorted(names))}) or on different groups: every "
                "rank of a group must call the same collectives in the same order.")
    peers = {o.rank: o.peer for o in waiting if o.kind in ("send", "recv", "probe")}
    chain, r = [], next(iter(peers), None)
    while r is not None and r not in chain:
        chain.append(r)
        r = peers.get(r)
    if r is not None and len(chain) > 1:
        cycle = " -> ".join(f"rank {x}" for x in chain[chain.index(r):] + [r])
        return (f"A cycle of waits ({cycle}, each waiting for the next): check who sends to whom; in a ring, rank r "
                "sends to (r + 1) % N and receives from (r - 1) % N.")
    return "Check the order of your communication calls: each rank waits for a call no other rank will make."


# ------------------------------------------------------------------------------------------------- running one
def _server() -> str | None:
    """The fork server to fork the ranks from: the engines' own when this process started a cluster (one server
    for both), else the plain one; None when there can be none (the ranks then start as fresh processes)."""
    mp = sys.modules.get("ddlcourse.cluster.mpicluster")
    preload = mp.ENGINE_PRELOAD if mp is not None else forkserver.PRELOAD
    return forkserver.shared(preload, _env(), runtime_dir(), wait=30)


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", DDLCOURSE_THREADS="1")
    env.pop("PYTHONUNBUFFERED", None)
    return env


def rehearse(name: str, fn, n: int, kwargs: dict | None = None, timeout: float = TIMEOUT_S,
             shipped: dict | None = None) -> Rehearsal:
    """Run the checker of coding exercise ``name`` on ``fn`` on ``n`` simulated ranks (see the module docstring)."""
    t0 = time.perf_counter()
    shipped = shipped or ship(fn)
    folder = tempfile.mkdtemp(prefix="rh-", dir=runtime_dir())
    address, key = os.path.join(folder, "s"), secrets.token_hex(16)
    listener = Listener(address, family="AF_UNIX", authkey=bytes.fromhex(key))
    sock = _server()
    procs, logs = [], []
    for r in range(n):
        argv = ["-m", "ddlcourse.exercises.simranks", address, key, str(r)]
        cmd = forkserver.rank_command(sock, argv) if sock else [sys.executable, *argv]
        log = open(os.path.join(folder, f"rank{r}.log"), "w+b")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      env=_env(), cwd=os.getcwd()))
    out = Rehearsal(name=name, n=n, referee=Referee(n))
    try:
        conns = _accept(listener, procs, n)
        job = {"name": name, "fn": shipped["fn"], "sources": shipped["sources"], "kwargs": kwargs or {}, "n": n}
        for c in conns.values():
            _send(c, job)
        _referee_loop(out, conns, procs, timeout)
    except Problem as e:
        out.problem = e
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        listener.close()
        for r, log in enumerate(logs):
            log.seek(0)
            text = log.read().decode(errors="replace")
            if text.strip():
                out.output[r] = text[-3000:]
            log.close()
        shutil.rmtree(folder, ignore_errors=True)
    out.seconds = time.perf_counter() - t0
    LAST["rehearsal"] = out
    return out


def _accept(listener, procs, n: int) -> dict:
    """The ranks' connections, by rank (each says hello with its rank); an error if a rank died before it."""
    got: dict = {}
    errors: list = []

    def accept():
        try:
            while len(got) < n:
                c = listener.accept()
                hello = pickle.loads(c.recv_bytes())
                got[hello[1]] = c
        except Exception as e:   # noqa: BLE001 -- the listener closed, or a rank spoke out of turn
            errors.append(e)
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    deadline = time.monotonic() + START_S
    while len(got) < n and time.monotonic() < deadline:
        dead = [r for r, p in enumerate(procs) if p.poll() is not None]
        if dead:
            raise Problem("died", f"rank {dead[0]}'s process ended before it started (exit {procs[dead[0]].returncode})")
        t.join(0.05)
    if len(got) < n:
        raise Problem("died", f"only {len(got)} of {n} simulated ranks started within {START_S:.0f} s")
    return got


def _referee_loop(out: Rehearsal, conns: dict, procs, timeout: float) -> None:
    ref = out.referee
    waiting: dict = {}          # rank -> (op ids, "all" | "any")
    live = dict(conns)          # rank -> connection, ranks not finished
    deadline = time.monotonic() + timeout
    while live:
        for c in wait_for(list(live.values()), timeout=0.25):
            r = next(k for k, v in live.items() if v is c)
            try:
                msg = pickle.loads(c.recv_bytes())
            except (EOFError, OSError):
                del live[r]
                out.problem = Problem("died", f"rank {r}'s process ended in the middle of the check (exit "
                                              f"{procs[r].poll()}): {out.output.get(r, '')[-500:]}")
                return
            _handle(ref, r, msg, c, waiting, live, out)
        for r, (ids, mode) in list(waiting.items()):
            ops = [ref.ops[i] for i in ids]
            done = [i for i, o in zip(ids, ops) if o.done]
            if (mode == "all" and len(done) == len(ids)) or (mode == "any" and done):
                del waiting[r]
                _send(live[r], ("ok", {i: ref.ops[i].result for i in done}))
        if live and all(r in waiting for r in live):
            raise ref.deadlock({r: [ref.ops[i] for i in ids] for r, (ids, _) in waiting.items()},
                               {r: _said(m) for r, (ok, m) in out.verdicts.items()})
        if time.monotonic() > deadline:
            busy = sorted(set(live) - set(waiting))
            raise Problem("timeout", f"the check ran for {timeout:.0f} s without ending: rank(s) {busy} kept "
                                     "computing without communicating (a loop that does not end?)")


def _send(conn, msg) -> None:
    """Plain pickle over the connection (torch's own pickler would hand a tensor's memory over a side channel)."""
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _said(message: str) -> str:
    return f"finished ({message})" if message else "finished"


def _handle(ref: Referee, r: int, msg, conn, waiting: dict, live: dict, out: Rehearsal) -> None:
    kind = msg[0]
    if kind == "post":
        _, specs, mode = msg
        ids = []
        for spec in specs:
            ref.post(r, spec)
            ids.append(len(ref.ops) - 1)          # post appends the op: its id is its place in the trace
        if mode is None:
            _send(conn, ("ok", ids))
        else:
            waiting[r] = (ids, mode)
    elif kind == "wait":
        waiting[r] = (msg[1], msg[2])
    elif kind == "test":
        _send(conn, ("ok", {i: ref.ops[i].result for i in msg[1] if ref.ops[i].done}))
    elif kind == "cancel":
        ref.cancel(ref.ops[msg[1]])
        _send(conn, ("ok", None))
    elif kind == "raised":                         # the learner's exception, caught by the checker: no reply
        out.raised.setdefault(r, msg[1])
    elif kind == "finish":
        out.verdicts[r] = (bool(msg[1]), msg[2])
        del live[r]


def pending(out: Rehearsal) -> list[Op]:
    """The calls still waiting when the rehearsal stopped."""
    return [o for o in out.referee.ops if not o.done]
