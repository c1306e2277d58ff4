"""Every dataset form from the local Hub, over real sockets, as `trainbox fetch` prepares it, then two epochs of real
libreyolo on what the agent hands it: a Roboflow YOLO export (tar), the same export as a zip, a Roboflow COCO export,
the classic COCO layout, and a parquet dataset with train and test only. And a dataset without labels, refused
before training by `trainbox fetch` and by `trainbox run`.

The forms are fetched once for the module (the stand-in libreyolo's doctor: no torch to import), and one process
trains them all (libreyolo is imported once): the module stays within a minute on a loaded machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from entrypoint import errors
from tests import dataset_forms as make
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.hub import HubServer
from tests.hubfixtures import HubContext
from tests.support import ONE_TORCH_THREAD, Result, make_dataset, run_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # agents, and (the contract test) real libreyolo training

FAST_ARGS = "model=LibreYOLO9t.pt epochs=2 imgsz=64"
NAMES = {0: "red", 1: "green", 2: "blue"}


def tarred(source: Path, target: Path) -> Path:
    with tarfile.open(target, "w") as archive:
        archive.add(source, arcname=source.name)
    return target


def _forms(tmp: Path) -> dict[str, tuple[dict[str, Path | bytes], dict]]:
    """form → (the repo's files, the class names the agent must find)."""
    parquet = make.parquet_dataset(tmp / "parquet")
    shards: dict[str, Path | bytes] = {str(path.relative_to(parquet)): path for path in parquet.rglob("*.parquet")}
    return {
        "roboflow-yolo": ({"shapes.tar": tarred(make.yolo_roboflow(tmp / "yolo" / "shapes"), tmp / "yolo.tar")}, NAMES),
        "zip": ({"shapes.zip": make.zipped(make.yolo_roboflow(tmp / "zip" / "shapes"), tmp / "shapes.zip")}, NAMES),
        "roboflow-coco": ({"coco.tar": tarred(make.coco_roboflow(tmp / "rcoco" / "shapes"), tmp / "rcoco.tar")}, NAMES),
        "classic-coco": (
            {"coco.tar": tarred(make.coco_classic(tmp / "ccoco" / "coco"), tmp / "ccoco.tar")},
            {0: "green", 1: "red", 2: "blue"},  # category ids 3, 7, 11
        ),
        "parquet": (
            shards | {"README.md": b"# shapes\n"},
            NAMES,
        ),
    }


FORMS = ("roboflow-yolo", "zip", "roboflow-coco", "classic-coco", "parquet")

# Two epochs of real libreyolo on each data.yaml, in one process: libreyolo is imported once.
TRAIN_ALL = """\
import json, sys
from libreyolo import LibreYOLO9
project, paths = sys.argv[1], sys.argv[2:]
for index, path in enumerate(paths):
    result = LibreYOLO9(None, size="t").train(
        data=path, epochs=2, imgsz=64, batch=4, workers=0, device="cpu", project=project, name=str(index),
        eval_interval=2,  # validated once, at the end: the val folder is read, one validation's time saved
    )
    print(json.dumps({"data": path, "last": str(result["last_checkpoint"]), "losses": len(result["epoch_losses"])}))
"""


@pytest.fixture(scope="module")
def fetched(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Result, dict, Path]]:
    tmp = tmp_path_factory.mktemp("forms")
    ctx = HubContext.create(hub, tmp)
    standin = fake_libreyolo.install(tmp / "stand-in")
    started: dict[str, tuple[subprocess.Popen[str], dict, Path]] = {}
    for form, (files, names) in _forms(tmp).items():
        repo = ctx.repo_id(form)
        ctx.hub.create_repo(repo, repo_type="dataset")
        ctx.hub.commit(repo, files, repo_type="dataset", message=form)  # type: ignore[arg-type]
        workdir = tmp / "work" / form
        env = trainbox_env(workdir, DATASET_REPO=repo, RUN_ARGS=FAST_ARGS, TRAINBOX_LIBREYOLO=str(standin))
        command = [sys.executable, "-m", "entrypoint", "fetch", "--json"]
        # all five at once: each mostly waits on its start-up and the Hub
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started[form] = (process, names, workdir)
    found: dict[str, tuple[Result, dict, Path]] = {}
    for form, (process, names, workdir) in started.items():
        stdout, stderr = process.communicate(timeout=300)
        found[form] = (Result(process.returncode, stdout, stderr), names, workdir)
    return found


