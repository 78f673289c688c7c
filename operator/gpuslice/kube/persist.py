"""A refreshed oidc token written back to the kubeconfig it came from, as client-go's persister
does (clientcmd.PersistAuthProviderConfigForUser, then ModifyConfig): otherwise the next command
would start from the expired id-token, and an identity provider that rotates its refresh tokens
would refuse the old one it still holds.

Only the ``auth-provider.config`` of that user, in the file that defines it, changes; the file is
locked as clientcmd locks it (``FILE.lock``, created exclusively) and written in place, so its
mode, owner and a symlink to it stay. A write that fails is a warning: the token still serves
this process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import structlog
import yaml

log = structlog.get_logger(__name__)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.with_name(path.name + ".lock")
    descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        yield
    finally:
        os.close(descriptor)
        lock.unlink(missing_ok=True)


def persist_auth_provider(path: Path, user: str, settings: Mapping[str, Any]) -> None:
    """Write ``settings`` as the auth-provider config of ``user`` in ``path``."""
    try:
        with _locked(path):
            loaded = yaml.safe_load(path.read_text()) or {}
            entry = next((item.get("user") for item in loaded.get("users") or []
                          if isinstance(item, dict) and item.get("name") == user), None)
            provider = entry.get("auth-provider") if isinstance(entry, dict) else None
            if not isinstance(provider, dict):
                return  # the user or its provider is gone from the file since: nothing to update
            provider["config"] = dict(settings)
            path.write_text(yaml.safe_dump(loaded, default_flow_style=False, sort_keys=False))
    except (OSError, yaml.YAMLError) as error:
        log.warning("could not write the refreshed oidc token back to the kubeconfig", file=str(path), user=user,
                    error=str(error))
