#!/usr/bin/env python3
"""An S3 server for benchmarks: moto's (PyPI moto[server]), in memory, with a fixed latency
added before every answer, like an object store across a network (first byte after
--latency; many requests wait at once, as they do on a real store).

    s3-server.py --port 9000 --latency 20ms [--pace 100M]

With --pace, each answer's body is sent at most at that many bytes a second (one S3 stream
gives about 100 MiB/s): many requests in flight then go faster than one, as on a real store.

A ranged GET reads only its range of the object ([`Ranged`]): moto reads the whole object for
every GET and slices the range out of it, so that 8 MiB of a 1 GiB object took 0.58 s (0.06 s
of a 40 MiB one), where a store's time grows with the bytes sent. Readers that read objects in
ranged GETs (coorfs, s3torchconnector, rclone, mountpoint-s3) would be measured against moto.

This machine's kernel has no netem to delay loopback traffic, so the delay is the server's.
Run it with the python of the venv that has moto (scripts/test.sh installs one into
target/moto)."""
import argparse
import re
import time
from urllib.parse import parse_qsl, unquote

from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.s3.models import s3_backends
from werkzeug.serving import WSGIRequestHandler, run_simple


def seconds(text):
    for suffix, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


class Delayed:
    """WSGI middleware: waits `latency` seconds before the app answers, and sends each body
    at `pace` bytes a second at most (0: as fast as it goes), in chunks of 256 KiB."""

    CHUNK = 256 << 10

    def __init__(self, app, latency, pace=0):
        self.app, self.latency, self.pace = app, latency, pace

    def __call__(self, environ, start_response):
        if self.latency:
            time.sleep(self.latency)
        body = self.app(environ, start_response)
        return self.paced(body) if self.pace else body

    def paced(self, body):
        start, sent = time.monotonic(), 0
        try:
            for part in body:
                for i in range(0, len(part), self.CHUNK):
                    chunk = part[i : i + self.CHUNK]
                    sent += len(chunk)
                    ahead = start + sent / self.pace - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                    yield chunk
        finally:
            if hasattr(body, "close"):
                body.close()


def presigned_only(environ):
    """True if the request's query holds nothing but a presigned URL's X-Amz-* parameters
    (a GET of the object itself, as one signed in its headers is)."""
    query = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    return all(name.startswith("X-Amz-") for name, _ in query)


class Ranged:
    """WSGI middleware: answers a GET of one byte range (`Range: bytes=A-B`, path-style
    /bucket/key, no query) of an object from the range alone, read from moto's copy under
    its lock, with the headers moto sends and If-Match honoured (412). Everything else, and
    a missing key, goes to moto."""

    RANGE = re.compile(r"bytes=(\d+)-(\d*)$")

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        got = self.ranged(environ)
        if got is None:
            return self.app(environ, start_response)
        status, headers, body = got
        start_response(status, headers)
        return [body]

    def ranged(self, environ):
        m = self.RANGE.match(environ.get("HTTP_RANGE", ""))
        path = environ.get("PATH_INFO", "")
        if environ["REQUEST_METHOD"] != "GET" or not m or not presigned_only(environ):
            return None
        if environ.get("HTTP_IF_NONE_MATCH") or environ.get("HTTP_IF_MODIFIED_SINCE"):
            return None
        bucket, _, key_name = path.lstrip("/").partition("/")
        if not key_name:
            return None
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        try:
            key = backend.get_object(bucket, unquote(key_name))
        except Exception:
            return None
        if key is None or not key.size:
            return None
        with key.lock:
            etag = key.etag
        if_match = environ.get("HTTP_IF_MATCH")
        if if_match and if_match not in ("*", etag) and if_match.strip('"') != etag.strip('"'):
            body = b"<Error><Code>PreconditionFailed</Code></Error>"
            return "412 Precondition Failed", [("Content-Length", str(len(body)))], body
        begin, end = int(m.group(1)), int(m.group(2)) if m.group(2) else key.size - 1
        if begin >= key.size:
            return None
        end = min(end, key.size - 1)
        with key.lock:
            key._value_buffer.seek(begin)
            body = key._value_buffer.read(end - begin + 1)
        headers = [
            ("Content-Type", key.metadata.get("content-type", "binary/octet-stream")),
            ("Content-Length", str(len(body))),
            ("Content-Range", f"bytes {begin}-{end}/{key.size}"),
            ("ETag", etag),
            ("Last-Modified", key.last_modified_RFC1123),
            ("Accept-Ranges", "bytes"),
        ]
        return "206 Partial Content", headers, body


class Quiet(WSGIRequestHandler):
    # HTTP/1.1 keeps connections open between requests, as S3 does.
    protocol_version = "HTTP/1.1"

    def log_request(self, *args, **kwargs):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--latency", default="20ms", help="added before each answer (e.g. 20ms)")
    p.add_argument("--pace", default="0", help="bytes a second per answer at most (e.g. 100M)")
    a = p.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    pace = a.pace.upper().rstrip("B")
    pace = int(float(pace[:-1]) * units[pace[-1]]) if pace[-1:] in units else int(pace)
    app = Delayed(
        Ranged(DomainDispatcherApplication(create_backend_app)), seconds(a.latency), pace
    )
    run_simple(a.host, a.port, app, threaded=True, request_handler=Quiet)


if __name__ == "__main__":
    main()
