"""test_forkserver: writes a line to stdout and one to stderr, then sleeps a minute (the test reads both while
the rank still runs)."""
import sys, time
print('out')
sys.stderr.write('err\n')
time.sleep(60)
