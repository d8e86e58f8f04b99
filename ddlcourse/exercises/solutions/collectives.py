"""Reference solutions of notebooks/04_collectives.ipynb: the ring allreduce, and the ring with one typical mistake
each (what its checker, :mod:`ddlcourse.exercises.checkers.collectives`, must name)."""
import numpy as np

from ddlcourse.selfcheck import reference


def ring_allreduce(buf, comm):
    """The reference a learner would write: reduce-scatter, then allgather, in place on ``buf``."""
    r, n = comm.Get_rank(), comm.Get_size()
    flat = buf.reshape(-1)                                  # a view: writing into flat writes into buf
    chunks = np.array_split(flat, n)                        # n views, sizes differ by at most one
    right, left = (r + 1) % n, (r - 1) % n
    tmp = np.empty(len(chunks[0]), dtype=flat.dtype)        # the largest chunk comes first
    for s in range(n - 1):                                  # reduce-scatter
        send_c, recv_c = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        comm.Sendrecv(send_c, dest=right, recvbuf=tmp[:len(recv_c)], source=left)
        recv_c += tmp[:len(recv_c)]
    for s in range(n - 1):                                  # allgather: pass the finished chunks on
        send_c, recv_c = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.Sendrecv(send_c, dest=right, recvbuf=recv_c, source=left)
    return buf


def _ring_variant(send_off=0, recv_off=-1, rs_extra=0, ag_extra=0, overwrite=False, allgather=True,
                  floor_chunks=False, ag_off=0):
    """A ring allreduce with one typical mistake. Every message is received into a buffer of the largest chunk
    (then copied), so a variant never truncates a message and never hangs: it only computes a wrong sum."""
    def ring(buf, comm):
        r, n = comm.Get_rank(), comm.Get_size()
        flat = buf.reshape(-1)
        if floor_chunks:                                    # size len // n: the remainder is never reduced
            c = len(flat) // n
            chunks = [flat[i * c:(i + 1) * c] for i in range(n)]
        else:
            chunks = np.array_split(flat, n)
        right, left = (r + 1) % n, (r - 1) % n
        tmp = np.zeros(max(len(ch) for ch in chunks) + 1, dtype=flat.dtype)
        for s in range(n - 1 + rs_extra):
            send_c, recv_c = chunks[(r - s + send_off) % n], chunks[(r - s + recv_off) % n]
            comm.Sendrecv(send_c, dest=right, recvbuf=tmp, source=left)
            if overwrite:
                recv_c[:] = tmp[:len(recv_c)]
            else:
                recv_c += tmp[:len(recv_c)]
        for s in range(n - 1 + ag_extra if allgather else 0):
            send_c, recv_c = chunks[(r + 1 - s + ag_off) % n], chunks[(r - s + ag_off) % n]
            comm.Sendrecv(send_c, dest=right, recvbuf=tmp, source=left)
            recv_c[:] = tmp[:len(recv_c)]
        return buf
    return ring



# One step too MANY is harmless here: the extra step only passes finished chunks on again.
RING_VARIANTS = {
    "off_by_one": _ring_variant(-1, -2),
    "overwrite": _ring_variant(overwrite=True),
    "rs_too_few": _ring_variant(rs_extra=-1),
    "ag_too_few": _ring_variant(ag_extra=-1),
    "no_allgather": _ring_variant(allgather=False),
    "floor_chunks": _ring_variant(floor_chunks=True),
    "ag_off_by_one": _ring_variant(ag_off=1),
}

def _mpi_allreduce(buf, comm):
    """Not a ring at all: MPI's own allreduce, which the exercise builds."""
    from mpi4py import MPI
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return buf


def _ring_ordered(order: str, off_by_one: bool = False, tmp_dtype=None):
    """A ring allreduce whose messages go one way or the other: ``receive_first`` (every rank Recv, then Send:
    a deadlock), ``send_first`` (every rank a blocking Send, then Recv: a deadlock as soon as MPI holds a Send for
    its receive, as it does for large messages), or ``sendrecv`` with ``off_by_one`` chunk indices and receives
    sized to the chunk (a message that does not fit) or a receive buffer of ``tmp_dtype``."""
    def ring(buf, comm):
        r, n = comm.Get_rank(), comm.Get_size()
        flat = buf.reshape(-1)
        chunks = np.array_split(flat, n)
        right, left = (r + 1) % n, (r - 1) % n
        tmp = np.empty(len(chunks[0]), dtype=tmp_dtype or flat.dtype)
        for s in range(n - 1):
            off = -1 if off_by_one else 0
            send_c, recv_c = chunks[(r - s + off) % n], chunks[(r - s - 1) % n]
            if order == "receive_first":
                comm.Recv(tmp[:len(recv_c)], source=left)
                comm.Send(send_c, dest=right)
            elif order == "send_first":
                comm.Send(send_c, dest=right)
                comm.Recv(tmp[:len(recv_c)], source=left)
            else:
                comm.Sendrecv(send_c, dest=right, recvbuf=tmp[:len(recv_c)], source=left)
            recv_c += tmp[:len(recv_c)].astype(flat.dtype)
        for s in range(n - 1):
            comm.Sendrecv(chunks[(r + 1 - s) % n], dest=right, recvbuf=chunks[(r - s) % n], source=left)
        return buf
    return ring


reference("ring_allreduce", mistakes=[
    (_mpi_allreduce, "point-to-point messages only"),
    (_ring_ordered("receive_first"), "Every rank waits to receive"),
    (_ring_ordered("send_first"), "Every rank waits in a blocking send"),
    (_ring_ordered("sendrecv", tmp_dtype=np.float64), "needs the sender's dtype"),
    (_ring_ordered("sendrecv", off_by_one=True), "A chunk index off by one? In the reduce-scatter"),
    (RING_VARIANTS["off_by_one"], "chunk index off by one in the reduce-scatter"),
    (RING_VARIANTS["overwrite"], "you overwrote a chunk"), (RING_VARIANTS["rs_too_few"], "one step too few in the reduce"),
    (RING_VARIANTS["no_allgather"], "allgather forgotten"), (RING_VARIANTS["floor_chunks"], "drop the remainder"),
    (RING_VARIANTS["ag_off_by_one"], "chunk index off by one in the allgather")])(ring_allreduce)
