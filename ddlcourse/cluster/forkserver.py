"""A fork server for MPI ranks: torch imported once, every rank forked from it.

A rank that is a fresh ``python`` spends its first 2.5-3 CPU-seconds on ``import torch`` (and an ipyparallel
engine another second on ipyparallel and ipykernel); on 2 cores, 2 or 4 ranks pay that side by side before
they do anything. A server of this file imports those modules once (never MPI, never the course's modules),
and ``mpiexec`` starts the light client of this file in place of ``python ARGS``. The client hands the server
its environment, working directory, arguments and file descriptors (stdin, stdout, stderr, and the PMI socket
that MPI_Init talks to ``mpiexec`` through), and the server forks a child that becomes the rank:

* the child takes the client's descriptors, environment (``os.environ`` and so what MPI_Init reads) and
  working directory, runs ``-c CODE`` or ``-m MODULE ARGS`` as ``__main__`` the way ``python`` does (same
  ``sys.argv``, same ``sys.path[0]``), then exits the way the interpreter does (non-daemon threads joined,
  ``atexit`` run, so mpi4py finalizes MPI), with the rank's exit status;
* the client waits for that status and exits with it, or dies of the same signal, so ``mpiexec`` sees what
  a plain rank would have shown; a signal sent to the client is passed on to the rank, and if the client
  dies (``mpiexec`` killed it) the server kills the rank;
* what fork cannot copy is refused, and then the client runs ``python -c CODE`` itself: an environment that
  differs from the server's in a variable read while Python or torch load (``PYTHON*``, ``OMP_*``,
  ``TORCH_*``, ``LD_*``, ...), or no server at all.

The ranks are still separate processes under ``mpiexec``, with their own MPI_Init: only the import is shared.
Each child reseeds ``random`` and NumPy's global generator from the OS, as a fresh interpreter would.

Two users, each through :func:`shared` (one server per process, preload and import-time environment, started
on first use and ended at exit): ``MPICluster`` forks its engines on one host from one
(``ddlcourse.cluster.mpicluster.ENGINE_FORK``), and the test suite forks ``run_mpi``'s ranks from another.

    python ddlcourse/cluster/forkserver.py serve SOCKET [MODULE,...]   # the server; it preloads PRELOAD by default
    python -S ddlcourse/cluster/forkserver.py run SOCKET -c CODE       # a rank (what mpiexec starts) ...
    python -S ddlcourse/cluster/forkserver.py run SOCKET -m MODULE ARGS  # ... or one that runs a module

The client runs without ``site`` and imports nothing but the standard library, so it starts in milliseconds.
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
# What a server imports for its ranks. torch._dynamo too: torch imports it at a process's first backward pass
# (2.2 CPU-s of the 2.4 s import, on this 2-core machine), so every rank that trains paid it once more. Preloaded,
# the checkers of tests/test_build_it.py on 1-4 ranks took 71 busy CPU-s instead of 93 (2026-11-28).
PRELOAD = ("numpy", "torch", "torch._dynamo")
HEADER = struct.Struct("!I")
_MAX_FDS = 8
_HIGH_FD = 1000


def import_time_env(env: dict) -> dict:
    """The part of ``env`` that a server and the ranks it forks must agree on."""
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


# ----------------------------------------------------------------------------- starting one, and its ranks
def start(sock_path: str, preload: tuple[str, ...], env: dict, log: str, wait: float = 30.0):
    """Start a server in its own session (so ``os.killpg(proc.pid, SIGKILL)`` ends it and every rank it forked);
    return its ``Popen`` once its socket listens, or after ``wait`` seconds (clients then run fresh).

    The folder of ``sock_path`` is the server's: made for it, and removed by it if it outlives its parent.
    ``env`` is the server's environment, and must agree with its ranks' in what is read at import time."""
    import subprocess
    import time

    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", sock_path, ",".join(preload)],
                                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    deadline = time.monotonic() + wait
    while not os.path.exists(sock_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def stop(proc, sock_path: str) -> None:
    """End a server that :func:`start` returned, with every rank it forked that is still there, and remove the
    folder of its socket."""
    import shutil

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    shutil.rmtree(os.path.dirname(sock_path), ignore_errors=True)


_SHARED: dict[tuple, tuple] = {}   # (preload, import-time environment) -> (server's Popen, socket)


def shared(preload: tuple[str, ...], env: dict, parent_dir, wait: float = 30.0) -> str | None:
    """The socket of this process's server for ``preload`` and ``env``, started on first use; None when there
    can be none (its ranks then start fresh). It serves until :func:`stop_shared`, which runs at exit; if this
    process dies instead, the server ends its ranks and itself, and removes its folder (made in ``parent_dir``)."""
    import atexit
    import shutil
    import tempfile

    key = (tuple(preload), tuple(sorted(import_time_env(env).items())))
    proc, sock = _SHARED.pop(key, (None, ""))
    if proc is not None:
        if proc.poll() is None and os.path.exists(sock):
            _SHARED[key] = (proc, sock)
            return sock
        stop(proc, sock)   # it died: a new one
    folder = tempfile.mkdtemp(prefix=f"fork-{os.getpid()}-", dir=parent_dir)
    sock = os.path.join(folder, "s")
    if len(sock.encode()) >= 100:   # a Unix socket's path has room for 107 bytes
        shutil.rmtree(folder, ignore_errors=True)
        return None
    proc = start(sock, preload, env=env, log=os.path.join(folder, "log"), wait=wait)
    if not os.path.exists(sock):
        stop(proc, sock)
        return None
    if not _SHARED:
        atexit.register(stop_shared)   # before the users' own exit handlers, so it runs after them
    _SHARED[key] = (proc, sock)
    return sock


def stop_shared() -> None:
    """Stop this process's shared servers, with any rank they still have, and remove their folders."""
    for proc, sock in _SHARED.values():
        stop(proc, sock)
    _SHARED.clear()


