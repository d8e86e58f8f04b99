"""test_forkserver: run as ``-m`` with the arguments ``a b``: prints whether argv[0] is this file, the arguments,
whether sys.path[0] is the working folder and __name__, then whether the fork server forked it."""
import os
PARENT = open(f'/proc/{os.getppid()}/cmdline', 'rb').read().replace(b'\0', b' ').decode()
import sys
print(sys.argv[0].endswith('forkserver_argv_and_path.py'), sys.argv[1:], sys.path[0] == os.getcwd(), __name__)
print('forkserver.py serve' in PARENT)
