"""Written by `coorfs run` into a private directory that it puts first on PYTHONPATH, beside a
copy of the coorfs package named `_coorfs_run`. Python imports it at start-up: it installs the
order-hint hook (python/coorfs/run.py) and then runs the sitecustomize module this one hides on
sys.path, if there is one, as Python would have run it. It never fails the program: a hook that
does not load says so in one line and the program goes on without it.
"""
import importlib.machinery
import importlib.util
import os
import sys

try:
    from _coorfs_run import run as _coorfs_run
except Exception as error:
    sys.stderr.write("coorfs run: no order hint: the hook did not load: %r\n" % (error,))
else:
    _coorfs_run.install()


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    # Its errors are reported by site.py, as they would be without coorfs run.
    spec.loader.exec_module(module)


_chain()
