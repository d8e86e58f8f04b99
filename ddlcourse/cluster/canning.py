"""How the learner's own classes reach the engines: a torch module or autograd Function defined in a notebook goes
by value (cloudpickle), as :class:`ddlcourse.cluster.MPICluster` sets up when it starts."""
from __future__ import annotations

import cloudpickle
import torch
from ipyparallel.serialize import canning
from ipyparallel.serialize.canning import CannedObject


class CannedByValue(CannedObject):
    """A class defined in a notebook, pickled by value with cloudpickle (with the globals its methods use).
    At module level: the engines unpickle it by this name."""

    def __init__(self, cls):
        self.data, self.buffers = cloudpickle.dumps(cls), []

    def get_object(self, g=None):
        return cloudpickle.loads(self.data)


def send_notebook_classes_by_value() -> None:
    """Let ipyparallel send a torch module or autograd Function class defined in a notebook (a learner's MyDDP or
    MySyncBatchNorm) to the engines. By default it sends a notebook's class as its methods, one by one: a method
    that calls ``super()`` holds the class in a closure cell and the canning recurses for ever, the methods look
    their globals (``tdist``) up in the engine's namespace, where the notebook's imports are missing, and an
    autograd Function (its own metaclass) is pickled by name, which the engines cannot find. Such classes go by
    value, with cloudpickle; every other object as before. Called by :meth:`MPICluster.start`."""
    if getattr(canning, "_ddlcourse_by_value", False):
        return
    default = canning.can_map.get(type, canning.can_class)

    def can_class(obj):
        if getattr(obj, "__module__", None) == "__main__" and isinstance(obj, type) \
                and issubclass(obj, (torch.nn.Module, torch.autograd.Function)):
            return CannedByValue(obj)
        return default(obj)

    canning.can_map[type] = can_class
    canning.can_map[type(torch.autograd.Function)] = can_class
    canning._ddlcourse_by_value = True
