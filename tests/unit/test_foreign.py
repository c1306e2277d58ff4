"""The one table from foreign exceptions to agent errors: the first matching row wins, by where it happened."""

from __future__ import annotations

import errno

import httpx2
import pytest
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import hf_raise_for_status

from entrypoint import errors
from entrypoint.foreign import Area, Where, agent_error


def hub_answer(status: int, **headers: str) -> HfHubHTTPError:
    """The exception huggingface_hub itself raises for this answer (its class chosen by X-Error-Code)."""
    response = httpx2.Response(status, headers=headers, request=httpx2.Request("GET", "http://hub.test/api/x"))
    with pytest.raises(HfHubHTTPError) as raised:
        hf_raise_for_status(response)
    return raised.value


INVALID = {"X-Error-Message": "Invalid credentials in Authorization header"}
DATASET = Where(Area.DATASET_READ, repo_id="org/data", revision="main", path="data.tar", token=True)


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        pytest.param(401, INVALID, errors.DatasetAccessError, id="invalid-token"),
        pytest.param(403, {"X-Error-Code": "GatedRepo"}, errors.DatasetAccessError, id="gated"),
        pytest.param(404, {"X-Error-Code": "RepoNotFound"}, errors.DatasetNotFoundError, id="no-repo"),
        pytest.param(404, {"X-Error-Code": "RevisionNotFound"}, errors.RevisionNotFoundError, id="no-revision"),
        pytest.param(404, {"X-Error-Code": "EntryNotFound"}, errors.NoArchiveError, id="no-file"),
        pytest.param(403, {}, errors.DatasetAccessError, id="refused"),
    ],
)
def test_a_dataset_read_is_named_by_the_hubs_answer(
    status: int, headers: dict[str, str], expected: type[errors.AgentError]
) -> None:
    assert type(agent_error(hub_answer(status, **headers), DATASET)) is expected


def test_the_servers_message_is_read_through_huggingface_hub() -> None:
    invalid = agent_error(hub_answer(401, **INVALID), DATASET)
    assert invalid is not None and "invalid or expired" in invalid.message
    other = agent_error(hub_answer(401, **{"X-Error-Message": "something else"}), DATASET)
    assert other is not None and "HTTP 401" in other.message


def test_a_missing_repo_without_a_token_says_to_set_one() -> None:
    mapped = agent_error(hub_answer(404, **{"X-Error-Code": "RepoNotFound"}), Where(Area.DATASET_READ, repo_id="o/d"))
    assert isinstance(mapped, errors.DatasetAccessError) and "HF_TOKEN is not set" in mapped.message


def test_a_server_failure_reading_a_dataset_is_left_to_the_caller() -> None:
    assert agent_error(hub_answer(500), DATASET) is None  # the retry policy's, then the download's own message


def test_an_upload_refusal_is_access_anything_else_a_sync_error() -> None:
    where = Where(Area.UPLOAD, repo_id="me/run")
    assert isinstance(agent_error(hub_answer(403), where), errors.AccessError)
    failed = agent_error(hub_answer(500), where)
    assert isinstance(failed, errors.SyncError) and failed.message == "upload to me/run failed: HTTP 500"
    offline = agent_error(ConnectionResetError(), where)
    assert isinstance(offline, errors.SyncError) and offline.hint == "check the network"


def test_any_other_hub_failure_is_a_sync_error_and_the_rest_is_not_ours() -> None:
    where = Where(Area.HUB)
    assert isinstance(agent_error(hub_answer(502), where), errors.SyncError)
    assert isinstance(agent_error(httpx2.ConnectTimeout("slow"), where), errors.SyncError)
    assert agent_error(ValueError("a bug"), where) is None


def test_a_full_disk_comes_before_any_other_write_failure() -> None:
    where = Where(Area.DATASET_WRITE, doing="extracting 'a.jpg'", path="a.jpg")
    full = agent_error(OSError(errno.ENOSPC, "No space left on device"), where)
    assert isinstance(full, errors.DiskSpaceError) and full.message.startswith("the disk filled up while extracting")
    assert isinstance(agent_error(OSError(errno.EDQUOT, "Disk quota exceeded"), where), errors.DiskSpaceError)
    denied = agent_error(PermissionError(errno.EACCES, "Permission denied"), where)
    assert type(denied) is errors.DatasetError and "'a.jpg'" in denied.message


def test_on_the_disk_alone_only_a_full_disk_is_named() -> None:
    where = Where(Area.DISK, doing="preparing the dataset", disk_hint="free space")
    assert isinstance(agent_error(OSError(errno.ENOSPC, "full"), where), errors.DiskSpaceError)
    assert agent_error(PermissionError(errno.EACCES, "denied"), where) is None
    assert agent_error(hub_answer(507), where) is None  # an HfHubHTTPError is an OSError without an errno


def test_an_agent_error_passes_through_everywhere() -> None:
    mine = errors.PreemptedError("SIGTERM")
    assert all(agent_error(mine, Where(area)) is mine for area in Area)


def test_proving_the_token_names_only_a_rejected_token() -> None:
    rejected = agent_error(hub_answer(401), Where(Area.TOKEN))
    assert isinstance(rejected, errors.AccessError) and rejected.message == "HF_TOKEN is invalid or expired"
    assert agent_error(hub_answer(403), Where(Area.TOKEN)) is None  # left to the caller, as before


def test_creating_the_output_repo_names_a_refusal_and_leaves_the_rest() -> None:
    where = Where(Area.REPO_CREATE, repo_id="me/run")
    for status in (401, 403):
        refused = agent_error(hub_answer(status), where)
        assert isinstance(refused, errors.AccessError) and "me/run" in refused.message
    assert agent_error(hub_answer(500), where) is None
