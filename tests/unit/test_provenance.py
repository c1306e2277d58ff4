"""The model card's base_model and license: where the starting weights came from, and LICENSE."""

from __future__ import annotations

import pytest

from entrypoint import run_args, settings
from entrypoint.errors import ConfigError
from entrypoint.report import provenance


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ("model=LibreYOLO9s.pt epochs=10", "LibreYOLO/LibreYOLO9s"),  # libreyolo downloads it from the Hub
        ("model=hf://acme/detector/weights/best.pt", "acme/detector"),
        ("model=hf://acme/detector@v2", "acme/detector"),
        ("model=LibreYOLO9s.pt pretrained=false", None),  # random weights: nothing to credit
        ("model=/models/mine.pt", None),
        ("epochs=10", None),
    ],
)
def test_base_model(args: str, expected: str | None) -> None:
    assert provenance.base_model(run_args.parse(args)) == expected


def test_license_is_a_hub_license_id() -> None:
    env = {"WORKDIR": "/tmp/w", "GPUS": "cpu"}
    assert settings.from_env(env | {"LICENSE": "apache-2.0"}, options={}).card_license == "apache-2.0"
    assert settings.from_env(env, options={}).card_license is None
    with pytest.raises(ConfigError, match="LICENSE") as refused:
        settings.from_env(env | {"LICENSE": "Apache 2.0"}, options={})
    assert refused.value.exit_code == 10 and "LICENSE=apache-2.0" in str(refused.value)
