"""The runtimes fetched on first use (pyarrow, onnx, onnxruntime): the image's pip, run for real against a local
wheelhouse of a tiny wheel made here (``PIP_FIND_LINKS`` + ``PIP_NO_INDEX``: no network)."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from entrypoint import errors, libreyolo
from entrypoint.dataset import parquet_child
from entrypoint.export import run as exports
from entrypoint.runtimes import fetch as runtimes
from entrypoint.settings import from_env
from entrypoint.state import RunState

REPO = Path(__file__).resolve().parents[2]
PROBE = runtimes.Runtime("probe", ("trainbox_probe_rt",), ("trainbox-probe-rt==1.0",))
ABSENT = runtimes.Runtime("absent", ("trainbox_absent_rt",), ("trainbox-absent-rt==1.0",))


def make_wheel(folder: Path, name: str, version: str, value: str) -> Path:
    """A pure-Python wheel of one module ``name`` whose ``VALUE`` is ``value``."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = name.replace("_", "-")
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def pip_env(wheelhouse: Path) -> dict[str, str]:
    return {**os.environ, "PIP_FIND_LINKS": str(wheelhouse), "PIP_NO_INDEX": "1", "PIP_NO_CACHE_DIR": "1"}


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a new start of the agent: nothing fetched or failed in this process yet."""
    monkeypatch.setattr(runtimes, "_failed", {})
    monkeypatch.setattr(runtimes, "_active", [])
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("trainbox_probe_rt", "trainbox_absent_rt"):
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheelhouse"
    make_wheel(folder, "trainbox_probe_rt", "1.0", "fetched")
    return folder


def test_a_runtime_is_fetched_once_into_the_volume_and_children_import_it(
    tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "workspace"
    runtimes.ensure(PROBE, workdir, pip_env(wheelhouse))
    import trainbox_probe_rt  # type: ignore[import-not-found]

    assert trainbox_probe_rt.VALUE == "fetched"
    folder = runtimes.root(workdir) / PROBE.folder
    assert Path(trainbox_probe_rt.__file__).is_relative_to(folder)
    assert [path.name for path in runtimes.root(workdir).iterdir() if not path.name.endswith(".lock")] == [
        PROBE.folder
    ], "only the finished folder: no temporary one left"

    child = subprocess.run(
        [sys.executable, "-c", "import trainbox_probe_rt; print(trainbox_probe_rt.VALUE)"],
        env=runtimes.child_env({"PATH": os.environ["PATH"], "PYTHONPATH": "/elsewhere"}),
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == 0 and child.stdout.strip() == "fetched", child.stderr

    # The next start (a new process) finds it on the volume: the wheelhouse gone, nothing is fetched.
    monkeypatch.setattr(runtimes, "_active", [])
    monkeypatch.delitem(sys.modules, "trainbox_probe_rt")
    monkeypatch.setattr(sys, "path", [path for path in sys.path if path != str(folder)])
    for wheel in wheelhouse.iterdir():
        wheel.unlink()
    runtimes.ensure(PROBE, workdir, pip_env(wheelhouse))
    assert runtimes._active == [folder]


def test_what_imports_already_is_not_fetched(tmp_path: Path) -> None:
    present = runtimes.Runtime("present", ("json",), ("no-such-wheel==0",))
    runtimes.ensure(present, tmp_path, pip_env(tmp_path / "empty"))
    assert not (tmp_path / ".trainbox").exists()
    assert runtimes.child_env({"A": "1"}) == {"A": "1"}, "no PYTHONPATH for a runtime that was not fetched"


def test_a_failed_fetch_leaves_nothing_trusted_and_is_not_retried_in_the_same_start(
    tmp_path: Path, wheelhouse: Path
) -> None:
    workdir = tmp_path / "workspace"
    with pytest.raises(runtimes.FetchFailed) as caught:
        runtimes.ensure(ABSENT, workdir, pip_env(wheelhouse))
    assert "pip install failed: ERROR:" in str(caught.value) and "trainbox-absent-rt==1.0" in str(caught.value)
    assert "\n" not in str(caught.value)
    left = [path.name for path in runtimes.root(workdir).iterdir() if not path.name.endswith(".lock")]
    assert left == [], "no folder, whole or partial, is left to be trusted later"

    make_wheel(wheelhouse, "trainbox_absent_rt", "1.0", "late")
    with pytest.raises(runtimes.FetchFailed):  # the same start does not ask pip again
        runtimes.ensure(ABSENT, workdir, pip_env(wheelhouse))
    assert not (runtimes.root(workdir) / ABSENT.folder).exists()


def test_what_a_killed_fetch_left_is_never_used_and_is_cleaned_up(tmp_path: Path, wheelhouse: Path) -> None:
    workdir = tmp_path / "workspace"
    partial = runtimes.root(workdir) / f".partial-{PROBE.folder}-k1ll3d"
    (partial / "trainbox_probe_rt").mkdir(parents=True)
    (partial / "trainbox_probe_rt" / "__init__.py").write_text("VALUE = 'half'\n")

    with pytest.raises(runtimes.FetchFailed):  # no wheel to be had: the half folder is not taken instead
        runtimes.ensure(PROBE, workdir, pip_env(tmp_path / "empty"))
    assert not partial.exists(), "the killed fetch's leftovers are removed"

    runtimes._failed.clear()  # a later start, with the wheel on offer
    runtimes.ensure(PROBE, workdir, pip_env(wheelhouse))
    import trainbox_probe_rt

    assert trainbox_probe_rt.VALUE == "fetched"


def test_two_starts_on_one_volume_fetch_it_once(tmp_path: Path, wheelhouse: Path) -> None:
    workdir = tmp_path / "workspace"
    script = (
        "import os, sys; from pathlib import Path; from entrypoint.runtimes import fetch as runtimes;"
        "probe = runtimes.Runtime('probe', ('trainbox_probe_rt',), ('trainbox-probe-rt==1.0',));"
        "runtimes.ensure(probe, Path(sys.argv[1]), os.environ);"
        "import trainbox_probe_rt; print(trainbox_probe_rt.VALUE)"
    )
    env = {**pip_env(wheelhouse), "PYTHONPATH": str(REPO)}
    starts = [
        subprocess.Popen([sys.executable, "-c", script, str(workdir)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [start.communicate(timeout=120)[0] for start in starts]
    assert [start.returncode for start in starts] == [0, 0]
    assert [output.strip() for output in outputs] == ["fetched", "fetched"]
    assert sorted(path.name for path in runtimes.root(workdir).iterdir() if not path.name.endswith(".lock")) == [
        PROBE.folder
    ]


def test_an_index_with_credentials_never_reaches_the_message(tmp_path: Path) -> None:
    env = {**os.environ, "PIP_INDEX_URL": "http://trainbox:s3cr3t-pass@127.0.0.1:9/simple", "PIP_RETRIES": "0"}
    env |= {"PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1"}
    env.pop("PIP_FIND_LINKS", None)
    with pytest.raises(runtimes.FetchFailed) as caught:
        runtimes.ensure(ABSENT, tmp_path, env)
    assert "s3cr3t-pass" not in str(caught.value)
    assert runtimes.redact("see https://user:pw@host/simple and http://tok@h/x") == (
        "see https://***@host/simple and http://***@h/x"
    )


def settings_for(tmp_path: Path, **extra: str):  # type: ignore[no-untyped-def]
    env = {"WORKDIR": str(tmp_path / "workspace"), "PROVIDER": "none", "GPUS": "cpu", **extra}
    env |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "empty"), "PIP_NO_CACHE_DIR": "1"}
    return from_env(env, options={})


def test_an_explicit_export_that_cannot_have_its_runtime_is_exit_10_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unreachable = runtimes.Runtime("onnx", ("onnx", "trainbox_absent_rt"), ("trainbox-absent-rt==1.0",))
    monkeypatch.setitem(runtimes.RUNTIMES, "onnx", unreachable)
    with pytest.raises(errors.ConfigError) as caught:
        exports.fetch_runtimes(settings_for(tmp_path, EXPORT="onnx"))
    assert caught.value.exit_code == 10
    assert "EXPORT=onnx needs trainbox-absent-rt==1.0, and fetching them failed" in str(caught.value)
    hint = caught.value.hint or ""
    assert "PyPI" in hint and "--build-arg TRAINBOX_RUNTIMES=onnx" in hint and "EXPORT=off" in hint


def test_the_default_export_goes_without_its_runtime_with_one_warning_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = runtimes.Runtime("onnx", ("onnx", "trainbox_absent_rt"), ("trainbox-absent-rt==1.0",))
    monkeypatch.setitem(runtimes.RUNTIMES, "onnx", unreachable)
    settings = settings_for(tmp_path, OUTPUT_REPO="acme/model", HF_TOKEN="hf_" + "x" * 30)
    assert settings.export == ("onnx",)
    with caplog.at_level(logging.WARNING, logger="trainbox"):
        exports.fetch_runtimes(settings)  # no exception: the run goes on
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("export onnx: skipped: fetching onnx failed"), warnings

    # At the end: skipped and recorded, without saying it again.
    settings.run_dir.mkdir(parents=True)
    state = RunState(settings.run_dir, settings.run_name)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainbox"):
        records = exports.export_all(settings, state, device="cpu", stopping=lambda: False, data_yaml=None)
    assert records["onnx"]["status"] == "skipped"
    assert "fetching trainbox-absent-rt==1.0 failed: pip install failed: ERROR:" in records["onnx"]["why"]
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


def test_without_the_fetch_at_the_start_the_export_fetches_it_and_says_why_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = runtimes.Runtime("onnx", ("onnx", "trainbox_absent_rt"), ("trainbox-absent-rt==1.0",))
    monkeypatch.setitem(runtimes.RUNTIMES, "onnx", unreachable)
    settings = settings_for(tmp_path, OUTPUT_REPO="acme/model", HF_TOKEN="hf_" + "x" * 30)
    settings.run_dir.mkdir(parents=True)
    state = RunState(settings.run_dir, settings.run_name)
    with caplog.at_level(logging.WARNING, logger="trainbox"):
        records = exports.export_all(settings, state, device="cpu", stopping=lambda: False, data_yaml=None)
    assert records["onnx"]["status"] == "skipped" and "trainbox-absent-rt==1.0" in records["onnx"]["why"]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("export onnx: not published: fetching"), warnings


def test_a_parquet_dataset_without_pyarrow_to_be_had_is_exit_48(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtimes, "PARQUET", runtimes.Runtime("parquet", ("trainbox_absent_rt",), ABSENT.wheels))
    with pytest.raises(errors.ParquetRuntimeError) as caught:
        parquet_child.fetch_pyarrow(settings_for(tmp_path))
    assert caught.value.exit_code == 48 and isinstance(caught.value, errors.DatasetError)
    assert "a parquet dataset needs trainbox-absent-rt==1.0" in str(caught.value)
    assert "--build-arg TRAINBOX_RUNTIMES=parquet" in (caught.value.hint or "")


def test_the_pins_are_the_image_extras_and_the_build_argument_knows_each() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for runtime in runtimes.RUNTIMES.values():
        assert sorted(extras[runtime.name]) == sorted(runtime.wheels), runtime.name
        assert all("==" in pin for pin in runtime.wheels), "exact versions: what was tested is what is fetched"
    named = {re.split(r"[<>=!~\[;\s]", dependency, maxsplit=1)[0].lower() for dependency in project["dependencies"]}
    assert not named & {"pyarrow", "onnx", "onnxruntime", "matplotlib", "trackio"}, "kept out of the image"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'n not in ("parquet", "onnx", "trackio")' in dockerfile, "the Dockerfile's TRAINBOX_RUNTIMES names each"
    assert set(runtimes.RUNTIMES) == {"parquet", "onnx", "trackio"}
    assert set(runtimes.ONNX.modules) == libreyolo.FETCHED_ON_FIRST_USE, "EXPORT's check knows what is fetched"


def test_the_dry_run_names_what_a_start_would_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runtimes.not_importable(("onnx", "onnxruntime")) == [], "this venv has them: nothing to fetch"
    unreachable = runtimes.Runtime("onnx", ("onnx", "trainbox_absent_rt"), ("trainbox-absent-rt==1.0",))
    monkeypatch.setitem(runtimes.RUNTIMES, "onnx", unreachable)
    assert runtimes.not_importable(("onnx", "onnxruntime")) == ["trainbox-absent-rt==1.0"]
    assert runtimes.not_importable(("openvino",)) == []


def test_pip_gets_its_own_settings_and_never_the_hubs_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, str] = {}
    real_run = runtimes.procs.run

    def run(argv: list[str], **kwargs: object) -> object:
        env = kwargs["env"]
        assert isinstance(env, dict)
        seen.update(env)
        return real_run(argv, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runtimes.procs, "run", run)
    env = pip_env(tmp_path / "empty") | {"HF_TOKEN": "hf_" + "x" * 30}
    with pytest.raises(runtimes.FetchFailed):
        runtimes.ensure(ABSENT, tmp_path / "workspace", env)
    assert seen["PIP_FIND_LINKS"] == str(tmp_path / "empty") and seen["PIP_NO_INDEX"] == "1"
    assert "HF_TOKEN" not in seen


def test_a_volume_that_cannot_hold_it_is_a_failed_fetch_in_one_line(tmp_path: Path, wheelhouse: Path) -> None:
    workdir = tmp_path / "workspace"
    workdir.mkdir()
    (workdir / ".trainbox").write_text("a file where the agent's folder would be")  # as a full or read-only volume
    with pytest.raises(runtimes.FetchFailed, match=r"^could not install it into .*: ") as failed:
        runtimes.ensure(PROBE, workdir, pip_env(wheelhouse))
    assert "\n" not in str(failed.value)
    assert runtimes.failure(PROBE) == str(failed.value)  # not tried again in this start
