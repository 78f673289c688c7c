"""``gpuslice delete-policies``: the first step of an uninstall, as the Helm chart's pre-delete hook runs it.

Every GpuSlicePolicy is deleted while the controller still runs: its finalizer holds a policy
until no claim holds its devices, removes the admin-access labels it set, and garbage collection
takes what the policy owns. Only then may the controller go; deleted later, a policy would keep
its finalizer (and the CRD, and its DeviceClasses) for good. So this waits for the policies to be
gone, and when claims still hold their devices it fails, naming them: delete those workloads
first, then uninstall again. It needs only get, list and delete on GpuSlicePolicies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import click

from gpuslice.coordinates import POLICIES, policy_path
from gpuslice.errors import GpusliceError
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from gpuslice.kube.credentials import KubeconfigError
from gpuslice.settings import KUBECONFIG_HELP


class PoliciesRemain(GpusliceError):
    """Policies still there when the time ran out; the message names them and what holds them."""


def _holding(policy: dict[str, object]) -> str:
    status = policy.get("status") or {}
    claims = status.get("holdingClaims") if isinstance(status, dict) else None
    name = str(policy["metadata"]["name"])  # type: ignore[index]
    return f"{name} (held by {', '.join(map(str, claims))})" if claims else f"{name} (not yet released)"


async def delete_all(kube: KubeClient, within: float, *, say: Callable[[str], None],
                     poll: float = 2.0) -> int:
    """Delete every policy and wait until none is left; the number deleted."""
    try:
        policies = await kube.list(POLICIES)
    except NotFound:
        say("no GpuSlicePolicy CRD: nothing to delete")
        return 0
    for policy in policies:
        name = policy["metadata"]["name"]
        try:
            await kube.delete(policy_path(name))
        except NotFound:
            continue
        say(f"deleting GpuSlicePolicy {name}")
    deadline = time.monotonic() + within
    while left := await kube.list(POLICIES):
        if time.monotonic() >= deadline:
            raise PoliciesRemain(
                f"{len(left)} GpuSlicePolicies are still there after {within:.0f} s, waiting for claims to release"
                f" their devices: {'; '.join(_holding(p) for p in left)}. Delete the workloads that hold those"
                " claims (kubectl gpuslice status shows them), then uninstall again.")
        await asyncio.sleep(poll)
    say(f"deleted {len(policies)} GpuSlicePolicies; the controller released what each one made")
    return len(policies)


@click.command(name="delete-policies")
@click.option("--kubeconfig", type=click.Path(path_type=Path), help=KUBECONFIG_HELP)
@click.option("--timeout", type=click.FloatRange(min=0), default=240.0, show_default=True,
              help="Seconds to wait for the policies to be gone.")
def delete_policies(kubeconfig: Path | None, timeout: float) -> None:
    """Delete every GpuSlicePolicy and wait until the controller has released them (the first step
    of an uninstall: the Helm chart's pre-delete hook runs it). Fails, naming the claims that hold
    devices, when they are not gone in time."""

    async def run() -> None:
        kube = await KubeClient.from_kubeconfig(kubeconfig)
        try:
            await delete_all(kube, timeout, say=click.echo)
        finally:
            await kube.close()

    try:
        asyncio.run(run())
    except (PoliciesRemain, KubeError, KubeconfigError) as error:
        raise click.ClickException(str(error)) from None
