"""Parallelism schemes, each tested against its serial equivalent.

data_parallel   the three ways to make a model data-parallel: hand-written allreduce, DDP, Horovod
syncbn          SyncBatchNorm on allreduce (works on CPU and GPU)
(model_parallel, pipeline, tensor, spatial, sharded, mesh: the notebooks of parts 3 and 4 add them)
"""
