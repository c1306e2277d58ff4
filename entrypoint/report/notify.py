"""NOTIFY: a message when the run starts, when it mends itself or falls back (NOTIFY_ON=all), and when it ends.

apprise speaks Slack, Discord, Telegram, ntfy, e-mail, Matrix and plain JSON webhooks. It is imported
only when NOTIFY is set, so the agent's start stays fast without it. apprise sends synchronously and
may block on DNS or TCP: each message goes to each target from a daemon thread of its own, and the job
waits for it only within a bound (``SEND_BOUND`` in the wrap-up, none at the start, after SIGTERM only
the time the shutdown leaves); a hung send never holds the exit (daemon threads, and the agent ends
with ``os._exit``). A message that fails or is late is one WARNING line and a line in trainbox.json
(``notify``), never a failure of the job. The URLs are secrets (a webhook URL carries its channel's
key): no line names one; a target is its number and its scheme, and apprise's own log is kept out of
the console (it prints URLs and their parts) and its reasons put in words of our own. Each send is bounded by
apprise's own ``timeout`` too, and signed Trainbox (an ``AppriseAsset``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, StopRequested
from ..log import logger, redact
from ..settings import Provider, Settings
from ..state import Phase, RunState, now_iso
from ..variables import NotifyOn
from . import card_eval, status

if TYPE_CHECKING:
    from ..parsing import Secret
    from ..release.clock import ShutdownClock

SEND_BOUND = 5.0  # seconds a message may take before the job stops waiting for it
_SLICE = 0.05  # a wait looks this often whether a SIGTERM shortened it
START, EVENT, END = "start", "event", "end"
_LEVELS = {START: "info", EVENT: "warning"}  # apprise's NotifyType values; the end's depends on its outcome


@dataclass
class _Message:
    """One message on its way to every target: each target's outcome (None: delivered) once known."""

    kind: str
    title: str
    body: str
    level: str
    targets: int
    started: float = field(default_factory=time.monotonic)
    outcomes: dict[int, str | None] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    settled: bool = False

    def waiting(self) -> bool:
        return len(self.outcomes) < self.targets


