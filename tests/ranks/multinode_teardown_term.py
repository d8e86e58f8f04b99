"""test_multinode: a SIGTERM that arrives while env/multinode/harness.py holds signals (its folder is
``sys.argv[1]``) waits for the teardown to finish, then ends the process: prints "teardown finished", then
"handler", and exits 143."""
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from harness import _signals_held
signal.signal(signal.SIGTERM, lambda signum, frame: (print("handler", flush=True), sys.exit(143)))
with _signals_held():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print("teardown finished", flush=True)
print("not reached", flush=True)