def rank_command(sock_path: str, argv: list[str]) -> list[str]:
    """The command line that runs ``python ARGV`` as a rank forked by the server at ``sock_path``."""
    return [sys.executable, "-S", os.path.abspath(__file__), "run", sock_path, *argv]


# ----------------------------------------------------------------------------- the client (one per rank)
def _fallback(argv: list[str]) -> None:
    """No server, or one that cannot fork this rank: the rank is a plain ``python ARGV``."""
    os.execv(sys.executable, [sys.executable, *argv])


def client(sock_path: str, argv: list[str]) -> None:
    """Be the rank ``python ARGV`` (``-c CODE`` or ``-m MODULE ARGS``), forked by the server at ``sock_path``."""
    fds = [0, 1, 2]
    pmi = os.environ.get("PMI_FD")
    if pmi is not None and pmi.isdigit():
        fds.append(int(pmi))
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(sock_path)
    except OSError:
        _fallback(argv)
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds}).encode()
    conn.sendmsg([HEADER.pack(len(request))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    conn.sendall(request)
    try:
        pid = struct.unpack("!q", _recv_exact(conn, 8))[0]
    except EOFError:
        pid = -1
    if pid < 0:  # refused: an environment the server's import does not match
        conn.close()
        _fallback(argv)

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


# ----------------------------------------------------------------------------- the server
def _become_rank(request: dict, fds: list[int]) -> int:
    """In the forked child: take the client's descriptors and environment, run its code or module; its exit
    status.

    The child then leaves through the interpreter's own exit (``sys.exit`` at the bottom of this file), which
    joins non-daemon threads and runs ``atexit`` and mpi4py's MPI_Finalize, as a ``python -c`` rank does."""
    import builtins
    import fcntl
    import io
    import random
    import runpy
    import traceback
    import types

    signal.set_wakeup_fd(-1)   # the server's wake-up pipe is closed below
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
    # as the interpreter builds them: with PYTHONUNBUFFERED, writes go straight to the descriptor (no binary
    # buffer); stderr is line-buffered
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))

    def writer(fd: int):
        raw = io.FileIO(fd, "w", closefd=False)
        return raw if unbuffered else io.BufferedWriter(raw)

    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(writer(1), write_through=unbuffered, line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(writer(2), write_through=unbuffered, line_buffering=True,
                                  errors="backslashreplace")
    flag, target, *args = request["argv"]
    sys.argv = [flag, *args] if flag == "-c" else [target, *args]   # runpy puts the module's file in argv[0]
    sys.path[0] = "" if flag == "-c" else os.getcwd()               # as python -c and python -m set it
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    try:
        if flag == "-c":
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = builtins
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:   # the module runs as __main__ (run_module puts it in sys.modules while it runs)
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit:
        raise
    except BaseException as e:  # what python -c prints: the traceback from the code's first line on
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        return 1
    return 0


def serve(sock_path: str, preload: tuple[str, ...] = PRELOAD) -> int | None:
    """Fork a rank for each client until the parent goes; in a forked rank, return its exit status.

    The socket listens before ``preload`` is imported: a client that comes meanwhile waits for the import, as
    its fresh interpreter would have. A module that fails to import is left to the rank, to fail there."""
    import importlib
    import selectors

    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = os.getcwd()   # run as a file: the package's folder must not shadow top-level modules
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parent = os.getppid()
    mine = import_time_env(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    listener.listen(64)
    os.rename(sock_path + ".tmp", sock_path)  # clients see the socket only once it listens
    for name in preload:
        try:
            importlib.import_module(name)   # imported for the children; kept in sys.modules
        except Exception:  # noqa: BLE001
            pass
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    # a rank's exit wakes the loop at once (SIGCHLD writes to this pipe), so its status reaches its client then
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(wake_r, selectors.EVENT_READ)
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
        for key, _ in sel.select(timeout=0.25):   # and at least this often: is the parent still there?
            if key.fileobj == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            elif key.fileobj is listener:
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
                if import_time_env(request["env"]) != mine or len(fds) != len(request["fds"]):
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
        if os.getppid() != parent:  # the process that started the server is gone: so are its ranks
            for pid in ranks:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            import shutil
            shutil.rmtree(os.path.dirname(sock_path), ignore_errors=True)   # the socket's folder is the server's
            return


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) in (3, 4):
        sys.exit(serve(sys.argv[2], *([tuple(m for m in sys.argv[3].split(",") if m)] if len(sys.argv) == 4 else [])))
    elif sys.argv[1:2] == ["run"] and len(sys.argv) >= 5 and sys.argv[3] in ("-c", "-m"):
        client(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
