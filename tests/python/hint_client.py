"""Driven by tests/hints.rs: exercises scripts/coorfs_torch.py's torch-free parts against a
real coorfs mount, then reads an epoch in the hinted order. Prints one JSON line of results.

    python3 hint_client.py SCRIPTS_DIR MOUNT
"""
import errno
import json
import os
import sys
import warnings

sys.path.insert(0, sys.argv[1])
import coorfs_torch  # noqa: E402

mount = sys.argv[2]
paths = sorted(
    os.path.join(root, f) for root, _, files in os.walk(mount) for f in files
)
out = {"files": len(paths), "torch": coorfs_torch.torch is not None}

# Bad hints: each raises OSError with coorfs's errno, in strict mode.
for name, bad in [("unknown", paths[:1] + [os.path.join(mount, "no/such.bin")]), ("directory", [os.path.dirname(paths[0])])]:
    try:
        coorfs_torch.write_order(mount, bad)
        out[name] = "accepted"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
try:
    coorfs_torch.write_order(mount, ["/etc/passwd"])
    out["outside"] = "accepted"
except ValueError:
    out["outside"] = "ValueError"

# Non-strict: a rejected hint warns and training goes on.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ok = coorfs_torch.HintedOrder([os.path.join(mount, "missing.bin")], mount).hint([0])
    out["lenient"] = [ok, len(caught)]

# The real thing: two epochs, each hinted, read in the hinted order.
order = coorfs_torch.HintedOrder(paths, mount, seed=7, strict=True)
digest = 0
for _ in range(2):
    for i in order.next_epoch():
        with open(paths[i], "rb") as f:
            digest = (digest + sum(f.read()[:64])) % (1 << 32)
out["digest"] = digest
out["pgid"] = os.getpgid(0)
print(json.dumps(out))
