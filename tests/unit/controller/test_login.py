"""Kopf's login: a counted session, and a rejected login is not tried again and again."""

from __future__ import annotations

import asyncio

import kopf
import pytest
from kopf._cogs.structs import credentials

from gpuslice.controller.login import counted_session


async def test_credentials_the_server_rejected_are_given_up_as_kopf_does() -> None:
    """Kopf tells a new login from the one that failed by comparing them; equal means give up."""
    info = kopf.ConnectionInfo(server="https://127.0.0.1:1", token="revoked")
    vault = credentials.Vault()
    await vault.populate({"login": counted_session(info)})
    key, item = next(iter(vault._current.items()))
    invalidated = asyncio.create_task(vault.invalidate(key, item.info, exc=RuntimeError("401 Unauthorized")))
    await asyncio.sleep(0.05)
    again = counted_session(kopf.ConnectionInfo(server="https://127.0.0.1:1", token="revoked"))
    assert again is item.info, "the same credentials, the same session"
    await vault.populate({"login": again})
    # Taken again, the rejected login would make every watcher retry at once, without pause.
    with pytest.raises(credentials.LoginError):
        await asyncio.wait_for(invalidated, 5)
    await again.aiohttp_session.close()
    renewed = counted_session(kopf.ConnectionInfo(server="https://127.0.0.1:1", token="renewed"))
    assert renewed is not again, "new credentials, a new session"
    await renewed.aiohttp_session.close()
