"""`gateway serve | check-config | replay`."""
from __future__ import annotations

import argparse
import sys

from gateway.config import ConfigError, load_settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app

    settings = load_settings(args.config)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=args.host or settings.server.host,
        port=args.port if args.port is not None else settings.server.port,
        log_level=settings.log_level,
    )
    return 0


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.path)
    print(
        f"{args.path}: ok ({len(settings.models)} models, {len(settings.tenants)} tenants, "
        f"storage {settings.storage_url().split('://')[0]})"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="Context gateway for tool-using agents")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    serve.add_argument("--config", default="config.yaml", help="YAML config (default: config.yaml)")
    serve.add_argument("--host", help="bind address (default: server.host of the config)")
    serve.add_argument("--port", type=int, help="port (default: server.port of the config)")
    serve.set_defaults(run=_serve)
    check = sub.add_parser("check-config", help="validate a config file without serving")
    check.add_argument("path")
    check.set_defaults(run=_check_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as error:
        print(f"gateway: config error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