@pytest.fixture(scope="module")
def trained(fetched: dict[str, tuple[Result, dict, Path]], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """form → libreyolo's result of two epochs on the data.yaml `trainbox fetch` made."""
    paths = {form: json.loads(got.stdout)["data_yaml"] for form, (got, _, _) in fetched.items() if not got.returncode}
    project = tmp_path_factory.mktemp("runs")
    process = subprocess.run(
        [sys.executable, "-c", TRAIN_ALL, str(project), *paths.values()],
        capture_output=True,
        text=True,
        timeout=900,
        env={**trainbox_env(project), **ONE_TORCH_THREAD},
    )
    assert process.returncode == 0, process.stderr[-3000:]
    by_path = {entry["data"]: entry for entry in map(json.loads, process.stdout.splitlines()) if entry}
    return {form: by_path[path] for form, path in paths.items()}


@pytest.mark.contract  # what libreyolo trains from: the data.yaml the agent writes for each form
@pytest.mark.parametrize("form", FORMS)
def test_each_form_is_fetched_from_the_hub_and_trains_two_epochs(
    fetched: dict[str, tuple[Result, dict, Path]], trained: dict, form: str
) -> None:
    result, names, workdir = fetched[form]
    assert result.returncode == 0, result.output[-3000:]
    config = yaml.safe_load(Path(json.loads(result.stdout)["data_yaml"]).read_text())
    given = config["names"]
    found = dict(enumerate(given)) if isinstance(given, list) else {int(key): value for key, value in given.items()}
    assert found == names
    for split in ("train", "val"):
        folder = Path(config[split])
        assert folder.is_absolute() and folder.is_dir() and folder.is_relative_to(workdir), config
        assert ".staging" not in str(folder)
    assert trained[form]["losses"] == 2
    assert Path(trained[form]["last"]).stat().st_size > 0


def test_a_warm_start_reads_nothing_again(fetched: dict[str, tuple[Result, dict, Path]], hub: HubServer) -> None:
    result, _, workdir = fetched["parquet"]
    assert result.returncode == 0, result.output[-3000:]
    repo = json.loads(result.stdout)["source"].split("@")[0]
    hub.reset_log()
    env = trainbox_env(workdir, DATASET_REPO=repo, RUN_ARGS=FAST_ARGS)
    env["TRAINBOX_LIBREYOLO"] = str(fake_libreyolo.install(workdir.parent / "stand-in-again"))
    again = run_trainbox("fetch", "--json", env=env)
    assert again.returncode == 0, again.output[-3000:]
    assert json.loads(again.stdout)["data_yaml"] == json.loads(result.stdout)["data_yaml"]
    assert "nothing downloaded" in again.stderr
    assert hub.find_requests(path="/resolve/|/xet-read-token/") == []


# -- a dataset without labels is refused before any training ---------------------------------------
def label_less(tmp_path: Path) -> Path:
    root = tmp_path / "src" / "cones"
    make_dataset(root)
    for label in (root / "labels").rglob("*.txt"):
        label.unlink()
    return tarred(root, tmp_path / "src" / "cones.tar")


def publish(hub_ctx: HubContext, files: dict[str, Path | bytes]) -> str:
    repo = hub_ctx.repo_id("data")
    hub_ctx.hub.create_repo(repo, repo_type="dataset")
    hub_ctx.hub.commit(repo, files, repo_type="dataset", message="dataset")  # type: ignore[arg-type]
    return repo


Refused = Callable[[Result], None]


def assert_no_labels(result: Result) -> None:
    assert result.returncode == errors.NoLabelsError.exit_code, result.output[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if "has a label" in line]
    assert "none of the 12 images has a label (looked for cones/labels/train/*.txt)" in line
    assert ".staging" not in line and "data/hub" not in line  # the dataset's own path, not a folder of the volume


@pytest.mark.transfer("xet")
def test_a_label_less_dataset_is_refused_by_fetch(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": label_less(tmp_path)})
    standin = fake_libreyolo.install(tmp_path / "stand-in")
    env = trainbox_env(tmp_path / "work", DATASET_REPO=repo, RUN_ARGS=FAST_ARGS, TRAINBOX_LIBREYOLO=str(standin))
    assert_no_labels(run_trainbox("fetch", env=env))


@pytest.mark.transfer("xet")
def test_a_label_less_dataset_is_refused_by_run_before_training(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": label_less(tmp_path)})
    standin = fake_libreyolo.install(tmp_path / "stand-in")
    workdir = tmp_path / "work"
    env = trainbox_env(workdir, DATASET_REPO=repo, RUN_ARGS=FAST_ARGS, GPUS="cpu", TRAINBOX_LIBREYOLO=str(standin))
    assert_no_labels(run_trainbox("run", env=env, timeout=300))
    (state_file,) = (workdir / "runs").glob("*/trainbox.json")
    state = json.loads(state_file.read_text())
    assert state["exit"]["reason"] == "dataset_no_labels"
    assert "training" not in state["phases"]
    assert not list((workdir / "runs").rglob("fake-pid")), "the trainer was never started"


@pytest.mark.transfer("xet")
def test_parquet_boxes_in_another_format_are_refused_until_dataset_bbox_names_it(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    root = make.parquet_dataset(tmp_path / "parquet", fmt="xyxy")
    repo = publish(hub_ctx, {str(path.relative_to(root)): path for path in root.rglob("*.parquet")})
    standin = fake_libreyolo.install(tmp_path / "stand-in")
    env = trainbox_env(tmp_path / "work", DATASET_REPO=repo, RUN_ARGS=FAST_ARGS, TRAINBOX_LIBREYOLO=str(standin))
    refused = run_trainbox("fetch", env=env)
    assert refused.returncode == errors.BoxesOutsideError.exit_code, refused.output[-3000:]
    (line,) = [line for line in refused.stderr.splitlines() if "fall outside their image" in line]
    assert "data/train-00000-of-00001.parquet" in line and "read as DATASET_BBOX=xywh" in line
    assert "set DATASET_BBOX" in line
    assert not list((tmp_path / "work" / "data").rglob("*.parquet")), "nothing of the refused conversion is left"
    accepted = run_trainbox("fetch", "--json", env=env | {"DATASET_BBOX": "xyxy"})
    assert accepted.returncode == 0, accepted.output[-3000:]


@pytest.mark.transfer("xet")
def test_plan_sizes_the_disk_of_a_parquet_dataset_without_downloading(hub_ctx: HubContext, tmp_path: Path) -> None:
    from entrypoint import dataset, settings

    root = make.parquet_dataset(tmp_path / "parquet")
    shards = {str(path.relative_to(root)): path for path in root.rglob("*.parquet")}
    repo = publish(hub_ctx, dict(shards))
    env = trainbox_env(tmp_path / "work", DATASET_REPO=repo, HF_TOKEN=hub_ctx.token, RUN_ARGS=FAST_ARGS)
    fields, _lines = dataset.disk_report(settings.from_env(env))
    assert fields["archive_bytes"] == sum(path.stat().st_size for path in shards.values())
    assert f"{repo}:*.parquet" in fields["dataset"]
    assert hub_ctx.hub.find_requests(method="GET", path="/resolve/|/xet-read-token/") == []
