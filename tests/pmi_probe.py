"""Speak PMI to ``srun --mpi=pmi2``'s slurmstepd by hand: put a value of LENGTH characters, fence, read it back.

    srun --mpi=pmi2 -n 1 python tests/pmi_probe.py 1|2 LENGTH

prints ``ok`` when the value read back equals the one put, else what came back. PMI-1 (version 1) sends each
request as one line; PMI-2 (version 2) sends a 6-character length, then the request. tests/test_slurm.py uses it
to show the 1024-byte limit behind the rare PMI start-up failures (tests/slurm_jobs.py).
"""
import os
import socket
import sys

version, length = int(sys.argv[1]), int(sys.argv[2])
sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
sock.settimeout(10)
rank = int(os.environ["PMI_RANK"])
buf = b""


def line() -> str:                       # PMI-1 replies end with a newline
    global buf
    while b"\n" not in buf:
        buf += sock.recv(4096)
    out, buf = buf.split(b"\n", 1)
    return out.decode()


def framed() -> str:                     # PMI-2 replies: a 6-character length, then that many bytes
    global buf
    while len(buf) < 6:
        buf += sock.recv(4096)
    n = int(buf[:6])
    while len(buf) < 6 + n:
        buf += sock.recv(4096)
    out, buf = buf[6:6 + n], buf[6 + n:]
    return out.decode()


def send1(cmd: str) -> None:
    sock.sendall((cmd + "\n").encode())


def send2(cmd: str) -> None:
    data = cmd.encode()
    sock.sendall(b"%-6d" % len(data) + data)


value = ("0123456789ABCDEF" * (length // 16 + 1))[:length]
try:
    if version == 1:
        send1("cmd=init pmi_version=1 pmi_subversion=1"); line()
        send1("cmd=get_my_kvsname"); kvs = dict(kv.split("=", 1) for kv in line().split())["kvsname"]
        send1(f"cmd=put kvsname={kvs} key=probe{rank} value={value}"); put = line()
        send1("cmd=barrier_in"); line()
        send1(f"cmd=get kvsname={kvs} key=probe{rank}"); got = dict(kv.split("=", 1) for kv in line().split())
        back = got.get("value")
    else:
        send1("cmd=init pmi_version=2 pmi_subversion=0"); line()
        send2(f"cmd=fullinit;pmijobid={os.environ.get('PMI_JOBID', '')};pmirank={rank};threaded=FALSE;"); framed()
        send2(f"cmd=kvs-put;key=probe{rank};value={value};"); put = framed()
        send2("cmd=kvs-fence;"); framed()
        send2(f"cmd=kvs-get;jobid=;srcid=-1;key=probe{rank};")
        got = dict(kv.split("=", 1) for kv in framed().split(";") if "=" in kv)
        back = got.get("value")
    print("ok" if back == value else f"differs: put -> {put!r}; got back {len(back or '')} characters", flush=True)
except (socket.timeout, ValueError, KeyError) as e:
    print(f"broken: {type(e).__name__}: {e}", flush=True)
