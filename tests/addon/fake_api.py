"""FakeApi: a stand-in for the coordinator's JSON API (issue 11) while it is
being written, for developing the add-on only; the e2e tests in
tests/tests/addon.rs use the real coordinator. Stores blobs in memory, checks
each upload's BLAKE3 (with the add-on's blake3.py), accepts file sets and
jobs, and reports every job done with one frame: the PNG given with --frame.

    /usr/bin/python3 tests/addon/fake_api.py --port 8765 --token T --frame ref.png \
        --blake3 blender/addon/tessera
"""

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, default=8765)
p.add_argument("--token", default="T")
p.add_argument("--frame", required=True)
p.add_argument("--blake3", required=True)
a = p.parse_args()
sys.path.insert(0, a.blake3)
import blake3  # noqa: E402

blobs, jobs, log = {}, {}, []


class FakeApi(BaseHTTPRequestHandler):
    def _send(self, code, payload, raw=None):
        body = raw if raw is not None else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self):
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _auth(self):
        if self.headers.get("Authorization") != "Bearer " + a.token:
            self._send(401, {"error": "unknown token", "hint": "ask your admin"})
            return False
        return True

    def do_GET(self):
        if not self._auth():
            return
        path = self.path.split("?")[0]
        if path == "/api/v1/whoami":
            return self._send(200, {"user": "artist", "role": "user", "version": "0.1.0"})
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "jobs"] and len(parts) == 4:
            return self._send(200, jobs[int(parts[3])])
        if parts[:3] == ["api", "v1", "jobs"] and parts[4:5] == ["frames"]:
            return self._send(200, None, open(a.frame, "rb").read())
        self._send(404, {"error": "no such thing", "hint": ""})

    def do_POST(self):
        if not self._auth():
            return
        body = json.loads(self._body() or b"{}")
        log.append((self.path, body))
        print("FakeApi:", self.path, json.dumps(body)[:300], flush=True)
        if self.path == "/api/v1/jobs/check":
            return self._send(200, {"tasks": 1, "frames": 1, "workers": 1, "waiting": ""})
        if self.path == "/api/v1/blobs/missing":
            return self._send(200, {"missing": [d for d in body["digests"] if d not in blobs]})
        if self.path == "/api/v1/filesets":
            for f in body["files"]:
                assert f["digest"] in blobs, f
            return self._send(200, {"digest": "f" * 64})
        if self.path == "/api/v1/jobs":
            assert body["scene_digest"] in blobs
            job_id = len(jobs) + 1
            jobs[job_id] = {"id": job_id, "state": "done", "frames_total": 1, "frames_done": 1,
                            "message": "", "waiting": "", "outputs_total": 1, "tasks": [],
                            "outputs": [{"frame": 1, "digest": "x", "ext": "png", "size": 1,
                                         "pass": ""}]}
            return self._send(201, {"job_id": job_id})
        self._send(404, {"error": "no such thing", "hint": ""})

    def do_PUT(self):
        if not self._auth():
            return
        digest = self.path.rsplit("/", 1)[1]
        data = self._body()
        if blake3.hash_bytes(data) != digest:
            return self._send(400, {"error": "digest mismatch", "hint": ""})
        blobs[digest] = data
        print("FakeApi: PUT", digest, len(data), flush=True)
        self._send(200, {"digest": digest, "size": len(data), "already_present": False})


ThreadingHTTPServer(("127.0.0.1", a.port), FakeApi).serve_forever()
