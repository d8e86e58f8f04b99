"""Stop a cluster when the process that started it dies.

Started by :class:`ddlcourse.cluster.MPICluster` as ``python -m ddlcourse.cluster.watchdog PARENT_PID STATE_FILE``
in a session of its own. A kernel killed by nbval or restarted in JupyterLab never runs its own cleanup,
so this process does it: once PARENT_PID is gone it kills what STATE_FILE records. It exits quietly when
the state file disappears (the cluster was stopped normally).
"""
import json
import os
import sys
import time

from ddlcourse.cluster.processes import alive, kill_recorded  # the standard library only: no ipyparallel, no torch


def main(parent_pid: int, state_file: str, poll: float = 0.5) -> int:
    while True:
        if not os.path.exists(state_file):
            return 0
        if not alive(parent_pid):
            try:
                with open(state_file) as f:
                    state = json.load(f)
            except (OSError, json.JSONDecodeError):
                state = {}
            kill_recorded(state)
            try:
                os.unlink(state_file)
            except OSError:
                pass
            return 0
        time.sleep(poll)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2]))
