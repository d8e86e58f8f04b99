"""Branch (view) parallelism: a model with parallel branches and a head, spread over ranks, with micro-batches,
combined with data parallelism on a 2D process mesh.

A multi-view network has one encoder per camera and a fusion head. Put each encoder on its own rank and the
head on another, and the encoders of one micro-batch run *at the same time* (model parallelism across
branches), while the head works on the previous micro-batch (a two-stage pipeline). Replicate that group of
``mp`` ranks ``dp`` times and average the gradients across replicas (data parallelism): a ``dp x mp`` mesh
(``ddlcourse.grid.build``; replicas are the rows, ranks of one replica are neighbours).

Correctness: each replica gets ``global_batch / dp`` samples; each micro-batch's loss is its summed loss
divided by the replica's batch, so the accumulated gradient is the replica's mean, and the average over
replicas is the mean over the global batch -- the serial gradient. ``tests/test_driving.py`` checks it.

Schedule (GPipe): every branch rank runs the forward of all micro-batches, sending each feature block to the
head as soon as it is ready; the head concatenates, computes the loss and its backward per micro-batch and
sends each feature gradient back; the branch ranks then run their backwards. Sends are non-blocking.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as tdist
from torch import nn

from ddlcourse.device import now, rank_device


def placement(n_branches: int, mp: int) -> tuple[list[int], int]:
    """Owner (index within the model-parallel group) of each branch, and of the head.

    The head goes to the last rank; branches are spread over the others first, so with ``mp = n_branches + 1``
    every branch has a rank of its own; with fewer ranks the last rank also takes branches.
    """
    if mp < 1:
        raise ValueError(f"mp must be >= 1, got {mp}")
    head = mp - 1
    if mp == 1:
        return [0] * n_branches, 0
    spread = max(1, mp - 1)
    owners = [b % spread for b in range(n_branches)] if mp - 1 >= n_branches else \
        [min(b * mp // n_branches, mp - 1) for b in range(n_branches)]
    return owners, head


@dataclass
class Event:
    rank: int
    kind: str          # F (branch forward), H (head forward+backward), B (branch backward)
    micro: int
    start: float
    end: float


@dataclass
class BranchParallel:
    """This rank's part of a branch-parallel model (see the module docstring).

    ``model`` must have ``encoders`` (a ModuleList of branches) and ``head``; every rank builds the full model
    with the same seed, moves it to its device, then keeps only its own modules. Received features and
    gradients land on ``device`` (default: the device of the model's parameters).
    """

    model: nn.Module
    mp: int
    mp_index: int
    mp_ranks: list[int]            # global ranks of this replica, by mp index
    dp_group: object = None        # ranks holding the same part of the model in the other replicas
    mp_group: object = None        # the ranks of this replica
    events: list[Event] = field(default_factory=list)
    device: object = None
    head_step: object = None       # optional: the head's messages of one micro-batch, written by a learner (lab 4)

    def __post_init__(self):
        if self.device is None:
            first = next(self.model.parameters(), None)
            self.device = first.device if first is not None else rank_device()
        self.device = torch.device(self.device)
        self.owners, self.head_owner = placement(len(self.model.encoders), self.mp)
        self.my_branches = [b for b, o in enumerate(self.owners) if o == self.mp_index]
        self.has_head = self.head_owner == self.mp_index
        # drop what this rank does not own: parameters and activations live only where they are used
        for b, o in enumerate(self.owners):
            if o != self.mp_index:
                self.model.encoders[b] = nn.Identity()
        if not self.has_head:
            self.model.head = nn.Identity()
        self.head_rank = self.mp_ranks[self.head_owner]

    def parameters(self):
        return [p for p in self.model.parameters()]

    def _now(self) -> float:
        return now(self.device)          # synchronises a GPU first: the event ends when its kernels do

    def _log(self, kind, micro, t0):
        self.events.append(Event(tdist.get_rank(), kind, micro, t0, self._now()))

    def _learners_head_step(self, m, rows, feats_out, target, loss_fn, scale, grads_out):
        """``head_step(head, feats, target, loss_fn, scale, send, recv)`` on micro-batch ``m``: ``feats`` has,
        per branch, its features if this rank computed them, else the global rank to receive them from."""
        feats = [feats_out[(m, br)] if owner == self.mp_index else int(self.mp_ranks[owner])
                 for br, owner in enumerate(self.owners)]
        width = self.model.head.mlp[0].in_features // len(self.owners)
        t0 = [self._now()]

        def recv(src):
            buf = torch.empty(rows, width, device=self.device)
            tdist.recv(buf, int(src))
            t0[0] = self._now()              # H starts when the last block has arrived, as in step
            return buf

        def send(t, dst):                    # posted after the last micro-batch's head, as in step
            grads_out.append((t.detach().contiguous(), int(dst)))

        loss = self.head_step(self.model.head, feats, target, loss_fn, scale, send, recv)
        self._log("H", m, t0[0])
        return loss.detach().reshape(())

    def step(self, video: torch.Tensor, target: torch.Tensor, loss_fn, micro_batches: int = 1) -> float:
        """Forward and backward of one replica batch; gradients are left in ``.grad`` (averaged over dp).

        ``video`` (batch, views, T, H, W) and ``target`` (batch,) are the replica's batch (all its ranks get
        the same). ``loss_fn(logits, target)`` must return the **summed** loss. Returns the replica's mean loss.
        """
        b = video.shape[0]
        if micro_batches < 1 or b % micro_batches:
            raise ValueError(f"the batch of {b} does not split into {micro_batches} equal micro-batches")
        vids, tgts = video.chunk(micro_batches), target.chunk(micro_batches)
        feats_out: dict[tuple[int, int], torch.Tensor] = {}
        pending, keep = [], []          # keep: buffers of in-flight sends stay alive until wait()
        # 1) branch forwards, sent to the head as they finish
        for m, v in enumerate(vids):
            for br in self.my_branches:
                t0 = self._now()
                f = self.model.encoders[br](v[:, br:br + 1])
                self._log("F", m, t0)
                feats_out[(m, br)] = f
                if not self.has_head:
                    keep.append(f.detach().contiguous())
                    pending.append(tdist.isend(keep[-1], self.head_rank))
        total = torch.zeros((), device=self.device)
        # 2) the head: per micro-batch, gather features, loss, backward; the feature gradients go back after the
        # last micro-batch. A branch rank sends all its micro-batches' features before it receives a gradient,
        # and NCCL runs one pair's sends and receives in the order they were posted: a gradient sent to a branch
        # between two of its features' receives would wait for that branch's receive, queued behind its next
        # send, which waits for this rank's next receive (a deadlock once messages outgrow NCCL's buffers).
        grads_out = []                       # (gradient, destination rank), in micro-batch then branch order
        if self.has_head:
            for m in range(micro_batches):
                if self.head_step is not None:   # the same messages, in the learner's head_step (lab 4)
                    total += self._learners_head_step(m, vids[m].shape[0], feats_out, tgts[m], loss_fn, b,
                                                      grads_out)
                    continue
                parts = []
                for br, owner in enumerate(self.owners):
                    if owner == self.mp_index:
                        parts.append(feats_out[(m, br)])
                    else:
                        buf = torch.empty(vids[m].shape[0], self.model.head.mlp[0].in_features // len(self.owners),
                                          device=self.device)
                        tdist.recv(buf, self.mp_ranks[owner])
                        parts.append(buf.requires_grad_(True))
                t0 = self._now()
                logits = self.model.head(torch.cat(parts, dim=1))
                loss = loss_fn(logits, tgts[m]) / b
                loss.backward()
                self._log("H", m, t0)
                total += loss.detach()
                for br, owner in enumerate(self.owners):
                    if owner != self.mp_index:
                        grads_out.append((parts[br].grad.contiguous(), self.mp_ranks[owner]))
            for g, dst in grads_out:
                keep.append(g)
                pending.append(tdist.isend(g, dst))
        # 3) branch backwards with the gradients from the head
        for m in range(micro_batches):
            for br in self.my_branches:
                f = feats_out[(m, br)]
                if self.has_head:
                    continue  # its gradient already flowed through the local head's backward
                g = torch.empty_like(f)
                tdist.recv(g, self.head_rank)
                t0 = self._now()
                f.backward(g)
                self._log("B", m, t0)
        for p in pending:
            p.wait()
        # 4) data parallelism across replicas: average every gradient over the dp group
        if self.dp_group is not None and tdist.get_world_size(self.dp_group) > 1:
            n = tdist.get_world_size(self.dp_group)
            for p in self.model.parameters():
                if p.grad is not None:
                    tdist.all_reduce(p.grad, group=self.dp_group)
                    p.grad.div_(n)
        # the replica's loss, known on the head rank: share it within the replica
        out = total.reshape(1).clone()       # on the device: no .item() before the broadcast
        if self.mp > 1:
            tdist.broadcast(out, self.head_rank, group=self.mp_group)
        return float(out.item())
