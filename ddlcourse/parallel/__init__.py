"""Parallelism schemes, each tested against its serial equivalent.

data_parallel   the three ways to make a model data-parallel: hand-written allreduce, DDP, Horovod
syncbn          SyncBatchNorm on allreduce (works on CPU and GPU)
(model_parallel, pipeline, tensor, spatial, sharded, mesh: the notebooks 09-13 add them)
"""
