"""The checkers, one module per notebook topic: each registers the reference answers of its notebook's questions
(``@exercise``) and a checker for each coding exercise (``@code_exercise``), which runs the learner's code on the
ranks, compares it with a reference the package computes, and names the typical mistake it recognises. No module
here holds a reference solution (tests/test_build_it.py checks it); the typical mistakes a checker recognises come
from :mod:`ddlcourse.exercises.solutions`.

Modules
-------
setup_check                  notebook 00: Setup check: is your environment ready for distributed training?
sgd                          notebook 01: Gradient descent from the ground up
batch_size                   notebook 02: Batch size and learning rate
loss_integrity               notebook 03: Loss integrity: the same answer on 1 and N processes
collectives                  notebook 04: Collectives: the allreduce from the inside
data_parallel                notebook 05: Data parallelism done right: hand-written, DDP and Horovod
data_parallel_in_practice    notebook 06: Data parallelism in practice: gradient accumulation, unused parameters, comp
comm_runtimes                notebook 07: Communication runtimes: MPI, NCCL, Gloo, gRPC
node_and_network             notebook 08: The node and the network: hierarchical allreduce, NVLink, InfiniBand
parameter_server             notebook 09: The parameter server, and why allreduce replaced it
federated                    notebook 10: Federated learning: averaging models, not gradients
sync_batchnorm               notebook 11: Synchronized batch normalization, on CPU and GPU
large_batch                  notebook 12: Large-batch training: LARS, LAMB, Shampoo and SOAP against SGD and Adam
scaling                      notebook 13: Measuring speedup: strong and weak scaling, Amdahl and Gustafson
memory                       notebook 14: Memory: where does training memory go?
model_parallel               notebook 15: Model parallelism: split the layers across ranks
pipeline                     notebook 16: Pipeline parallelism: GPipe and 1F1B
pipeline_schedules           notebook 17: Pipeline schedules beyond 1F1B: interleaved and zero bubble
tensor_spatial               notebook 18: Tensor and spatial parallelism
sharded_data_parallel        notebook 19: Sharded data parallelism: ZeRO, FSDP and a 2-D mesh
tensor_sequence_parallel     notebook 20: Tensor and sequence parallelism in a transformer block
context_parallel             notebook 21: Context parallelism: ring attention
expert_parallel              notebook 22: Expert parallelism: a mixture of experts across ranks
mixed_precision              notebook 23: Mixed precision done right
profiling                    notebook 24: Profiling a data-parallel step: traces, stragglers, exposed communication, `
fault_tolerance              notebook 25: Fault tolerance: a rank dies, the training goes on
native_sharding_checkpoints  notebook 26: Native sharding and checkpoints: FSDP2, DTensor, DCP
data_pipeline                notebook 27: Feeding the accelerators: data loading and I/O
hyperparameter_search        notebook 28: Using the cluster for search: hyper-parameter optimization
perfmodel                    notebook 29: How far will it scale? A performance model of data-parallel training
sizing_a_layout              notebook 30: Sizing a layout: choosing DP × TP × PP × CP for a 7B and a 70B model
maize                        lab 01: Maize in the field: plant segmentation and anomaly detection at scale
seismic                      lab 02: 3-D seismic facies classification beyond one device's memory
topology                     lab 03: Lab 3: a deep-learning surrogate for topology optimisation
driving                      lab 04: Traffic conflicts from multi-camera driving video
"""
