"""Progress of a run: a bar on the command line, a file a notebook follows, and the notebook's runners.

On the command line rank 0 shows a tqdm bar. On ipyparallel engines nobody sees the engines' output live,
so rank 0 writes its progress to a small JSON file and :func:`run`, in the notebook, draws the bar from it.
"""
from __future__ import annotations

import json
import os
import time

from ddlcourse.training.results import results_dir, write_text_atomic


class Progress:
    """A tqdm bar on rank 0 (command line) that also writes ``progress_file`` for a notebook to follow."""

    def __init__(self, total: int, desc: str = "", enabled: bool = True, progress_file: str | None = None):
        self.total, self.n, self.enabled, self.file = total, 0, enabled, progress_file
        self.desc = desc
        self.bar = None
        if enabled and not progress_file:
            from tqdm.auto import tqdm   # lazy: picks its notebook or console form where a bar is drawn
            self.bar = tqdm(total=total, desc=desc, mininterval=1.0)
        self._last_write = 0.0

    def update(self, n: int = 1, **postfix) -> None:
        if not self.enabled:
            return
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                     refresh=False)
        # at most ~3 writes a second: the notebook polls every 0.5 s; the last update is always written
        if self.file and (time.time() - self._last_write > 0.3 or self.n >= self.total):
            write_text_atomic(self.file, json.dumps({"n": self.n, "total": self.total, "desc": self.desc,
                                                     "postfix": postfix}))
            self._last_write = time.time()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(cluster, fn, *args, desc: str = "training", **kwargs) -> list:
    """Call ``fn(*args, progress_file=..., **kwargs)`` on every engine and show rank 0's progress live.

    ``fn`` must accept a ``progress_file`` keyword (``train`` functions pass it to :func:`setup`).
    Returns the per-rank results in rank order (ranks that did not take part return ``None``); it runs through
    ``cluster.run``, which also turns a dead engine into an error at once.
    """
    pfile = str(results_dir("_progress") / f"{desc.replace(' ', '_')}-{os.getpid()}-{time.time_ns()}.json")
    follow = _Follower(pfile, desc)
    try:
        return cluster.run(fn, *args, progress=follow, progress_file=pfile, **kwargs)
    finally:
        follow.close()
        if os.path.exists(pfile):
            os.unlink(pfile)


class _Follower:
    """Called while the ranks work: draws a bar from the progress file rank 0 writes (once it exists)."""

    def __init__(self, path: str, desc: str):
        self.path, self.desc, self.bar = path, desc, None

    def __call__(self) -> None:
        try:
            with open(self.path) as f:
                p = json.load(f)
        except (OSError, json.JSONDecodeError):
            return
        if self.bar is None:
            from tqdm.auto import tqdm       # lazy, as above: engines that import this module draw no bar
            self.bar = tqdm(total=p["total"], desc=self.desc)
        self.bar.update(p["n"] - self.bar.n)
        if p.get("postfix"):
            self.bar.set_postfix(p["postfix"], refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self()                           # the last state rank 0 wrote
            self.bar.close()


def scaling_experiment(cluster, fn, make_cfg, ranks=(1, 2, 4), desc: str = "scaling", **kwargs) -> dict:
    """Run ``fn(make_cfg(k))`` on the first ``k`` ranks for each ``k`` in ``ranks``, in one cluster.

    ``fn`` returns a dict on rank 0 with at least ``seconds`` (training time) and ``samples`` (samples
    processed); other keys (metrics) are kept. Returns ``{k: rank-0 result}``.
    """
    out = {}
    for k in ranks:
        if k > cluster.n:
            raise ValueError(f"scaling to {k} ranks needs a cluster of at least {k} engines (it has {cluster.n})")
        res = run(cluster, fn, make_cfg(k), desc=f"{desc} on {k} rank(s)", **kwargs)
        out[k] = res[0]
    return out
