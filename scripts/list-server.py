#!/usr/bin/env python3
"""A synthetic S3 bucket of any size for the listing benchmark (scripts/bench-listing.sh):
OBJECTS objects in FOLDERS folders under ds/ (ds/f0000/o000000.jpg ...), made up from their
keys rather than stored, so that a million cost no memory; every answer after --latency, as
from a store across a network. It answers what a mount asks: ListObjectsV2 (with or without a
delimiter, 1,000 keys a page), HEAD and ranged GETs (bytes derived from the key). Standard
library only.

    list-server.py --port 9000 --objects 1000000 --folders 1000 --latency 20ms
"""
import argparse
import hashlib
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = 1000
STAMP = "2026-01-01T00:00:00.000Z"


def seconds(text):
    for suffix, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


class Bucket:
    def __init__(self, objects, folders):
        self.folders = folders
        self.per = [objects // folders + (1 if f < objects % folders else 0) for f in range(folders)]

    @staticmethod
    def folder(f):
        return f"ds/f{f:04d}/"

    def key(self, f, j):
        return f"{self.folder(f)}o{j:06d}.jpg"

    @staticmethod
    def size(key):
        return 1000 + int(hashlib.md5(key.encode()).hexdigest()[:4], 16) % 4000

    @staticmethod
    def etag(key):
        return '"' + hashlib.md5(key.encode()).hexdigest() + '"'

    def parse(self, key):
        """(folder, index) of an object's key, or None."""
        try:
            folder, name = key[len("ds/"):].split("/")
            f, j = int(folder[1:]), int(name[1:7])
        except ValueError:
            return None
        if key.startswith("ds/") and 0 <= f < self.folders and 0 <= j < self.per[f] and key == self.key(f, j):
            return f, j
        return None

    def keys(self, prefix, delimiter, start):
        """Up to PAGE (key or common prefix, is_prefix) after `start` beneath `prefix`, and
        the next page's token (None at the end)."""
        out = []
        if delimiter and prefix in ("", "ds", "ds/"):
            if prefix == "":
                return [("ds/", True)], None
            names = [(self.folder(f), True) for f in range(self.folders)]
        elif prefix.startswith("ds/f") and len(prefix) == len("ds/f0000/"):
            try:
                f = int(prefix[4:8])
            except ValueError:
                return [], None
            if not 0 <= f < self.folders:
                return [], None
            names = None
            begin = int(start) if start else 0
            end = min(self.per[f], begin + PAGE)
            out = [(self.key(f, j), False) for j in range(begin, end)]
            return out, (str(end) if end < self.per[f] else None)
        elif not delimiter and prefix in ("", "ds", "ds/"):
            # Every key, in order: the token is "folder,index".
            f, j = (int(x) for x in start.split(",")) if start else (0, 0)
            while len(out) < PAGE and f < self.folders:
                take = min(self.per[f] - j, PAGE - len(out))
                out.extend((self.key(f, k), False) for k in range(j, j + take))
                j += take
                if j >= self.per[f]:
                    f, j = f + 1, 0
            return out, (f"{f},{j}" if f < self.folders else None)
        else:
            return [], None
        begin = int(start) if start else 0
        page = names[begin : begin + PAGE]
        return page, (str(begin + PAGE) if begin + PAGE < len(names) else None)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        time.sleep(self.server.latency)
        with self.server.lock:
            self.server.requests += 1
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if path in ("/bench", "/bench/") and self.command == "GET":
            return self.list(query)
        key = path[len("/bench/"):] if path.startswith("/bench/") else ""
        if self.server.bucket.parse(key) is None:
            body = b"<Error><Code>NoSuchKey</Code><Message>none</Message></Error>"
            return self.answer(404, body, [("Content-Type", "application/xml")])
        size, etag = Bucket.size(key), Bucket.etag(key)
        data = (hashlib.sha256(key.encode()).digest() * (size // 32 + 1))[:size]
        headers = [("ETag", etag), ("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT"),
                   ("Accept-Ranges", "bytes")]
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            a, b = int(a), min(int(b) if b else size - 1, size - 1)
            headers.append(("Content-Range", f"bytes {a}-{b}/{size}"))
            return self.answer(206, data[a : b + 1], headers)
        return self.answer(200, data, headers)

    do_HEAD = do_GET

    def list(self, q):
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        entries, token = self.server.bucket.keys(prefix, delimiter, q.get("continuation-token", ""))
        parts = [
            '<?xml version="1.0" encoding="UTF-8"?>',
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
            f"<Name>bench</Name><Prefix>{prefix}</Prefix><KeyCount>{len(entries)}</KeyCount>",
            f"<MaxKeys>{PAGE}</MaxKeys><Delimiter>{delimiter}</Delimiter>",
            f"<IsTruncated>{'true' if token else 'false'}</IsTruncated>",
        ]
        if token:
            parts.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
        for name, is_prefix in entries:
            if is_prefix:
                parts.append(f"<CommonPrefixes><Prefix>{name}</Prefix></CommonPrefixes>")
            else:
                parts.append(
                    f"<Contents><Key>{name}</Key><LastModified>{STAMP}</LastModified>"
                    f"<ETag>{Bucket.etag(name)}</ETag><Size>{Bucket.size(name)}</Size>"
                    "<StorageClass>STANDARD</StorageClass></Contents>"
                )
        parts.append("</ListBucketResult>")
        self.answer(200, "".join(parts).encode(), [("Content-Type", "application/xml")])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--objects", type=int, default=50_000)
    p.add_argument("--folders", type=int, default=1000)
    p.add_argument("--latency", default="20ms")
    a = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    server.bucket = Bucket(a.objects, a.folders)
    server.latency = seconds(a.latency)
    server.lock, server.requests = threading.Lock(), 0
    server.serve_forever()


if __name__ == "__main__":
    main()
