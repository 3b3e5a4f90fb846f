"""`gateway serve | check-config | migrate-config | replay | evaluate | demo | fake-upstream | encryption rotate |
gc | tenant purge`."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from gateway.commands.migrate_config import migrate, render
from gateway.config import ConfigError, Settings, load_settings, policy_file, read_yaml
from gateway.upstream.encodings import use_bundled_encodings
from policies.presets import PRESET_NAMES, preset

log = logging.getLogger("gateway")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import CONFIG_ENV, create_app
    from gateway.edge.connections import PROTOCOL
    from gateway.edge.worker_sockets import SocketPerWorker, spreads_connections
    from gateway.ops.logs import logging_config, serve_logging
    from gateway.ops.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before the first thread the gateway starts, and for its workers
    settings = load_settings(args.config)
    serve_logging(settings.log_level, settings.log_format, settings.access_log)  # every line from here on
    # What it stands on answers before it serves; with several processes on one socket the schema is
    # brought up to date here, once, before any of them starts (each would race the others to migrate
    # a fresh SQLite file).
    problem = _cannot_start(settings, migrate=args.workers > 1)
    if problem is not None:
        log.error("gateway: cannot start: %s", problem)
        return 1
    where = {"http": PROTOCOL,  # header deadlines and the connection cap (gateway/edge/connections.py)
             "host": args.host or settings.server.host,
             "port": args.port if args.port is not None else settings.server.port, "log_level": settings.log_level,
             "log_config": logging_config(settings.log_level, settings.log_format, settings.access_log),
             "access_log": False,  # the gateway writes its own (gateway.access)
             "timeout_graceful_shutdown": settings.server.shutdown_grace_seconds}
    if args.workers <= 1:
        uvicorn.run(create_app(settings), **where)
        return 0
    os.environ[CONFIG_ENV] = str(Path(args.config).resolve())
    if not spreads_connections() or where["port"] == 0:  # port 0: each socket would get a port of its own
        uvicorn.run("gateway.app:app_from_environment", factory=True, workers=args.workers, **where)
        return 0
    supervisor = SocketPerWorker(
        uvicorn.Config("gateway.app:app_from_environment", factory=True, workers=args.workers, **where))
    supervisor.run()
    return 1 if supervisor.failed else 0


def _cannot_start(settings: Settings, *, migrate: bool) -> str | None:
    """What stops a start (the database or blob store not answering, Redis under `refuse`), in one
    line; the traceback as well at `log_level: debug`."""
    from gateway.app import build_store
    from gateway.ops.outages import check_at_start, failure_line

    store = None
    try:
        store = build_store(settings)
        check_at_start(settings, store, migrate=migrate)
    except Exception as exc:
        log.debug("the start failed", exc_info=exc)  # the traceback, at `log_level: debug`
        return failure_line(exc, settings)
    finally:
        if store is not None:
            store.engine.dispose()
    return None


def _check_config(args: argparse.Namespace) -> int:
    from gateway.commands.check_config import budget_warnings, connection_checks
    from gateway.upstream.litellm_client.client import LiteLLMUpstream  # LiteLLM's price map, for the budget warnings

    path = args.config_option or args.path
    if path is None:
        print("gateway: check-config needs a config: --config PATH", file=sys.stderr)
        return 2
    settings = load_settings(path)
    encryption = settings.storage.encryption_keys().current_id
    print(
        f"{path}: ok ({len(settings.models)} models, {len(settings.tenants)} tenants, "
        f"storage {settings.storage_url().split('://')[0]}"
        + (f", encrypted at rest under key {encryption})" if encryption else ")")
    )
    upstream = LiteLLMUpstream(direct_transport=False)
    for warning in budget_warnings(settings, lambda params: upstream.prices(params) is not None):
        print(f"gateway: warning: {warning}", file=sys.stderr)
    if not args.connect:
        return 0
    failed = 0
    for check in connection_checks(settings):
        failed += check.problem is not None
        print(f"{check.what}: {'ok' if check.problem is None else 'FAILED: ' + check.problem}")
    return 1 if failed else 0


def _migrate_config(args: argparse.Namespace) -> int:
    source = Path(args.litellm_config)
    if args.output and Path(args.output).resolve() == source.resolve():
        raise ConfigError(args.output, "", "is the LiteLLM config being converted: write the result elsewhere")
    migration = migrate(read_yaml(source), str(source))
    text = render(migration, str(source))
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(args.output, "", f"cannot write the file ({exc.strerror})") from exc
    else:
        sys.stdout.write(text)
    for note in migration.notes:
        print(f"gateway: note: {note}", file=sys.stderr)
    print(f"gateway: wrote {args.output or 'stdout'} ({len(migration.config['models'])} model entries, "
          f"{len(migration.notes)} notes); check it with `gateway check-config {args.output or 'PATH'}`",
          file=sys.stderr)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from gateway.commands.replay import LEGEND, CachePrices, TraceError, format_table, load_trace, replay_trace, totals

    if args.policy in PRESET_NAMES:
        policy = preset(args.policy)
    elif Path(args.policy).is_file():
        policy = policy_file(Path(args.policy))
    else:
        print(f"gateway: --policy {args.policy!r} is neither a preset ({', '.join(PRESET_NAMES)}) "
              "nor a policy file", file=sys.stderr)
        return 2
    prices = CachePrices(read=args.cache_read, write=args.cache_write, usd_per_mtok=args.usd_per_mtok)
    rows = []
    for trace_path in args.traces:
        try:
            trace = load_trace(trace_path)
        except TraceError as error:
            print(f"gateway: trace {error}", file=sys.stderr)
            return 2
        report = replay_trace(policy, trace, Path(trace_path).name, tenant=args.tenant)
        rows.append(report.summary(prices))
    total = totals(rows)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        print(json.dumps({"TOTAL": True, **total}))
    else:
        print(f"policy {policy.name} {policy.version_label}; cache prices read {prices.read}x, write {prices.write}x")
        print(format_table(rows, total))
        if args.legend:
            print(LEGEND)
    return 1 if total["protocol_violations"] or total["latest_round_lost"] or total["user_system_lost"] else 0


def _evaluate(args: argparse.Namespace) -> int:
    from gateway.commands.evaluate import run_evaluate

    return run_evaluate(args)


def _demo(args: argparse.Namespace) -> int:
    from gateway.commands.demo import DemoFailed, run_demo

    print(f"gateway demo: a real agent session (OpenHands on ponyc-4595, 23 tool calls) through {args.url}, "
          f"model {args.model!r}")
    try:
        result = run_demo(args.url, args.key, args.model)
    except DemoFailed as error:
        print(f"gateway demo: {error}", file=sys.stderr)
        return 1
    share = 1 - result.tokens_forwarded / result.tokens_sent if result.tokens_sent else 0.0
    print(f"session {result.session}: {result.requests} requests, {result.tokens_sent:,} prompt tokens sent by "
          f"the agent, {result.tokens_forwarded:,} forwarded ({share:.0%} fewer); "
          f"${result.saved_usd:.4f} saved of ${result.cost_original_usd:.4f}")
    print(f"open {args.url}/dashboard and sign in with the same key to see it")
    return 0


def _fake_upstream(args: argparse.Namespace) -> int:
    from gateway.fake_upstream.agent import DEFAULT_SCRIPT, AgentScript, ScriptError
    from gateway.fake_upstream.app import serve
    from gateway.fake_upstream.reader import Reader

    if sum(map(bool, (args.plain, args.script, args.reader))) > 1:
        print("gateway fake-upstream: give one of --plain, --script and --reader", file=sys.stderr)
        return 2
    try:
        agent = None if args.plain else Reader() if args.reader else \
            AgentScript.load(args.script) if args.script else DEFAULT_SCRIPT
    except ScriptError as error:
        print(f"gateway fake-upstream: {error}", file=sys.stderr)
        return 2
    mode = "plain (\"ok\")" if agent is None else "reader mode (READ and NEED lines)" if args.reader else \
        f"agent mode, {args.script or 'the built-in script'}"
    print(f"gateway fake-upstream: http://{args.host}:{args.port}/v1 (chat/completions, responses, messages), "
          f"{mode}", file=sys.stderr)
    serve(args.host, args.port, agent, delay=args.delay, keep_requests=args.keep_requests)
    return 0


def _rotate_keys(args: argparse.Namespace) -> int:
    from gateway.app import build_store

    settings = load_settings(args.config)
    if settings.storage.encryption_key is None:
        raise ConfigError(settings.source, "storage.encryption_key", "not set: there is no key to rotate to")
    store = build_store(settings)
    store.create_schema()
    report = store.rotate_keys(batch=args.batch)
    store.engine.dispose()
    for problem in report.unreadable:
        print(f"gateway: unreadable: {problem}", file=sys.stderr)
    print(json.dumps({"key_id": store.encryption.current_id, **report.as_dict(), "unreadable": len(report.unreadable)}))
    return 1 if report.unreadable else 0


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return number


def _moment(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not an ISO date or datetime") from exc
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def _print_counts(counts: dict[str, int]) -> None:
    width = max((len(name) for name in counts), default=0)
    for name, count in sorted(counts.items()):
        print(f"  {name:<{width}}  {count}")


def _gc(args: argparse.Namespace) -> int:
    from gateway.app import build_store
    from storage.retention import run_gc

    settings = load_settings(args.config)
    store = build_store(settings)
    try:
        store.create_schema()
        now = args.now or datetime.now(timezone.utc)
        report = run_gc(store, settings.retention_for, now, dry_run=args.dry_run,
                        batch_size=settings.retention.batch_size)
    finally:
        store.engine.dispose()
    if report.skipped:
        print("gc: another garbage collection holds the lock; nothing done", file=sys.stderr)
        return 3
    verb = "would remove" if args.dry_run else "removed"
    print(f"gc at {now.isoformat()}: {verb} {sum(report.counts.values())} row(s) and file(s); "
          f"{report.rolled_up} finished run(s) rolled up into the savings ledger")
    _print_counts(report.counts)
    return 0


def _tenant_purge(args: argparse.Namespace) -> int:
    import getpass
    import socket

    from gateway.app import build_store

    settings = load_settings(args.config)
    if not args.yes and not sys.stdin.isatty():
        print("gateway: tenant purge asks for confirmation and there is no terminal: pass --yes", file=sys.stderr)
        return 2
    store = build_store(settings)
    try:
        store.create_schema()
        counts = store.tenant_row_counts(args.tenant)
        configured = any(t.id == args.tenant for t in settings.tenants)
        if not configured and not any(counts.values()) and not args.unknown:
            print(f"gateway: tenant {args.tenant!r} is not in the config and has no records: nothing to purge "
                  "(--unknown purges it anyway, leaving an audit entry)", file=sys.stderr)
            return 1
        if not args.yes:
            print(f"tenant {args.tenant!r} has:")
            _print_counts(counts)
            note = " (it stays in the config: requests with its keys are recorded anew)" if configured else ""
            answer = input(f"remove all of it and its blob files{note}? type the tenant id to confirm: ")
            if answer.strip() != args.tenant:
                print("gateway: purge cancelled", file=sys.stderr)
                return 1
        result = store.purge_tenant(args.tenant, actor=f"cli:{getpass.getuser()}@{socket.gethostname()}")
    finally:
        store.engine.dispose()
    print(f"purged tenant {args.tenant!r} (audit entry {result.audit_id}):")
    _print_counts(result.counts)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("context-gateway")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    evaluate = sub.add_parser("evaluate", help="ask a deployment for each turn's next action under two policies "
                                                "and compare them")
    evaluate.add_argument("traces", nargs="*", help="trace files (as `replay` reads them)")
    evaluate.add_argument("--config", default="config.yaml", help="YAML config (default: config.yaml)")
    evaluate.add_argument("--model", required=True, help="the model of the config to ask")
    evaluate.add_argument("--policy", default="coding-agent", help="policy A: a preset or a YAML policy file "
                                                                    "(default: %(default)s)")
    evaluate.add_argument("--against", default="none", help="policy B: a preset, a policy file, or `none` for the "
                                                             "transcript unprojected (default: %(default)s)")
    evaluate.add_argument("--tenant", help="also the stored conversations of this tenant (the config's store)")
    evaluate.add_argument("--conversation", help="only this stored conversation (its session label, or its id)")
    evaluate.add_argument("--max-conversations", type=_positive, default=10,
                          help="stored conversations at most, the latest first (default: %(default)s)")
    evaluate.add_argument("--max-turns", type=_positive, default=30,
                          help="turns per conversation at most, from its start (default: %(default)s)")
    evaluate.add_argument("--json", metavar="FILE", help="write every turn's comparison here")
    evaluate.set_defaults(run=_evaluate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="Context gateway for tool-using agents")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    serve.add_argument("--config", default="config.yaml", help="YAML config (default: config.yaml)")
    serve.add_argument("--host", help="bind address (default: server.host of the config)")
    serve.add_argument("--port", type=int, help="port (default: server.port of the config)")
    serve.add_argument("--workers", type=int, default=1,
                       help="processes serving one socket (default 1); SQLite (WAL) and PostgreSQL both take them")
    serve.set_defaults(run=_serve)
    check = sub.add_parser("check-config", help="validate a config file without serving")
    check.add_argument("path", nargs="?", help="the config (or --config)")
    check.add_argument("--config", dest="config_option", metavar="PATH", help="YAML config, as the other commands take it")
    check.add_argument("--connect", action="store_true",
                       help="also connect to the database, Redis and the blob store (exit 1 if one fails)")
    check.set_defaults(run=_check_config)
    migrate_config = sub.add_parser("migrate-config", help="convert a LiteLLM Proxy config.yaml into this gateway's")
    migrate_config.add_argument("litellm_config", metavar="LITELLM_YAML", help="LiteLLM Proxy config file")
    migrate_config.add_argument("-o", "--output", metavar="OUT", help="write here (default: stdout)")
    migrate_config.set_defaults(run=_migrate_config)
    replay = sub.add_parser("replay", help="run agent traces through the assembler offline and print the figures")
    replay.add_argument("traces", nargs="+", help="trace files (JSON or JSONL with a `messages` list)")
    replay.add_argument("--policy", default="default", help=f"a preset ({', '.join(PRESET_NAMES)}) or a YAML policy file")
    replay.add_argument("--cache-read", type=float, default=0.1,
                        help="price of an input token read from the cache, relative to an uncached one (default 0.1)")
    replay.add_argument("--cache-write", type=float, default=1.25,
                        help="price of an input token written to the cache, relative to an uncached one; every "
                             "token not read from the cache is written (default 1.25, Anthropic's 5-minute cache)")
    replay.add_argument("--usd-per-mtok", type=float, default=3.0,
                        help="USD per million uncached input tokens, for the dollar figures (default 3.0)")
    replay.add_argument("--legend", action=argparse.BooleanOptionalAction, default=True,
                        help="explain the columns after the table (default: on)")
    replay.add_argument("--json", action="store_true", help="one JSON object per trace, then the totals")
    replay.add_argument("--tenant", default="replay",
                        help="tenant the ids are derived for (use the gateway's to compare with it exactly)")
    replay.set_defaults(run=_replay)
    _add_evaluate_parser(sub)
    demo = sub.add_parser("demo", help="send a bundled real agent session through a running gateway")
    demo.add_argument("--url", default="http://127.0.0.1:4000", help="the gateway (default: %(default)s)")
    demo.add_argument("--key", default="sk-acme-1", help="a tenant key (default: config.example.yaml's)")
    demo.add_argument("--model", default="demo", help="the model to ask (default: the offline demo model)")
    demo.set_defaults(run=_demo)
    fake = sub.add_parser("fake-upstream", help="serve a fake model provider offline (OpenAI and Anthropic APIs) "
                                                "that plays an agent: tool rounds, then an answer")
    fake.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    fake.add_argument("--port", type=int, default=18080, help="port (default: %(default)s)")
    fake.add_argument("--script", metavar="FILE",
                      help="agent script (JSON: `rounds` of tool calls, then `answer`; README: Try your agent "
                           "offline); default: three shell commands (pwd, ls -la, uname -s), then an answer")
    fake.add_argument("--plain", action="store_true",
                      help="no agent: answer \"ok\" to every request not queued with POST /_script")
    fake.add_argument("--reader", action="store_true",
                      help="a model that reads the files the first user message names (READ <path>) and reports "
                           "the facts it asks for (NEED <name>), or reads again what it cannot see")
    fake.add_argument("--delay", type=float, default=0.0, help="seconds before each plain answer (default 0)")
    fake.add_argument("--keep-requests", type=int, default=1000, help="requests remembered for GET /_requests")
    fake.set_defaults(run=_fake_upstream)
    # `encryption` (once `keys`, still accepted): the storage's encryption keys, not the API keys of /api/keys
    keys_command = sub.add_parser("encryption", aliases=["keys"],
                                  help="encryption at rest: re-seal the stored conversations under a new key")
    keys = keys_command.add_subparsers(dest="keys_command", required=True)
    rotate = keys.add_parser("rotate", help="re-seal everything stored under storage.encryption_key (safe while serving)")
    rotate.add_argument("--config", default="config.yaml", help="YAML config (default: config.yaml)")
    rotate.add_argument("--batch", type=_positive, default=200, help="rows re-sealed per transaction (default 200)")
    rotate.set_defaults(run=_rotate_keys)
    gc = sub.add_parser("gc", help="remove what the retention classes allow (and blob files nothing names)")
    gc.add_argument("--config", default="config.yaml", help="YAML config (default: config.yaml)")
    gc.add_argument("--now", type=_moment, help="collect as if it were this ISO time (default: now)")
    gc.add_argument("--dry-run", action="store_true", help="count what would go, remove nothing")
    gc.set_defaults(run=_gc)
    tenant = sub.add_parser("tenant", help="tenant operations").add_subparsers(dest="tenant_command", required=True)
    purge = tenant.add_parser("purge", help="remove every record and blob file of a tenant, leaving an audit entry")
    purge.add_argument("tenant", help="the tenant id")
    purge.add_argument("--config", default="config.yaml", help="YAML config (default: config.yaml)")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation (needed without a terminal)")
    purge.add_argument("--unknown", action="store_true",
                       help="purge a tenant that is neither in the config nor in the records (an audit entry only)")
    purge.set_defaults(run=_tenant_purge)
    return parser


def main(argv: list[str] | None = None) -> int:
    use_bundled_encodings()  # every command may count tokens
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as error:
        for problem in error.problems:
            print(f"gateway: config error: {problem.one_line()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