class Notifier:
    """The job's messages: ``started`` after preflight (which checks the URLs first), ``event`` on a
    self-heal or a fallback, ``ended`` once the final upload returned, ``settle`` after the release."""

    def __init__(self, settings: Settings, state: RunState) -> None:
        self.settings = settings
        self.state = state
        # Several machines: node 0 speaks for the run (the others would repeat it).
        self._urls: tuple[Secret, ...] = settings.notify if settings.topology.leader else ()
        self._lock = threading.Lock()
        self._messages: list[_Message] = []
        self._closed = False  # after settle: a late answer no longer rewrites trainbox.json

    @property
    def active(self) -> bool:
        return bool(self._urls)

    def wants(self, kind: str) -> bool:
        on = self.settings.notify_on
        return self.active and (kind == END or on is NotifyOn.ALL or (kind == START and on is NotifyOn.START_END))

    # -- the job's calls ------------------------------------------------------------------------
    def check(self) -> None:
        """Every NOTIFY URL is one apprise can use; else a ConfigError naming the target (never its URL)."""
        if not self.active:
            return
        try:
            apprise = _apprise()
        except ImportError:
            self._urls = ()
            raise ConfigError(
                "NOTIFY is set but apprise is not installed", "pip install apprise, or unset NOTIFY"
            ) from None
        schemes = []
        for number, url in enumerate(self._urls, 1):
            scheme = _scheme(url)
            if apprise.Apprise.instantiate(url.reveal()) is None:
                self._urls = ()  # the job ends on this error: no message to a list that is half wrong
                raise ConfigError(
                    f"NOTIFY: target {number} ({scheme}://…) is not a URL apprise can use",
                    "see https://appriseit.com/services/ for each service's URL, e.g. ntfy://my-topic",
                )
            schemes.append(scheme)
        self.state.update(notify={"targets": schemes, "on": self.settings.notify_on.value})

    def started(self, price_per_hour: float | None, price_source: str | None) -> None:
        """After preflight: every URL is one apprise can use (``check``), then the start message (not waited
        for): host, GPU, price, where to follow the run."""
        self.check()
        if self.wants(START):
            with _never_fails("start"):
                self._send(START, *start_message(self.settings, self.state.snapshot(), price_per_hour, price_source))

    def event(self, kind: str, text: str) -> None:
        """A self-heal or a fallback worth a look (NOTIFY_ON=all); not waited for."""
        if self.wants(EVENT):
            with _never_fails(kind):
                title = f"trainbox: {self.settings.run_name}: {kind}"
                self._send(EVENT, title, f"{text}\n{_follow(self.settings)}", tag=kind)

    def ended(self, clock: ShutdownClock, sync: dict[str, Any] | None = None) -> None:
        """The end message, once the final upload returned: ``sync`` is what the uploader reports now (what
        the Hub holds; trainbox.json's ``sync`` was written before that upload). Waited for at most
        ``SEND_BOUND``, so trainbox.json records its outcome before it is published; after SIGTERM not at
        all: the release needs the time, and ``settle`` waits with what is left."""
        if not self.wants(END):
            return
        with _never_fails("end"):
            snapshot = self.state.snapshot()
            title, body, level = end_message(self.settings, snapshot | ({"sync": sync} if sync else {}))
            message = self._send(END, title, body, level=level)
            if not clock.preempted:
                self._wait(message, SEND_BOUND, until=lambda: clock.preempted)  # a SIGTERM now: stop waiting
                if not clock.preempted:
                    self._settle(message, late=True)

    def settle(self, clock: ShutdownClock) -> None:
        """After the release: wait for the messages still on their way, with the time the shutdown leaves
        after SIGTERM (else none: ``ended`` already waited), then record and warn about the rest."""
        with _never_fails("settle"):
            spare = clock.remaining(SEND_BOUND) if clock.preempted else 0.0
            deadline = time.monotonic() + spare
            with self._lock:
                pending = list(self._messages)
            for message in pending:
                self._wait(message, max(0.0, deadline - time.monotonic()))
            for message in pending:
                self._settle(message, late=True)
        self._closed = True

    # -- sending -------------------------------------------------------------------------------
    def _send(self, kind: str, title: str, body: str, *, level: str | None = None, tag: str | None = None) -> _Message:
        message = _Message(tag or kind, redact(title), redact(body), level or _LEVELS[kind], len(self._urls))
        with self._lock:
            self._messages.append(message)
        for number, url in enumerate(self._urls, 1):
            thread = threading.Thread(
                target=self._deliver, args=(message, number, url), name=f"notify-{kind}-{number}", daemon=True
            )
            message.threads.append(thread)
            thread.start()
        return message

    def _deliver(self, message: _Message, number: int, url: Secret) -> None:
        try:
            outcome = _send_one(url.reveal(), message.title, message.body, message.level)
        except Exception as error:  # a notifier's failure is never the job's; its text may quote the URL
            outcome = f"apprise failed ({type(error).__name__})"
        with self._lock:
            message.outcomes[number] = None if outcome is None else redact(outcome)[:200]
            done = not message.waiting()
        if done:
            self._settle(message, late=False)

    def _wait(self, message: _Message, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        """Wait for ``message`` up to ``seconds``, never past its own bound, and not once ``until()``."""
        deadline = min(time.monotonic() + seconds, message.started + SEND_BOUND)
        for thread in message.threads:
            while thread.is_alive() and not until() and (left := deadline - time.monotonic()) > 0:
                thread.join(min(left, _SLICE))

    def _settle(self, message: _Message, *, late: bool) -> None:
        """Once every target answered (or ``late``: the job waits no longer): one line, one record."""
        with self._lock:
            if message.settled or (message.waiting() and not late) or self._closed:
                return
            message.settled = True
            seconds = round(time.monotonic() - message.started, 2)
            failed = {
                number: message.outcomes.get(number, f"no answer within {min(seconds, SEND_BOUND):.0f} s")
                for number in range(1, message.targets + 1)
                if message.outcomes.get(number) is not None or number not in message.outcomes
            }
        schemes = [_scheme(url) for url in self._urls]
        reasons = [f"target {number} ({schemes[number - 1]}): {why}" for number, why in failed.items()]
        record: dict[str, Any] = {"at": now_iso(), "delivered": message.targets - len(failed), "seconds": seconds}
        if reasons:
            record["failed"] = reasons
            logger.warning("NOTIFY: the %s message was not delivered: %s", message.kind, "; ".join(reasons))
        self.state.update(notify={message.kind: record})


# -- what the messages say -----------------------------------------------------------------------
def start_message(
    settings: Settings, snapshot: dict[str, Any], price_per_hour: float | None, price_source: str | None
) -> tuple[str, str]:
    attempt = snapshot.get("attempt")
    lines = [
        f"run {settings.run_name}{f' (attempt {attempt})' if attempt not in (None, 1) else ''} started",
        f"host: {_host(settings)}",
        f"GPU: {status.gpu_text(snapshot.get('gpus'))}",
    ]
    if price_per_hour is not None:
        budget = f"; MAX_COST ${settings.max_cost:g}" if settings.max_cost is not None else ""
        lines.append(f"price: ${price_per_hour:.2f}/h{f' ({price_source})' if price_source else ''}{budget}")
    else:
        lines.append("price: unknown (set PRICE_PER_HOUR for dollars)")
    lines.append(f"dataset: {settings.dataset_repo or 'the bundled demo'} · RUN_ARGS: {settings.user_run_args or '-'}")
    lines.append(_follow(settings))
    return f"trainbox: {settings.run_name} started on {socket.gethostname()}", "\n".join(lines)


def end_message(settings: Settings, snapshot: dict[str, Any]) -> tuple[str, str, str]:
    """Title, body and apprise level of the end message: outcome, exit, best mAP, epochs, cost, the Hub."""
    phase = str(snapshot.get("phase"))
    exit_info = snapshot.get("exit") or {}
    words = status.OUTCOME_WORDS.get(phase, phase)
    progress = snapshot.get("progress") or {}
    done, total = progress.get("epochs_done"), progress.get("epochs_total")
    lines = [
        f"{words}: exit {exit_info.get('code')} ({exit_info.get('reason')}): {exit_info.get('message')}",
        f"epochs: {done if done is not None else 0}/{total or '?'}",
        f"best: {status.best_text(snapshot)}",
    ]
    lines += [f"best.pt scored: {scored}"] if (scored := card_eval.scored_text(snapshot)) else []
    cost = status.cost_text(snapshot, time.time())
    if cost:
        lines.append(f"cost: {cost}")
    lines.append(f"on the Hub: {hub_holds(settings, snapshot)}")
    if settings.output_repo:
        from huggingface_hub import constants

        lines.append(f"model card: {constants.ENDPOINT.rstrip('/')}/{settings.output_repo}")
    lines.append(_follow(settings).replace(" --watch", ""))
    level = "success" if exit_info.get("code") == 0 else "warning" if phase == Phase.PREEMPTED else "failure"
    return f"trainbox: {settings.run_name} {phase} (exit {exit_info.get('code')})", "\n".join(lines), level


def hub_holds(settings: Settings, snapshot: dict[str, Any]) -> str:
    """What the Hub holds of this run once the final upload returned, from trainbox.json's ``sync``."""
    if settings.output_repo is None:
        return "nothing: OUTPUT_REPO is unset, the weights stay on the volume"
    sync = snapshot.get("sync")
    if not sync:
        return f"nothing new from this attempt in {settings.output_repo} (it ended before the upload started)"
    done = (snapshot.get("progress") or {}).get("epochs_done") or 0
    missing = sorted({*(sync.get("pending") or []), *(sync.get("bucket_pending") or [])})
    if missing:
        return f"{settings.output_repo} lacks {len(missing)} file(s) still on the volume ({', '.join(missing[:3])})" + (
            f": {sync['error']}" if sync.get("error") else ""
        )
    if sync.get("bucket"):
        published = (sync.get("final_publish") or {}).get("done")
        repo = "with the final weights" if published else "with milestones (the final publish did not finish)"
        return f"every epoch ({done}) in the bucket {sync['bucket']}; {settings.output_repo} {repo}"
    resume = "; the next start resumes from there" if snapshot.get("phase") != Phase.DONE and done else ""
    return f"{settings.output_repo} holds all {done} epoch(s){resume}"


def _follow(settings: Settings) -> str:
    if settings.output_repo is None:
        return "follow: on the machine only (no OUTPUT_REPO): trainbox status --watch"
    return f"follow: {status.follow_line(settings.output_repo)}"


def _host(settings: Settings) -> str:
    name = socket.gethostname()
    access = settings.provider
    if access.provider is Provider.NONE or not access.instance_id:
        return name
    return f"{name} ({access.provider} instance {access.instance_id})"


def _scheme(url: Secret) -> str:
    return url.reveal().partition("://")[0].lower()


# -- apprise ---------------------------------------------------------------------------------------
_apprise_lock = threading.Lock()


def _apprise() -> Any:
    """apprise, imported on first use, its logger kept from the console before it can print anything (its
    lines name URLs and their parts); why a send failed comes from the call's own log capture (``_send_one``)."""
    with _apprise_lock:
        quiet = logging.getLogger("apprise")
        if not quiet.handlers or not isinstance(quiet.handlers[0], logging.NullHandler):
            quiet.handlers[:] = [logging.NullHandler()]
            quiet.propagate = False
        import apprise

        return apprise


def _asset(apprise: Any) -> Any:
    """The messages are signed Trainbox (a service that shows the sender's name or icon shows ours)."""
    from .. import __version__

    return apprise.AppriseAsset(app_id="Trainbox", app_desc=f"Trainbox {__version__}")


def _send_one(url: str, title: str, body: str, level: str) -> str | None:
    """Send to one target from this thread, within apprise's own ``timeout``; None when delivered, else the
    reason from apprise's log of this call (captured through ``log_callback``, never printed)."""
    apprise = _apprise()
    sender = apprise.Apprise(asset=_asset(apprise))
    if not sender.add(url):
        return "apprise cannot use this URL"
    said: list[str] = []
    result = sender.notify(
        body=body,
        title=title,
        notify_type=apprise.NotifyType(level),
        timeout=SEND_BOUND,
        log_callback=lambda entry, _service: said.append(str(entry.message)),
        log_level=logging.WARNING,
    )
    if result:
        return None
    if result.status == apprise.AppriseResultStatus.TIMEOUT:
        return "the service did not answer in time"
    return _why(said[-1] if said else "")


def _why(said: str) -> str:
    """apprise's reason in words of our own: its lines may name a part of the URL (an ntfy topic, a
    webhook's path), which is the secret, so they are never repeated."""
    status = re.search(r"error=(\d{3})\b", said)
    if status:
        return f"the service answered HTTP {status.group(1)}"
    lowered = said.lower()
    if "timed out" in lowered or "timeout" in lowered:
        return "the service did not answer in time"
    if "connection" in lowered:
        return "the service could not be reached"
    return "the service refused the message"


@contextlib.contextmanager
def _never_fails(what: str) -> Iterator[None]:
    """A message is a courtesy: whatever breaks while making or sending it is one line, never the job's end."""
    try:
        yield
    except StopRequested:
        raise  # the job's stop is never a message's to swallow
    except Exception as error:
        logger.warning(
            "NOTIFY: the %s message was not sent (%s)", what, type(error).__name__
        )  # its text may quote a URL


# -- the one notifier of this process (for the stages that have no handle on the job) ---------------
_installed: list[Notifier] = []


def install(notifier: Notifier) -> Notifier:
    _installed[:] = [notifier]
    return notifier


def event(kind: str, text: str) -> None:
    """Tell NOTIFY (with NOTIFY_ON=all) of something worth a look: ``event("fallback", "…")``. Returns at
    once; never raises; nothing happens outside a job or without NOTIFY."""
    try:
        for notifier in _installed:
            notifier.event(kind, text)
    except StopRequested:
        raise
    except Exception as error:  # a message is never worth a failure
        logger.debug("notify: %s", error)
