"""Writes to the test emulators with plain HTTP, for tests/it/common/stores.rs: a bucket (or
Azure container) made, an object put (its bytes on stdin) or deleted, under any key, those
object_store refuses to write too (a folder marker `a/`, a tab); for the benchmarks, a tree
put or read back. Standard library only.

    store-client.py KIND ENDPOINT mkbucket BUCKET
    store-client.py KIND ENDPOINT put BUCKET KEY < bytes
    store-client.py KIND ENDPOINT delete BUCKET KEY
    store-client.py KIND ENDPOINT get BUCKET KEY > bytes
    store-client.py KIND ENDPOINT put-dir BUCKET PREFIX DIR   # every file of DIR, 16 at once
    store-client.py KIND ENDPOINT get-dir BUCKET PREFIX DIR   # GET them back, 16 at once:
                                                              # prints seconds and bytes

KIND: s3 (moto, which checks no signature), gcs (fake-gcs-server's JSON API, unsigned),
azure (Azurite's well-known account, signed with its Shared Key).
"""

import base64
import hashlib
import hmac
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from email.utils import formatdate

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def request(method, url, data=None, headers=None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(req) as answer:
        return answer.read()


def azure(endpoint, method, path, query, data=b"", extra=None):
    """A request to Azurite at ENDPOINT for PATH (account/container[/blob]), signed."""
    headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    headers.update(extra or {})
    if data:
        # Signed as sent: urllib would add a form's content type of its own.
        headers["Content-Type"] = "application/octet-stream"
    length = str(len(data)) if data else ""
    canonical_headers = "".join(
        f"{k}:{v}\n" for k, v in sorted(headers.items()) if k.startswith("x-ms-")
    )
    quoted = urllib.parse.quote(path)
    resource = f"/{AZURITE_ACCOUNT}/{quoted}" + "".join(
        f"\n{k}:{v}" for k, v in sorted(query.items())
    )
    sign = "\n".join(
        [method, "", "", length, "", headers.get("Content-Type", ""), "", "", "", "", "", ""]
    )
    sign += "\n" + canonical_headers + resource
    mac = hmac.new(base64.b64decode(AZURITE_KEY), sign.encode(), hashlib.sha256)
    headers["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(mac.digest()).decode()}"
    url = f"{endpoint}/{quoted}" + ("?" + urllib.parse.urlencode(query) if query else "")
    return request(method, url, data if data else None, headers)


def put_dir(kind, endpoint, bucket, prefix, root):
    """Puts every file beneath `root` as PREFIX/its path, 16 at a time."""
    import concurrent.futures
    import os

    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]

    def put(path):
        with open(path, "rb") as f:
            data = f.read()
        act(kind, endpoint, "put", bucket, f"{prefix}/{os.path.relpath(path, root)}", data)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files))


def get_dir(kind, endpoint, bucket, prefix, root):
    """GETs the objects PREFIX/(each file's path beneath `root`), 16 at a time, checks each
    against the file and prints the seconds it took and the bytes: a store's own speed,
    with no mount."""
    import concurrent.futures
    import os

    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]

    def get(path):
        key = f"{prefix}/{os.path.relpath(path, root)}"
        got = act(kind, endpoint, "get", bucket, key, b"")
        with open(path, "rb") as f:
            if f.read() != got:
                raise SystemExit(f"store-client.py: {key}: the bytes differ")
        return len(got)

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        total = sum(pool.map(get, files))
    print(f"{time.monotonic() - start:.2f} s {total} bytes {len(files)} objects")


def main():
    kind, endpoint, verb, bucket = sys.argv[1:5]
    if verb == "put-dir":
        return put_dir(kind, endpoint, bucket, sys.argv[5], sys.argv[6])
    if verb == "get-dir":
        return get_dir(kind, endpoint, bucket, sys.argv[5], sys.argv[6])
    key = sys.argv[5] if len(sys.argv) > 5 else None
    data = sys.stdin.buffer.read() if verb == "put" else b""
    got = act(kind, endpoint, verb, bucket, key, data)
    if verb == "get":
        sys.stdout.buffer.write(got)


def act(kind, endpoint, verb, bucket, key, data):
    """Makes `bucket`, puts `data` as `key`, deletes `key` or returns its bytes (`verb`)."""
    if kind == "s3":
        url = f"{endpoint}/{bucket}" + (f"/{urllib.parse.quote(key, safe='/')}" if key else "")
        method = {"mkbucket": "PUT", "put": "PUT", "delete": "DELETE", "get": "GET"}[verb]
        # Not a form's content type (urllib's default: moto stores such a body empty), and
        # the tests' key, unsigned (moto refuses an anonymous overwrite, and checks no
        # signature).
        headers = {
            "Content-Type": "application/octet-stream",
            "Authorization": "AWS4-HMAC-SHA256 Credential=AKIATESTKEY/20260101/us-east-1/s3/"
            "aws4_request, SignedHeaders=host, Signature=00",
        }
        return request(method, url, data if verb == "put" else None, headers)
    elif kind == "gcs":
        if verb == "mkbucket":
            request(
                "POST",
                f"{endpoint}/storage/v1/b",
                f'{{"name": "{bucket}"}}'.encode(),
                {"Content-Type": "application/json"},
            )
        elif verb == "put":
            name = urllib.parse.quote(key, safe="")
            request(
                "POST",
                f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
                data,
                {"Content-Type": "application/octet-stream"},
            )
        elif verb == "get":
            # The JSON API's media download: fake-gcs-server answers it with the handler of
            # the XML API's GET /BUCKET/KEY, which object_store's client sends.
            name = urllib.parse.quote(key, safe="")
            return request("GET", f"{endpoint}/storage/v1/b/{bucket}/o/{name}?alt=media")
        else:
            name = urllib.parse.quote(key, safe="")
            request("DELETE", f"{endpoint}/storage/v1/b/{bucket}/o/{name}")
    elif kind == "azure":
        path = f"{AZURITE_ACCOUNT}/{bucket}"
        if verb == "mkbucket":
            azure(endpoint, "PUT", path, {"restype": "container"})
        elif verb == "put":
            azure(endpoint, "PUT", f"{path}/{key}", {}, data, {"x-ms-blob-type": "BlockBlob"})
        elif verb == "get":
            return azure(endpoint, "GET", f"{path}/{key}", {})
        else:
            azure(endpoint, "DELETE", f"{path}/{key}", {})
    else:
        sys.exit(f"store-client.py: unknown kind {kind}")


if __name__ == "__main__":
    try:
        main()
    except urllib.error.HTTPError as e:
        sys.exit(f"store-client.py {' '.join(sys.argv[1:])}: {e.code} {e.reason}: {e.read()[:300]!r}")
