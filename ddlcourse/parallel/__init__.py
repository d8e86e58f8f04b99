"""The parallelism schemes: the mechanisms themselves, each tested against its serial equivalent. The experiments
that compare them with serial training and measure them live in :mod:`ddlcourse.experiments`, under the same names.

Modules
-------
data_parallel       data parallelism three ways behind one call: hand-written allreduce hooks, DDP, Horovod
mpi_hook            DDP communication hooks that carry CPU gradient buckets through MPI
syncbn              SyncBatchNorm on allreduce (CPU and GPU)
param_server        the parameter server: servers hold the parameters, workers push gradients and pull parameters
model_parallel      layers split across ranks, activations and gradients sent point to point; timelines
pipeline            GPipe and 1F1B over stages with micro-batches
pipeline_schedules  torch's pipeline schedules (interleaved, zero bubble): stage placement, predicted bubble and memory
tensor              Megatron tensor parallelism: column and row parallel layers, f and g
sequence            tensor and sequence parallelism of a transformer block, by hand and with DTensor
context             context parallelism: causal ring attention by hand, online softmax, zig-zag layout
expert              expert parallelism: a mixture of experts over ranks, all_to_all dispatch and combine
spatial             spatial parallelism: an image or volume split over ranks, with halo exchange
sharded             ZeRO-1 and ZeRO-2 written out, ZeRO-3 with FSDP2; bytes held and sent
branches            branch parallelism: the views of lab 4's model on their own ranks, in a two-stage pipeline
traffic             bytes a rank sends, counted where the transformer-parallel schemes communicate
"""
