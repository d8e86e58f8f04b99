"""The notebooks' experiments on the mechanisms of :mod:`ddlcourse.parallel`: each runs a mechanism against its
serial reference, measures it, or trains with it, and returns what a notebook prints or plots.

A mechanism module holds the mechanism; the experiment that checks it lives here, under the same name, beside
the notebook that runs it. Run them on the ranks, usually on the first k of a cluster::

    from ddlcourse import dist
    from ddlcourse.experiments import pipeline as exp
    res = c.run(dist.on_first_ranks, 4, exp.compare_with_serial, num_micro_batches=4)

Modules
-------
data_parallel       notebooks 05, 06, 12: the data-parallel ways trained and timed against serial; optimizer state across ranks
mpi_hook            notebook 07: DDP with gloo's default hook against the MPI hooks, each against serial
param_server        notebook 09: the parameter server against serial and allreduce, asynchronous and stale; traffic; local SGD
syncbn              notebook 11: SyncBatchNorm against batch norm on the full batch; batch norm trained three ways
model_parallel      notebook 15: one naive model-parallel step against the serial step
pipeline            notebook 16: GPipe and 1F1B against serial; the bubble measured
pipeline_schedules  notebook 17: torch's pipeline schedules against the unpipelined model; busy time and saved activations
tensor              notebook 18: the Megatron MLP against the serial MLP
spatial             notebook 18: a spatially split convolution against the serial one
sharded             notebook 19: ZeRO-1/2/3 and FSDP trained against serial
mesh                notebook 19: tensor parallelism in the rows of a 2-D grid, data parallelism down its columns
sequence            notebooks 20, 30: tensor and sequence parallel blocks against serial; clipping, memory, training
context             notebooks 21, 30: ring attention against full attention; work per rank, memory, training
expert              notebook 22: the expert-parallel MoE against serial; capacity; all_to_all traffic
"""
