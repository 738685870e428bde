"""The `ki` command line.

Every command loads the one settings object first, so a bad config fails before anything starts.
Errors a user can fix print one line and exit with a non-zero code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ki.errors import PermanentError
from ki.exposure import refuse_exposure
from ki.settings import Settings, load_settings, with_overrides


class CliError(PermanentError):
    """An error the user can act on; printed as one line."""


def _stack(args: argparse.Namespace, settings: Settings) -> int:
    from apps.dev.stack import manager
    from apps.dev.stack.cluster import with_profile

    settings = with_profile(settings, cluster=args.action == "up" and args.cluster)

    # Annotated: the commands' signatures differ, so mypy would otherwise infer the values as plain `function`.
    actions: dict[str, Callable[..., int]] = {
        "up": manager.up,
        "down": manager.down,
        "status": manager.status,
        "logs": manager.logs,
        "connect": manager.connect,
        "stop": manager.stop_service,
        "start": manager.start_service,
        "wipe": manager.wipe,
    }
    action = actions[args.action]
    if args.action == "logs":
        return action(settings, service=args.service, lines=args.lines)
    if args.action in ("stop", "start"):
        return action(settings, args.service)
    if args.action == "up":
        return action(settings, idp=args.idp, secure=args.secure)
    return action(settings)


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from ki.db.migrate import current_revision, downgrade, upgrade

    before = current_revision(settings)
    if args.down_to:
        downgrade(settings, revision=args.down_to)
    else:
        upgrade(settings, revision=args.revision)
    after = current_revision(settings)
    print(f"schema: {before or 'empty'} -> {after or 'empty'}" if before != after else f"schema: already at {after}")
    return 0


def _mcp(args: argparse.Namespace, settings: Settings) -> int:
    from apps.runtime.mcp_server import main as mcp_main

    if args.port is not None and not 1 <= args.port <= 65535:
        raise CliError("--port must be a port number (1-65535)")
    if not args.stdio:  # stdio listens nowhere
        refuse_exposure(settings, "mcp")
    return mcp_main(settings, stdio=args.stdio, port=args.port)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    if args.workers < 1:
        raise CliError("--workers must be at least 1")
    refuse_exposure(settings)  # before any worker starts: one line, not one per worker (each asks again)
    if args.workers > 1:
        from apps.runtime.serve_workers import run_workers

        return run_workers(args.workers, config=args.config)
    from search.web.api import serve

    serve(settings, reuse_port=args.reuse_port)
    return 0


def _embed(args: argparse.Namespace, settings: Settings) -> int:
    from apps.runtime.embed_server import ServerLimits, serve

    if not 1 <= args.port <= 65535:
        raise CliError("--port must be a port number (1-65535)")
    limits = ServerLimits(running=args.running, waiting=args.waiting, max_inputs=args.max_inputs,
                          retry_after_s=args.retry_after)  # fmt: skip
    return serve(settings, host=args.host, port=args.port, limits=limits, api_key_env=args.api_key_env)


def _token(args: argparse.Namespace, settings: Settings) -> int:
    from search.web.auth import mint_token

    if args.ttl < 1:
        raise CliError("--ttl must be at least 1 second")
    split = lambda v: [p.strip() for p in (v or "").split(",") if p.strip()]  # noqa: E731
    print(mint_token(settings.api, args.sub, groups=split(args.groups), roles=split(args.roles), ttl_s=args.ttl))
    return 0


def _sync(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "run" and args.lane == "all":
        from streams.topics import ensure_topics

        ensure_topics(settings)  # once, before the lanes race to it
        from apps.runtime.sync_lanes import run_lanes

        return run_lanes(settings, config=args.config, loglevel=args.loglevel)
    if args.action == "run":
        from streams.topics import ensure_topics, start_new_partitions_at_end

        ensure_topics(settings)
        if args.lane == "principals":  # a fast path: history is the access lane's
            start_new_partitions_at_end(settings, "principals")
        from streams.app import create_app

        if args.lane == "content" and settings.streams.content_nice:
            os.nice(settings.streams.content_nice)  # embedding yields the CPU to everything else
        if args.lane == "content" and settings.streams.content_embed_threads:
            threads = settings.streams.content_embed_threads
            settings = with_overrides(settings, {"embedding": {"threads": threads}})
        from ki.embedding import create_embedder

        # The model first: loading it holds the GIL for seconds (minutes at a low priority on a busy machine),
        # which would stall a joined worker's heartbeats until the group drops it. Only the content lane embeds:
        # the others need the tokenizer (they cut text) and the signature, never the model.
        embedder = create_embedder(settings, lazy=args.lane != "content")
        app = create_app(settings, args.lane, embedder)  # this process's settings (--config, $KI_CONFIG, KI_*)
        # Faust spells "warning" as "warn".
        sys.argv = ["ki sync", "worker", "--loglevel", {"warning": "warn"}.get(args.loglevel, args.loglevel)]
        app.main()
        return 0
    from streams.status import print_status

    return print_status(settings)


def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    """`ki dlq list | replay | drop`: the dead letters waiting, and each replay or drop logged in ki_dlq_operations."""
    import asyncio
    import getpass
    import json
    import time

    from ki.clients import make_engine
    from streams import dlq
    from streams.dead_letters import SelectionError, by_key, select, summary_line, table_lines

    operator = (args.by or "").strip() if args.by is not None else getpass.getuser()
    if not operator:
        raise CliError("dlq: --by must name who acts")
    if args.action == "drop" and not (args.reason or "").strip():
        raise CliError('dlq drop: --reason "..." is required: say why these dead letters are dropped')
    if args.action == "list" and (args.key or args.all):
        raise CliError("dlq list: --key and --all select for replay and drop; list shows every waiting dead letter")
    engine = make_engine(settings, pooled=False)
    try:
        waiting = dlq.read_waiting(settings, engine)
        if args.action == "list":
            summaries = by_key(waiting)
            if args.json:
                print(json.dumps([s.as_json() for s in summaries], indent=2))
            elif not summaries:
                print(f"no dead letter waits on {settings.streams.dlq_topic}")
            else:
                print("\n".join(table_lines(summaries, time.time())))
            return 0
        try:
            chosen = select(waiting, args.key or [], args.all, args.action)
        except SelectionError as exc:
            raise CliError(str(exc)) from None
        if args.action == "drop":
            op = dlq.drop(engine, settings.streams.dlq_topic, chosen, operator, args.reason.strip())
        else:
            op = asyncio.run(dlq.replay(settings, engine, chosen, operator, (args.reason or "").strip() or None))
    finally:
        engine.dispose()
    print(f"{summary_line(args.action, op.counts())} ({', '.join(dict.fromkeys(d.key for d, _, _ in op.outcomes))})")
    for letter, detail in op.failed:
        print(f"ki: dlq replay: {letter.key} still waits: {detail}", file=sys.stderr)
    return 1 if op.failed else 0


def _rebuild(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from apps.runtime.progress import StepReport
    from streams.replay import rebuild, rebuild_from_postgres

    # --from-postgres: the CDC topics lost their history (deleted, retention), so PostgreSQL is read instead.
    run = rebuild_from_postgres if args.from_postgres else rebuild
    with StepReport("rebuild") as steps:
        asyncio.run(run(settings, progress=steps.line, on_progress=steps.advance))
    return 0


def _backfill(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from apps.runtime.progress import StepReport
    from streams.replay import backfill

    with StepReport("backfill") as steps:
        stats = asyncio.run(backfill(settings, on_progress=steps.advance))
    print(
        f"backfill: {stats.versions_projected} versions, {stats.rows_written} rows written, "
        f"{stats.rows_embedded} embedded"
    )
    return 0


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from apps.dev.demo.commands import run_demo, run_generate

    if args.scale < 1:
        raise CliError("--scale must be at least 1")
    if args.action == "generate":
        return run_generate(settings, scale=args.scale, seed=args.seed)
    return run_demo(settings, scale=args.scale, seed=args.seed, config=args.config)


def _reconcile(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from apps.runtime.progress import StepReport
    from streams.replay import reconcile

    with StepReport("reconcile") as steps:
        report = asyncio.run(reconcile(settings, progress=steps.line, on_progress=steps.advance))
    return 0 if report is not None else 1


def _int_list(flag: str, value: str, low: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise CliError(f"{flag} must be comma-separated integers, got {value!r}") from None
    if any(v < low for v in values):
        raise CliError(f"{flag} values must be at least {low}")
    return values


def _env_pairs(flag: str, value: str) -> dict[str, str]:
    """`KI_A=1,KI_B=x` -> {"KI_A": "1", "KI_B": "x"}: settings overrides only (names starting KI_)."""
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, setting = item.partition("=")
        if not sep or not name.startswith("KI_") or not setting:
            raise CliError(f"{flag}: {item!r} is not KI_<SECTION>__<FIELD>=<value>")
        pairs[name] = setting
    return pairs


def _bench_search(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from apps.dev.bench.search import DEFAULT_SCALE, BenchError, BenchOptions
    from apps.dev.bench.search import main as bench_search

    for flag, value in (
        ("--scale", args.scale),
        ("--requests", args.requests),
        ("--rounds", args.rounds),
        ("--workers", args.workers),
    ):
        if value is not None and value < 1:
            raise CliError(f"{flag} must be at least 1")
    concurrency = _int_list("--concurrency", args.concurrency, 1)
    if not concurrency:
        raise CliError("--concurrency needs at least one level")
    options = BenchOptions(
        scale=args.scale or DEFAULT_SCALE,
        seed=args.seed,
        concurrency=concurrency,
        rounds=args.rounds,
        requests=args.requests,
        scope_sizes=_int_list("--scope-sizes", args.scope_sizes, 1),
        caller_set=args.callers,
        workers=args.workers,
        index_missing=not args.no_indexing,
        out_dir=Path(args.out) if args.out else BenchOptions().out_dir,
        config=args.config,
        command="ki " + " ".join(sys.argv[1:]),
        compare_env=_env_pairs("--compare-env", args.compare_env),
        compare_checkout=args.compare_checkout or None,
    )
    try:
        return bench_search(settings, options)
    except BenchError as exc:
        raise CliError(str(exc)) from None


def _bench_corpus(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from apps.dev.bench.large_corpus import CorpusError, CorpusOptions
    from apps.dev.bench.large_corpus import main as bench_corpus

    if args.scale < 1 or args.segments < 1:
        raise CliError("--scale and --segments must be at least 1")
    if not 0 < args.bank_fraction <= 1 or (args.cosine is not None and not 0 < args.cosine < 1):
        raise CliError("--bank-fraction must be in (0, 1] and --cosine in (0, 1)")
    options = CorpusOptions(
        scale=args.scale, seed=args.seed, bank_fraction=args.bank_fraction, cosine=args.cosine,
        segments=args.segments, out_dir=Path(args.out), command="ki " + " ".join(sys.argv[1:]),
    )  # fmt: skip
    try:
        return bench_corpus(settings, options)
    except CorpusError as exc:
        raise CliError(str(exc)) from None


def _bench_principals(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from apps.dev.bench.principals import PrincipalsOptions
    from apps.dev.bench.principals import main as bench_principals
    from apps.dev.bench.search import BenchError

    if args.groups < 2 or not 0 <= args.granting < args.groups or args.rounds < 1 or args.requests < 1:
        raise CliError("--groups must be at least 2, --granting in [0, groups), --rounds and --requests at least 1")
    options = PrincipalsOptions(
        groups=args.groups, granting=args.granting, scale=args.scale, concurrency=_int_list("--concurrency",
        args.concurrency, 1), rounds=args.rounds, requests=args.requests, config=args.config,
        out_dir=Path(args.out) if args.out else PrincipalsOptions.out_dir, command="ki " + " ".join(sys.argv[1:]),
    )  # fmt: skip
    try:
        return bench_principals(settings, options)
    except BenchError as exc:
        raise CliError(str(exc)) from None


def _bench_injection(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from apps.dev.bench.injection import ATTACKS, InjectionOptions, default_data
    from apps.dev.bench.injection import main as bench_injection
    from apps.dev.eval.beir import DataError

    data = [Path(d) for d in args.data] if args.data else default_data()
    if not data:
        raise CliError("no data set to scan: none in the shared data folder; pass --data (a BEIR folder)")
    for folder in data:
        if not folder.is_dir():
            raise CliError(f"--data {folder}: no such directory")
    attacks = Path(args.attacks) if args.attacks else ATTACKS
    if not attacks.is_file():
        raise CliError(f"--attacks {attacks}: no such file")
    options = InjectionOptions(
        data=data, attacks=attacks, out=Path(args.out or "benchmarks/injection.json"),
        command="ki " + " ".join(sys.argv[1:]),
    )  # fmt: skip
    try:
        return bench_injection(settings, options)
    except DataError as exc:
        raise CliError(str(exc)) from None


def _bench_soak(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from apps.dev.bench.soak import SoakError, SoakOptions, parse_faults
    from apps.dev.bench.soak import main as bench_soak

    for flag, value in (("--minutes", args.minutes), ("--rate", args.rate), ("--fault-every", args.fault_every)):
        if value <= 0:
            raise CliError(f"{flag} must be positive")
    try:
        faults = parse_faults(args.faults)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    options = SoakOptions(
        minutes=args.minutes, rate=args.rate, fault_every_s=args.fault_every, faults=faults, seed=args.seed,
        out=Path(args.out), config=args.config, command="ki " + " ".join(sys.argv[1:]),
    )  # fmt: skip
    try:
        return bench_soak(settings, options)
    except SoakError as exc:
        raise CliError(str(exc)) from exc


def _bench_first_load(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from apps.dev.bench.first_load import FirstLoadOptions
    from apps.dev.bench.first_load import main as bench_first_load

    counts = {"--scale": args.scale, "--access-rate": args.access_rate, "--access-docs": args.access_docs,
              "--standalone-chunks": args.standalone_chunks,
              "--versions-per-transaction": args.versions_per_transaction}  # fmt: skip
    for flag, value in counts.items():
        if value < 1:
            raise CliError(f"{flag} must be at least 1")
    for flag, seconds in (("--probe-interval", args.probe_interval), ("--search-interval", args.search_interval),
                          ("--timeout", args.timeout)):  # fmt: skip
        if seconds <= 0:
            raise CliError(f"{flag} must be above 0")
    if args.vector_seconds < 0:
        raise CliError("--vector-seconds must be at least 0 (0: until every vector is in place)")
    options = FirstLoadOptions(
        scale=args.scale, seed=args.seed, access_rate=args.access_rate, access_docs=args.access_docs,
        probe_interval=args.probe_interval,
        search_interval=args.search_interval, vector_seconds=args.vector_seconds,
        standalone_chunks=args.standalone_chunks, versions_per_transaction=args.versions_per_transaction,
        timeout_s=args.timeout, keep=args.keep,
        out=Path(args.out) if args.out else None, config=args.config, command="ki " + " ".join(sys.argv[1:]),
    )  # fmt: skip
    return bench_first_load(settings, options)


def _bench(args: argparse.Namespace, settings: Settings) -> int:
    from apps.dev.checkout import require_checkout

    if args.what != "clean":  # the others read the repository's data or write its build/ and benchmarks/
        require_checkout(f"ki bench {args.what}")
    if args.what == "injection":
        return _bench_injection(args, settings)
    if args.what == "search":
        return _bench_search(args, settings)
    if args.what == "clean":
        from apps.dev.bench.cleanup import clean

        return clean(settings)
    if args.what == "authz-timing":
        from pathlib import Path

        from apps.dev.bench.authz_timing import CASES, AuthzOptions
        from apps.dev.bench.authz_timing import main as bench_authz_timing

        if args.pairs < 1 or args.block < 1 or args.slow_pairs < 1 or args.warmup < 0:
            raise CliError("--pairs, --block and --slow-pairs must be at least 1, --warmup at least 0")
        if args.max_pairs < args.pairs or args.slow_max_pairs < args.slow_pairs:
            raise CliError("--max-pairs must be at least --pairs, --slow-max-pairs at least --slow-pairs")
        cases = tuple(c.strip() for c in args.cases.split(",") if c.strip()) if args.cases else CASES
        unknown = sorted(set(cases) - set(CASES))
        if unknown or not cases:
            raise CliError(f"--cases: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(CASES)}")
        authz_options = AuthzOptions(
            pairs=args.pairs, max_pairs=args.max_pairs, block=args.block, slow_pairs=args.slow_pairs,
            slow_max_pairs=args.slow_max_pairs, warmup=args.warmup, stop_outside=not args.run_to_max, cases=cases,
            seed=args.seed,
            out=Path(args.out) if args.out else None, raw=Path(args.raw) if args.raw else None, config=args.config,
            command="ki " + " ".join(sys.argv[1:]),
        )  # fmt: skip
        return bench_authz_timing(settings, authz_options)
    if args.what == "freshness":
        from pathlib import Path

        from apps.dev.bench.freshness import FreshnessOptions
        from apps.dev.bench.freshness import main as bench_freshness

        for flag, value in (("--rate", args.rate), ("--docs", args.docs)):
            if value < 1:
                raise CliError(f"{flag} must be at least 1")
        for flag, seconds in (("--seconds", args.seconds), ("--step-seconds", args.step_seconds),
                              ("--probe-interval", args.probe_interval)):  # fmt: skip
            if seconds <= 0:
                raise CliError(f"{flag} must be above 0")
        if args.content_backlog < 0:
            raise CliError("--content-backlog must be at least 0 (chunks)")
        options = FreshnessOptions(
            rate=args.rate,
            seconds=args.seconds,
            docs=args.docs,
            probe_interval=args.probe_interval,
            content_backlog=args.content_backlog,
            access_rates=_int_list("--access-rates", args.access_rates, 1),
            step_seconds=args.step_seconds,
            past_break=args.past_break,
            config=args.config,
            command="ki " + " ".join(sys.argv[1:]),
        )
        return bench_freshness(settings, options, Path(args.out) if args.out else None)
    if args.what == "consistency":
        from pathlib import Path

        from apps.dev.bench.consistency import ConsistencyOptions
        from apps.dev.bench.consistency import main as bench_consistency

        for flag, value in (("--docs", args.docs), ("--pairs", args.pairs), ("--trials", args.trials),
                            ("--rate", args.rate)):  # fmt: skip
            if value < 1:
                raise CliError(f"{flag} must be at least 1")
        consistency_options = ConsistencyOptions(
            docs=args.docs, read_pairs=args.pairs, trials=args.trials, rate=args.rate, config=args.config,
            command="ki " + " ".join(sys.argv[1:]),
        )  # fmt: skip
        return bench_consistency(settings, consistency_options, Path(args.out) if args.out else None)
    if args.what == "soak":
        return _bench_soak(args, settings)
    if args.what == "reuse":
        from pathlib import Path

        from apps.dev.bench.reuse import main as bench_reuse

        out = Path(args.out) if args.out else Path("benchmarks/reuse-demo.json")
        return bench_reuse(settings, out=out, command="ki " + " ".join(sys.argv[1:]))
    if args.what == "principals":
        return _bench_principals(args, settings)
    if args.what == "corpus":
        return _bench_corpus(args, settings)
    if args.what == "first-load":
        return _bench_first_load(args, settings)
    if args.what == "embedder":
        from pathlib import Path

        from apps.dev.bench.embedder import main as bench_embedder

        if settings.embedding.provider != "local":
            raise CliError("ki bench embedder measures the local embedder (embedding.provider = local)")
        for flag, value in (("--texts", args.texts), ("--rounds", args.rounds)):
            if value < 1:
                raise CliError(f"{flag} must be at least 1")
        if args.remote:
            from apps.dev.bench.embedder import remote_main

            out = Path(args.out) if args.out else Path("benchmarks/embedder-remote.json")
            return remote_main(settings, texts=args.texts, rounds=args.rounds, out=out,
                               command="ki " + " ".join(sys.argv[1:]))  # fmt: skip
        out = Path(args.out) if args.out else Path("benchmarks/embedder.json")
        return bench_embedder(settings, texts=args.texts, rounds=args.rounds, out=out,
                              command="ki " + " ".join(sys.argv[1:]))  # fmt: skip
    from apps.dev.bench.sync import main as bench_sync

    return bench_sync(
        settings,
        versions=args.versions,
        paragraphs=args.paragraphs,
        rounds=args.rounds,
        compare_model=args.compare_model,
        compare_max_tokens=args.compare_max_tokens,
    )


def _keys(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from ki.evidence_keys import key_id, load_public_key, make_keys

    private, public = make_keys(Path(args.folder).expanduser(), args.name)
    print(f"keys: {private} (private: sign with retrieval.mode_gate.signing_key_file; keep it out of the repository)")
    print(f"keys: {public} (public, key {key_id(load_public_key(public))}: list it in "
          "retrieval.mode_gate.trusted_key_files wherever its reports should count)")  # fmt: skip
    return 0


def _config(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from ki.exposure import exposure_problem
    from ki.settings import changed_names, deviations, find_config, reference

    if args.what == "print":
        print("\n".join(reference(settings)))
        return 0
    found = find_config(args.config)
    print(f"config file: {found.absolute() if found is not None else 'none (the built-in defaults)'}")
    changed = deviations(settings)
    names = changed_names(changed)
    problems = [p for p in (exposure_problem(settings, "api"), exposure_problem(settings, "mcp")) if p]
    for problem in problems:
        print(f"ki: {problem}", file=sys.stderr)
    verdict = "config ok" if not problems else "config valid, but no server may start with it"
    print(f"{verdict}: {len(names)} setting(s) differ from the defaults" + (f": {', '.join(names)}" if names else ""))
    if args.json:
        print(json.dumps(changed, indent=2, ensure_ascii=False))
    return 2 if problems else 0


def _eval(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from apps.dev.eval.run import EvalError, EvalOptions
    from apps.dev.eval.run import main as run_eval

    for flag, value, low in (("--limit-docs", args.limit_docs, 1), ("--queries", args.queries, 1),
                             ("--concurrency", args.concurrency, 1), ("--batch-docs", args.batch_docs, 1),
                             ("--negatives", args.negatives, 1), ("--answerable", args.answerable, 1)):  # fmt: skip
        if value is not None and value < low:
            raise CliError(f"{flag} must be at least {low}")
    if args.timeout <= 0:
        raise CliError("--timeout must be positive")
    if args.worker_port is not None and not 1 <= args.worker_port <= 65535:
        raise CliError("--worker-port must be a port number (1-65535)")
    data = Path(args.data) if args.data else None
    if data is not None and not data.is_dir():
        raise CliError(f"--data {data}: no such directory")
    if args.drop and args.fresh:
        raise CliError("--drop and --fresh exclude each other (--fresh drops, then runs)")
    if args.self_documents < 20:
        raise CliError("--self-documents must be at least 20 (each half needs queries to test)")
    if args.self_check and data is None:  # the live deployment, not a labelled data set
        return _self_eval(args, settings)
    from apps.dev.checkout import require_checkout

    require_checkout("ki eval on a labelled data set")  # its data, test data and build/ are the repository's
    defaults = EvalOptions()
    if args.identity_reach:  # offline: no services, no index
        from apps.dev.eval.beir import DataError
        from apps.dev.eval.identity_reach import write_reach

        root = data or defaults.data_dir
        out = Path(args.out or "build/eval") / f"identity-reach-{root.resolve().name}.json"
        try:
            report = write_reach(root, settings, out)
        except (DataError, OSError) as exc:
            raise CliError(f"--identity-reach {root}: {exc}") from None
        print(f"{report['data_set']}: {report['test_queries']} test queries, identity outcomes {report['outcomes']}, "
              f"unique and relevant {report['unique_and_relevant']}; {out}")  # fmt: skip
        return 0
    options = EvalOptions(
        data_dir=data or defaults.data_dir,
        name=args.name,
        language=args.language,
        out_dir=Path(args.out) if args.out else defaults.out_dir,
        limit_docs=args.limit_docs,
        queries=args.queries,
        tune=args.tune,
        tune_floor=args.tune_floor,
        features=args.features,
        analyzer=args.analyzer,
        worker=args.worker,
        worker_port=args.worker_port,
        timeout_s=args.timeout,
        batch_docs=args.batch_docs,
        concurrency=args.concurrency,
        fresh=args.fresh,
        drop=args.drop,
        self_check=args.self_check,
        train_fusions=not args.no_train_fusions,
        categories=args.categories,
        negatives=args.negatives,
        answerable=args.answerable,
        floor_sweep=not args.no_floor_sweep,
        self_documents=args.self_documents,
        argv=tuple(sys.argv[1:]),
    )
    try:
        return run_eval(settings, options)
    except EvalError as exc:
        raise CliError(str(exc)) from None


def _self_eval(args: argparse.Namespace, settings: Settings) -> int:
    """`ki eval --self`: the deployment's own evidence for its default mode (apps.dev.eval.self_check)."""
    import asyncio
    from pathlib import Path

    from apps.dev.eval.self_check import SelfEvalError, self_evaluate
    from ki.clients import as_ki_error
    from ki.errors import Unavailable

    out = Path(args.out) if args.out else Path("build/self-eval")
    try:
        report = asyncio.run(
            self_evaluate(
                settings,
                max_documents=args.self_documents,
                out_dir=out,
                concurrency=args.concurrency,
                check_lag=True,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )  # fmt: skip
        )
    except SelfEvalError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:
        error = as_ki_error(exc)
        if not isinstance(error, Unavailable):
            raise
        raise CliError(f"self-eval: {error}") from None
    print(f"self-eval #{report['id']}: default mode {report['decision']} ({report['summary']}); {report['file']}")
    refresh = settings.retrieval.mode_gate.self_eval_refresh_s
    print(f"every API process picks it up within retrieval.mode_gate.self_eval_refresh_s ({refresh:g} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ki", description="ki-sidecar: CDC-driven search over PostgreSQL")
    parser.add_argument("--config", help="path to a config file (default: $KI_CONFIG, else ./config.json, else "
                        "/etc/ki-sidecar/config.json, else the built-in defaults)")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)

    stack = sub.add_parser("stack", help="run the local stack (PostgreSQL, Kafka, Connect+Debezium, OpenSearch)")
    stack.add_argument(
        "action",
        choices=["up", "down", "status", "logs", "connect", "stop", "start", "wipe"],
        help="connect: only migrate and register the Debezium connector (for a stack started elsewhere, e.g. compose);"
        " stop/start: one service only; wipe: delete the state of a stopped stack (not the artifact cache)",
    )
    stack.add_argument(
        "service",
        nargs="?",
        help="for logs, stop, start: postgres, kafka, connect, opensearch or keycloak (a cluster's further nodes: "
        "kafka-2, opensearch-3, ...)",
    )
    stack.add_argument(
        "--idp", action="store_true", help="for up: also the local identity provider (Keycloak, realm `ki`)"
    )
    stack.add_argument(
        "--secure", action="store_true",
        help="for up: the secured profile (TLS and credentials on every service; CA, certificates and passwords "
        "generated into <stack.home>/secure; client settings in <stack.home>/secure/operator.env)",
    )  # fmt: skip
    stack.add_argument(
        "--cluster", action="store_true",
        help="for up: the cluster profile (three Kafka brokers, three OpenSearch nodes; client settings in "
        "<stack.home>/cluster.env, which the stack commands then load themselves until `wipe`)",
    )  # fmt: skip
    stack.add_argument("-n", "--lines", type=int, default=50, help="for logs: how many lines")
    stack.set_defaults(handler=_stack)

    migrate = sub.add_parser("migrate", help="apply the reference schema migrations (alembic upgrade)")
    migrate.add_argument("--revision", default="head", help="upgrade to this revision (default: head)")
    migrate.add_argument("--down-to", metavar="REVISION", help="downgrade to this revision instead ('base': empty)")
    migrate.set_defaults(handler=_migrate)

    mcp = sub.add_parser("mcp", help="the search tools as an MCP server (streamable HTTP on mcp.host:mcp.port)")
    mcp.add_argument("--stdio", action="store_true",
                     help="speak MCP on stdin/stdout instead; the caller is mcp.stdio_principals")  # fmt: skip
    mcp.add_argument("--port", type=int, help="HTTP port (default mcp.port)")
    mcp.set_defaults(handler=_mcp)

    serve = sub.add_parser("serve", help="the search API (aiohttp) on api.host:api.port")
    serve.add_argument(
        "--workers", type=int, default=1, help="API processes sharing the port (SO_REUSEPORT; default 1)"
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # set for each worker
    serve.set_defaults(handler=_serve)

    embed = sub.add_parser(
        "embed", help="serve the local embedder as an OpenAI-compatible POST /v1/embeddings (for other hosts' "
        "content lanes: embedding.provider openai)",
    )  # fmt: skip
    embed.add_argument("action", choices=["serve"])
    embed.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; off loopback "
                       "the variable --api-key-env names must hold the key clients send)")  # fmt: skip
    embed.add_argument("--port", type=int, default=56080, help="port (default 56080)")
    embed.add_argument("--running", type=int, default=1,
                       help="requests embedded at once (each on embedding.threads model runs; default 1)")  # fmt: skip
    embed.add_argument(
        "--waiting",
        type=int,
        default=8,
        help="requests queued for a turn; beyond them a request gets 503 + Retry-After (default 8)",
    )
    embed.add_argument("--max-inputs", type=int, default=256, help="texts per request at most (default 256)")
    embed.add_argument("--retry-after", type=int, default=1, help="seconds a refused request is told to wait")
    embed.add_argument("--api-key-env", default="KI_EMBEDDING_API_KEY",
                       help="variable holding the bearer key clients must send (unset or empty: no key)")  # fmt: skip
    embed.set_defaults(handler=_embed)

    token = sub.add_parser("token", help="mint a signed bearer token for local use")
    token.add_argument("--sub", required=True, help="subject: the caller is user:<sub> (api.jwt.claims_carry_kinds: "
                       "a kind:name subject is that principal)")  # fmt: skip
    token.add_argument("--groups", default="", help="comma-separated groups (each group:<g>)")
    token.add_argument("--roles", default="", help="comma-separated roles (each role:<r>; operator: timings and "
                       "/metrics, admin: administrator)")  # fmt: skip
    token.add_argument("--ttl", type=int, default=3600, help="seconds until the token expires")
    token.set_defaults(handler=_token)

    sync = sub.add_parser("sync", help="the CDC sync worker")
    sync.add_argument("action", choices=["run", "status"])
    sync.add_argument(
        "--lane",
        default="all",
        choices=["all", "access", "content", "principals"],
        help="run: every lane as a child process (default), or one lane in this process",
    )
    sync.add_argument("--loglevel", default="info", choices=["debug", "info", "warning", "error"])
    sync.set_defaults(handler=_sync)

    dlq = sub.add_parser(
        "dlq", help="the dead-letter topic: list what waits, replay it through the projector, or drop it with a reason"
    )
    dlq.add_argument(
        "action", choices=["list", "replay", "drop"],
        help="list: the waiting dead letters by key; replay: project what they dirtied again (after the cause is "
        "fixed); drop: mark them handled without replaying. Each replay and drop is logged in ki_dlq_operations",
    )  # fmt: skip
    dlq.add_argument("--key", action="append", metavar="KEY",
                     help="a key as `ki dlq list` shows it (table/id); repeatable")  # fmt: skip
    dlq.add_argument("--all", action="store_true", help="every waiting dead letter")
    dlq.add_argument("--reason", help="why (required for drop; kept in the operations log)")
    dlq.add_argument("--by", help="who acts, for the operations log (default: the OS user)")
    dlq.add_argument("--json", action="store_true", help="for list: JSON instead of a table")
    dlq.set_defaults(handler=_dlq)

    rebuild = sub.add_parser("rebuild", help="replay the CDC topics into a fresh index, verify, swap the alias")
    rebuild.add_argument(
        "--from-postgres",
        action="store_true",
        help="read PostgreSQL instead of the topics (they were lost): recreates missing CDC topics, builds a fresh "
        "index while the lanes run, swaps the alias, then applies what arrived meanwhile",
    )
    rebuild.set_defaults(handler=_rebuild)

    backfill = sub.add_parser("backfill", help="index every version straight from PostgreSQL")
    backfill.set_defaults(handler=_backfill)

    reconcile = sub.add_parser("reconcile", help="diff PostgreSQL against the index and repair drift")
    reconcile.set_defaults(handler=_reconcile)

    keys = sub.add_parser("keys", help="make an Ed25519 key pair that signs this deployment's evaluation reports")
    keys.add_argument("folder", help="where to write <name>.key (private, mode 0600) and <name>.pub")
    keys.add_argument("--name", default="ki-evidence", help="file name stem (default ki-evidence)")
    keys.set_defaults(handler=_keys)

    config = sub.add_parser("config", help="the settings in effect: every one with its default, or a check")
    config_kinds = config.add_subparsers(dest="what", required=True, metavar="ACTION")
    config_kinds.add_parser("print", help="every setting as section.field = value, with its default where it differs")
    check = config_kinds.add_parser(
        "check", help="validate the settings in effect (file, --config, KI_* variables) and list the deviations"
    )
    check.add_argument("--json", action="store_true", help="also print the deviations as a minimal config.json")
    config.set_defaults(handler=_config)

    bench = sub.add_parser("bench", help="benchmarks that print figures (ratios against a same-run baseline)")
    kinds = bench.add_subparsers(dest="what", required=True, metavar="KIND")

    def kind(name: str, help_: str) -> argparse.ArgumentParser:
        parser = kinds.add_parser(name, help=help_, description=help_)
        parser.set_defaults(handler=_bench, measures_modes=True)
        return parser

    sync_bench = kind("sync", "content and access sync throughput through the real CDC path")
    sync_bench.add_argument("--versions", type=int, default=60, help="versions in the corpus")
    sync_bench.add_argument("--paragraphs", type=int, default=40, help="paragraphs per version")
    sync_bench.add_argument("--rounds", type=int, default=5, help="rounds (median reported)")
    sync_bench.add_argument(
        "--compare-model",
        default=None,
        help="also run the content sync with this local model (e.g. all-MiniLM-L6-v2) in the same run",
    )
    sync_bench.add_argument(
        "--compare-max-tokens", type=int, default=256, help="token window of --compare-model (default 256)"
    )

    consistent = kind("consistency", "reading a 2,000-character slice, and a writer's consistency token under load")
    consistent.add_argument("--docs", type=int, default=40, help="documents of about 10,000 characters each")
    consistent.add_argument("--pairs", type=int, default=400, help="interleaved reading pairs (slice, metadata)")
    consistent.add_argument("--trials", type=int, default=100, help="write-then-search trials with a token")
    consistent.add_argument("--rate", type=int, default=200, help="access changes per second during the trials")
    consistent.add_argument("--out", default="benchmarks", help="folder for consistency.json")

    soak = kind("soak", "a mixed soak: content and access changes, a fault every few minutes, searches throughout")
    soak.add_argument("--minutes", type=float, default=60, help="how long the load runs (default 60)")
    soak.add_argument("--rate", type=float, default=50, help="row changes per second (default 50)")
    soak.add_argument("--fault-every", type=float, default=300, help="seconds between faults (default 300)")
    soak.add_argument(
        "--faults", default="all",
        help="comma list in rotation: kill, opensearch-block, kafka, stall, connect, postgres (default all; none)",
    )  # fmt: skip
    soak.add_argument("--seed", type=int, default=51, help="random seed of the changes and searches")
    soak.add_argument("--out", default="benchmarks/soak.json", help="the JSON file (default benchmarks/soak.json)")

    fresh = kind("freshness", "commit-to-searchable lag under a sustained change rate")
    fresh.add_argument("--rate", type=int, default=200, help="row changes per second")
    fresh.add_argument("--seconds", type=float, default=60, help="how long to sustain the rate")
    fresh.add_argument("--docs", type=int, default=200, help="documents the load spreads over")
    fresh.add_argument("--probe-interval", type=float, default=0.5, help="seconds between probes")
    fresh.add_argument(
        "--content-backlog",
        type=int,
        default=0,
        help="also measure access changes while about this many chunks are being embedded",
    )
    fresh.add_argument(
        "--access-rates",
        default="",
        help="comma-separated access-change rates to step through until p99 > 2 s (e.g. 5,10,20,50)",
    )
    fresh.add_argument("--step-seconds", type=float, default=20, help="seconds per --access-rates step")
    fresh.add_argument("--past-break", action="store_true",
                       help="every --access-rates step, also after p99 > 2 s (the CPU of each rate)")  # fmt: skip
    fresh.add_argument("--out", help="output folder (default benchmarks)")

    corpus = kind("corpus", "a large bench corpus (10^5-10^6 chunks) in a stack of its own, indexed directly")
    corpus.add_argument("--scale", type=int, required=True, help="demo corpus versions (~6.4 chunks each)")
    corpus.add_argument("--seed", type=int, default=7, help="demo corpus seed")
    corpus.add_argument("--bank-fraction", type=float, default=0.02,
                        help="share of distinct inputs the real model embeds (others: perturbed)")  # fmt: skip
    corpus.add_argument("--cosine", type=float, help="a fixed cosine of perturbed vectors to their anchors "
                        "(default: drawn from the anchors' nearest-neighbour cosines)")  # fmt: skip
    corpus.add_argument("--segments", type=int, default=1, help="force-merge to this many segments")
    corpus.add_argument("--out", default="benchmarks", help="output folder (default benchmarks)")

    first = kind("first-load", "a first load through the real CDC path: until keyword-searchable, then vectors, "
                 "with access changes and searches meanwhile")  # fmt: skip
    first.add_argument("--scale", type=int, required=True, help="demo corpus versions (~6.2 chunks each)")
    first.add_argument("--seed", type=int, default=7, help="demo corpus seed")
    first.add_argument("--access-rate", type=int, default=100, help="access changes per second during the load")
    first.add_argument("--access-docs", type=int, default=100, help="documents the access changes spread over")
    first.add_argument("--probe-interval", type=float, default=0.5, help="seconds between access-change probes")
    first.add_argument("--search-interval", type=float, default=0.5, help="seconds between searches")
    first.add_argument("--vector-seconds", type=float, default=120,
                       help="time box of the vector phase (0: until every vector is in place)")  # fmt: skip
    first.add_argument("--standalone-chunks", type=int, default=64,
                       help="chunks the embedder embeds alone for its own rate")  # fmt: skip
    first.add_argument(
        "--versions-per-transaction",
        type=int,
        default=1,
        help="whole documents per PostgreSQL transaction up to this many versions (1: one document)",
    )
    first.add_argument("--timeout", type=float, default=4 * 3600, help="seconds the keyword phase may take")
    first.add_argument("--keep", action="store_true", help="leave the corpus in PostgreSQL and the index")
    first.add_argument("--out", help="the JSON file (default benchmarks/first-load-<chunks>.json)")

    many = kind("principals", "a caller in very many groups (memberships in SQL) against one of one group")
    many.add_argument("--groups", type=int, default=25_000, help="groups of the many-group caller")
    many.add_argument("--granting", type=int, default=5_000, help="of those, groups holding a document grant")
    many.add_argument("--scale", type=int, default=200, help="demo corpus versions searched (reused if indexed)")
    many.add_argument("--concurrency", default="1,8", help="comma-separated concurrency levels")
    many.add_argument("--rounds", type=int, default=3, help="rounds (median reported)")
    many.add_argument("--requests", type=int, default=120, help="requests per caller and round")
    many.add_argument("--out", help="output folder (default build/bench)")

    search_bench = kind("search", "the search API against raw _msearch on the demo corpus, in the same rounds")
    search_bench.add_argument("--scale", type=int, help="demo corpus versions (default 1000, ~6.4k chunks)")
    search_bench.add_argument(
        "--no-indexing",
        action="store_true",
        help="measure the index as it is; corpus versions not indexed yet stay out",
    )
    search_bench.add_argument("--seed", type=int, default=7, help="demo corpus and query-mix seed")
    search_bench.add_argument("--rounds", type=int, default=5, help="rounds (median reported)")
    search_bench.add_argument("--concurrency", default="1,8,32", help="comma-separated concurrency levels")
    search_bench.add_argument("--requests", type=int, default=160, help="requests per side and round")
    search_bench.add_argument("--callers", choices=["mix", "broad", "narrow"], default="mix",
                              help="the first four demo users who see anything (mix), or the one who sees the "
                                   "most (broad) or least (narrow)")  # fmt: skip
    search_bench.add_argument("--workers", type=int, default=1, help="API processes (`ki serve --workers N`)")
    search_bench.add_argument("--compare-env", default="",
                              help="a second API with these settings overrides (KI_A=1,KI_B=x), measured in the "
                                   "same rounds; reports the difference of the two API/raw ratios")  # fmt: skip
    search_bench.add_argument("--compare-checkout", default="",
                              help="the second API from this git commit of the repository (a worktree "
                                   "under build/), e.g. the commit before a change; with or without "
                                   "--compare-env")  # fmt: skip
    search_bench.add_argument("--scope-sizes", default="100,1000,10000,100000",
                              help="visible-document counts for scope compilation ('' to skip)")  # fmt: skip
    search_bench.add_argument("--out", help="output folder (default build/bench)")

    authz = kind("authz-timing", "whether something hidden answers any faster or slower than nothing: P(hidden "
                 "slower) per case, 95 % interval within [0.45, 0.55]")  # fmt: skip
    authz.add_argument("--pairs", type=int, default=1000, help="hidden/missing pairs per case at least")
    authz.add_argument("--max-pairs", type=int, default=4000,
                       help="pairs per case at most (more blocks while the interval misses the goal)")  # fmt: skip
    authz.add_argument("--block", type=int, default=500, help="pairs per block after the first --pairs")
    authz.add_argument("--slow-pairs", type=int, default=500,
                       help="pairs at least of the slow case (invalidation: a change, the feed per pair)")  # fmt: skip
    authz.add_argument("--slow-max-pairs", type=int, default=1000, help="pairs at most of the slow case")
    authz.add_argument("--warmup", type=int, default=20, help="untimed pairs per case first")
    authz.add_argument("--run-to-max", action="store_true",
                       help="take more blocks also once a case's interval lies wholly beyond the goal")  # fmt: skip
    authz.add_argument("--cases", default="", help="comma-separated cases (default all: documents, read, chunk, "
                       "related, traverse, decisions, traverse-batch, related-incoming, related-kinds, expired, "
                       "names-cache, names-hidden, superset, compare, invalidation)")  # fmt: skip
    authz.add_argument("--seed", type=int, default=7, help="the pairs' seed")
    authz.add_argument("--out", help="output file (default benchmarks/authz-timing.json)")
    authz.add_argument("--raw", help="also write every pair's two timings per case to this file")

    embedder_bench = kind("embedder", "the local embedder's texts/s at ~256 and ~480 tokens, before and after")
    embedder_bench.add_argument("--texts", type=int, default=16, help="texts per length")
    embedder_bench.add_argument("--rounds", type=int, default=3, help="rounds (median reported)")
    embedder_bench.add_argument("--out", help="output file (default benchmarks/embedder.json, with --remote "
                                "benchmarks/embedder-remote.json)")  # fmt: skip
    embedder_bench.add_argument(
        "--remote", action="store_true",
        help="instead: the local embedder against the same model behind `ki embed serve` in a second process "
        "(the HTTP provider at a few request sizes and requests in flight), and the local speed-ups that change "
        "the vectors, at ~480 and ~64 tokens",
    )  # fmt: skip

    reuse_bench = kind("reuse", "the share of rows whose vector the store can share, as configured and per variant")
    reuse_bench.add_argument("--out", help="output file (default benchmarks/reuse-demo.json)")

    injection = kind("injection", "the prompt-injection detector: recall on the committed attack corpus, and the "
                     "chunks of German dev sets it flags (pure CPU, no services)")  # fmt: skip
    injection.add_argument("--data", action="append", help="a BEIR folder to chunk and scan, repeatable (default: "
                           "gesetze-headings-dev and xquad-de in the shared data folder `ki eval` reads)")  # fmt: skip
    injection.add_argument("--attacks", help="the attack strings as JSON lines (default "
                           "tests/data/injection/attacks.jsonl)")  # fmt: skip
    injection.add_argument("--out", help="output file (default benchmarks/injection.json)")

    kind("clean", "remove what benchmark runs killed outright left in PostgreSQL and the index")

    ev = sub.add_parser(
        "eval",
        help="retrieval quality on a labelled BEIR data set through the real CDC path, isolated from the main index "
        "(nDCG@10, recall@100, MRR@10)",
    )
    ev.add_argument("--data", help="a BEIR folder (default: SciFact, ../shared/data/scifact next to the repo)")
    ev.add_argument("--name", help="data set name for labels, files and the eval database (default: folder name)")
    ev.add_argument("--language", help="language of the documents, e.g. de (default: README `language:` line, "
                    "else guessed from the corpus, else de)")  # fmt: skip
    ev.add_argument("--limit-docs", type=int, help="load only N documents, those judged relevant first")
    ev.add_argument("--queries", type=int, help="evaluate only the first N test queries")
    ev.add_argument("--tune", action="store_true",
                    help="grid-search semantic weight / rrf_k on the train split (needs qrels/train.tsv)")  # fmt: skip
    ev.add_argument("--tune-floor", action="store_true",
                    help="only propose the semantic floor from the train split (a part of --tune)")  # fmt: skip
    ev.add_argument("--features", action="store_true",
                    help="also measure each ranking feature (identity, synonyms, semantic floor, graph augmentation) "
                    "switched from its default, top 10 on the test queries")  # fmt: skip
    ev.add_argument("--categories", action="store_true",
                    help="also report the figures per question category and run unanswerable queries against the "
                    "semantic floor's answer gate, swept over floors (chosen on train, reported on test)")  # fmt: skip
    ev.add_argument("--negatives", type=int, default=100,
                    help="--categories: unanswerable queries per kind and split (default 100)")  # fmt: skip
    ev.add_argument("--answerable", type=int, default=100,
                    help="--categories: answerable queries per split beside them, sampled (default 100: each emptied "
                    "one then costs about 0.01 nDCG@10; more give the gate's cost with less noise)")  # fmt: skip
    ev.add_argument("--no-floor-sweep", action="store_true",
                    help="--categories: leave out the floor's sweep through the API (the coverage gate's curve, "
                    "read from one run, and its point chosen on train still run)")  # fmt: skip
    ev.add_argument("--analyzer", help="text analyzer of the eval index (default: retrieval.text_analyzer)")
    ev.add_argument("--out", help="output folder for JSON, per-query diff and PNG (default: build/eval)")
    ev.add_argument("--worker", choices=["auto", "external"], default="auto",
                    help="auto: start the eval sync worker as a child process; external: you run it")  # fmt: skip
    ev.add_argument("--worker-port", type=int, help="the eval worker's web port (default: a free port)")
    ev.add_argument("--timeout", type=float, default=3600.0,
                    help="seconds to wait for the index (default 3600); a re-run resumes")  # fmt: skip
    ev.add_argument("--batch-docs", type=int, default=250, help="documents per PostgreSQL transaction")
    ev.add_argument("--concurrency", type=int, default=4, help="queries in flight at once")
    ev.add_argument("--fresh", action="store_true",
                    help="drop this eval's database, connector, slot, topics and indexes first, then run")  # fmt: skip
    ev.add_argument("--drop", action="store_true",
                    help="only drop this eval's database, connector, slot, topics, groups and indexes")  # fmt: skip
    ev.add_argument("--self", dest="self_check", action="store_true",
                    help="the deployment's own evidence: pseudo-queries from the live corpus decide the default "
                    "mode of every API process (with --data: on that data set's eval world, beside its labels)",
                    )  # fmt: skip
    ev.add_argument("--no-train-fusions", action="store_true",
                    help="skip the train split's grid of every fusion and semantic weight (where the shipped default "
                    "was chosen); refreshing the test evidence does not need it")  # fmt: skip
    ev.add_argument("--self-documents", type=int, default=500,
                    help="--self: documents sampled for pseudo-queries (default 500)")  # fmt: skip
    ev.add_argument("--identity-reach", action="store_true",
                    help="only count the test queries that name a document (identity preflight), offline")  # fmt: skip
    ev.set_defaults(handler=_eval, measures_modes=True)

    demo = sub.add_parser("demo", help="stack up + demo corpus (if none yet) + sync worker; or `demo generate`")
    demo.add_argument("action", nargs="?", choices=["generate"], help="generate: only write a corpus")
    demo.add_argument("--scale", type=int, default=200, help="number of document versions (default 200)")
    demo.add_argument("--seed", type=int, default=7)
    demo.set_defaults(handler=_demo)
    return parser


def _kafka_line(settings: Settings, line: str) -> str:
    """A Kafka time-out's real cause when the brokers refuse the credentials or the certificate."""
    from ki.clients import kafka_refusal

    refusal = kafka_refusal(settings)
    return f"ki: Kafka refused this client: {refusal}" if refusal else line


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings: Settings | None = None
    try:
        settings = load_settings(args.config)
        if getattr(args, "measures_modes", False):
            # Evaluations and benchmarks measure every mode, where the evidence does not back one yet too:
            # that is how evidence is made (retrieval.mode_gate.explicit_without_evidence).
            settings = with_overrides(settings, {"retrieval": {"mode_gate": {"explicit_without_evidence": "honour"}}})
        return int(args.handler(args, settings))
    except Exception as exc:  # ours, or a client library's mapped to ours: one line, no traceback
        from ki.clients import as_ki_error

        error = as_ki_error(exc)
        if error is None:
            raise  # a bug: the traceback is what helps
        line = f"ki: {error}".splitlines()[0]
        if settings is not None and getattr(error, "service", "") == "kafka":
            line = _kafka_line(settings, line)
        print(settings.redact(line) if settings is not None else line, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ki: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
