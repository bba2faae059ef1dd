"""A local stand-in for a Grafana server's HTTP API (standard library only), for the monitoring role's tests.

Grafana is not packaged by Debian, PyPI or npm, so the role's provisioning runs its real modules
(community.grafana.grafana_folder and grafana_dashboard) against this. It answers the calls they make, with
Grafana 11's shapes and status codes:

* ``GET /api/health``, ``GET /api/frontend/settings``          the version
* ``GET /api/folders``, ``POST /api/folders``                   folders (a duplicate title: 409, as Grafana)
* ``GET /api/dashboards/uid/<uid>``                             {"dashboard": ..., "meta": {"folderId", ...}}
* ``POST /api/dashboards/db``                                   saves (version + 1); an existing uid without
                                                                 "overwrite": 412 version-mismatch

Every request needs ``Authorization: Bearer <token>`` (401 otherwise). ``requests`` logs (method, path, status);
``writes`` counts the POSTs that changed something.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

VERSION = "11.3.0"


class FakeGrafana:
    def __init__(self, token: str):
        self.token = token
        self.folders: list[dict] = []
        self.dashboards: dict[str, dict] = {}  # uid -> {"dashboard": ..., "folderId": ...}
        self.requests: list[tuple[str, str, int]] = []
        self.writes = 0
        self._next_id = 1
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self.server.shutdown()
        self.server.server_close()

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def answer(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        if method == "GET" and path == "/api/health":
            return 200, {"database": "ok", "version": VERSION}
        if method == "GET" and path == "/api/frontend/settings":
            return 200, {"buildInfo": {"version": VERSION}}
        if path == "/api/folders":
            if method == "GET":
                return 200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders]
            if any(f["title"] == body.get("title") for f in self.folders):
                return 409, {"message": "a folder with the same name already exists"}
            folder = {"id": self._id(), "uid": body.get("uid") or f"f{len(self.folders)}", "title": body["title"],
                      "version": 1}
            self.folders.append(folder)
            self.writes += 1
            return 200, folder
        if method == "GET" and path.startswith("/api/dashboards/uid/"):
            stored = self.dashboards.get(path.rsplit("/", 1)[1])
            if stored is None:
                return 404, {"message": "Dashboard not found"}
            folder = next((f for f in self.folders if f["id"] == stored["folderId"]), None)
            return 200, {"dashboard": stored["dashboard"],
                         "meta": {"folderId": stored["folderId"], "folderUid": folder["uid"] if folder else "",
                                  "folderTitle": folder["title"] if folder else "General", "slug": "x"}}
        if method == "POST" and path == "/api/dashboards/db":
            dashboard = dict(body["dashboard"])
            uid = dashboard.get("uid")
            old = self.dashboards.get(uid)
            if old is not None and not body.get("overwrite"):
                return 412, {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"}
            dashboard["id"] = old["dashboard"]["id"] if old else self._id()
            dashboard["version"] = (old["dashboard"]["version"] + 1) if old else 1
            self.dashboards[uid] = {"dashboard": dashboard, "folderId": body.get("folderId", 0)}
            self.writes += 1
            return 200, {"id": dashboard["id"], "uid": uid, "status": "success", "version": dashboard["version"],
                         "url": f"/d/{uid}/x", "slug": "x"}
        return 404, {"message": "Not found"}

    def _handler(self):
        grafana = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method):
                path = urlsplit(self.path).path
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                with grafana._lock:
                    if self.headers.get("Authorization") != f"Bearer {grafana.token}":
                        status, answer = 401, {"message": "invalid API key"}
                    else:
                        status, answer = grafana.answer(method, path, body)
                    grafana.requests.append((method, path, status))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def log_message(self, *_args):
                pass

        return Handler
