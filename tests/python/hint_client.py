"""Driven by tests/it/hints.rs: exercises the torch-free parts of the coorfs package against a
real coorfs mount (order hints, good and bad; its statistics), then reads two epochs in the
hinted order. Prints one JSON line of results.

    python3 hint_client.py PACKAGE_DIR MOUNT
"""
import errno
import json
import os
import sys
import warnings

sys.path.insert(0, sys.argv[1])
import coorfs  # noqa: E402

mount = sys.argv[2]
paths = sorted(
    os.path.join(root, f) for root, _, files in os.walk(mount) for f in files
)
out = {"files": len(paths)}

stats = coorfs.read_stats(mount)
out["stats_files"], out["stats_bytes"] = stats["dataset_files"], stats["dataset_bytes"]

# Bad hints: each raises OSError with coorfs's errno, in strict mode.
for name, bad in [("unknown", paths[:1] + [os.path.join(mount, "no/such.bin")]), ("directory", [os.path.dirname(paths[0])])]:
    try:
        coorfs.write_order(mount, bad)
        out[name] = "accepted"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
try:
    coorfs.write_order(mount, ["/etc/passwd"])
    out["outside"] = "accepted"
except ValueError:
    out["outside"] = "ValueError"

# Non-strict: a rejected hint warns and training goes on.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ok = coorfs.HintedOrder([os.path.join(mount, "missing.bin")], mount).hint([0])
    out["lenient"] = [ok, len(caught)]

# The real thing: two epochs, each hinted, read in the hinted order.
order = coorfs.HintedOrder(paths, mount, seed=7, strict=True)
digest = 0
for _ in range(2):
    for i in order.next_epoch():
        with open(paths[i], "rb") as f:
            digest = (digest + sum(f.read()[:64])) % (1 << 32)
out["digest"] = digest
out["cached"] = coorfs.cached_bytes(paths[0])  # read twice, but the budget holds no file
out["pgid"] = os.getpgid(0)
print(json.dumps(out))
