"""Tools for instructors and for whoever runs the course on a site: reached as ``python -m ddlcourse <command>``.

Modules
-------
plan        memory budget of every notebook and lab per GPU and per node, at a scale (``plan``; ``plan --measure``
            on a GPU compares each workload's allocator peak with the estimate)
bench_ddp   DDP (gloo), DDP with the MPI hook and Horovod timed side by side on the same steps (``bench-ddp``)
bench_simp  the topology solver's two linear solvers timed on one 3-D problem (``bench-simp``)
bench_checkers  seconds from submission to verdict for every build-it exercise: the reference, a typical
            mistake, a deadlock, an exception on one rank (``bench-checkers``)
"""
