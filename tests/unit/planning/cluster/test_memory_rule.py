"""The maxMemory webhook's configuration as the API server holds it: the controller's probe proves
only that a claim's creation reaches the webhook, so it also reads the configuration, and one that
would let an allocation write past it (a rule dropped, a condition, selector or failure policy
changed) keeps maxMemory tenants out, as a probe that fails does."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.planning.cluster.memory_rule import memory_webhook, memory_webhook_drift


def shipped(url: str | None = None) -> dict[str, Any]:
    config = memory_webhook(url, "Q0E=")
    hook = config["webhooks"][0]
    hook["objectSelector"] = {}  # what the API server defaults
    hook["timeoutSeconds"] = 10  # the install's to set
    return config


def test_the_configuration_gpuslice_ships_judges_every_allocation() -> None:
    assert memory_webhook_drift(shipped(), CONTROLLER_NAMESPACE) is None
    assert memory_webhook_drift(shipped("https://127.0.0.1:9443/validate/maxmemory"), CONTROLLER_NAMESPACE) is None
    wider = shipped()
    wider["webhooks"][0]["rules"] = [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"],
                                      "resources": ["*/*"], "scope": "*"}]
    assert memory_webhook_drift(wider, CONTROLLER_NAMESPACE) is None, "a rule that matches more drops nothing"


def _hook(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    config = copy.deepcopy(shipped())
    change(config["webhooks"][0])
    return config


@pytest.mark.parametrize(("what", "config", "said"), [
    ("the allocation rule dropped", _hook(lambda h: h["rules"].pop()), "UPDATE of resourceclaims/status"),
    ("the status subresource no more", _hook(lambda h: h["rules"][1].update(resources=["resourceclaims"])),
     "UPDATE of resourceclaims/status"),
    ("creation only", _hook(lambda h: h["rules"][1].update(operations=["CREATE"])), "UPDATE"),
    ("a matchCondition that leaves allocations out", _hook(lambda h: h["matchConditions"][0].update(
        expression="request.operation == 'CREATE'")), "matchConditions"),
    ("failurePolicy Ignore", _hook(lambda h: h.update(failurePolicy="Ignore")), "failurePolicy"),
    ("another namespaceSelector", _hook(lambda h: h.update(namespaceSelector={"matchLabels": {"x": "y"}})),
     "namespaceSelector"),
    ("an objectSelector", _hook(lambda h: h.update(objectSelector={"matchLabels": {"x": "y"}})), "objectSelector"),
    ("the webhook renamed", _hook(lambda h: h.update(name="other.example.com")), "no webhook"),
])
def test_a_configuration_that_lets_an_allocation_past_is_found(what: str, config: dict[str, Any], said: str) -> None:
    found = memory_webhook_drift(config, CONTROLLER_NAMESPACE)
    assert found is not None, what
    assert said in found, found
