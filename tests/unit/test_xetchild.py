"""entrypoint/xet/child.py without a Hub: the private huggingface_hub names it relies on exist in the
installed release, and the child's errors come back as the parent's exceptions."""

from __future__ import annotations

import dataclasses

import httpx2
import pytest
from huggingface_hub import CommitOperationAdd
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from entrypoint.retry import is_retryable, retry_after_of, status_of
from entrypoint.xet import child as xetchild


def test_the_private_names_it_uses_exist() -> None:
    from huggingface_hub.lfs import UploadInfo
    from huggingface_hub.utils._runtime import is_xet_available

    assert callable(is_xet_available)
    names = {field.name for field in dataclasses.fields(CommitOperationAdd)}
    assert {"_upload_mode", "_should_ignore", "_remote_oid", "_is_uploaded"} <= names
    assert isinstance(UploadInfo.is_hashed, property)


def _http(status: int, headers: dict[str, str], body: str = "") -> dict[str, object]:
    request = httpx2.Request("POST", "https://hub.example/api/models/a/b/preupload/main")
    response = httpx2.Response(status, headers=headers, content=body.encode(), request=request)
    try:
        from huggingface_hub.utils import hf_raise_for_status

        hf_raise_for_status(response)
    except HfHubHTTPError as error:
        return xetchild.encoded(error)
    raise AssertionError("no error raised")


def test_an_http_error_comes_back_with_its_class_status_and_retry_after() -> None:
    rebuilt = xetchild._rebuilt(_http(429, {"Retry-After": "7"}))
    assert isinstance(rebuilt, HfHubHTTPError) and status_of(rebuilt) == 429
    assert retry_after_of(rebuilt) == 7.0
    missing = xetchild._rebuilt(_http(404, {"X-Error-Code": "RepoNotFound"}))
    assert isinstance(missing, RepositoryNotFoundError)


@pytest.mark.parametrize(
    ("error", "expected", "retryable"),
    [
        (httpx2.ConnectError("refused"), httpx2.ConnectError, True),
        (TimeoutError("slow"), TimeoutError, True),
        (ValueError("LFS batch API returned errors"), ValueError, False),
        (RuntimeError("hf_xet: upload failed"), RuntimeError, False),
    ],
)
def test_other_errors_come_back_as_the_same_class(error: Exception, expected: type[Exception], retryable: bool) -> None:
    rebuilt = xetchild._rebuilt(xetchild.encoded(error))
    assert type(rebuilt) is expected and str(rebuilt) == str(error)
    assert is_retryable(rebuilt) is retryable


def test_a_child_that_dies_is_retried_like_a_lost_connection() -> None:
    died = xetchild._died(-9, b"")
    assert isinstance(died, xetchild.XetChildDied) and "SIGKILL" in str(died)
    assert is_retryable(died)
    assert xetchild._answer(b"some noise\n") is None
    assert xetchild._answer(b'{"files": []}\n') == {"files": []}
