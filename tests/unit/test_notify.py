"""NOTIFY: what the messages say, to a receiver on a real socket, within their bounds, and never a URL in a line.

Integration tests (tests/integration/test_notify.py) run the agent; these drive ``Notifier`` directly."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from entrypoint import log, procs
from entrypoint.cli import cli
from entrypoint.errors import ConfigError
from entrypoint.release.clock import ShutdownClock
from entrypoint.report import notify
from entrypoint.settings import Settings, from_env
from entrypoint.state import Phase, RunState
from entrypoint.variables import NotifyOn
from tests.fakes.receiver import Receiver

SLACK = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ"  # the shape of a Slack webhook: its key inside


def make(tmp_path: Path, **env: str) -> Settings:
    base = {"WORKDIR": str(tmp_path), "PROVIDER": "none", "RUN_NAME": "cones", "OUTPUT_REPO": "acme/yolo"}
    return from_env(base | env, options={})


def job_state(settings: Settings, **fields: Any) -> RunState:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    state = RunState(settings.run_dir, settings.run_name)
    state.update(
        gpus={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}, {"index": 1, "name": "NVIDIA H100 80GB HBM3"}]},
        progress={"epochs_done": 12, "epochs_total": 12},
        metrics={"seconds_per_epoch": 41.0, "mAP50": 0.61, "best": {"epoch": 9, "mAP50": 0.634, "mAP50-95": 0.412}},
        **fields,
    )
    return state


def finish(state: RunState, phase: Phase = Phase.DONE, code: int = 0, reason: str = "success") -> None:
    state.update(
        cost={"hours": 0.51, "price_per_hour": 2.49, "price_source": "PRICE_PER_HOUR", "dollars": 1.27},
        sync={"repo": "acme/yolo", "commits": 12, "pending": [], "last_error": None},
    )
    state.finish(phase, code, reason, "training finished" if code == 0 else "received SIGTERM")


# -- settings --------------------------------------------------------------------------------
def test_notify_is_a_list_of_secrets_kept_from_children_and_logs(tmp_path: Path) -> None:
    other = "json://hooks.example.com:8080/trainbox-hook"
    settings = make(tmp_path, NOTIFY=f" {SLACK} , {other},")
    assert [url.reveal() for url in settings.notify] == [SLACK, other]
    assert SLACK not in repr(settings) and settings.notify_on is NotifyOn.START_END
    # each URL alone is redacted wherever it shows (a log line, trainbox.json, an upload)
    assert log.redact(f"posting to {SLACK} and {other}") == "posting to *** and ***"
    # no child gets it: neither the training's environment nor any other child's
    assert "NOTIFY" not in settings.env
    assert "NOTIFY" not in procs.child_env({"NOTIFY": SLACK, "PATH": "/bin"})


@pytest.mark.parametrize("value", ["not-a-url", "ntfy://ok, slack//T000/B000", "   ,  "])
def test_a_bad_notify_names_the_target_never_its_value(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        make(tmp_path, NOTIFY=value)
    assert "NOTIFY" in str(refused.value) and refused.value.exit_code == 10
    assert "slack//T000" not in str(refused.value) and "not-a-url" not in str(refused.value)


def test_notify_on_takes_end_or_all(tmp_path: Path) -> None:
    assert make(tmp_path, NOTIFY_ON="END").notify_on is NotifyOn.END
    assert make(tmp_path, NOTIFY_ON="all").notify_on is NotifyOn.ALL
    with pytest.raises(ConfigError, match="NOTIFY_ON"):
        make(tmp_path, NOTIFY_ON="sometimes")


def test_dry_run_says_set_not_the_url(tmp_path: Path) -> None:
    env = {"WORKDIR": str(tmp_path), "PROVIDER": "none", "GPUS": "cpu", "NOTIFY": SLACK, "TRAINBOX_CACHE_DIR": ""}
    shown = CliRunner().invoke(cli, ["run", "--dry-run"], env=env)
    assert shown.exit_code == 0, shown.output
    assert "NOTIFY" in shown.output and SLACK not in shown.output and "T1JJ3T3L2" not in shown.output


def test_an_unknown_scheme_is_refused_at_the_start_without_printing_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # the scheme is judged with the settings (so by --dry-run, before the GPU check); the URL's details at the start
    with pytest.raises(ConfigError, match=r"target 2 \(nosuchservice://…\)") as refused:
        make(tmp_path, NOTIFY="json://127.0.0.1:9/ok,nosuchservice://secret-channel-key-123")
    assert "secret-channel-key-123" not in str(refused.value)
    settings = make(tmp_path, NOTIFY="json://127.0.0.1:9/ok,slack://secret-channel-key-123")  # too few parts for Slack
    notifier = notify.Notifier(settings, job_state(settings))
    with pytest.raises(ConfigError, match=r"target 2 \(slack://…\)"):
        notifier.check()
    assert not notifier.active  # the end message of the job that ends on this error goes nowhere
    assert "secret-channel-key-123" not in capfd.readouterr().err


# -- the messages ----------------------------------------------------------------------------
def test_start_and_end_carry_what_a_person_needs(tmp_path: Path) -> None:
    with Receiver() as receiver:
        settings = make(tmp_path, NOTIFY=receiver.url, PRICE_PER_HOUR="2.49", MAX_COST="25")
        state = job_state(settings)
        notifier = notify.Notifier(settings, state)
        notifier.check()
        notifier.started(2.49, "PRICE_PER_HOUR")
        (start,) = receiver.wait_for(1)
        finish(state)
        clock = ShutdownClock()
        notifier.ended(clock)
        notifier.settle(clock)
        _, end = receiver.wait_for(2)
    assert start["title"].startswith("trainbox: cones started on ") and start["type"] == "info"
    assert start["user_agent"] == "Trainbox"  # signed by Trainbox (AppriseAsset), not "Apprise"
    body = start["message"]
    assert "host: " in body and "GPU: 2 × NVIDIA H100 80GB HBM3" in body
    assert "price: $2.49/h (PRICE_PER_HOUR); MAX_COST $25" in body
    assert "follow: trainbox status --repo acme/yolo --watch" in body
    assert end["title"] == "trainbox: cones done (exit 0)" and end["type"] == "success"
    body = end["message"]
    assert "done: exit 0 (success): training finished" in body
    assert "epochs: 12/12" in body and "best: mAP50 0.634 · mAP50-95 0.412 (epoch 9)" in body
    assert "cost: 0.51 h, $1.27 at $2.49/h (PRICE_PER_HOUR)" in body
    assert "on the Hub: acme/yolo holds all 12 epoch(s)" in body
    assert f"model card: {os.environ['HF_ENDPOINT'].rstrip('/')}/acme/yolo" in body
    assert "trainbox status --repo acme/yolo" in body
    recorded = state.snapshot()["notify"]
    assert recorded["targets"] == ["json"] and recorded["start"]["delivered"] == 1
    assert recorded["end"]["delivered"] == 1 and "failed" not in recorded["end"]


def test_a_preempted_end_says_so_and_what_the_hub_holds(tmp_path: Path) -> None:
    with Receiver() as receiver:
        settings = make(tmp_path, NOTIFY=receiver.url)
        state = job_state(settings)
        state.update(progress={"epochs_done": 3})
        finish(state, Phase.PREEMPTED, 143, "preempted")
        clock = ShutdownClock()
        clock.preempt()
        notifier = notify.Notifier(settings, state)
        notifier.ended(clock)
        notifier.settle(clock)
        (end,) = receiver.wait_for(1)
    assert end["title"] == "trainbox: cones preempted (exit 143)" and end["type"] == "warning"
    assert "preempted (the machine was taken back): exit 143 (preempted)" in end["message"]
    assert "on the Hub: acme/yolo holds all 3 epoch(s); the next start resumes from there" in end["message"]


def test_notify_on_chooses_the_messages(tmp_path: Path) -> None:
    for on, expected in (("end", ["end"]), ("start,end", ["start", "end"]), ("all", ["start", "self-heal", "end"])):
        with Receiver() as receiver:
            settings = make(tmp_path / on.replace(",", "-"), NOTIFY=receiver.url, NOTIFY_ON=on)
            state = job_state(settings)
            notifier = notify.Notifier(settings, state)
            notify.install(notifier)
            notifier.started(None, None)
            if notifier.wants("start"):
                receiver.wait_for(1)
            notify.event("self-heal", "out of GPU memory at batch=16: resumed after epoch 4 with batch=8")
            if on == "all":
                receiver.wait_for(2)
            finish(state)
            clock = ShutdownClock()
            notifier.ended(clock)
            notifier.settle(clock)
            received = receiver.wait_for(len(expected), timeout=5.0)
        kinds = [
            "start" if "started" in message["title"] else "end" if "exit" in message["title"] else "self-heal"
            for message in received
        ]
        assert kinds == expected, on
    notify.install(notify.Notifier(make(tmp_path), job_state(make(tmp_path))))  # none left pointing at a receiver


def test_several_nodes_speak_once(tmp_path: Path) -> None:
    settings = make(tmp_path, NOTIFY="json://127.0.0.1:9/x", NNODES="2", NODE_RANK="1", MASTER_ADDR="m")
    assert not notify.Notifier(settings, job_state(settings)).active


# -- the bounds ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [pytest.param("hang", marks=pytest.mark.slow), "500"])  # hang: waits the bound
def test_a_receiver_that_hangs_or_fails_costs_the_wrap_up_at_most_the_bound(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Receiver(mode) as receiver:
        # apprise itself would wait 30 s for the answer (rto): the bound is the notifier's own
        settings = make(tmp_path, NOTIFY=f"{receiver.url}?rto=30")
        state = job_state(settings)
        finish(state)
        notifier = notify.Notifier(settings, state)
        clock = ShutdownClock()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="trainbox"):
            notifier.ended(clock)
            notifier.settle(clock)
        took = time.monotonic() - started
        assert receiver.wait_for(1)  # it did reach the receiver
    assert took <= notify.SEND_BOUND + 1.0, took
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "trainbox"]
    assert len(warnings) == 1 and warnings[0].startswith("NOTIFY: the end message was not delivered: target 1 (json)")
    assert receiver.url.split("//", 1)[1] not in warnings[0]  # never the URL itself
    if mode == "hang":
        assert warnings[0].endswith(f"no answer within {notify.SEND_BOUND:g} s")
    else:  # a refusal is known from the answer itself: nothing waited out
        assert warnings[0].endswith("the service answered HTTP 500"), warnings[0]
    failed = state.snapshot()["notify"]["end"]["failed"]
    assert len(failed) == 1 and failed[0].startswith("target 1 (json): ")


@pytest.mark.slow  # waits out a real bound
def test_after_sigterm_the_end_message_waits_only_for_the_spare_time(tmp_path: Path) -> None:
    with Receiver("hang") as receiver:
        settings = make(tmp_path, NOTIFY=f"{receiver.url}?rto=30")
        state = job_state(settings)
        finish(state, Phase.PREEMPTED, 143, "preempted")
        notifier = notify.Notifier(settings, state)
        clock = ShutdownClock()
        clock.preempt()
        started = time.monotonic()
        notifier.ended(clock)
        # the release's publish goes first: ended() neither waited for the hanging receiver nor settled its message
        assert "notify" not in state.snapshot(), state.snapshot()["notify"]
        clock.deadline = time.monotonic() + 1.3  # the release took most of the budget: 1 s is left
        notifier.settle(clock)
        settled = time.monotonic() - started
        assert receiver.wait_for(1)
    # Within the machine's deadline (1.3 s after ``started``, plus a loaded machine's scheduling slack), far from the
    # 5 s a message may take otherwise, or the receiver's 30 s.
    assert settled < 1.3 + 1.0 < notify.SEND_BOUND, settled
    assert "failed" in state.snapshot()["notify"]["end"]


def test_a_broken_message_is_one_warning_never_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = make(tmp_path, NOTIFY="json://127.0.0.1:9/hook")
    state = job_state(settings)
    state.update(progress="not a dict")  # a trainbox.json this version cannot read
    notifier = notify.Notifier(settings, state)
    with caplog.at_level(logging.WARNING, logger="trainbox"):
        notifier.ended(ShutdownClock())
    assert any("NOTIFY: the end message was not sent" in r.getMessage() for r in caplog.records)


def test_without_a_job_an_event_is_nothing() -> None:
    notify._installed.clear()
    notify.event("fallback", "the bucket is unavailable")  # no notifier: returns, raises nothing


def test_apprises_reasons_are_never_repeated_they_may_quote_the_secret(tmp_path: Path) -> None:
    with Receiver("500") as receiver:
        # ntfy's plugin names the topic in its failure line: the topic is the channel's key
        url = receiver.url.replace("json://", "ntfy://").replace("/hook", "/secret-topic-4242")
        settings = make(tmp_path, NOTIFY=url, NOTIFY_ON="end")
        state = job_state(settings)
        finish(state)
        notifier = notify.Notifier(settings, state)
        notifier.check()
        notifier.ended(ShutdownClock())
        assert receiver.wait_for(1) and receiver.messages[0]["topic"] == "secret-topic-4242"
    (failed,) = state.snapshot()["notify"]["end"]["failed"]
    assert failed == "target 1 (ntfy): the service answered HTTP 500"
    assert "secret-topic-4242" not in (settings.run_dir / "trainbox.json").read_text()
