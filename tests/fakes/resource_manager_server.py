"""A local Cloud Resource Manager v1 REST endpoint: ``projects.testIamPermissions``.

``POST /v1/projects/{project}:testIamPermissions`` with ``{"permissions": [...]}``
answers ``{"permissions": [...]}``, the subset the caller holds on the project, in the
order asked, the field left out when it holds none (proto3 JSON leaves out an empty
repeated field). A project the fake does not know answers 403 PERMISSION_DENIED, as
Google does for a project the caller cannot see; a permission with a wildcard is 400
INVALID_ARGUMENT (the request reference: "Permissions with wildcards ... are not
allowed"). Errors are Google's JSON error body (``code``, ``message``, ``status``).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
from collections.abc import Iterable
from typing import Any

from tests.fakes.http_server import serve_http

_PATH = re.compile(r"^/v1/projects/(?P<project>[^/:]+):testIamPermissions$")


class FakeResourceManager:
    """Per project, the permissions the caller holds; every call recorded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.granted: dict[str, set[str]] = {}
        self.calls: list[tuple[str, tuple[str, ...], str]] = []  # project, asked, auth

    def grant(self, project: str, permissions: Iterable[str]) -> None:
        with self._lock:
            self.granted.setdefault(project, set()).update(permissions)

    def revoke(self, project: str, *permissions: str) -> None:
        with self._lock:
            self.granted.get(project, set()).difference_update(permissions)

    def test(self, project: str, asked: list[str], authorization: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.calls.append((project, tuple(asked), authorization))
            if any("*" in permission for permission in asked):
                return 400, _error(400, "INVALID_ARGUMENT", "Permissions with wildcards are "
                                                            "not allowed.")
            held = self.granted.get(project)
            if held is None:
                return 403, _error(403, "PERMISSION_DENIED",
                                   "The caller does not have permission")
            answer = [permission for permission in asked if permission in held]
        return 200, {"permissions": answer} if answer else {}


def _error(code: int, status: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


def _handler(fake: FakeResourceManager) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: pytest shows failures, not access logs."""

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            match = _PATH.match(self.path.split("?", 1)[0])
            if match is None:
                self._reply(404, _error(404, "NOT_FOUND", f"no route {self.path}"))
                return
            try:
                asked = json.loads(raw or b"{}").get("permissions", [])
            except json.JSONDecodeError as error:
                self._reply(400, _error(400, "INVALID_ARGUMENT", f"Invalid JSON payload: {error}"))
                return
            status, body = fake.test(match["project"], list(asked),
                                     self.headers.get("Authorization", ""))
            self._reply(status, body)

    return Handler


def serve_rest(fake: FakeResourceManager) -> contextlib.AbstractContextManager[str]:
    """Serve ``fake``; yields the ``http://127.0.0.1:PORT`` endpoint."""
    return serve_http(_handler(fake), "fake-resource-manager")
