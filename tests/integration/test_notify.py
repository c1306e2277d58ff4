"""NOTIFY with the real agent: a receiver on a real socket (apprise ``json://``) gets the start and the end;
one that hangs or answers 500 costs the wrap-up no more than its bound; a SIGTERM run's end message says
preempted and what the Hub holds; the URL is nowhere (output, trainbox.json, the Hub, a child's environment).

The agent trains with the stand-in libreyolo (tests/fakes/libreyolo.py) on the CPU, OUTPUT_REPO on the test Hub.
"""

from __future__ import annotations

import json
import re

import pytest

from entrypoint.errors import PreemptedError
from entrypoint.report.notify import SEND_BOUND
from tests.fakes.receiver import Receiver
from tests.integration.test_failure_ordering import EXIT_BOUND, Agent, agent, local_phase, sigterm, wait_for

pytestmark = pytest.mark.slow  # every test runs `trainbox run`

__all__ = ["agent"]  # the fixture, shared with the failure-ordering tests


def texts_on_the_hub(agent: Agent) -> list[str]:
    hub = agent.hub_ctx.hub
    return [hub.file_bytes(agent.repo, name).decode(errors="replace") for name in hub.files(agent.repo)]


def test_start_and_end_messages_and_the_url_stays_secret(agent: Agent) -> None:
    with Receiver() as receiver:
        url = f"{receiver.url}-with-a-channel-key-0123456789"
        code, output = agent.run(agent.env(NOTIFY=url, PRICE_PER_HOUR="2.49", FAKE_PRINT_ENV="NOTIFY,HF_HOME"))
        start, end = receiver.wait_for(2)
    assert code == 0, output[-3000:]
    assert start["title"].startswith("trainbox: order started on ")
    assert "GPU: CPU" in start["message"] and "price: $2.49/h (PRICE_PER_HOUR)" in start["message"]
    assert f"follow: trainbox status --repo {agent.repo} --watch" in start["message"]
    assert end["title"] == "trainbox: order done (exit 0)" and end["type"] == "success"
    body = end["message"]
    assert "done: exit 0 (success): training finished" in body and "epochs: 4/4" in body
    # The stand-in validates each epoch the way libreyolo logs it; the line names the best one.
    assert re.search(r"^best: mAP50 \d\.\d{3} · mAP50-95 \d\.\d{3} \(epoch [1-4]\)$", body, re.M), body
    assert "cost: " in body and "at $2.49/h (PRICE_PER_HOUR)" in body
    assert f"on the Hub: {agent.repo} holds all 4 epoch(s)" in body
    assert f"model card: {agent.hub_ctx.url.rstrip('/')}/{agent.repo}" in body
    assert f"trainbox status --repo {agent.repo}" in body
    state = agent.state()
    assert state["notify"]["start"]["delivered"] == 1 and state["notify"]["end"]["delivered"] == 1
    assert agent.hub_state()["notify"]["end"]["delivered"] == 1  # the record travels with the final publish
    # The training child never saw it (nor HF_HOME's neighbour would have: the stand-in prints what it got).
    assert "env NOTIFY=None" in output and "env HF_HOME=" in output
    for text in [output, json.dumps(state), *texts_on_the_hub(agent)]:
        assert url not in text and "channel-key-0123456789" not in text


@pytest.mark.parametrize("mode", ["hang", "500"])
def test_a_receiver_that_hangs_or_fails_never_holds_the_release(agent: Agent, mode: str) -> None:
    with Receiver(mode) as receiver:
        # apprise alone would wait 30 s for an answer (rto=30): the bound is the agent's
        code, output = agent.run(agent.env(NOTIFY=f"{receiver.url}?rto=30", NOTIFY_ON="end"))
        (end,) = receiver.wait_for(1)
    assert code == 0, output[-3000:]  # the run's own outcome: a message is never the job's failure
    assert "done: exit 0" in end["message"]
    warnings = [line for line in output.splitlines() if "WARNING: NOTIFY" in line]
    assert len(warnings) == 1 and "the end message was not delivered: target 1 (json)" in warnings[0], warnings
    failed = agent.state()["notify"]["end"]
    assert failed["delivered"] == 0 and failed["seconds"] <= SEND_BOUND + 0.5, failed
    assert agent.hub_state()["notify"]["end"]["failed"] == failed["failed"]  # published with the end
    if mode == "500":  # a refusal is known from the answer: nothing waited out
        assert failed["failed"] == ["target 1 (json): the service answered HTTP 500"], failed


def test_sigterm_the_end_message_says_preempted_and_what_the_hub_holds(agent: Agent) -> None:
    with Receiver() as receiver:
        process = agent.start(agent.env(NOTIFY=receiver.url, FAKE_EPOCH_SECONDS="1.0", RUN_ARGS="epochs=50"))
        wait_for(lambda: "weights/epoch_2.pt" in agent.hub_files(), "epoch 2 on the Hub", process)
        code, output = sigterm(process)
        messages = receiver.wait_for(2, timeout=5.0)
    assert code == PreemptedError.exit_code, output[-3000:]
    (end,) = [message for message in messages if "exit" in message["title"]]
    done = agent.state()["progress"]["epochs_done"]
    assert end["title"] == "trainbox: order preempted (exit 143)"
    assert "preempted (the machine was taken back): exit 143 (preempted)" in end["message"]
    assert f"epochs: {done}/50" in end["message"]
    assert f"on the Hub: {agent.repo} holds all {done} epoch(s); the next start resumes from there" in end["message"]


def test_sigterm_with_a_hanging_receiver_still_exits_within_the_bound(agent: Agent) -> None:
    with Receiver("hang") as receiver:
        process = agent.start(agent.env(NOTIFY=f"{receiver.url}?rto=30", NOTIFY_ON="end", FAKE_EPOCH_SECONDS="1.0"))
        wait_for(lambda: local_phase(agent) == "training", "training", process)
        code, output = sigterm(process)  # fails the test past EXIT_BOUND
        assert receiver.wait_for(1)
    assert code == PreemptedError.exit_code, output[-3000:]
    assert EXIT_BOUND < SEND_BOUND + 5.0  # the bound sigterm() held the agent to is the shutdown's, not the message's
    assert "failed" in agent.state()["notify"]["end"]


def test_notify_on_all_tells_of_a_self_heal(agent: Agent) -> None:
    with Receiver() as receiver:
        env = agent.env(NOTIFY=receiver.url, NOTIFY_ON="all", RUN_ARGS="epochs=3 batch=16", FAKE_OOM_ABOVE="8")
        code, output = agent.run(env)
        messages = receiver.wait_for(3)
    assert code == 0, output[-3000:]
    titles = [message["title"] for message in messages]
    assert titles[0].startswith("trainbox: order started") and titles[2] == "trainbox: order done (exit 0)", titles
    assert titles[1] == "trainbox: order: self-heal"
    (heal,) = receiver.titled("self-heal")
    assert heal["type"] == "warning"
    assert (
        "out of GPU memory at epoch 2 with batch=16" in heal["message"] and "resumed after epoch 1" in heal["message"]
    )
    assert agent.state()["notify"]["self-heal"]["delivered"] == 1
