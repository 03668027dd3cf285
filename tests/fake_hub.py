"""A small real HTTP server speaking the parts of the Hugging Face hub's file API that
huggingface_hub uses to list and download a dataset repo: tree listing, HEAD/GET resolve with
Range (resume). It can cut a transfer short once, or serve corrupted bytes, to test recovery."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repo_id: str, files: dict[str, bytes], lfs: set[str]):
        self.repo_id, self.files, self.lfs = repo_id, files, lfs
        self.interrupt_once: set[str] = set()
        self.corrupt: set[str] = set()
        self.requests: list[dict] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_HEAD(self):
                hub._resolve(self, body=False)

            def do_GET(self):
                path = urlparse(self.path).path
                if path.startswith(f"/api/datasets/{hub.repo_id}/tree/"):
                    return hub._tree(self)
                hub._resolve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def oid(self, path: str) -> str:
        data = self.files[path]
        if path in self.lfs:
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()

    def _tree(self, handler):
        entries = []
        for path, data in sorted(self.files.items()):
            entry = {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
            if path in self.lfs:
                entry["lfs"] = {"oid": self.oid(path), "size": len(data), "pointerSize": 130}
            else:
                entry["oid"] = self.oid(path)
            entries.append(entry)
        body = json.dumps(entries).encode()
        self.requests.append({"method": "GET", "kind": "tree", "auth": handler.headers.get("Authorization")})
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _resolve(self, handler, body: bool):
        prefix = f"/datasets/{self.repo_id}/resolve/"
        url_path = unquote(urlparse(handler.path).path)
        if not url_path.startswith(prefix):
            handler.send_error(404)
            return
        _revision, _, path = url_path[len(prefix):].partition("/")
        if path not in self.files:
            handler.send_response(404)
            handler.send_header("X-Error-Code", "EntryNotFound")
            handler.end_headers()
            return
        data = self.files[path]
        if path in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = handler.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
        self.requests.append({"method": handler.command, "kind": "resolve", "path": path, "range_start": start,
                              "auth": handler.headers.get("Authorization")})
        handler.send_response(206 if start else 200)
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("ETag", f'"{self.oid(path)}"')
        handler.send_header("Content-Length", str(len(data) - start))
        if start:
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        handler.end_headers()
        if not body:
            return
        if path in self.interrupt_once and not start:
            self.interrupt_once.discard(path)
            handler.wfile.write(data[: len(data) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(2)
            return
        handler.wfile.write(data[start:])
