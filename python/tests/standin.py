"""A plain directory standing in for a coorfs mount in the unit tests.

A real mount takes hints through ioctls on its order file (coorfs.order.send_hint); a plain
directory takes no ioctls, so the tests replace send_hint with one that writes the hint's bytes
to the order file there, where each test reads them back. STANDIN is the same function as
source text, for the copy of the package that `coorfs run`'s hook loads in a job's interpreter.
"""

import os

STANDIN = '''

def send_hint(mount, data):
    """The tests' stand-in (python/tests/standin.py): the hint, written to MOUNT/.coorfs-order."""
    with open(os.path.join(os.fspath(mount), ORDER_FILE), "wb") as f:
        f.write(data)
'''


def install(order_module):
    """Replaces `order_module.send_hint` with the stand-in; returns the real one (also when
    installed before)."""
    real = order_module.__dict__.setdefault("_real_send_hint", order_module.send_hint)
    exec(STANDIN, order_module.__dict__)
    return real
