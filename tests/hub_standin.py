"""A stand-in Hugging Face Hub on loopback, for the REAL `huggingface_hub` client.

The endpoints are the ones huggingface_hub 2.x calls (read from its source):
- `GET /api/models/{org}/{name}[/revision/{rev}]`: the model info (`sha`, `siblings` with sizes);
- `GET /api/models/{org}/{name}/tree/{rev}[/{path}]?recursive=`: the file listing;
- `HEAD|GET /{org}/{name}/resolve/{rev}/{path}`: a file. Small ("git") files answer here with
  `ETag`, `X-Repo-Commit`, `Content-Length`; large ("LFS") files answer `302` to a second
  listener on another port (the "CDN", another origin, so the client neither follows the
  HEAD's redirect nor sends the token there), with `X-Linked-Etag`/`X-Linked-Size` on the
  redirect, as the real Hub does. The CDN serves `Range` requests (206).
Errors carry the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo), which the client maps to its exception types. No `X-Xet-*` header is ever sent,
so downloads go over plain HTTP even with hf-xet installed.

A repo is a list of commits (`add_commit`), each a full file set, with refs (branches and
tags) pointing at them; a gated repo's files need `Authorization: Bearer <token>` (401
without a token, 403 with a wrong one), its info and listing stay public (as on the Hub).
`hold(name, after_bytes)` pauses a file's body on the CDN after that many bytes until the
test releases it: a download observed mid-way without sleeping. Every file request is
logged (`fetched`), so tests can say which files were (not) downloaded.

Use the `hub_standin` fixture (a session-wide server with the repos of `tests.hub_repos`),
or start a `HubStandin` of your own and `add_commit`/`add_folder` what you need.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".onnx", ".msgpack", ".h5", ".pt", ".npz")
"""Files the Hub keeps in LFS (served through the CDN redirect), by name."""
SEND_CHUNK = 1 << 20


@dataclass(frozen=True)
class Blob:
    """A file's content: bytes, or a file on disk (served without reading it whole)."""

    source: Path | bytes
    size: int
    sha256: str
    git_oid: str

    @staticmethod
    def of(source: Path | bytes) -> Blob:
        return _blob_of(source)

    def read(self, start: int, end: int) -> Iterator[bytes]:
        """The bytes [start, end), in chunks."""
        if isinstance(self.source, bytes):
            yield self.source[start:end]
            return
        with self.source.open("rb") as handle:
            handle.seek(start)
            while start < end:
                chunk = handle.read(min(SEND_CHUNK, end - start))
                if not chunk:
                    return
                start += len(chunk)
                yield chunk


_BLOBS: dict[tuple[str, int, float], Blob] = {}
_BLOBS_LOCK = threading.Lock()


def _blob_of(source: Path | bytes) -> Blob:
    if isinstance(source, bytes):
        return Blob(source, len(source), hashlib.sha256(source).hexdigest(), _git_oid(source))
    stat = source.stat()
    key = (str(source.resolve()), stat.st_size, stat.st_mtime)
    with _BLOBS_LOCK:
        if key not in _BLOBS:  # hashing 100 MB takes a moment: once per file per session
            digest = hashlib.sha256()
            with source.open("rb") as handle:
                while chunk := handle.read(SEND_CHUNK):
                    digest.update(chunk)
            oid = hashlib.sha1(f"blob {stat.st_size}\0".encode() + digest.hexdigest().encode()).hexdigest()
            _BLOBS[key] = Blob(source, stat.st_size, digest.hexdigest(), oid)
        return _BLOBS[key]


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


