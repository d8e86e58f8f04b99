"""test_cluster: a process (as a notebook's kernel) starts a 2-engine MPICluster, prints its recorded state and
its fork server as JSON, and kills itself with SIGKILL, as nbval kills kernels."""
import os, json
from ddlcourse.cluster import MPICluster
c = MPICluster(n=2, quiet=True).start()
from ddlcourse import cluster
from ddlcourse.cluster import forkserver
st = [s for _, s in cluster.recorded_clusters() if s['cluster_id'] == c._cluster.cluster_id][0]
(server, sock), = forkserver._SHARED.values()
print(json.dumps(dict(st, server=[server.pid, sock])), flush=True)
os.kill(os.getpid(), 9)
