"""test_synthetic_bench: the synthetic benchmark's command line on the ranks, with the backend of ``sys.argv[1]``;
rank 0 prints its summary."""
import sys

from ddlcourse import synthetic_bench as sb
sb.main(["--model", "smallcnn", "--batch-size", "4", "--image-size", "16", "--width", "4",
         "--backend", sys.argv[1], "--num-iters", "2", "--num-batches-per-iter", "1"])