@dataclass
class Repo:
    repo_id: str
    gated: bool = False
    commits: dict[str, dict[str, Blob]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def commit_of(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


@dataclass
class Fetch:
    """One request for a file's content (a GET, not a HEAD)."""

    repo_id: str
    path: str
    revision: str
    authorized: bool


class Gate:
    """Holds a file's body on the CDN after `after_bytes` until `release()`."""

    def __init__(self, name: str, after_bytes: int) -> None:
        self.name = name
        self.after_bytes = after_bytes
        self.reached = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()


class HubStandin:
    """The server: `endpoint` goes into HF_ENDPOINT (or `endpoint=`), `token` opens gated repos."""

    def __init__(self, token: str = "hf_standin_secret_token") -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.fetched: list[Fetch] = []
        self.gates: dict[str, Gate] = {}
        self._signed: dict[str, tuple[Repo, str, str, Blob]] = {}
        self._lock = threading.Lock()
        self._api = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=False))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=True))
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self._api, self._cdn)]
        for server in (self._api, self._cdn):
            server.daemon_threads = True

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._api.server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def start(self) -> HubStandin:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        for gate in list(self.gates.values()):
            gate.release()
        for server in (self._api, self._cdn):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> HubStandin:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- content ----------------------------------------------------------------------------

    def add_commit(
        self, repo_id: str, files: Mapping[str, Path | bytes], *, refs: tuple[str, ...] = ("main",), gated: bool = False
    ) -> str:
        """A new commit holding exactly `files` (repo path -> content); `refs` point at it. Returns its sha."""
        repo = self.repos.setdefault(repo_id, Repo(repo_id, gated=gated))
        blobs = {path: Blob.of(source) for path, source in sorted(files.items())}
        seed = json.dumps([repo_id, len(repo.commits), {p: b.sha256 for p, b in blobs.items()}])
        sha = hashlib.sha1(seed.encode()).hexdigest()
        repo.commits[sha] = blobs
        repo.refs.update(dict.fromkeys(refs, sha))
        return sha

    def add_folder(self, repo_id: str, folder: Path, *, refs: tuple[str, ...] = ("main",), gated: bool = False) -> str:
        """A commit with every file under `folder` (a model folder another test built)."""
        files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.add_commit(repo_id, files, refs=refs, gated=gated)

    def hold(self, name: str, after_bytes: int) -> Gate:
        """Pause the CDN body of the repo file `name` (a path, or its last part) after `after_bytes`."""
        gate = Gate(name, after_bytes)
        self.gates[name] = gate
        return gate

    def fetched_paths(self, repo_id: str) -> set[str]:
        with self._lock:
            return {f.path for f in self.fetched if f.repo_id == repo_id}

    def sha(self, repo_id: str, ref: str = "main") -> str:
        return self.repos[repo_id].refs[ref]

    # -- serving (called by the handler threads) --------------------------------------------

    def log(self, fetch: Fetch) -> None:
        with self._lock:
            self.fetched.append(fetch)

    def sign(self, repo: Repo, commit: str, path: str, blob: Blob) -> str:
        key = hashlib.sha1(f"{repo.repo_id}/{commit}/{path}".encode()).hexdigest()
        with self._lock:
            self._signed[key] = (repo, commit, path, blob)
        return f"{self.cdn}/blob/{blob.sha256}?sig={key}&name={quote(path)}"

    def signed(self, key: str) -> tuple[Repo, str, str, Blob] | None:
        with self._lock:
            return self._signed.get(key)

    def gate_for(self, path: str) -> Gate | None:
        return self.gates.get(path) or self.gates.get(path.rsplit("/", 1)[-1])


