"""A Cloud Storage emulator from PyPI (``gcp-storage-emulator``), served in this process
on a free port, that Google's own ``google-cloud-storage`` client talks to with
anonymous credentials (``STORAGE_EMULATOR_HOST``), as the Pub/Sub tests use Google's
Pub/Sub emulator.

It keeps objects in memory and answers the JSON API's list, media download (ranged
reads included, 416 past the end) and upload; it checks no permissions, so refusals
are served by ``forbidding_storage`` (Cloud Storage's own 403 body) instead.
"""

from __future__ import annotations

import contextlib
import http.server
import json
from collections.abc import Iterator

from gcp_storage_emulator.server import create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tests.fakes.http_server import serve_http
from tests.fakes.pubsub_emulator import free_port

PROJECT = "falcon-test"


@contextlib.contextmanager
def storage_emulator() -> Iterator[str]:
    """Serve the emulator; yields its ``http://127.0.0.1:PORT``."""
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def client(host: str) -> storage.Client:
    """Google's client on the emulator, with anonymous credentials."""
    return storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": host})


class _Forbidding(http.server.BaseHTTPRequestHandler):
    """Every request refused as Cloud Storage refuses a caller without the permission
    (the JSON API's error body: code 403, ``... does not have storage.objects.X access
    to the Google Cloud Storage ...``)."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        permission = "storage.objects.list" if self.path.split("?")[0].endswith("/o") \
            else "storage.objects.get"
        message = (f"reader@falcon-test.iam.gserviceaccount.com does not have {permission} "
                   "access to the Google Cloud Storage object. Permission "
                   f"'{permission}' denied on resource (or it may not exist).")
        body = json.dumps({"error": {"code": 403, "message": message,
                                     "errors": [{"message": message, "domain": "global",
                                                 "reason": "forbidden"}]}}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return


@contextlib.contextmanager
def forbidding_storage() -> Iterator[str]:
    """A Cloud Storage front end that refuses everything with 403; yields its URL."""
    with serve_http(_Forbidding, "forbidding-storage") as url:
        yield url
