"""The audit log of gpuslice's requests: one request per auditID whatever its stages, who asked
(an agent's node from its node-bound token), and read on from a mark."""

from __future__ import annotations

import json
from pathlib import Path

from gpuslice.devcluster.audit import GROUP, NODE_EXTRA, POLICY, AuditLog, apiserver_flags, count

AGENT = "system:serviceaccount:gpuslice-system:gpuslice-agent"


def event(audit_id: str, stage: str, verb: str, resource: str, namespace: str = "", node: str = "",
          uri: str = "/apis/x") -> str:
    extra = {NODE_EXTRA: [node]} if node else {}
    return json.dumps({"auditID": audit_id, "stage": stage, "verb": verb, "requestURI": uri,
                       "user": {"username": AGENT, "groups": [GROUP], "extra": extra},
                       "objectRef": {"resource": resource, "namespace": namespace}, "responseStatus": {"code": 200},
                       "requestReceivedTimestamp": "2026-12-06T00:00:00Z"}) + "\n"


def test_each_request_once_with_who_asked_and_read_from_a_mark(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.log")
    assert log.since(log.mark()) == []  # no log yet
    log.path.write_text(event("1", "ResponseStarted", "watch", "resourceslices", node="n1")
                        + event("1", "ResponseComplete", "watch", "resourceslices", node="n1"))
    mark = log.mark()
    with log.path.open("a") as out:
        out.write(event("2", "ResponseComplete", "list", "pods", namespace="t1", uri="/api/v1/pods?limit=5"))
        out.write(event("3", "ResponseComplete", "patch", "resourceslices", node="n1", uri="/apis/x?dryRun=All"))
        out.write('{"auditID": "4", "stage": "Resp')  # a line being written: read next time
    [watch] = log.since(0)[:1]
    assert (watch.who, watch.node, watch.key) == ("gpuslice-agent", "n1", "watch resourceslices")
    later = log.since(mark)
    assert [(r.key, r.namespace, r.dry_run) for r in later] == [("list pods", "t1", False),
                                                                 ("patch resourceslices", "", True)]
    assert count(log.since(0)) == {"watch resourceslices": 1, "list pods": 1, "patch resourceslices": 1}
    assert count(later, "namespace") == {"t1": 1, "": 1}


def test_the_policy_logs_gpuslices_own_identities_only(tmp_path: Path) -> None:
    flags = apiserver_flags(tmp_path / "policy.yaml", tmp_path / "audit.log")
    assert f"--audit-policy-file={tmp_path / 'policy.yaml'}" in flags
    assert "--audit-log-mode=blocking" in flags
    assert (tmp_path / "policy.yaml").read_text() == POLICY
    assert f'userGroups: ["{GROUP}"]' in POLICY
    assert POLICY.rstrip().endswith("- level: None")