class _Reply(Exception):
    """An error answer, with the Hub's X-Error-Code."""

    def __init__(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.commit = status, code, commit


def _handler(hub: HubStandin, *, cdn: bool) -> type[BaseHTTPRequestHandler]:
    """A handler class bound to this hub (http.server builds one handler per request)."""
    return type("Handler", (_HubHandler,), {"hub": hub, "is_cdn": cdn})


class _HubHandler(BaseHTTPRequestHandler):
    hub: HubStandin
    is_cdn: bool
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet: pytest shows failures
        pass

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def do_GET(self) -> None:
        self._dispatch(body=True)

    def _dispatch(self, *, body: bool) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        try:
            if self.is_cdn:
                self._cdn(parse_qs(url.query), body=body)
            elif parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._api(parts[2:], parse_qs(url.query))
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body=body)
            else:
                raise _Reply(404, "NotFound", f"no route {url.path}")
        except _Reply as reply:
            self._error(reply)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a cancelled download)

    # -- the API ----------------------------------------------------------------------------

    def _api(self, parts: list[str], query: dict[str, list[str]]) -> None:
        repo = self._repo("/".join(parts[:2]))
        rest = parts[2:]
        if not rest or rest[0] == "revision":
            commit = self._commit(repo, rest[1] if len(rest) > 1 else "main")
            self._json(_model_info(repo, commit))
        elif rest[0] == "tree" and len(rest) >= 2:
            commit = self._commit(repo, rest[1])
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            self._json(_tree(repo.commits[commit], "/".join(rest[2:]), recursive=recursive))
        else:
            raise _Reply(404, "NotFound", f"no API route {'/'.join(rest)}")

    def _resolve(self, repo_id: str, revision: str, path: str, *, body: bool) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, revision)
        blob = repo.commits[commit].get(path)
        if blob is None:
            raise _Reply(404, "EntryNotFound", f"{path} does not exist at {revision}", commit=commit)
        authorized = self._check_gate(repo)
        if is_lfs(path):
            location = self.hub.sign(repo, commit, path, blob)
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("X-Linked-Etag", f'"{blob.sha256}"')
            self.send_header("X-Linked-Size", str(blob.size))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if body:
            self.hub.log(Fetch(repo.repo_id, path, revision, authorized))
        self._send_blob(blob, etag=blob.git_oid, commit=commit, body=body, gate=None)

    def _cdn(self, query: dict[str, list[str]], *, body: bool) -> None:
        signed = self.hub.signed(query.get("sig", [""])[0])
        if signed is None:
            raise _Reply(403, "AccessDenied", "bad signature")
        repo, commit, path, blob = signed
        if body:
            self.hub.log(Fetch(repo.repo_id, path, commit, "Authorization" in self.headers))
        self._send_blob(blob, etag=blob.sha256, commit=commit, body=body, gate=self.hub.gate_for(path))

    # -- pieces -----------------------------------------------------------------------------

    def _repo(self, repo_id: str) -> Repo:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            raise _Reply(401, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
        return repo

    def _commit(self, repo: Repo, revision: str) -> str:
        commit = repo.commit_of(revision)
        if commit is None:
            raise _Reply(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _check_gate(self, repo: Repo) -> bool:
        given = self.headers.get("Authorization", "")
        if not repo.gated:
            return bool(given)
        if not given:
            raise _Reply(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must be authenticated.")
        if given != f"Bearer {self.hub.token}":
            raise _Reply(
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the authorized list.",
            )
        return True

    def _send_blob(self, blob: Blob, *, etag: str, commit: str, body: bool, gate: Gate | None) -> None:
        start, end = _range(self.headers.get("Range"), blob.size)
        self.send_response(206 if (start, end) != (0, blob.size) else 200)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if (start, end) != (0, blob.size):
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{blob.size}")
        self.end_headers()
        if body:
            self._stream(blob, start, end, gate)

    def _stream(self, blob: Blob, start: int, end: int, gate: Gate | None) -> None:
        sent = start
        for chunk in blob.read(start, end):
            if gate is not None and sent + len(chunk) > gate.after_bytes and not gate.released.is_set():
                head = max(gate.after_bytes - sent, 0)
                self.wfile.write(chunk[:head])
                self.wfile.flush()
                sent, chunk = sent + head, chunk[head:]
                gate.reached.set()
                gate.released.wait()
            self.wfile.write(chunk)
            sent += len(chunk)

    def _json(self, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, reply: _Reply) -> None:
        data = json.dumps({"error": str(reply)}).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Code", reply.code)
        self.send_header("X-Error-Message", str(reply))
        if reply.commit:
            self.send_header("X-Repo-Commit", reply.commit)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _range(header: str | None, size: int) -> tuple[int, int]:
    if not header or not header.startswith("bytes="):
        return 0, size
    first, _, last = header[len("bytes=") :].partition("-")
    if not first:  # a suffix: the last N bytes
        return max(size - int(last), 0), size
    return min(int(first), size), min(int(last) + 1 if last else size, size)


def _model_info(repo: Repo, commit: str) -> dict[str, object]:
    files = repo.commits[commit]
    return {
        "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "sha": commit,
        "private": False,
        "gated": "manual" if repo.gated else False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "lastModified": "2026-11-01T00:00:00.000Z",
        "createdAt": "2026-11-01T00:00:00.000Z",
        "usedStorage": sum(b.size for b in files.values()),
        "siblings": [_sibling(path, blob) for path, blob in files.items()],
    }


def _sibling(path: str, blob: Blob) -> dict[str, object]:
    sibling: dict[str, object] = {"rfilename": path, "size": blob.size, "blobId": blob.git_oid}
    if is_lfs(path):
        sibling["lfs"] = {"sha256": blob.sha256, "size": blob.size, "pointerSize": 134}
    return sibling


def _tree(files: Mapping[str, Blob], under: str, *, recursive: bool) -> list[dict[str, object]]:
    prefix = f"{under.strip('/')}/" if under.strip("/") else ""
    entries: dict[str, dict[str, object]] = {}
    for path, blob in files.items():
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix) :].split("/")
        for depth in range(1, len(rest)):  # the folders on the way
            folder = prefix + "/".join(rest[:depth])
            if recursive or depth == 1:
                entries.setdefault(
                    folder, {"type": "directory", "oid": _git_oid(folder.encode()), "size": 0, "path": folder}
                )
        if recursive or len(rest) == 1:
            entries[path] = _file_entry(path, blob)
    return list(entries.values())


def _file_entry(path: str, blob: Blob) -> dict[str, object]:
    entry: dict[str, object] = {"type": "file", "oid": blob.git_oid, "size": blob.size, "path": path}
    if is_lfs(path):
        entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": 134}
    return entry


def publish_standard_repos(hub: HubStandin, work: Path) -> None:
    """The repos of `tests.hub_repos`, built under `work` (once per session)."""
    from tests import hub_repos as r

    gguf = r.smollm2_gguf()
    readme = b"# SmolLM2-135M-Instruct GGUF (stand-in)\n"
    hub.add_commit(r.GGUF_REPO, {r.gguf_name("Q8_0"): gguf, "README.md": readme}, refs=("v1.0",))
    hub.add_commit(r.GGUF_REPO, {**{r.gguf_name(q): gguf for q in r.GGUF_QUANTS}, "README.md": readme})
    parts = r.split_gguf(work / "split")
    hub.add_commit(r.SPLIT_REPO, {**{p.name: p for p in parts}, r.gguf_name("Q8_0"): gguf, "README.md": readme})
    folder = r.tiny_hf_folder(work / "tiny-llama-hf")
    hub.add_folder(r.HF_REPO, folder)
    hub.add_folder(r.GATED_REPO, folder, gated=True)


@pytest.fixture(scope="session")
def hub_standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    """A stand-in hub with the standard repos, for the whole session. Point clients at
    `hub_standin.endpoint` (HF_ENDPOINT); `hub_env` does that for one test."""
    with HubStandin() as hub:
        publish_standard_repos(hub, tmp_path_factory.mktemp("hub-repos"))
        yield hub


@pytest.fixture
def hub_env(hub_standin: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's process talks to the stand-in: HF_ENDPOINT set, an empty Hugging Face cache
    (returned), no token and not offline (unless the test sets them)."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_ENDPOINT", hub_standin.endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # belt and braces: the stand-in sends no Xet headers either
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))  # never a token stored on this machine
    return cache
