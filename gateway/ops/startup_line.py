"""The one line a serving process logs once it is up: what it stands on and what it serves.

Storage by kind and URL, Redis (or none), the blob store, the model names, and which policy each
tenant is under; no credential: the URLs lose their passwords (storage/database.py,
storage/redis_link.py) and S3's keys are not named.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from gateway.config import Settings
from policies.policy import Policy
from storage.database import safe_url as database_url
from storage.redis_link import safe_url as redis_url

log = logging.getLogger("gateway")


def _blobs(settings: Settings) -> str:
    blobs = settings.storage.blobs
    if blobs.backend == "s3":
        return f"s3://{blobs.bucket}/{blobs.prefix}" + (f" at {blobs.endpoint_url}" if blobs.endpoint_url else "")
    return str(settings.resolve_path(settings.storage.blob_folder))


def startup_fields(settings: Settings, policies: Mapping[str, Policy]) -> dict[str, Any]:
    url = settings.storage_url()
    by_policy: dict[str, list[str]] = {}
    for tenant, policy in policies.items():
        by_policy.setdefault(f"{policy.name} {policy.version_label}", []).append(tenant)
    return {
        "pid": os.getpid(),
        "storage": url.split(":", 1)[0].split("+", 1)[0],
        "storage_url": database_url(url),
        "blobs": _blobs(settings),
        "encrypted_at_rest": settings.storage.encryption_key is not None,
        "redis": redis_url(settings.redis.url) if settings.redis.url else None,
        "models": list(dict.fromkeys(model.name for model in settings.models)),
        "policies": by_policy,
    }


def log_started(settings: Settings, policies: Mapping[str, Policy]) -> None:
    fields = startup_fields(settings, policies)
    log.info("gateway ready: %s storage, %s, %d models, %d tenants under %s", fields["storage"],
             f"redis {fields['redis']}" if fields["redis"] else "no redis", len(fields["models"]), len(policies),
             ", ".join(sorted({policy.name for policy in policies.values()})), extra={"fields": fields})
