"""test_imports: a reference cycle whose finaliser prints at exit, in a process of its own. With ``course``
(``sys.argv[1]``) the package is imported first (it freezes the objects at exit: the finaliser does not run);
with ``plain`` it is not (the package ``tests.ranks`` imports nothing)."""
import importlib
import sys

assert sys.argv[1] in ("plain", "course"), sys.argv
if sys.argv[1] == "course":
    importlib.import_module("ddlcourse")


class A:
    def __del__(self):
        print('finalised at exit', flush=True)
a = A()
a.me = a
del a
