"""The coordinator's JSON API (`/api/v1/`), over urllib only.

Every failure becomes a FarmError whose message says what went wrong and what
to do, so operators can show it with self.report and never a traceback.
No bpy here: these calls run in the upload thread too.
"""

import ipaddress
import json
import os
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request


class FarmError(Exception):
    """A failure to show the artist as it is."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class Cancelled(Exception):
    """The artist pressed Esc."""


PREFS_HINT = "Edit > Preferences > Add-ons > Tessera"


class _Reader:
    """A file body for urllib that reports progress and stops on cancel."""

    def __init__(self, f, progress, cancelled):
        self.f, self.progress, self.cancelled = f, progress, cancelled

    def read(self, n=-1):
        if self.cancelled and self.cancelled():
            raise Cancelled()
        data = self.f.read(1 << 16 if n is None or n < 0 else min(n, 1 << 16))
        if data and self.progress:
            self.progress(len(data))
        return data


class Api:
    """One coordinator, as the preferences name it."""

    def __init__(self, url, token, ca_file="", timeout=30.0, online=True):
        url = (url or "").strip().rstrip("/")
        if not url:
            raise FarmError("no coordinator URL is set; set it in " + PREFS_HINT)
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise FarmError("the coordinator URL %r is not an http:// or https:// address "
                            "(for example http://farm:7879); fix it in %s" % (url, PREFS_HINT))
        if not (token or "").strip():
            raise FarmError("no token is set; ask the farm's admin for one "
                            "(`tessera users add NAME`) and put it in " + PREFS_HINT)
        self.url = url
        self.token = token.strip()
        self.timeout = timeout
        self.context = None
        # Blender 4.2+'s "Allow Online Access" (bpy.app.online_access), read
        # by the caller: this module runs in threads and imports no bpy.
        self.online = online
        self._host_checked = online
        if parsed.scheme == "https":
            ca = os.path.expanduser(ca_file or "")
            if ca and not os.path.isfile(ca):
                raise FarmError("the CA file %s does not exist; fix it in %s" % (ca, PREFS_HINT))
            try:
                self.context = ssl.create_default_context(cafile=ca or None)
            except (ssl.SSLError, OSError) as e:
                raise FarmError("cannot read the CA file %s: %s" % (ca, e)) from None

    def dashboard(self, job_id=None):
        """The dashboard's page of a job (or its front page)."""
        return self.url + ("/jobs/%d" % job_id if job_id else "/")

    # ------------------------------------------------------------ transport

    def _check_online_access(self):
        """With online access off, Blender asks add-ons to stay off the
        internet. A farm's coordinator is nearly always on this machine or
        the local network, which that setting does not cover: refuse only
        an address on the internet. Resolved once, off Blender's main thread
        where the panel polls (see state.py)."""
        if self._host_checked:
            return
        host = urllib.parse.urlparse(self.url).hostname or ""
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except OSError:
            return  # the request itself fails and says why
        public = sorted(a for a in addresses
                        if ipaddress.ip_address(a.split("%")[0]).is_global)
        if public:
            raise FarmError("Blender's online access is off and the coordinator at %s is on the "
                            "internet (%s); allow it in Edit > Preferences > System > Network > "
                            "Allow Online Access, or start Blender with --online-mode"
                            % (self.url, ", ".join(public)))
        self._host_checked = True

    def _open(self, method, path, body=None, headers=None, timeout=None):
        self._check_online_access()
        req = urllib.request.Request(self.url + path, data=body, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout,
                                          context=self.context)
        except urllib.error.HTTPError as e:
            raise self._http_error(e) from None
        except Cancelled:
            raise
        except urllib.error.URLError as e:
            raise self._unreachable(e.reason) from None
        except (socket.timeout, TimeoutError) as e:
            raise self._unreachable(e) from None
        except (ConnectionError, OSError) as e:
            raise self._unreachable(e) from None

    def _unreachable(self, reason):
        if isinstance(reason, ssl.SSLError) or "CERTIFICATE" in str(reason).upper():
            return FarmError("cannot make a TLS connection to %s: %s; set the CA file that "
                             "signed the coordinator's certificate in %s"
                             % (self.url, reason, PREFS_HINT))
        return FarmError("cannot reach the coordinator at %s: %s; check the URL in %s and that "
                         "the coordinator runs with --http" % (self.url, reason, PREFS_HINT))

    def _http_error(self, e):
        try:
            payload = json.loads(e.read().decode("utf-8", "replace") or "{}")
        except (ValueError, OSError):
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        text = str(payload.get("error") or e.reason or "HTTP %d" % e.code)
        hint = payload.get("hint")
        if e.code == 401:
            text = "the coordinator at %s refused the token (%s); put a valid token in %s" % (
                self.url, text, PREFS_HINT)
        elif e.code == 403:
            text = "not allowed: " + text
        elif e.code == 404 and not payload:
            text = ("%s has no Tessera API here (HTTP 404); the URL must be the coordinator's "
                    "--http address" % self.url)
        if hint and hint not in text:
            text = "%s; %s" % (text, hint)
        return FarmError(text, status=e.code)

    def call(self, method, path, payload=None):
        """A JSON request; returns the decoded answer."""
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        with self._open(method, path, body, headers) as r:
            raw = r.read()
        try:
            return json.loads(raw.decode("utf-8")) if raw else {}
        except ValueError:
            raise FarmError("%s answered %s %s with something that is not JSON; is the URL "
                            "the coordinator's --http address?" % (self.url, method, path)) from None

    # ------------------------------------------------------------ endpoints

    def whoami(self):
        return self.call("GET", "/api/v1/whoami")

    def check(self, spec):
        return self.call("POST", "/api/v1/jobs/check", spec)

    def missing(self, digests):
        out = set()
        digests = list(digests)
        for i in range(0, len(digests), 1000):
            out.update(self.call("POST", "/api/v1/blobs/missing",
                                 {"digests": digests[i:i + 1000]}).get("missing", []))
        return out

    def put_blob(self, digest, path, size, progress=None, cancelled=None):
        with open(path, "rb") as f:
            body = _Reader(f, progress, cancelled)
            headers = {"Content-Type": "application/octet-stream",
                       "Content-Length": str(size)}
            with self._open("PUT", "/api/v1/blobs/" + digest, body, headers,
                            timeout=max(self.timeout, 300)) as r:
                r.read()

    def file_set(self, file_set):
        return self.call("POST", "/api/v1/filesets", file_set)["digest"]

    def submit(self, spec):
        return int(self.call("POST", "/api/v1/jobs", spec)["job_id"])

    def job(self, job_id, output_from=0, output_limit=0):
        q = ""
        if output_limit:
            q = "?output_from=%d&output_limit=%d" % (output_from, output_limit)
        return self.call("GET", "/api/v1/jobs/%d%s" % (job_id, q))

    def cancel(self, job_id):
        return self.call("POST", "/api/v1/jobs/%d/cancel" % job_id, {})

    def download(self, path, dest, cancelled=None):
        """Writes the bytes at `path` to `dest` (through a temporary name)."""
        tmp = dest + ".part"
        with self._open("GET", path, timeout=max(self.timeout, 300)) as r, open(tmp, "wb") as f:
            while True:
                if cancelled and cancelled():
                    raise Cancelled()
                block = r.read(1 << 16)
                if not block:
                    break
                f.write(block)
        os.replace(tmp, dest)

    def frame(self, job_id, frame, dest):
        self.download("/api/v1/jobs/%d/frames/%d" % (job_id, frame), dest)

    def blob(self, digest, dest):
        self.download("/api/v1/blobs/" + digest, dest)
