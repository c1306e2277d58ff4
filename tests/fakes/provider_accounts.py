"""The providers' fakes (providers.py) with the account's other instances beside their own, for a container that
asks its provider about the instance that held its run's lease (entrypoint/release/elsewhere.py).

``others`` maps another instance's id to how its record reads (Vast.ai: ``actual_status``, ``intended_status``,
``cur_state``; RunPod: the Pod's ``status``), or to None: that id answers 404. ``delay``: seconds every answer
takes (a provider slower than the relaunch waits). The fakes' own instance and faults behave as before.
"""

from __future__ import annotations

import re
import time
from typing import Any

from tests.fakes.providers import FakeRunPod, FakeVast


class VastAccount(FakeVast):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.others: dict[str, dict[str, Any] | None] = {}
        self.delay = 0.0

    def __enter__(self) -> VastAccount:
        self.start()
        return self

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        time.sleep(self.delay)
        match = re.fullmatch(r"/api/v0/instances/([^/]+)/", path)
        if match is None or match.group(1) not in self.others or method != "GET":
            return super()._route(method, path, body)
        record = self.others[match.group(1)]
        if record is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"}, {}
        return 200, {"instances": {"id": match.group(1), "dph_total": self.price, **record}}, {}


class RunPodAccount(FakeRunPod):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.others: dict[str, str | None] = {}
        self.delay = 0.0

    def __enter__(self) -> RunPodAccount:
        self.start()
        return self

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        time.sleep(self.delay)
        match = re.fullmatch(r"/v2/pods/([^/]+)", path)
        if match is None or match.group(1) not in self.others or method != "GET":
            return super()._route(method, path, body)
        status = self.others[match.group(1)]
        if status is None:
            return self._error(404, "pod not found")
        return self._ok(200, self._pod(status) | {"id": match.group(1)})
