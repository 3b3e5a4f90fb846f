"""What `gateway check-config` says beyond "it loads": warnings, and with `--connect` whether the
database, Redis and the blob store answer.

Warnings are about a config that serves but will not do what it says: a tenant budget over a
model nobody priced never triggers (its runs cost $0). Connection checks open what `gateway serve`
would open and report each in one line, so an operator sees every unreachable service in one run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from gateway.config import Settings


@dataclass(frozen=True)
class Check:
    what: str  # "database sqlite:///...", "redis redis://...", "blobs s3 bucket ..."
    problem: str | None  # None: it answered


def budget_warnings(settings: Settings, priced: Callable[[Mapping[str, Any]], bool]) -> list[str]:
    """A line per tenant budget that a model it may use cannot count against (no price anywhere)."""
    warnings = []
    for index, tenant in enumerate(settings.tenants):
        if tenant.budget.usd_per_day is None and tenant.budget.usd_per_month is None:
            continue
        names = sorted(tenant.models if tenant.models is not None else {m.name for m in settings.models})
        for name in names:
            for deployment_id, entry in settings.deployments(name) if "*" not in name else ():
                if not priced(entry.litellm_params):
                    warnings.append(
                        f"{settings.source}: tenants[{index}].budget: model {name!r} ({deployment_id}, "
                        f"{entry.litellm_params['model']}) has no price (set litellm_params.input_cost_per_token "
                        "and output_cost_per_token): its runs cost $0 and never count against the budget")
    return warnings


def connection_checks(settings: Settings) -> list[Check]:
    """The database, Redis (if configured) and the blob store, each tried once."""
    return [_database(settings), *([_redis(settings.redis.url)] if settings.redis.url else []), _blobs(settings)]


def _database(settings: Settings) -> Check:
    from sqlalchemy import text

    from storage.database import make_engine

    url = settings.storage_url()
    what = f"database {_without_password(url)}"
    try:
        engine = make_engine(url, pool_size=1)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:  # any driver's failure is the answer
        return Check(what, _first_line(getattr(exc, "orig", None) or exc))
    return Check(what, None)


def _redis(url: str) -> Check:
    import redis

    what = f"redis {_without_password(url)}"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return Check(what, _first_line(exc))
    return Check(what, None)


def _blobs(settings: Settings) -> Check:
    blobs = settings.storage.blobs
    if blobs.backend != "s3":
        folder = settings.resolve_path(settings.storage.blob_folder)
        what = f"blobs folder {folder}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / ".check-config"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            return Check(what, exc.strerror or str(exc))
        return Check(what, None)
    from storage.s3_blobs import S3BlobStore

    what = f"blobs s3 bucket {blobs.bucket!r}"
    try:
        S3BlobStore.connect(blobs.bucket or "", prefix=blobs.prefix, endpoint_url=blobs.endpoint_url,
                            region=blobs.region, access_key_id=blobs.access_key_id,
                            secret_access_key=blobs.secret_access_key).check()
    except Exception as exc:
        return Check(what, _first_line(exc))
    return Check(what, None)


def _without_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads (a Redis URL with odd parts): its scheme and host only
        return url.split("@")[-1]


def _first_line(exc: object) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
