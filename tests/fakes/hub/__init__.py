"""A local Hugging Face Hub for tests: the subset of the Hub HTTP API that ``huggingface_hub`` uses.

Python standard library only, so it runs in-process (``from tests.fakes.hub import HubServer``) or as a
separate process (container tests, benchmarks)::

    python -m tests.fakes.hub --host 127.0.0.1 --port 0 --data DIR \\
        [--token TOKEN:USER:ROLE[:ORG,ORG...] ...] [--ready-file PATH] [--no-xet] [--local-cas] \\
        [--cas-bandwidth BYTES_PER_S]    # from the repository root

It prints its URL on stdout once listening and, with ``--ready-file``, writes it there (atomically).
SIGTERM/SIGINT stop it.

Clients set ``HF_ENDPOINT=<url>`` before ``huggingface_hub`` is imported. Both transfer paths of the Hub:

* Xet (default; ``xet=False`` / ``--no-xet`` / ``set_xet(False)`` for a Hub or mirror without it). The CAS
  is served over HTTP at ``<url>/cas`` (``cas.py``: xorb and shard upload, reconstruction with ``Range``,
  ranged data URLs), so clients run hf_xet's network client; its files live in ``<root>/cas`` in hf_xet's
  ``local://`` layout. ``cas_over_http = False`` hands out ``local://<root>/cas`` instead (clients then
  open that folder's redb index themselves: two client processes at once fail "Database already open").
  ``GET /api/{t}/{repo}/xet-write-token/{rev}`` and ``xet-read-token/{rev}`` answer ``X-Xet-Cas-Url``,
  ``X-Xet-Access-Token``, ``X-Xet-Token-Expiration`` (and the same as JSON, which hf_xet's refresh reads);
  tokens live ``xet_token_ttl`` seconds. A commit's ``lfsFile`` names only the sha256: the server maps it
  to the Xet file hash by reading the shards the client wrote (``shard_files``). ``resolve`` of a Xet file
  sends ``X-Xet-Hash`` and ``Link: <xet-read-token>; rel="xet-auth"``; a plain GET still serves the bytes
  (rebuilt from the CAS on first use), as the Hub's resolve redirect does. The Python API stores LFS files
  in the CAS too, so seeded files are Xet-backed.
* LFS: clients with ``HF_HUB_DISABLE_XET=1`` take preupload -> LFS batch -> PUT -> NDJSON commit, and
  plain HTTP downloads.

Layout: ``model`` (what is stored: repos, commits, files, tokens, request records), ``storage`` (blobs on
disk, repos and commits, the Python API), ``git_api`` (auth, routing, repo/tree/commit/branch/resolve
routes), ``lfs`` (LFS batch/PUT/verify), ``xet`` (shards, the CAS, CAS token routes), ``cas`` (the CAS
routes over HTTP), ``faults`` (fault
injection, request log), ``http`` (request handler and socket server), ``admin`` (``/_admin/`` routes,
``RemoteHub``), ``buckets`` (Storage Buckets), ``history`` (super-squash), ``server`` (``HubServer``, which
joins them, and ``main``).

Model
-----
Repos (models, datasets, spaces; public or private) live in memory and die with the process; file
contents live on disk under ``<root>/blobs/<sha256>`` and are streamed both ways (a 1 GiB round trip
peaks at ~30 MiB RSS). Every commit keeps a full snapshot of the tree, so branches, tags and the 40-hex
sha of any past commit resolve. Commits go to existing branches only (``create_branch`` first), as on
the Hub. ``create_repo`` makes an initial ``.gitattributes`` commit, like the Hub. Preupload answers
``lfs`` for files >= 10 MiB, with a NUL byte in the first 512 bytes, or with a binary suffix
(``LFS_PATTERNS``), else ``regular``; it returns the remote oid so unchanged files are skipped.
ETags: git blob sha1 for regular files, sha256 for LFS files (quoted), as on the Hub.

Auth, as on the Hub: tokens map to (user, role ``read``|``write``, orgs), or are fine-grained (``scoped``:
whoami-v2 answers ``role: "fineGrained"`` and lists the grants, ``{"entity": {"type", "name"}, "permissions"}``;
a write needs ``repo.write`` on the namespace, or on the repo itself when it exists; a bucket, on the namespace).
A bad token is a 401 "Invalid credentials in Authorization header" everywhere. A private or missing repo is a 401 +
``X-Error-Code: RepoNotFound`` without a token and a 404 RepoNotFound with a token lacking access (the
client raises ``RepositoryNotFoundError`` for both). A read token cannot write (403), nobody writes
outside their user/org namespaces (403), anonymous writes are refused (401). The LFS upload href carries
its own unguessable key instead of an Authorization header (the client sends none there).

Python API (all ``repo_type`` arguments default to ``"model"``; ``revision`` to ``"main"``; errors raise
``HubError`` with ``status``/``code``/``message``)
---------------------------------------------------------------------------------------------
``HubServer(root=None, *, host="127.0.0.1", port=0)``  binds at once (``url`` is known); ``root=None``
    uses a temp dir that ``stop()`` removes.
``start() -> HubServer``, ``stop()``, ``with HubServer() as hub:``; ``url``, ``host``, ``port``, ``root``.
``add_token(token, user, role="write", *, orgs=(), name=None, scoped=None)``, ``remove_token(token)``.
``create_repo(repo_id, *, repo_type, private=False, exist_ok=False, author="hubserver") -> str`` (url);
    ``delete_repo(repo_id, *, repo_type)``; ``repo_exists(repo_id, *, repo_type) -> bool``.
``commit(repo_id, files: Mapping[str, bytes | os.PathLike | None], *, repo_type, revision, message,
    author, lfs=None) -> str``: one commit; bytes = content, a path = local file (streamed), None =
    delete (``"dir/"`` deletes a folder); ``lfs`` forces the storage mode. Returns the commit sha.
``upload_bytes(repo_id, path_in_repo, data, **kw) -> str``, ``upload_file(repo_id, path_in_repo,
    local_path, **kw) -> str``, ``delete_file(repo_id, path_in_repo, **kw) -> str``.
``create_branch(repo_id, branch, *, repo_type, revision="main")``, ``create_tag(repo_id, tag, ...)``.
``head(repo_id, *, repo_type, revision) -> str``; ``commits(repo_id, *, repo_type, revision) ->
    list[Commit]`` (newest first); ``files(...) -> dict[str, FileEntry]``; ``file_bytes(repo_id, path,
    *, repo_type, revision) -> bytes``; ``blob_path(...) -> Path`` (for big files).
``inject(kind, *, method=None, path=None, share=1.0, times=None, skip=0, seed=None, status=None,
    retry_after=0, after_bytes=None, rate=None) -> Fault``; ``clear_faults()``; ``faults``.
    ``kind``: ``"500"``/``"503"``/``"429"``/any status (``"status"`` + ``status=``), ``"reset"`` (drop
    the connection without a response), ``"reset-body"`` (headers + ``after_bytes`` (default: half) of
    the body, then drop), ``"slow"`` (body at ``rate`` bytes/s), ``"apply-then-reset"`` (handle the
    request, e.g. apply a commit, then drop the connection instead of answering). ``method``/``path``
    are regexes (``re.search`` on the URL path, no query); ``skip`` lets the first N matches pass,
    ``times`` limits the fault to the next N selected requests, ``share`` (0..1) selects a random share
    (``seed`` for reproducibility); ``"cas-unwritable"`` (on a Xet token route: hand out a CAS URL where
    nothing can be written). ``Fault`` is a context manager that removes itself on exit and has
    ``fired``. Admin requests are never faulted.
``set_commit_rate_limit(limit: int | None, window_s=3600.0)``: more HTTP commits than ``limit`` per
    window and repo get 429 + Retry-After (the Hub allows 128/hour/repo). Off by default. (On a retried
    429 the client sleeps Retry-After + 1 s; use ``retry_after=0`` in faults.)
``requests -> list[RequestRecord]`` (method, path, query, status, bytes_in, bytes_out, user, fault,
    range), ``find_requests(method=None, path=None)``, ``bytes_served(path=None) -> int`` (response body
    bytes, path regex), ``reset_log()``. Status 0 = no response was sent. Records are logged when the
    request arrives and updated in place, so the log is complete once the client has its answer.

Useful path regexes for ``inject``/``find_requests``: ``/preupload/``, ``/info/lfs/objects/batch``,
``^/_lfs/`` (LFS PUT), ``/commit/``, ``/resolve/``, ``/tree/``, ``/paths-info/``, ``/commits/``; the CAS:
``^/cas/v1/xorbs/``, ``^/cas/v1/shards``, ``^/cas/v1/reconstructions/``, ``^/cas/xorbs/`` (data URLs).

Admin API (JSON; for tests in another process; ``RemoteHub(url)`` wraps it with the same names; no
auth, so keep the server on a loopback address)
---------------------------------------------------------------------------------------------
``GET /_admin/health`` | ``POST /_admin/tokens`` {token,user,role,orgs,name,scoped} |
``POST /_admin/repos`` {repo_id,repo_type,private,exist_ok} -> {url} | ``DELETE /_admin/repos?repo_id=&repo_type=`` |
``PUT /_admin/files?repo_id=&path=&repo_type=&revision=&message=&lfs=`` raw body (streamed) -> {commit} |
``GET /_admin/files?repo_id=&path=&repo_type=&revision=`` -> raw bytes |
``GET /_admin/commits?repo_id=&repo_type=&revision=`` -> {commits:[...]} |
``POST /_admin/faults`` {kind, ...inject kwargs} -> {id} | ``GET /_admin/faults`` | ``DELETE /_admin/faults`` |
``GET /_admin/log`` -> {requests:[...], bytes_served:{path:n}} | ``DELETE /_admin/log`` |
``POST /_admin/config`` {commit_rate_limit, commit_rate_window, xet, xet_token_ttl, cas_over_http, cas_bandwidth}
-> the config | ``GET /_admin/config`` -> {xet, xet_token_ttl, cas_over_http, cas_bandwidth, commit_rate_limit}.

``set_xet(enabled, *, token_ttl=None)``; ``cas``, ``cas_url``; ``set_cas_bandwidth(bytes_per_s | None)``: the
CAS data URLs and xorb uploads share one link of that speed (faults on a request shape it their own way);
``set_cas_over_http(False)``: hand out ``local://`` (both also on ``RemoteHub``, and ``--cas-bandwidth``,
``--local-cas`` on the command line).

Storage Buckets (Xet-only, no history; ``buckets``): the bucket routes huggingface_hub 2.4.0 calls, with the
same auth and faults; ``create_bucket``, ``bucket_files``, ``bucket_bytes``, ``set_buckets(False)`` (a Hub
without buckets), ``deny_buckets(token)`` (a token that may write repos, not buckets).

Not supported: multipart LFS, pull requests (``create_pr``), pagination (lists come in one page),
.gitignore handling in preupload, gated repos.
"""

from tests.fakes.hub.admin import RemoteHub
from tests.fakes.hub.faults import FAULT_KINDS, Fault
from tests.fakes.hub.model import Commit, FileEntry, HubError, RequestRecord, git_blob_sha1, lfs_pointer
from tests.fakes.hub.server import HubServer, main

__all__ = [
    "FAULT_KINDS",
    "Commit",
    "Fault",
    "FileEntry",
    "HubError",
    "HubServer",
    "RemoteHub",
    "RequestRecord",
    "git_blob_sha1",
    "lfs_pointer",
    "main",
]
