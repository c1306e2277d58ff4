"""The libreyolo command line and its exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint import errors
from entrypoint.errors import ConfigError
from entrypoint.run_args import parse
from entrypoint.training import process as training


def test_command_puts_owned_keys_last_and_never_uses_a_shell(tmp_path: Path) -> None:
    command = training.build_command(
        parse("model=LibreYOLO9t.pt epochs=2 name2=$(id)"),
        data_yaml=tmp_path / "data.yaml",
        workdir=tmp_path,
        run_name="r1",
        device="0,1",
    )
    assert Path(command.argv[0]).name == "libreyolo" and command.argv[1] == "train"
    assert command.argv[2:] == (
        "model=LibreYOLO9t.pt",
        "epochs=2",
        "name2=$(id)",
        f"data={tmp_path / 'data.yaml'}",
        f"project={tmp_path / 'runs'}",
        "name=r1",
        "exist_ok=true",
        "device=0,1",
    )
    assert command.cwd == tmp_path  # ./weights downloads land on the volume
    assert command.run_dir == tmp_path / "runs" / "r1"


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (1, errors.TrainingError),
        (2, errors.TrainingConfigError),
        (3, errors.DatasetInvalidError),
        (4, errors.ModelError),
        (130, errors.UserInterruptError),
        (-9, errors.TrainingError),
    ],
)
def test_libreyolo_exit_codes_map_to_typed_errors(code: int, error: type) -> None:
    mapped = training.error_for_exit(code, "boom")
    assert type(mapped) is error
    assert training.error_for_exit(0, "") is None


def test_dataset_failure_uses_the_dataset_exit_code() -> None:
    mapped = training.error_for_exit(3, "No images found")
    assert mapped is not None and mapped.exit_code == errors.DatasetInvalidError.exit_code
    assert "No images found" in str(mapped)


def test_fixed_batch_must_divide_by_the_gpus() -> None:
    training.check_batch(parse("batch=64"), 4)
    training.check_batch(parse("batch=-1"), 3)
    with pytest.raises(ConfigError, match="multiple of 4"):
        training.check_batch(parse("batch=6"), 4)


def test_device_argument() -> None:
    assert training.device_arg(None) == "cpu"
    assert training.device_arg((0, 1, 2)) == "0,1,2"


def test_profile_command_follows_run_args(tmp_path: Path) -> None:
    from entrypoint import settings
    from entrypoint.training import profiling

    config = settings.from_env(
        {"WORKDIR": str(tmp_path), "PROFILE": "1", "RUN_ARGS": "model=LibreYOLO9s.pt imgsz=640 batch=-1 workers=8"}
    )
    argv = profiling.profile_command(config, tmp_path / "data.yaml", device=2)
    assert argv[1:4] == ["profile", "run", str(tmp_path / "data.yaml")]
    joined = " ".join(argv)
    assert "--weights LibreYOLO9s.pt --size s" in joined
    assert "--batch -1" in joined and "--imgsz 640" in joined and "--workers 8" in joined
    assert "--device 2" in joined and argv[-1] == "--json"
