"""Scale profiles: one place that decides how big every notebook and lab runs.

Three profiles share the same code path:

* ``smoke``   -- CI; every notebook finishes in seconds.
* ``laptop``  -- the default; minutes on a few CPU ranks.
* ``cluster`` -- a GPU allocation.

The profile comes from the environment variable ``DDLCOURSE_SCALE`` (default ``laptop``),
or is passed explicitly. Notebooks never hard-code a size: they ask for their section,

>>> from ddlcourse import config
>>> s = config.sizes("setup_check", scale="smoke")
>>> s.n_ranks
2

and get an attribute-style record of the sizes for that section at that scale.
Later notebooks and labs add their own section to ``PROFILES``.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

SCALES = ("smoke", "laptop", "cluster")
DEFAULT_SCALE = "laptop"
ENV_VAR = "DDLCOURSE_SCALE"

# section -> scale -> sizes. Keep the keys of one section identical across scales.
PROFILES: dict[str, dict[str, dict]] = {
    "setup_check": {
        "smoke": dict(n_ranks=2, vector_len=4),
        "laptop": dict(n_ranks=2, vector_len=4),
        "cluster": dict(n_ranks=8, vector_len=4),
    },

    # ---- foundations and loss integrity (issue 3) ----
    "sgd": {  # notebook 01: numpy gradient descent, then a small torch training loop
        "smoke": dict(n_points=64, gd_steps=30, grid=60, torch_samples=2048, torch_epochs=3, torch_batch=64),
        "laptop": dict(n_points=200, gd_steps=60, grid=120, torch_samples=8192, torch_epochs=10, torch_batch=64),
        "cluster": dict(n_points=200, gd_steps=60, grid=120, torch_samples=65536, torch_epochs=10, torch_batch=256),
    },
    "batch_size": {  # notebook 02: batch-size x lr sweep, noise scale, accumulation, generalization gap
        "smoke": dict(n_train=4096, n_test=1024, batch_sizes=[8, 64, 512], lrs=[0.03, 0.3, 3.0],
                      steps=60, eval_every=10, noise_batches=[16, 512], noise_reps=8,
                      base_batch=32, base_lr=0.1, rule_batches=[32, 512], rule_epochs=2, warmup_steps=5,
                      gap_train=1024, gap_batches=[16, 1024], gap_epochs=5),
        "laptop": dict(n_train=16384, n_test=4096, batch_sizes=[8, 32, 128, 512, 2048],
                       lrs=[0.01, 0.03, 0.1, 0.3, 1.0, 3.0], steps=300, eval_every=20, noise_batches=[16, 1024],
                       noise_reps=32, base_batch=32, base_lr=0.1, rule_batches=[32, 256, 2048], rule_epochs=2,
                       warmup_steps=20, gap_train=2048, gap_batches=[16, 2048], gap_epochs=30),
        "cluster": dict(n_train=65536, n_test=8192, batch_sizes=[8, 32, 128, 512, 2048, 8192],
                        lrs=[0.01, 0.03, 0.1, 0.3, 1.0, 3.0], steps=1000, eval_every=50, noise_batches=[16, 4096],
                        noise_reps=64, base_batch=32, base_lr=0.1, rule_batches=[32, 128, 512, 2048, 8192],
                        rule_epochs=8, warmup_steps=50, gap_train=4096, gap_batches=[16, 4096], gap_epochs=100),
    },
    "loss_integrity": {  # notebook 03: one 4-rank cluster, subgroups of 1, 2, 4 ranks
        "smoke": dict(n_ranks=4, n_samples=202, global_batch=32, epochs=2, micro_batch=16, weak_epochs=6, weak_lr=0.02,
                      tol=1e-9),
        "laptop": dict(n_ranks=4, n_samples=1002, global_batch=32, epochs=4, micro_batch=16, weak_epochs=6, weak_lr=0.02,
                       tol=1e-9),
        "cluster": dict(n_ranks=8, n_samples=4002, global_batch=64, epochs=5, micro_batch=16, weak_epochs=8, weak_lr=0.02,
                        tol=1e-9),
    },


    # ---- data parallelism (issue 4) ----
    "collectives": {  # 04: message sizes are powers of two, 2**min_log2 .. 2**max_log2 bytes
        "smoke": dict(n_ranks=2, bw_ranks=2, min_log2=3, max_log2=16, reps=2, fusion_tensors=16, fusion_nelem=256),
        "laptop": dict(n_ranks=4, bw_ranks=4, min_log2=3, max_log2=24, reps=8, fusion_tensors=64, fusion_nelem=1024),
        "cluster": dict(n_ranks=8, bw_ranks=8, min_log2=3, max_log2=28, reps=20, fusion_tensors=128, fusion_nelem=4096),
    },
    "data_parallel": {  # 05
        "smoke": dict(n_ranks=2, n_train=512, dim=16, hidden=32, global_batch=32, steps=6, bench_steps=3,
                      bench_hidden=256, bench_depth=4, bench_batch=64),
        "laptop": dict(n_ranks=2, n_train=4096, dim=16, hidden=64, global_batch=64, steps=40, bench_steps=15,
                       bench_hidden=512, bench_depth=6, bench_batch=128),
        "cluster": dict(n_ranks=8, n_train=65536, dim=32, hidden=256, global_batch=512, steps=200, bench_steps=50,
                        bench_hidden=2048, bench_depth=8, bench_batch=512),
    },
    "sync_batchnorm": {  # 06: micro_batch is the per-rank batch
        "smoke": dict(n_ranks=2, n_train=256, n_test=256, image_size=16, width=8, micro_batch=2, steps=15, lr=0.05),
        "laptop": dict(n_ranks=4, n_train=2048, n_test=512, image_size=16, width=16, micro_batch=2, steps=150, lr=0.05),
        "cluster": dict(n_ranks=8, n_train=16384, n_test=2048, image_size=32, width=32, micro_batch=4, steps=600, lr=0.05),
    },
    "large_batch": {  # 07: global batches compared; steps shrink as the batch grows (same epochs)
        "smoke": dict(n_ranks=2, n_train=512, dim=16, hidden=32, base_batch=32, global_batches=[32, 256],
                      epochs=1, warmup_frac=0.1),
        "laptop": dict(n_ranks=2, n_train=2048, dim=16, hidden=64, base_batch=32, global_batches=[32, 256, 1024],
                       epochs=2, warmup_frac=0.1),
        "cluster": dict(n_ranks=8, n_train=65536, dim=32, hidden=512, base_batch=64,
                        global_batches=[64, 1024, 8192], epochs=10, warmup_frac=0.1),
    },
    "scaling": {  # 08: synthetic benchmark (random images) and the step-time breakdown
        "smoke": dict(n_ranks=2, model="smallcnn", width=8, image_size=16, batch_size=8, num_iters=2,
                      batches_per_iter=2, strong_global_batch=16),
        "laptop": dict(n_ranks=4, model="smallcnn", width=16, image_size=32, batch_size=16, num_iters=5,
                       batches_per_iter=3, strong_global_batch=64),
        # cluster: strong_global_batch 192 (was 256: its 1-rank point needed 15.8 GiB of a T4's 14.75, plan.py)
        "cluster": dict(n_ranks=8, model="resnet", width=64, image_size=224, batch_size=64, num_iters=10,
                        batches_per_iter=10, strong_global_batch=192),
    },


    # ---- beyond one device's memory, and federated learning (issue 5) ----
    "memory": {
        "smoke": dict(batch=64, dim=64, hidden=256, depth=8, image_sizes=[16, 32], volume_sizes=[8, 16], segments=3),
        "laptop": dict(batch=256, dim=64, hidden=512, depth=12, image_sizes=[16, 32, 64, 128],
                       volume_sizes=[8, 16, 24, 32], segments=4),
        "cluster": dict(batch=1024, dim=256, hidden=2048, depth=24, image_sizes=[64, 128, 256, 512],
                        volume_sizes=[32, 64, 96, 128], segments=5),
    },
    "model_parallel": {
        "smoke": dict(n_ranks=4, batch=32, n_layers=8, delay_s=0.02),
        "laptop": dict(n_ranks=4, batch=256, n_layers=8, delay_s=0.05),
        "cluster": dict(n_ranks=8, batch=1024, n_layers=16, delay_s=0.0),
    },
    "pipeline": {
        "smoke": dict(n_ranks=4, global_batch=32, n_layers=8, micro_batch_counts=[1, 4, 8], delay_s=0.005,
                      repeats=1),
        "laptop": dict(n_ranks=4, global_batch=128, n_layers=8, micro_batch_counts=[1, 2, 4, 8, 16, 32],
                       delay_s=0.01, repeats=3),
        "cluster": dict(n_ranks=8, global_batch=1024, n_layers=16, micro_batch_counts=[1, 2, 4, 8, 16, 32, 64],
                        delay_s=0.0, repeats=3),
    },
    "tensor_spatial_sharded": {
        "smoke": dict(n_ranks=4, hidden=64, image_size=16, volume_size=8, sharded_hidden=128, sharded_depth=2, steps=1),
        "laptop": dict(n_ranks=4, hidden=256, image_size=64, volume_size=16, sharded_hidden=1024, sharded_depth=6,
                       steps=3),
        "cluster": dict(n_ranks=8, hidden=1024, image_size=256, volume_size=64, sharded_hidden=4096,
                        sharded_depth=8, steps=3),
    },
    "federated": {
        "smoke": dict(n_ranks=4, n_train=600, rounds=4, local_epochs=[1, 3], alpha=0.2, batch_size=32, lr=0.1),
        "laptop": dict(n_ranks=4, n_train=3000, rounds=20, local_epochs=[1, 4], alpha=0.2, batch_size=32,
                       lr=0.1),
        "cluster": dict(n_ranks=8, n_train=20000, rounds=50, local_epochs=[1, 2, 5], alpha=0.2, batch_size=32,
                        lr=0.1),
    },


    # ---- data pipeline and hyper-parameter search (issue 12) ----
    "data_pipeline": {  # notebook 27
        "smoke": dict(n_samples=1536, image_size=16, samples_per_shard=256, batch_size=16, n_batches=8,
                      read_latency_s=0.002, width=8, n_ranks=2, contention_mb=8),
        "laptop": dict(n_samples=8192, image_size=32, samples_per_shard=1024, batch_size=64, n_batches=20,
                       read_latency_s=0.002, width=16, n_ranks=4, contention_mb=64),
        "cluster": dict(n_samples=200_000, image_size=64, samples_per_shard=8192, batch_size=256, n_batches=50,
                        read_latency_s=0.002, width=32, n_ranks=8, contention_mb=1024),
    },
    "hp_search": {  # notebook 28; budgets count training samples
        "smoke": dict(n_engines=2, n_trials=8, budget=2048, sh_configs=9, sh_min_budget=256, eta=3,
                      hb_max_budget=2304, hb_min_budget=256, grid_lrs=(0.03, 0.1, 0.3, 1.0),
                      grid_batches=(16, 64), grid_budget=2048),
        "laptop": dict(n_engines=2, n_trials=32, budget=8192, sh_configs=27, sh_min_budget=512, eta=3,
                       hb_max_budget=13824, hb_min_budget=512, grid_lrs=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
                       grid_batches=(16, 32, 64, 128), grid_budget=8192),
        "cluster": dict(n_engines=8, n_trials=128, budget=32768, sh_configs=81, sh_min_budget=512, eta=3,
                        hb_max_budget=41472, hb_min_budget=512, grid_lrs=(0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
                        grid_batches=(16, 32, 64, 128, 256), grid_budget=32768),
    },


    # ---- the performance model (issue 11) ----
    "perfmodel": {
        "smoke": dict(n_ranks=2, allreduce_bytes=[4096, 262144, 1048576, 4194304], repeats=3,
                      micro_batch=8, image=32, max_world_size=4096),
        "laptop": dict(n_ranks=2, allreduce_bytes=[4096, 65536, 262144, 1048576, 4194304, 16777216], repeats=10,
                       micro_batch=32, image=32, max_world_size=4096),
        "cluster": dict(n_ranks=8, allreduce_bytes=[4096, 65536, 1048576, 16777216, 67108864], repeats=20,
                        micro_batch=64, image=64, max_world_size=4096),
    },


    # ---- lab 01 maize (issue 6): add sections below this line ----
    # field tiles of size x size px; n_train tiles in chunks of chunk_size (global batch = n_chunks * per_chunk)
    # cluster: per_chunk 1 (was 2, before that 4): the 1-rank strong-scaling point holds the whole global batch, and
    # with what GPU 0 also holds (plan.py: NCCL communicators, kernels left running) 2 needed 15.8 GiB of a T4's 14.75
    "lab_maize": {
        "smoke": dict(size=64, n_rows=2, n_slots=5, n_train=32, chunk_size=8, n_val=16, val_chunk_size=4,
                      per_chunk=2, seg_epochs=2, ae_epochs=2, width=8, depth=2, ae_width=8, latent=8, crop=32,
                      lr=3e-3, ae_lr=3e-3, weak_chunks_per_rank=1, scaling_epochs=1, n_engines=4),
        "laptop": dict(size=64, n_rows=2, n_slots=5, n_train=256, chunk_size=32, n_val=64, val_chunk_size=8,
                       per_chunk=2, seg_epochs=8, ae_epochs=8, width=12, depth=2, ae_width=12, latent=8, crop=32,
                       lr=3e-3, ae_lr=3e-3, weak_chunks_per_rank=1, scaling_epochs=1, n_engines=4),
        "cluster": dict(size=128, n_rows=4, n_slots=10, n_train=16384, chunk_size=256, n_val=1024,
                        val_chunk_size=64, per_chunk=1, seg_epochs=40, ae_epochs=30, width=32, depth=3,
                        ae_width=32, latent=16, crop=32, lr=2e-3, ae_lr=2e-3, weak_chunks_per_rank=8,
                        scaling_epochs=5, n_engines=8),
    },


    # ---- lab 02 seismic (issue 7): add sections below this line ----
    "lab_seismic": {
        # (depth, x, y). Cubes span the whole depth (longer in depth, as Botelho et al. 2021 advise);
        # memory_edges: lateral edges of the memory curve; spatial_cube: past the per-rank budget
        "smoke": dict(n_ranks=4, volume=[64, 16, 16], cube=[64, 8, 8], spatial_cube=[64, 16, 16],
                      cubes_per_volume=1, n_volumes=8, n_test=4, global_batch=4, width=4, levels=2,
                      epochs=2, lr=3e-3, memory_budget_mb=2.0, memory_edges=[4, 8, 12, 16, 24, 32],
                      scaling_epochs=1),
        "laptop": dict(n_ranks=4, volume=[64, 32, 32], cube=[64, 16, 16], spatial_cube=[64, 32, 32],
                       cubes_per_volume=1, n_volumes=64, n_test=4, global_batch=4, width=8, levels=2,
                       epochs=8, lr=4e-3, memory_budget_mb=14.0, memory_edges=[8, 16, 24, 32, 48, 64, 96, 128],
                       scaling_epochs=1),
        "cluster": dict(n_ranks=8, volume=[256, 256, 256], cube=[256, 64, 64], spatial_cube=[256, 128, 128],
                        cubes_per_volume=8, n_volumes=256, n_test=16, global_batch=32, width=16, levels=3,
                        epochs=30, lr=1e-3, memory_budget_mb=1000.0, memory_edges=[32, 64, 96, 128, 192, 256],
                        scaling_epochs=2),
    },


    # ---- lab 03 topology (issue 8): add sections below this line ----
    # grid (ny, nx) must be divisible by 2**depth; the fine grid is twice as wide and high.
    # cluster: a 48x96 grid (was 64x128): the 1-rank strong-scaling point, the optimizer study's batch 512 on 2 ranks
    # and the fine grid's batch on 2 ranks each hold 256 coarse designs' worth per rank; with what GPU 0 also holds
    # (plan.py) 64x128 needed 17.0 GiB of a T4's 14.75
    "topology": {
        "smoke": dict(n_ranks=2, ny=16, nx=32, n_train=16, n_val=4, n_fine=2, chunk_size=1, maxloop=12,
                      width=8, depth=2, epochs=3, global_batch=8, lr=3e-3, opt_batches=[8, 16], opt_epochs=2,
                      target_loss=0.6, scaling_epochs=1, finetune_epochs=1),
        "laptop": dict(n_ranks=4, ny=24, nx=48, n_train=192, n_val=32, n_fine=16, chunk_size=4, maxloop=40,
                       width=8, depth=3, epochs=12, global_batch=16, lr=3e-3, opt_batches=[16, 64], opt_epochs=6,
                       target_loss=0.45, scaling_epochs=2, finetune_epochs=3),
        "cluster": dict(n_ranks=8, ny=48, nx=96, n_train=8192, n_val=512, n_fine=128, chunk_size=32,
                        maxloop=100, width=32, depth=4, epochs=50, global_batch=256, lr=1e-3,
                        opt_batches=[32, 128, 512], opt_epochs=20, target_loss=0.15, scaling_epochs=2,
                        finetune_epochs=5),
    },


    # ---- lab 04 driving (issue 9): add sections below this line ----
    "lab_driving": {
        "smoke": dict(n_clips=46, n_val=23, frames=8, size=32, width=4, feat=16, hidden=32, epochs=2,
                      global_batch=8, micro_batches=1, lr=1e-3, n_ranks=4, scaling_epochs=1),
        # laptop: 8 epochs of 920 clips ran the notebook for over 18 minutes on 2 cores; the lab must fit 10
        "laptop": dict(n_clips=460, n_val=115, frames=12, size=48, width=8, feat=32, hidden=64, epochs=4,
                       global_batch=16, micro_batches=1, lr=1e-3, n_ranks=4, scaling_epochs=1),
        # cluster: global_batch 64 (was 128), and each rank's share of a step in micro_batches=4 (gradients
        # accumulated, exact with GroupNorm): the 1-rank strong-scaling point holds the activations of 16 clips,
        # not 64; with what GPU 0 also holds (plan.py: mesh lines, send/recv pairs, kernels left running) all 64
        # needed 19.0 GiB of a T4's 14.75. The lab's Summit prediction still sees 8 clips per GPU.
        "cluster": dict(n_clips=23000, n_val=2300, frames=16, size=64, width=16, feat=128, hidden=256, epochs=30,
                        global_batch=64, micro_batches=4, lr=2e-3, n_ranks=8, scaling_epochs=2),
    },

    # ---- issue 23 (resilience): mixed precision, fault tolerance, native sharding + DCP, profiling ----
    "mixed_precision": {  # n: samples of the small-gradient regression (gradients ~ target_scale / n)
        "smoke": dict(n_ranks=2, n=4096, steps=20, growth_interval=5, accumulate_steps=300, dp_steps=2),
        "laptop": dict(n_ranks=2, n=4096, steps=60, growth_interval=10, accumulate_steps=1000, dp_steps=3),
        "cluster": dict(n_ranks=8, n=8192, steps=200, growth_interval=20, accumulate_steps=1000, dp_steps=5),
    },
    "fault_tolerance": {  # kill_at: the step at which one rank is killed; every: steps per checkpoint
        "smoke": dict(n_ranks=2, steps=12, every=4, kill_at=9, hidden=32),
        "laptop": dict(n_ranks=2, steps=40, every=10, kill_at=27, hidden=64),
        "cluster": dict(n_ranks=8, steps=200, every=25, kill_at=130, hidden=256),
    },
    "native_sharding_checkpoints": {  # 2-D mesh (dp, n_load // dp); DCP saved on n_save ranks after save_at steps
        "smoke": dict(n_save=2, n_load=4, dp=2, dim=16, hidden=64, global_batch=32, steps=8, save_at=4, lr=1e-2),
        "laptop": dict(n_save=2, n_load=4, dp=2, dim=32, hidden=256, global_batch=64, steps=30, save_at=15, lr=5e-3),
        "cluster": dict(n_save=4, n_load=8, dp=2, dim=256, hidden=4096, global_batch=256, steps=100, save_at=50, lr=1e-3),
    },

    # ---- issue 22 (transformer-era parallelism): add sections below this line ----
    # the small transformer on the sort task: seq_len = 2 * (symbols per sequence); seq_len % (2 * n_ranks) == 0
    "context_parallel": {
        "smoke": dict(n_ranks=2, seq_len=16, dim=32, n_heads=4, n_layers=2, steps=8, batch=16, lr=3e-3,
                      check_seq=32, time_seq=256, time_heads=2, head_dim=16, repeats=1, mem_seq=64),
        "laptop": dict(n_ranks=4, seq_len=16, dim=32, n_heads=4, n_layers=2, steps=120, batch=32, lr=3e-3,
                       check_seq=64, time_seq=1024, time_heads=4, head_dim=32, repeats=3, mem_seq=128),
        "cluster": dict(n_ranks=8, seq_len=32, dim=128, n_heads=8, n_layers=4, steps=600, batch=64, lr=1e-3,
                        check_seq=256, time_seq=16384, time_heads=8, head_dim=64, repeats=5, mem_seq=1024),
    },
    "expert_parallel": {  # tokens_per_rank routed per rank; experts = experts_per_rank * n_ranks
        "smoke": dict(n_ranks=2, tokens_per_rank=32, dim=16, hidden=32, experts_per_rank=2, top_k=2,
                      capacity_factors=[0.5, 1.0, 2.0], sweep_tokens=256, seq_len=16, steps=8, batch=16, lr=3e-3),
        "laptop": dict(n_ranks=4, tokens_per_rank=128, dim=32, hidden=64, experts_per_rank=2, top_k=2,
                       capacity_factors=[0.5, 0.75, 1.0, 1.25, 2.0], sweep_tokens=2048, seq_len=16, steps=150,
                       batch=32, lr=3e-3),
        # cluster: sweep_tokens 49152 (was 65536: with notebook 22's traffic measurement GPU 0 needed 14.8 GiB)
        "cluster": dict(n_ranks=8, tokens_per_rank=4096, dim=256, hidden=1024, experts_per_rank=2, top_k=2,
                        capacity_factors=[0.5, 0.75, 1.0, 1.25, 1.5, 2.0], sweep_tokens=49152, seq_len=32,
                        steps=600, batch=64, lr=1e-3),
    },
    "tensor_sequence_parallel": {  # check_*: the equality checks; mem_*: activation memory; rest: training
        "smoke": dict(n_ranks=2, check_seq=8, check_dim=16, check_heads=4, mem_seq=16, mem_dim=64, mem_heads=4,
                      mem_batch=2, seq_len=16, dim=32, n_heads=4, n_layers=2, steps=6, batch=16, lr=3e-3),
        "laptop": dict(n_ranks=4, check_seq=16, check_dim=32, check_heads=4, mem_seq=32, mem_dim=128, mem_heads=4,
                       mem_batch=4, seq_len=16, dim=32, n_heads=4, n_layers=2, steps=40, batch=32, lr=3e-3),
        "cluster": dict(n_ranks=8, check_seq=64, check_dim=128, check_heads=8, mem_seq=512, mem_dim=1024,
                        mem_heads=16, mem_batch=8, seq_len=32, dim=128, n_heads=8, n_layers=4, steps=600, batch=64,
                        lr=1e-3),
    },
    "sizing_layout": {  # one block measured on the ranks (tp = cp = n_ranks)
        "smoke": dict(n_ranks=2, seq_len=32, dim=64, n_heads=4, batch=1),
        "laptop": dict(n_ranks=4, seq_len=64, dim=128, n_heads=8, batch=1),
        "cluster": dict(n_ranks=8, seq_len=512, dim=512, n_heads=8, batch=1),
    },

    # ---- issue 21 (communication runtimes, parameter server) ----
    # message sizes 2**min_log2 .. 2**max_log2 bytes; ranks_per_host emulates hosts (rank // ranks_per_host)
    "comm_runtimes": {
        "smoke": dict(n_ranks=4, min_log2=8, max_log2=16, reps=3, bw_mib=1, ranks_per_host=2, hier_bytes=65536,
                      model_mb=100, hook_steps=3, hook_time_steps=2),
        "laptop": dict(n_ranks=4, min_log2=8, max_log2=24, reps=7, bw_mib=16, ranks_per_host=2, hier_bytes=1 << 20,
                       model_mb=100, hook_steps=4, hook_time_steps=10),
        "cluster": dict(n_ranks=8, min_log2=8, max_log2=26, reps=10, bw_mib=64, ranks_per_host=4,
                        hier_bytes=1 << 24, model_mb=100, hook_steps=4, hook_time_steps=20),
    },
    # global_batch must divide by the workers of every run (1..n_ranks-1) and by n_ranks
    "param_server": {
        "smoke": dict(n_ranks=4, steps=4, global_batch=24, lr=0.5, n_train=96, dim=8, hidden=16,
                      staleness=[0, 1, 4], stale_steps=20, periods=[1, 4], local_steps=8, async_steps=4,
                      traffic_params=1000),
        "laptop": dict(n_ranks=4, steps=10, global_batch=24, lr=0.5, n_train=480, dim=16, hidden=32,
                       staleness=[0, 1, 4, 16], stale_steps=150, periods=[1, 4, 16], local_steps=96,
                       async_steps=20, traffic_params=100_000),
        "cluster": dict(n_ranks=8, steps=20, global_batch=840, lr=0.5, n_train=8400, dim=32, hidden=128,
                        staleness=[0, 1, 4, 16, 64], stale_steps=400, periods=[1, 4, 16, 64], local_steps=256,
                        async_steps=50, traffic_params=1_000_000),
    },
    # notebook 17: torch.distributed.pipelining schedules; micro-batch counts are multiples of n_ranks and at
    # least 2 * n_ranks (DualPipeV needs as many micro-batches as stages); layers_per_rank divides by 2
    "pipeline_schedules": {
        "smoke": dict(n_ranks=2, dim=64, global_batch=32, layers_per_rank=2, check_micro_batches=4,
                      micro_batch_counts=[8], repeats=1),
        "laptop": dict(n_ranks=4, dim=256, global_batch=256, layers_per_rank=4, check_micro_batches=8,
                       micro_batch_counts=[8, 16], repeats=3),
        "cluster": dict(n_ranks=8, dim=4096, global_batch=512, layers_per_rank=2, check_micro_batches=16,
                        micro_batch_counts=[16, 32, 64], repeats=3),
    },

    # notebook 24: one DDP step under torch.profiler; delay_s: the straggler's extra seconds per step (well above
    # the run-to-run noise of a shared machine); bucket_cap_mb small enough for several buckets per step
    "profiling": {
        "smoke": dict(n_ranks=2, dim=32, hidden=128, depth=3, batch=64, steps=3, bucket_cap_mb=0.05, delay_s=0.2,
                      compile_steps=5, hvd_steps=3),
        "laptop": dict(n_ranks=2, dim=64, hidden=512, depth=4, batch=128, steps=5, bucket_cap_mb=0.25, delay_s=0.2,
                       compile_steps=20, hvd_steps=5),
        "cluster": dict(n_ranks=8, dim=1024, hidden=4096, depth=4, batch=256, steps=10, bucket_cap_mb=25.0,
                        delay_s=0.1, compile_steps=50, hvd_steps=10),
    },
}


class ScaleError(ValueError):
    """An unknown scale profile or section."""


def get_scale(scale: str | None = None) -> str:
    """The active scale: the argument if given, else ``$DDLCOURSE_SCALE``, else ``laptop``."""
    name = scale if scale is not None else os.environ.get(ENV_VAR, DEFAULT_SCALE)
    name = name.strip().lower()
    if name not in SCALES:
        raise ScaleError(
            f"unknown scale {name!r} (from {'the argument' if scale is not None else '$' + ENV_VAR}); "
            f"choose one of {', '.join(SCALES)}"
        )
    return name


def sizes(section: str, scale: str | None = None, **overrides) -> SimpleNamespace:
    """The sizes of one notebook or lab (``section``) at a scale, with optional overrides."""
    if section not in PROFILES:
        raise ScaleError(f"no scale section {section!r}; known sections: {', '.join(sorted(PROFILES))}")
    values = dict(PROFILES[section][get_scale(scale)])
    unknown = set(overrides) - set(values)
    if unknown:
        raise ScaleError(f"section {section!r} has no size(s) {sorted(unknown)}; it has {sorted(values)}")
    values.update(overrides)
    return SimpleNamespace(scale=get_scale(scale), **values)


def check_profiles() -> None:
    """Every section defines every scale, with the same keys (used by the tests)."""
    for section, by_scale in PROFILES.items():
        if set(by_scale) != set(SCALES):
            raise ScaleError(f"section {section!r} defines scales {sorted(by_scale)}, expected {list(SCALES)}")
        keys = {s: set(v) for s, v in by_scale.items()}
        if len({frozenset(k) for k in keys.values()}) != 1:
            raise ScaleError(f"section {section!r} has different keys per scale: {keys}")
