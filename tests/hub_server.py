"""A loopback Hub for tests: a wire-protocol test double, not a Hub.

It is a small HTTP server on 127.0.0.1 (a free port, chosen by the OS) that answers the requests the
*real* huggingface_hub 2.4.0 client makes for what the zoo uses — read from the installed client's source,
not from documentation — so the tests drive the real client (`HF_ENDPOINT=<its url>`), headers, error
parsing and cache layout included:

    HEAD  /                                             reachability probe (zoo.hub.hub_reachable)
    GET   /api/whoami-v2                                the token's user name
    POST  /api/repos/create                             create a repo (409 if it exists, as the Hub does)
    POST  /api/validate-yaml                            README.md front matter: parsed with PyYAML
    GET   /api/models/{repo}[/revision/{rev}]           repo_info: sha, siblings
    GET   /api/models/{repo}/tree/{rev}[/{path}]        list_repo_tree (recursive), LFS sha256 + size
    POST  /api/models/{repo}/branch/{branch}            create a branch from main
    POST  /api/models/{repo}/preupload/{rev}            upload mode per file (regular | lfs) + remote oid
    POST  /{repo}.git/info/lfs/objects/batch            LFS batch: an upload action only for unknown objects
    PUT   /lfs-upload/{oid}                             LFS basic transfer (sha256 checked on arrival)
    POST  /api/models/{repo}/commit/{rev}               ndjson commit: file (base64), lfsFile, deletedFile
    HEAD  /{repo}/resolve/{rev}/{path}                  metadata: ETag, X-Repo-Commit, X-Linked-Etag/-Size
    GET   /{repo}/resolve/{rev}/{path}                  the bytes (Range: bytes=N- supported)

Errors carry the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) so the
client raises its real exception classes. What it is not: no Xet. Downloads never advertise Xet (no
`X-Xet-*` headers), so the client uses plain HTTP; uploads need `HF_HUB_DISABLE_XET=1` on the client
side, because the client (not the server) picks Xet when hf_xet is installed, and this double does not
speak the Xet CAS protocol. No multipart LFS, no pull requests, no git history beyond a commit per
branch head, model repos only, everything in memory. Bounded: request bodies up to MAX_BODY bytes, and the
server stops itself after `lifetime_s` even if a test forgets to.

Test hooks: `stall_lfs_after=N` lets N LFS uploads through and holds every later one until `release()`,
then drops it unstored (the test kills the uploading process meanwhile: a transfer cut midway); `fail_downloads=N` answers the next N file downloads with 503
(transient); `gated` repos need a token in `granted_tokens`; `lfs_uploads` counts the objects received.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

MAX_BODY = 256 * 2**20
LFS_SUFFIXES = (".bin", ".safetensors", ".tflite", ".mlirb", ".pt", ".onnx", ".npz", ".gguf", ".h5")
LFS_THRESHOLD = 10 * 2**20  # the Hub stores files above 10 MB in LFS whatever their content


def git_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class StoredFile:
    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.content)}\n".encode()

    @property
    def etag(self) -> str:
        """What the Hub sends as the (linked) etag: sha256 for LFS, the git blob sha1 otherwise."""
        return self.sha256 if self.lfs else git_sha1(self.content)

    @property
    def oid(self) -> str:
        """The git object id in tree listings (for LFS files, that of the pointer file)."""
        return git_sha1(self.pointer if self.lfs else self.content)


@dataclass
class Repo:
    repo_id: str
    private: bool = False
    branches: dict[str, str] = field(default_factory=dict)         # branch -> commit sha
    commits: dict[str, dict[str, StoredFile]] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision in self.commits else None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        self.status, self.message, self.code = status, message, code


class LoopbackHub:
    """`with LoopbackHub() as hub:` → `hub.url` for HF_ENDPOINT. Thread-safe enough for one client."""

    def __init__(self, token: str | None = None, lifetime_s: float = 300.0, stall_lfs_after: int | None = None):
        self.token = token                     # when set: writes need it, reads of private repos too
        self.granted_tokens: set[str] = set()  # tokens that accepted the terms of gated repos
        self.gated: set[str] = set()
        self.repos: dict[str, Repo] = {}
        self.lfs_store: dict[str, bytes] = {}
        self.lfs_uploads: list[str] = []       # oids received, in order (the resume test counts them)
        self.requests: list[tuple[str, str]] = []
        self.auth_seen: set[str] = set()
        self.stall_lfs_after = stall_lfs_after
        self.stalled = 0
        self.admitted = 0
        self._release = threading.Event()
        self.fail_downloads = 0
        self.lifetime_s = lifetime_s
        self.lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "LoopbackHub":
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "LoopbackHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def release(self) -> None:
        """Let held LFS uploads go on (after the uploading process was killed, they find a closed socket)."""
        self.stall_lfs_after = None
        self._release.set()

    # ---------------------------------------------------------- state helpers (tests call these directly)

    def seed_repo(self, repo_id: str, files: dict[str, bytes], private: bool = False, branch: str = "main") -> str:
        """A repo with one commit holding `files`; returns the commit sha."""
        with self.lock:
            repo = self.repos.setdefault(repo_id, Repo(repo_id, private))
            head = dict(repo.commits.get(repo.branches.get(branch, ""), {}))
            for path, content in files.items():
                head[path] = StoredFile(content, is_lfs(path, content[:512], len(content)))
                if head[path].lfs:
                    self.lfs_store[head[path].sha256] = content
            return self._new_commit(repo, branch, head)

    def head_files(self, repo_id: str, revision: str = "main") -> dict[str, StoredFile]:
        repo = self.repos[repo_id]
        return repo.commits[repo.resolve(revision)]

    def _new_commit(self, repo: Repo, branch: str, files: dict[str, StoredFile]) -> str:
        sha = secrets.token_hex(20)
        repo.commits[sha] = files
        repo.branches[branch] = sha
        return sha


def is_lfs(path: str, sample: bytes, size: int) -> bool:
    """The Hub's rule in short: big files, binary content, or a suffix its default .gitattributes tracks."""
    return size > LFS_THRESHOLD or path.endswith(LFS_SUFFIXES) or b"\0" in sample or not _is_utf8(sample)


