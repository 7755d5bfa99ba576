"""A webhook receiver on 127.0.0.1 for the notification tests: it records every POST (path, content type and the
JSON body) and answers ``status`` (204 unless a test changes it). ``stop()`` shuts the server down.

Shared by ``tests/integration/test_notify.py`` and ``tests/dags/test_gate_notifier.py``; both put this directory on
``sys.path`` (tests/ is not a package) and ``from webhook_receiver import Receiver``. Test support only.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Records every POST to ``url``; answers ``status``."""

    def __init__(self, path: str = "/hooks/kvfleet") -> None:
        self.posts: list[dict[str, Any]] = []
        self.status = 204
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.posts.append({"path": self.path, "content_type": self.headers.get("Content-Type"),
                                       "json": json.loads(body)})
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
