"""A fork server for the test suite's MPI ranks: torch imported once, every rank forked from it.

``run_mpi`` starts ``n`` ranks with ``mpiexec`` for each test. A rank used to be a fresh ``python -c CODE`` whose
first 2.5-3 CPU-seconds went to ``import torch``, and on 2 cores a 4-rank test paid that four times before it
did anything. Here each pytest worker keeps one server that has imported torch (nothing else of the course,
and no MPI). ``mpiexec`` starts the light client of this file instead of ``python -c CODE``; the client hands
the server its environment, working directory, code and file descriptors (stdin, stdout, stderr, and the
PMI socket that MPI_Init talks to ``mpiexec`` through), and the server forks a child that becomes the rank:

* the child takes the client's descriptors, environment (``os.environ`` and so what MPI_Init reads), working
  directory and ``sys.argv``, runs CODE as ``__main__`` the way ``python -c`` does, then exits the way the
  interpreter does (non-daemon threads joined, ``atexit`` run, so mpi4py finalizes MPI), with CODE's exit
  status;
* the client waits for that status and exits with it, or dies of the same signal, so ``mpiexec`` sees what
  a plain rank would have shown; a signal sent to the client is passed on to the rank, and if the client
  dies (``mpiexec`` killed it) the server kills the rank;
* what fork cannot copy is refused, and then the client runs ``python -c CODE`` itself: an environment that
  differs from the server's in a variable read while Python or torch load (``PYTHON*``, ``OMP_*``,
  ``TORCH_*``, ``LD_*``, ...), or no server at all.

The ranks are still separate processes under ``mpiexec``, with their own MPI_Init: only the import is shared.
Each child reseeds ``random`` and NumPy's global generator from the OS, as a fresh interpreter would.

    python ddlcourse/forkserver.py serve SOCKET     # the server (conftest starts one per pytest worker)
    python -S ddlcourse/forkserver.py run SOCKET CODE  # a rank (what mpiexec starts)
"""
from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys

# Environment variables read while the interpreter, OpenMP or torch load: a rank whose value differs from the
# server's cannot be forked from it.
IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "TORCH_", "PYTORCH_", "CUDA", "NVIDIA_",
                        "LD_", "MALLOC_", "DNNL_", "ONEDNN_", "OPENBLAS_")
HEADER = struct.Struct("!I")
_MAX_FDS = 8
_HIGH_FD = 1000


def _import_time_env(env: dict) -> dict:
    # PYTHONUNBUFFERED is not among them: the child builds its own sys.stdout and honours it there
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k != "PYTHONUNBUFFERED"}


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


# ----------------------------------------------------------------------------- the client (one per rank)
def _fallback(code: str) -> None:
    """No server, or one that cannot fork this rank: the rank is a plain ``python -c``."""
    os.execv(sys.executable, [sys.executable, "-c", code])


def client(sock_path: str, code: str) -> None:
    fds = [0, 1, 2]
    pmi = os.environ.get("PMI_FD")
    if pmi is not None and pmi.isdigit():
        fds.append(int(pmi))
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(sock_path)
    except OSError:
        _fallback(code)
    request = json.dumps({"code": code, "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds}).encode()
    conn.sendmsg([HEADER.pack(len(request))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    conn.sendall(request)
    try:
        pid = struct.unpack("!q", _recv_exact(conn, 8))[0]
    except EOFError:
        pid = -1
    if pid < 0:  # refused: an environment the server's import does not match
        conn.close()
        _fallback(code)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        signal.signal(s, forward)
    try:
        status = struct.unpack("!i", _recv_exact(conn, 4))[0]
    except EOFError:  # the server went away: the rank went with it
        status = -signal.SIGKILL
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


# ----------------------------------------------------------------------------- the server (one per pytest worker)
def _become_rank(request: dict, fds: list[int]) -> int:
    """In the forked child: take the client's descriptors and environment, run its code; its exit status.

    The child then leaves through the interpreter's own exit (``sys.exit`` at the bottom of this file), which
    joins non-daemon threads and runs ``atexit`` and mpi4py's MPI_Finalize, as a ``python -c`` rank does."""
    import builtins
    import fcntl
    import io
    import random
    import traceback
    import types

    # the received descriptors out of the way, every descriptor of the server closed, then the client's
    # onto the numbers they had there
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, _HIGH_FD + i) for i, fd in enumerate(fds)]
    os.closerange(0, _HIGH_FD)
    for src, dst in zip(high, request["fds"]):
        os.dup2(src, dst, inheritable=True)
    for fd in high:
        os.close(fd)
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), write_through=unbuffered,
                                  line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), write_through=True,
                                  errors="backslashreplace")
    sys.argv = ["-c"]
    sys.path[0] = ""
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main

    try:
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:  # what python -c prints: the traceback from the code's first line on
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        return 1
    return 0


def serve(sock_path: str) -> int | None:
    """Fork a rank for each client until the parent goes; in a forked rank, return its exit status."""
    import selectors

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy  # noqa: F401  (what every rank imports first, and the reason this server exists)
    import torch  # noqa: F401

    del numpy, torch  # imported for the children; kept in sys.modules
    parent = os.getppid()
    mine = _import_time_env(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    os.rename(sock_path + ".tmp", sock_path)  # clients see the socket only once it listens
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    ranks: dict[int, socket.socket] = {}  # pid -> its client's connection

    def reap() -> None:
        while ranks:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = ranks.pop(pid, None)
            if conn is None:
                continue
            status = -os.WTERMSIG(wstatus) if os.WIFSIGNALED(wstatus) else os.WEXITSTATUS(wstatus)
            try:
                sel.unregister(conn)
            except KeyError:  # its client had gone already
                pass
            try:
                conn.sendall(struct.pack("!i", status))
            except OSError:
                pass
            conn.close()

    while True:
        for key, _ in sel.select(timeout=0.05):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    msg, anc, _, _ = conn.recvmsg(HEADER.size, socket.CMSG_SPACE(_MAX_FDS * 4))
                    fds = array.array("i")
                    for level, kind, data in anc:
                        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                    request = json.loads(_recv_exact(conn, HEADER.unpack(msg)[0]))
                except (OSError, EOFError, ValueError, struct.error):
                    conn.close()
                    continue
                if _import_time_env(request["env"]) != mine or len(fds) != len(request["fds"]):
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(struct.pack("!q", -1))
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    try:
                        sel.close()
                        listener.close()
                        conn.close()
                        for other in ranks.values():
                            other.close()
                    except BaseException:
                        os._exit(70)
                    return _become_rank(request, list(fds))
                for fd in fds:
                    os.close(fd)
                ranks[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
                conn.sendall(struct.pack("!q", pid))
            else:  # a client's connection closed before its rank ended: mpiexec killed the client
                pid = key.data
                sel.unregister(key.fileobj)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        reap()
        if os.getppid() != parent:  # the pytest worker is gone: so are its ranks
            for pid in ranks:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve(sys.argv[2]))
    elif sys.argv[1:2] == ["run"]:
        client(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