def _is_utf8(sample: bytes) -> bool:
    try:
        sample.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return len(sample) >= 512  # a sample cut in the middle of a multi-byte character is still text
    # (the Hub samples 512 bytes; a cut character at the end is not evidence of binary content)


_REPO = r"(?P<repo>[^/]+/[^/]+)"


def _handler_for(hub: LoopbackHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the tests read hub.requests instead
            pass

        # ---------------------------------------------------------- plumbing

        def _route(self, method: str):
            hub.requests.append((method, self.path))
            auth = self.headers.get("Authorization", "")
            if auth:
                hub.auth_seen.add(auth.removeprefix("Bearer ").strip())
            try:
                path = urlsplit(self.path).path
                for pattern, name in ROUTES.get(method, []):
                    found = re.fullmatch(pattern, path)
                    if found:
                        return getattr(self, name)(**{k: unquote(v) for k, v in found.groupdict().items() if v is not None})
                raise HubError(404, f"no route for {method} {path}")
            except HubError as exc:
                self._json({"error": exc.message}, exc.status, code=exc.code, body=method != "HEAD")
            except (ConnectionError, TimeoutError):
                self.close_connection = True
            except Exception as exc:  # a bug in the double: say so on the wire instead of hanging up
                self._json({"error": f"loopback hub bug: {type(exc).__name__}: {exc}"}, 500, body=method != "HEAD")

        def do_GET(self):
            self._route("GET")

        def do_HEAD(self):
            self._route("HEAD")

        def do_POST(self):
            self._route("POST")

        def do_PUT(self):
            self._route("PUT")

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                data = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return data
                    data += self.rfile.read(size)
                    self.rfile.readline()
                    if len(data) > MAX_BODY:
                        raise HubError(413, "body too large")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise HubError(413, "body too large")
            data = self.rfile.read(length)
            if len(data) != length:
                raise ConnectionError("client went away mid-body")
            return data

        def _json(self, payload, status: int = 200, code: str | None = None, headers: dict | None = None,
                  body: bool = True):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if code:
                self.send_header("X-Error-Code", code)
            if status >= 400:
                self.send_header("X-Error-Message", payload.get("error", ""))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _token(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            return auth.removeprefix("Bearer ").strip() or None

        def _require_write(self):
            token = self._token()
            if token is None or (hub.token is not None and token != hub.token):
                raise HubError(401, "Invalid credentials in Authorization header")

        def _repo(self, repo_id: str) -> Repo:
            repo = hub.repos.get(repo_id)
            token = self._token()
            if repo is None or (repo.private and (token is None or token != hub.token)):
                raise HubError(401 if token is None else 404, "Repository not found", "RepoNotFound")
            if repo_id in hub.gated and token not in hub.granted_tokens:
                raise HubError(401 if token is None else 403,
                               f"Access to model {repo_id} is restricted. You must have access to it and be authenticated.",
                               "GatedRepo")
            return repo

        def _commit(self, repo: Repo, revision: str) -> str:
            sha = repo.resolve(revision)
            if sha is None:
                raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            return sha

        # ---------------------------------------------------------- endpoints

        def root(self):
            self._json({"loopback": True}, body=self.command != "HEAD")

        def whoami(self):
            if self._token() is None:
                raise HubError(401, "Invalid credentials in Authorization header")
            self._json({"name": "loopback-user", "type": "user", "orgs": [], "auth": {"type": "access_token"}})

        def create_repo(self):
            self._require_write()
            payload = json.loads(self._body())
            repo_id = f"{payload.get('organization') or 'loopback-user'}/{payload['name']}"
            with hub.lock:
                if repo_id in hub.repos:  # the Hub's 409 carries the url; the client reads it (exist_ok=True)
                    self._json({"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"}, 409)
                    return
                repo = hub.repos[repo_id] = Repo(repo_id, payload.get("visibility") == "private")
                hub._new_commit(repo, "main", {})
            self._json({"url": f"{hub.url}/{repo_id}", "name": repo_id, "id": repo_id})

        def validate_yaml(self):
            content = json.loads(self._body())["content"]
            errors = []
            if content.startswith("---"):
                front = content.split("---", 2)[1]
                try:
                    if not isinstance(yaml.safe_load(front) or {}, dict):
                        errors.append({"message": "metadata is not a mapping"})
                except yaml.YAMLError as exc:
                    errors.append({"message": f"invalid YAML: {exc}"})
            if errors:
                self._json({"errors": errors, "warnings": []}, 400)
            else:
                self._json({"errors": [], "warnings": []})

        def repo_info(self, repo, revision="main"):
            found = self._repo(repo)
            sha = self._commit(found, revision)
            files = found.commits[sha]
            self._json({"id": repo, "modelId": repo, "sha": sha, "private": found.private,
                        "gated": "auto" if repo in hub.gated else False, "disabled": False, "tags": [],
                        "siblings": [{"rfilename": p} for p in sorted(files)]})

        def tree(self, repo, revision, path=""):
            found = self._repo(repo)
            files = found.commits[self._commit(found, revision)]
            query = parse_qs(urlsplit(self.path).query)
            recursive = query.get("recursive", ["False"])[0].lower() == "true"
            prefix = f"{path.strip('/')}/" if path else ""
            entries, folders = [], set()
            for name, stored in sorted(files.items()):
                if not name.startswith(prefix):
                    continue
                rest = name[len(prefix):]
                parts = rest.split("/")
                for depth in range(1, len(parts)):
                    if recursive or depth == 1:
                        folders.add(prefix + "/".join(parts[:depth]))
                if "/" in rest and not recursive:
                    continue
                entry = {"type": "file", "oid": stored.oid, "size": len(stored.content), "path": name}
                if stored.lfs:
                    entry["lfs"] = {"oid": stored.sha256, "size": len(stored.content), "pointerSize": len(stored.pointer)}
                entries.append(entry)
            entries += [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "path": f} for f in sorted(folders)]
            self._json(entries)

        def create_branch(self, repo, branch):
            self._require_write()
            found = self._repo(repo)
            with hub.lock:
                if branch in found.branches:
                    raise HubError(409, f"Reference already exists: refs/heads/{branch}")
                found.branches[branch] = found.branches["main"]
            self._json({})

        def preupload(self, repo, revision):
            self._require_write()
            found = self._repo(repo)
            head = found.commits.get(found.resolve(revision) or "", {})  # a new branch has no files yet
            out = []
            for item in json.loads(self._body())["files"]:
                sample = base64.b64decode(item["sample"])
                lfs = is_lfs(item["path"], sample, int(item["size"]))
                current = head.get(item["path"])
                oid = None if current is None else (current.sha256 if current.lfs else git_sha1(current.content))
                out.append({"path": item["path"], "uploadMode": "lfs" if lfs else "regular",
                            "shouldIgnore": False, "oid": oid})
            self._json({"files": out, "commitOid": found.resolve(revision)})

        def lfs_batch(self, repo):
            self._require_write()
            self._repo(repo)
            payload = json.loads(self._body())
            objects = []
            for obj in payload["objects"]:
                entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
                if obj["oid"] not in hub.lfs_store:  # known objects get no action: the client skips them
                    entry["actions"] = {"upload": {"href": f"{hub.url}/lfs-upload/{obj['oid']}", "header": {}}}
                objects.append(entry)
            self._json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                       headers={"Content-Type": "application/vnd.git-lfs+json"})

        def lfs_upload(self, oid):
            with hub.lock:
                hold = hub.stall_lfs_after is not None and hub.admitted >= hub.stall_lfs_after
                hub.stalled += hold
                hub.admitted += not hold  # counted on arrival: parallel uploads cannot slip past the limit
            if hold:  # the test kills the uploader meanwhile: this transfer dies with it, nothing is stored
                hub._release.wait(timeout=hub.lifetime_s)
                self.close_connection = True
                return
            data = self._body()
            if hashlib.sha256(data).hexdigest() != oid:
                raise HubError(400, "sha256 of the uploaded bytes does not match the oid")
            with hub.lock:
                hub.lfs_store[oid] = data
                hub.lfs_uploads.append(oid)
            self._json({})

        def commit(self, repo, revision):
            self._require_write()
            found = self._repo(repo)
            lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
            with hub.lock:
                if revision not in found.branches:
                    raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
                parent = lines[0]["value"].get("parentCommit") if lines and lines[0]["key"] == "header" else None
                if parent and parent != found.branches[revision]:
                    raise HubError(412, "A commit has happened since. Please refresh and try again.")
                files = dict(found.commits[found.branches[revision]])
                for line in lines[1:]:
                    key, value = line["key"], line["value"]
                    if key == "file":
                        files[value["path"]] = StoredFile(base64.b64decode(value["content"]), False)
                    elif key == "lfsFile":
                        if value["oid"] not in hub.lfs_store:
                            raise HubError(422, f"LFS object {value['oid']} was never uploaded")
                        files[value["path"]] = StoredFile(hub.lfs_store[value["oid"]], True)
                    elif key == "deletedFile":
                        files.pop(value["path"], None)
                    elif key == "deletedFolder":
                        files = {p: f for p, f in files.items() if not p.startswith(value["path"].rstrip("/") + "/")}
                sha = hub._new_commit(found, revision, files)
            self._json({"commitUrl": f"{hub.url}/{repo}/commit/{sha}", "commitOid": sha, "success": True,
                        "pullRequestUrl": None})

        def resolve(self, repo, revision, path):
            found = self._repo(repo)
            sha = self._commit(found, revision)
            stored = found.commits[sha].get(path)
            if stored is None:
                raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
            if self.command == "GET" and hub.fail_downloads > 0:
                hub.fail_downloads -= 1
                raise HubError(503, "loopback: injected transient failure")
            headers = {"X-Repo-Commit": sha, "ETag": f'"{stored.etag}"', "Accept-Ranges": "bytes"}
            if stored.lfs:
                headers.update({"X-Linked-Etag": f'"{stored.sha256}"', "X-Linked-Size": str(len(stored.content))})
            content, status = stored.content, 200
            start = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            if start:
                content, status = content[int(start.group(1)):], 206
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(content)

    ROUTES = {
        "HEAD": [(r"/", "root"), (rf"/{_REPO}/resolve/(?P<revision>[^/]+)/(?P<path>.+)", "resolve")],
        "GET": [
            (r"/", "root"),
            (r"/api/whoami-v2", "whoami"),
            (rf"/api/models/{_REPO}", "repo_info"),
            (rf"/api/models/{_REPO}/revision/(?P<revision>[^/]+)", "repo_info"),
            (rf"/api/models/{_REPO}/tree/(?P<revision>[^/]+)(?:/(?P<path>.+))?", "tree"),
            (rf"/{_REPO}/resolve/(?P<revision>[^/]+)/(?P<path>.+)", "resolve"),
        ],
        "POST": [
            (r"/api/repos/create", "create_repo"),
            (r"/api/validate-yaml", "validate_yaml"),
            (rf"/api/models/{_REPO}/branch/(?P<branch>[^/]+)", "create_branch"),
            (rf"/api/models/{_REPO}/preupload/(?P<revision>[^/]+)", "preupload"),
            (rf"/api/models/{_REPO}/commit/(?P<revision>[^/]+)", "commit"),
            (rf"/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch", "lfs_batch"),
        ],
        "PUT": [(r"/lfs-upload/(?P<oid>[0-9a-f]{64})", "lfs_upload")],
    }
    return Handler


def serve_forever_in_foreground(lifetime_s: float = 600.0) -> None:
    """`python tests/hub_server.py`: a loopback Hub to poke at by hand (HF_ENDPOINT=<printed url>)."""
    with LoopbackHub(lifetime_s=lifetime_s) as hub:
        print(hub.url, flush=True)
        time.sleep(lifetime_s)


if __name__ == "__main__":
    serve_forever_in_foreground()
