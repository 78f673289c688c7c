"""The API server's audit log of gpuslice's own requests: what the controller, the webhook and
each node agent asked, counted by the server rather than by our own counters.

The dev cluster's kube-apiserver logs, at level Metadata, every request of a user in the group
``system:serviceaccounts:gpuslice-system`` (gpuslice's ServiceAccounts: the controller, the
webhook, the agents, whose node-bound tokens name their node) and nothing else, so the log stays
small whatever else runs. ``apiserver_request_total`` counts every client together (the
scheduler, the controller manager, the bench itself) and says nothing of who asked, nor in which
namespace; this does.

Each request is one line per stage; RequestReceived is omitted, so a request is logged when its
answer starts (ResponseStarted, long-running requests only: a watch is counted when it opens) and
when it completes. :class:`AuditLog` keeps the first line of each ``auditID``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GROUP = "system:serviceaccounts:gpuslice-system"
NODE_EXTRA = "authentication.kubernetes.io/node-name"
POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    userGroups: ["{GROUP}"]
  - level: None
"""


def apiserver_flags(policy: Path, log: Path) -> list[str]:
    """kube-apiserver's flags for the log at ``log`` (written in blocking mode: a request's line is
    there before its answer, so a test reads what it just caused), with its policy written to ``policy``."""
    policy.write_text(POLICY)
    return [f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-format=json",
            "--audit-log-mode=blocking", "--audit-log-maxbackup=0", "--audit-log-maxsize=0"]


@dataclass(frozen=True)
class Request:
    """One request as the audit log has it."""

    user: str  # system:serviceaccount:gpuslice-system:gpuslice-agent
    node: str  # the node a node-bound token names ("" for others)
    verb: str  # get, list, watch, create, patch, update, delete, deletecollection
    resource: str  # pods, resourceslices/status, or the path for a non-resource URL
    namespace: str
    name: str
    code: int  # 0 while a watch is open
    time: str  # requestReceivedTimestamp
    dry_run: bool

    @property
    def who(self) -> str:
        """The ServiceAccount's name (gpuslice-agent, gpuslice-controller), or the user."""
        return self.user.rsplit(":", 1)[-1] if self.user.startswith("system:serviceaccount:") else self.user

    @property
    def key(self) -> str:
        """``list pods`` (what a figure counts by)."""
        return f"{self.verb} {self.resource}"

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Request:
        user = event.get("user") or {}
        ref = event.get("objectRef") or {}
        resource = str(ref.get("resource") or event.get("requestURI", "").split("?", 1)[0])
        if ref.get("subresource"):
            resource += "/" + str(ref["subresource"])
        nodes = (user.get("extra") or {}).get(NODE_EXTRA) or [""]
        return cls(str(user.get("username") or ""), str(nodes[0]), str(event.get("verb") or ""), resource,
                   str(ref.get("namespace") or ""), str(ref.get("name") or ""),
                   int((event.get("responseStatus") or {}).get("code") or 0),
                   str(event.get("requestReceivedTimestamp") or ""), "dryRun=" in str(event.get("requestURI", "")))


class AuditLog:
    """The audit log at ``path``, read from a mark on: ``mark()`` before, ``since(mark)`` after."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """Where the log ends now."""
        return self.path.stat().st_size if self.path.exists() else 0

    def _lines(self, start: int) -> Iterator[str]:
        if not self.path.exists():
            return
        with self.path.open("rb") as log:
            log.seek(start)
            for raw in log:
                if raw.endswith(b"\n"):  # a line half-written now is read next time
                    yield raw.decode(errors="replace")

    def since(self, mark: int = 0) -> list[Request]:
        """Each request logged after ``mark``, once (by auditID), in the order they were logged."""
        seen: set[str] = set()
        found = []
        for line in self._lines(mark):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            audit_id = str(event.get("auditID") or "")
            if audit_id in seen:
                continue
            seen.add(audit_id)
            found.append(Request.from_event(event))
        return found


def count(requests: Iterable[Request], by: str = "key") -> Counter[str]:
    """Requests counted by one of :class:`Request`'s fields or properties (``key``: verb and resource)."""
    return Counter(str(getattr(r, by)) for r in requests)
