"""RUN_ARGS: shell-style quoting, checked against the installed libreyolo, never shelled."""

from __future__ import annotations

import pytest

from entrypoint.errors import ConfigError
from entrypoint.libreyolo import train_options as libreyolo_options
from entrypoint.run_args import parse, validate


def test_quotes_and_equals_inside_values() -> None:
    args = parse("""model=LibreYOLO9s.pt freeze="backbone neck" classes='0,3' mosaic_scale=(0.1,2.0) x=a=b""")
    assert args.pairs == (
        ("model", "LibreYOLO9s.pt"),
        ("freeze", "backbone neck"),
        ("classes", "0,3"),
        ("mosaic_scale", "(0.1,2.0)"),
        ("x", "a=b"),
    )


def test_shell_metacharacters_stay_literal() -> None:
    args = parse("""name='$(touch pwned); rm -rf ~' freeze=`id` distill_model=a|b>c&&d""")
    assert args.get("name") == "$(touch pwned); rm -rf ~"
    assert args.get("freeze") == "`id`"
    assert args.get("distill_model") == "a|b>c&&d"
    assert args.argv() == ["name=$(touch pwned); rm -rf ~", "freeze=`id`", "distill_model=a|b>c&&d"]


def test_dashes_and_leading_double_dash_normalise() -> None:
    assert parse("--eval-interval=1").pairs == (("eval_interval", "1"),)


@pytest.mark.parametrize("text", ["epochs", "epochs 100", "'unclosed=1", "epochs=1 epochs=2", "=5"])
def test_malformed(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert "RUN_ARGS" in str(caught.value)


def test_options_are_read_from_the_installed_libreyolo() -> None:
    options = libreyolo_options()
    # present in libreyolo 1.6.0's train command, with their types
    assert options["epochs"] == "int"
    assert options["lr0"] == "float"
    assert options["amp"] == "bool"
    assert options["imgsz"] == "str"
    assert "json_output" not in options and "dry_run" not in options


def test_unknown_key_lists_the_closest_valid_keys() -> None:
    with pytest.raises(ConfigError) as caught:
        validate(parse("epoch=10"), libreyolo_options())
    assert "'epoch'" in str(caught.value)
    assert "epochs" in caught.value.hint


@pytest.mark.parametrize(
    ("key", "variable"),
    [
        ("data", "DATASET_REPO"),
        ("project", "WORKDIR"),
        ("name", "RUN_NAME"),
        ("exist_ok", "RUN_NAME"),
        ("device", "GPUS"),
    ],
)
def test_owned_keys_name_the_env_var(key: str, variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate(parse(f"{key}=x"), libreyolo_options())
    assert variable in caught.value.hint


@pytest.mark.parametrize("text", ["epochs=ten", "lr0=fast", "amp=maybe"])
def test_values_of_the_wrong_type(text: str) -> None:
    with pytest.raises(ConfigError, match="is not a valid"):
        validate(parse(text), libreyolo_options())


def test_defaults_merge_and_set() -> None:
    args = parse("epochs=5").with_defaults(parse("epochs=20 imgsz=128"))
    assert args.argv() == ["imgsz=128", "epochs=5"]
    assert args.set("batch", "-1").get("batch") == "-1"
