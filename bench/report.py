"""The tables ``make bench`` prints (``run`` measures, this module prints)."""

from __future__ import annotations

import math
from typing import Any

import harness
import rpcload
from harness import Table, millis, rate, verdict

SMALL = 100
LARGE = 10 * 1024
PATHS = ("SDK->broker", "SDK->proxy->broker")


def summary(entry: dict[str, Any]) -> dict[str, Any]:
    """The median-rate run of an entry, and the spread of its rates."""
    runs = entry["runs"]
    rates = [r["rate"] for r in runs]
    chosen = sorted(runs, key=lambda r: r["rate"])[(len(runs) - 1) // 2]
    return {**chosen, "min": min(rates), "max": max(rates), "median": harness.median(rates)}


def cpu_cell(cpu: dict[str, float]) -> str:
    """CPU microseconds per message as ``client/proxy/broker``."""
    parts = [f"{cpu[name]:.1f}" if name in cpu else "-" for name in ("client", "proxy", "broker")]
    return "/".join(parts)


# ---------------------------------------------------------------------------- the sections


def print_loads(figures: dict[str, Any], echo_rates: dict[int, float]) -> None:
    """The PUT->ACK, PUSH->CONFIRM and idle round-trip tables."""
    table = Table(
        "PUT->ACK, one producer: Session.post() -> on_ack",
        [
            "store",
            "size",
            "path",
            "msg/s",
            "min..max",
            "p50 ms",
            "p99 ms",
            "PUTs/frame",
            "CPU us/msg c/p/b",
            "others",
            "of echo",
        ],
    )
    for entry in figures["produce"]:
        s = summary(entry)
        share = s["median"] / echo_rates[entry["size"]] if entry["size"] in echo_rates else math.nan
        table.add(
            entry["store"],
            entry["size"],
            entry["path"],
            rate(s["median"]),
            f"{rate(s['min'])}..{rate(s['max'])}",
            millis(s["p50"]),
            millis(s["p99"]),
            f"{s['mean_batch']:.0f}",
            cpu_cell(s["cpu_us"]),
            f"{s['others_cores']:.2f}",
            f"{share:.0%}",
        )
    table.notes = [
        "msg/s: median of the runs, first post() to last on_ack; latency of the median run:",
        "  post() is not paced, so p50/p99 include the time a PUT waits behind the others.",
        "CPU us/msg: CPU time per message of the client (this process, SDK + bench loop),",
        "  the proxy and the broker. With 2 cores, their sum bounds the rate at 2e6/sum.",
        "others: cores' worth of CPU used by other processes of the machine meanwhile.",
        "of echo: msg/s as a share of the raw gRPC echo with the same batch size (below).",
    ]
    harness.print_table(table)

    table = Table(
        "PUSH->CONFIRM, one consumer draining the queue its producer run filled",
        ["store", "size", "path", "msg/s", "min..max", "CPU us/msg c/p/b", "others"],
    )
    for entry in figures["consume"]:
        s = summary(entry)
        table.add(
            entry["store"],
            entry["size"],
            entry["path"],
            rate(s["median"]),
            f"{rate(s['min'])}..{rate(s['max'])}",
            cpu_cell(s["cpu_us"]),
            f"{s['others_cores']:.2f}",
        )
    table.notes = [
        "Default QueueOptions (1000 unconfirmed messages); timed from open_queue() to the",
        "last message confirmed, message.confirm() called in on_message.",
    ]
    harness.print_table(table)

    table = Table(
        "Idle round trip: one 100-byte PUT at a time, post() -> on_ack",
        ["store", "path", "p50 ms", "p99 ms", "PUTs"],
    )
    for row in figures["idle"]:
        table.add(row["store"], row["path"], millis(row["p50"]), millis(row["p99"]), row["count"])
    harness.print_table(table)


def print_echo(results: list[dict[str, Any]]) -> None:
    """The raw ceiling table."""
    table = Table(
        "Raw ceiling: batched gRPC bidi-streaming echo on raw bytes (bench/echo.py)",
        ["size", "messages", "per frame", "msg/s", "runs"],
    )
    for row in results:
        table.add(
            row["size"],
            row["count"],
            f"{row['batch']}{' (sweep)' if row.get('sweep') else ' (ours)'}",
            rate(row["rate"]),
            " ".join(rate(r) for r in row["rates"]),
        )
    table.notes = [
        "Sync grpc client (requests pulled by gRPC's thread, replies read on the caller's),",
        "grpc.aio server in its own process, no per-message Python work at all. 'ours' =",
        "mean PUTs per frame of our SDK->broker memory-store runs (the ceiling and the",
        "'of echo' ratios use it); 'sweep' rows show the rate by frame size for context.",
    ]
    harness.print_table(table)


def print_recovery(results: list[dict[str, Any]]) -> None:
    """The recovery table."""
    table = Table(
        "Recovery: producer at 5k msg/s (100 B), sqlite broker cut for ~1 s",
        [
            "path",
            "cut",
            "outage s",
            "back->StateRestored s",
            "back->1st ACK s",
            "stall s",
            "outage+0.3",
            "posted",
            "ACKed ok",
            "dup ACKs",
        ],
    )
    for row in results:
        table.add(
            row["path"],
            row["cut"],
            f"{row['outage']:.3f}",
            "no reconnect" if math.isnan(row["restore"]) else f"{row['restore']:.3f}",
            f"{row['first_ack']:.3f}",
            f"{row['stall']:.3f}",
            f"{row['budget']:.3f}",
            row["posted"],
            row["acked_ok"],
            row["duplicate_acks"],
            verdict=verdict(row["stall"] <= row["budget"]),
        )
    table.notes = [
        "kill: SIGKILL, 1 s, restart on the same port and file; outage = SIGKILL -> the new",
        "  broker's 'listening on' (includes its start and store recovery); restore = that",
        "  -> StateRestored (the SDK's event direct; the proxy's logged one via the proxy);",
        "  1st ACK: the retransmitted PUTs stored (fsync) and the first of them ACKed.",
        "stop: SIGSTOP 1 s then SIGCONT; keepalive (1 s + 2 s) keeps the link: no reconnect.",
        "stall: longest gap between consecutive ACKs; post() never blocked longer than "
        + ", ".join(f"{r['longest_post'] * 1000:.0f} ms" for r in results)
        + ".",
    ]
    harness.print_table(table)


def print_otel(rows: list[dict[str, Any]]) -> None:
    """The OpenTelemetry cost table."""
    table = Table(
        "OpenTelemetry: one producer, 100-byte PUTs to a broker process",
        ["set-up", "post()", "PUT->last ACK"],
    )
    names = {
        "off": "telemetry=False",
        "api": "API, no provider set",
        "sampled": "SDK, 1 % sampled",
        "recorded": "SDK, every span recorded",
    }
    for row in rows:
        table.add(
            names.get(row["mode"], row["mode"]),
            f"{row['post_us']:.1f} us",
            f"{rate(row['rate'])}/s",
        )
    table.notes = ["Each set-up in a subprocess of its own (global providers are set once)."]
    harness.print_table(table)


def print_memory(result: dict[str, Any]) -> None:
    """The memory table."""
    table = Table(
        "SDK memory per buffered PUT (disconnected, 100-byte distinct payloads)",
        ["PUTs", "RSS growth/PUT", "payload object", "SDK's own/PUT", "post() rate"],
    )
    per_put = result["bytes_per_put"]
    table.add(
        result["count"],
        f"{per_put:.0f} B",
        f"{result['payload_object_bytes']} B",
        f"{per_put - result['payload_object_bytes']:.0f} B",
        f"{rate(result['post_rate_disconnected'])}/s",
    )
    table.notes = [
        "In a subprocess: open the queue on a broker, SIGKILL it, wait for the session to see",
        "the loss, then post; RSS from /proc/self/statm before and after (after gc.collect()).",
    ]
    harness.print_table(table)


def print_history(result: dict[str, Any]) -> None:
    """The dedup history table."""
    table = Table(
        "Broker dedup history: memory per GUID held (1M GUIDs with digests)",
        [
            "bytes/GUID (RSS)",
            "allocated",
            "target",
            "default bound",
            "its memory",
            f"covers at {rate(result['rate'])}/s",
            "full window + grace needs",
        ],
    )
    target = result.get("target_bytes_per_guid", 32)
    traced = result.get("traced_bytes_per_guid")
    table.add(
        f"{result['bytes_per_guid']:.1f} B",
        "?" if traced is None else f"{traced:.1f} B",
        f"<= {target} B",
        f"{result['default_max_guids'] / 1e6:.0f}M GUIDs",
        f"{result['default_bound_bytes'] / 1e9:.1f} GB",
        f"{result['default_covers_seconds']:.0f} s",
        f"{result['guids_for_full_retention'] / 1e6:.0f}M GUIDs, "
        f"{result['bytes_for_full_retention'] / 1e9:.1f} GB",
    )
    table.notes = [
        "RSS growth per GUID recorded in one GuidHistory (fresh 16-byte bytes, 64-bit digest);",
        "allocated: what tracemalloc counts (RSS adds the allocator's fragmentation).",
        "Past the bound new PUTs get HISTORY_FULL (producers retry); nothing is evicted early.",
        f"Target <= {target} B/GUID: "
        + ("PASS" if result["bytes_per_guid"] <= target else "MISS")
        + ".",
    ]
    harness.print_table(table)


def print_nats(result: dict[str, Any], ours: dict[str, float]) -> None:
    """The NATS comparison table (or the line saying why it was skipped)."""
    if "skipped" in result:
        print()
        print(f"== NATS JetStream comparison skipped: {result['skipped']}")
        return
    table = Table(
        "NATS JetStream, same load: 100-byte publish_async with Nats-Msg-Id, every PubAck awaited",
        ["JetStream storage", "msg/s", "Holdfast SDK->broker", "Holdfast / NATS"],
    )
    for row in result["runs"]:
        mine = ours["memory" if row["storage"] == "memory" else "sqlite"]
        table.add(
            row["storage"],
            rate(row["rate"]),
            f"{rate(mine)} ({'memory' if row['storage'] == 'memory' else 'sqlite full'})",
            f"{mine / row['rate']:.2f}x",
        )
    table.notes = [
        "nats-py client in this process against the local nats-server. JetStream's file store",
        "does not fsync each message by default; Holdfast's sqlite here fsyncs every commit.",
    ]
    harness.print_table(table)


def print_rpc(results: list[dict[str, Any]]) -> None:
    """Request/reply (1 caller, pipelined, through the proxy) beside the plain gRPC
    unary call."""
    table = Table(
        "Request/reply (100 B echo, 1 caller, pipelined) vs plain gRPC unary",
        [
            "path",
            "calls/s",
            "workers",
            "in flight",
            "one at a time calls/s",
            "p50 one call ms",
            "p99 one call ms",
        ],
    )
    for row in results:
        table.add(
            row["name"],
            rate(row["rate"]),
            row.get("workers", 1),
            row["window"],
            rate(row.get("sequential_rate", math.nan)),
            millis(row["p50"]),
            millis(row["p99"]),
        )
    table.notes += rpc_ratio_notes(results)
    harness.print_table(table)


def rpc_ratio_notes(results: list[dict[str, Any]]) -> list[str]:
    """Today against the baseline of the same run, saying exactly what each is."""
    old = [row for row in results if "old shape" in row["name"]]
    now = [row for row in results if row["name"].startswith("request/reply") and row not in old]
    now = [row for row in now if "SDK->proxy" in row["name"]]
    if not old or not now:
        return []
    base = old[0]
    best = max(now, key=lambda row: row["rate"])
    notes = [
        f"now: {best['name']} ({best['workers']} workers, {best['window']} in flight): "
        f"{rate(best['rate'])} calls/s",
        f"baseline (first row, same run: {base['name'].split('old shape')[-1].strip(', ')}): "
        f"the threaded caller, 1 worker process of 8 threads, {base['window']} in flight, "
        f"as #35 measured 1.9k: {rate(base['rate'])} calls/s "
        f"-> now/baseline = {best['rate'] / base['rate']:.1f}x",
    ]
    if base.get("sequential_rate"):
        notes.append(
            f"the same 1-worker shape one call at a time: {rate(base['sequential_rate'])} "
            f"calls/s -> now/that = {best['rate'] / base['sequential_rate']:.1f}x"
        )
    return notes


def rpc_targets(results: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """Issue #35's throughput targets, on the best request/reply row."""
    rows = [row for row in results if row["name"].startswith("request/reply")]
    old = [row for row in rows if "old shape" in row["name"]]
    rows = [row for row in rows if row not in old and "SDK->proxy" in row["name"]]
    if not rows:
        return []
    best = max(rows, key=lambda row: row["rate"])
    before = old[0]["rate"] if old else rpcload.BEFORE
    flavour = best["name"].split(",")[0].removeprefix("request/reply ")
    return [
        (
            f"request/reply via proxy, 1 caller, {rpcload.WORKERS} workers "
            f">= {rpcload.TARGET / 1000:.0f}k calls/s",
            f"{rate(best['rate'])}/s ({flavour})",
            best["rate"] >= rpcload.TARGET,
        ),
        (
            "request/reply via proxy >= 5x #35's old shape (1 worker, 64 in flight), same run",
            f"{best['rate'] / before:.1f}x of {rate(before)}/s",
            best["rate"] >= 5 * before,
        ),
    ]


def print_targets(rows: list[tuple[str, str, bool]]) -> None:
    """The targets, each with its figure and PASS or MISS."""
    table = Table("Targets (figures, not tests)", ["target", "figure"])
    for name, figure, ok in rows:
        table.add(name, figure, verdict=verdict(ok))
    harness.print_table(table)


# ---------------------------------------------------------------------------- main


_ROUNDS_NOTE = (
    "Medians of 3 rounds (a fresh broker each). The rate is wall clock (the slowest "
    "process sets it); CPU/msg is what the servers spent, the cost the curve is about; "
    "client CPU/msg is the bench process (SDK and load loop) hosting the sessions."
)


def _print_curve(title: str, columns: list[str], key: str, rows: list[dict[str, Any]]) -> None:
    """One growth curve: each point's rate and server CPU per message, both against
    the first point, and the bench client's CPU per message."""
    base = rows[0]
    table = Table(title, columns)
    for row in rows:
        table.add(
            row[key],
            rate(row["rate"]),
            f"{row['rate'] / base['rate']:.2f}x",
            f"{row['server_us']:.2f} us",
            f"{row['server_us'] / base['server_us']:.2f}x",
            f"{row['client_us']:.2f} us",
        )
    table.notes = [_ROUNDS_NOTE]
    harness.print_table(table)


def _hops(cpu: dict[str, float]) -> str:
    return "/".join(f"{cpu[hop]:.1f}" for hop in ("producers", "brokers", "redis"))


def print_scale(scale: dict[str, Any]) -> None:
    """Issue #20's growth curves and the Redis store's figures."""
    if scale.get("sessions"):
        _print_curve(
            "Sessions through one proxy (asyncio sessions, 100 B, memory store)",
            [
                "sessions",
                "PUT->ACK msg/s",
                "vs 1 session",
                "proxy+broker CPU/msg",
                "vs 1",
                "client CPU/msg",
            ],
            "sessions",
            scale["sessions"],
        )
    if scale.get("queues"):
        _print_curve(
            "Open queues (one session, round-robin)",
            ["queues", "msg/s", "vs 1 queue", "broker CPU/msg", "vs 1", "client CPU/msg"],
            "queues",
            scale["queues"],
        )
    if scale.get("depth"):
        row = scale["depth"]
        table = Table(
            "Queue depth (memory store, 100 B)",
            ["held", "PUT->ACK msg/s", "broker bytes per queued message"],
        )
        table.add(0, rate(row["empty_rate"]), "")
        table.add(row["depth"], rate(row["deep_rate"]), f"{row['bytes_per_message']:.0f} B")
        table.notes = [
            f"Per message while filling: {row['bytes_first_quarter']:.0f} B over the first "
            f"{row['first_quarter']:,}, {row['bytes_rest']:.0f} B over the rest."
        ]
        harness.print_table(table)
    if scale.get("payloads"):
        table = Table("Payload size (SDK->broker, memory)", ["size", "msg/s", "MB/s"])
        for row in scale["payloads"]:
            table.add(f"{row['size']} B", rate(row["rate"]), f"{row['mb_s']:.1f}")
        harness.print_table(table)
    if scale.get("redis"):
        row = scale["redis"]
        table = Table(
            "Redis store (AOF everysec, 100 B, SDK->broker, a producer process per node)",
            ["nodes", "offered", "PUT->ACK msg/s", "CPU us/msg producers/brokers/redis"],
        )
        for nodes, key in ((1, "one_node"), (2, "two_nodes")):
            table.add(nodes, "all it takes", rate(row[key]), _hops(row["cpu_us"][str(nodes)]))
        control = row.get("control")  # absent from results of older trees
        if control:
            table.add(
                "1, 2 producers", "all it takes", rate(control["rate"]), _hops(control["cpu_us"])
            )
        for run in row["paced"]:
            table.add(run["nodes"], rate(run["offered"]), rate(run["rate"]), _hops(run["cpu_us"]))
        paced_control = control.get("paced") if control else None  # absent before 2026-11-28
        if paced_control:
            table.add(
                "1, 2 producers",
                rate(paced_control["offered"]),
                rate(paced_control["rate"]),
                _hops(paced_control["cpu_us"]),
            )
        table.notes = [
            f"Two nodes / one: {row['ratio']:.2f}x (medians of alternating rounds; "
            "target >= 1.0x)."
            + (
                f" Two nodes / one node with two producers: {control['two_nodes_ratio']:.2f}x."
                if control
                else ""
            ),
            *(
                [
                    f"Paced (medians of {paced_control.get('rounds', 1)} alternating rounds):"
                    f" two nodes / one node {row['paced_ratio']:.2f}x, / one node with the"
                    f" same two producers {control['paced_two_nodes_ratio']:.2f}x. A paced"
                    " producer sends a frame a millisecond whatever its share, so two"
                    " producers send twice the frames of one.",
                ]
                if paced_control
                else []
            ),
            f"Redis commands per message (inside the scripts): {row['commands_per_message']:.3f};",
            "a PUT frame is one script call (one round trip) for all its messages.",
        ]
        harness.print_table(table)
    if scale.get("heartbeat"):
        table = Table(
            "Redis node liveness by open queues (lease renewals sampled for 4 s)",
            ["queues", "renewal p50", "renewal max", "lapses", "counts refresh", "loss check"],
        )
        for row in scale["heartbeat"]:
            table.add(
                f"{row['queues']:,}",
                f"{row['renewal_p50_ms']:.1f} ms",
                f"{row['renewal_max_ms']:.1f} ms",
                row["lapses"],
                f"{row['refresh_ms']:.0f} ms",
                f"{row['loss_check_ms']:.1f} ms",
            )
        table.notes = [
            "The renewal is one round trip on the lease thread's own connection; the counts",
            "refresh (one pass over the open queues) and the loss check run on the event loop.",
        ]
        harness.print_table(table)


def issue_20_targets(
    rates: dict[tuple[str, int, str], float],
    consume: dict[tuple[str, int, str], float],
    nats: dict[str, Any],
    memory: dict[str, Any],
    scale: dict[str, Any],
    history: dict[str, Any],
) -> list[tuple[str, str, bool]]:
    """Issue #20's targets as (target, figure, met) rows, ratios from this run."""
    direct = rates[("memory", SMALL, PATHS[0])]
    proxied = rates[("memory", SMALL, PATHS[1])]
    rows: list[tuple[str, str, bool]] = []
    jetstream = next(
        (r["rate"] for r in nats.get("runs", []) if r.get("storage") == "memory"), math.nan
    )
    rows.append(
        (
            "PUT->ACK via the sidecar >= 3x JetStream publish_async with dedup",
            f"{rate(proxied)}/s = {proxied / jetstream:.2f}x {rate(jetstream)}/s"
            if jetstream == jetstream
            else f"{rate(proxied)}/s (JetStream not measured: {nats.get('skipped', '?')})",
            proxied >= 3 * jetstream,
        )
    )
    rows.append(("SDK->broker PUT->ACK >= 150k msg/s", f"{rate(direct)}/s", direct >= 150_000))
    sqlite = rates[("sqlite", SMALL, PATHS[0])]
    rows.append(("sqlite --sync full, direct >= 70k msg/s", f"{rate(sqlite)}/s", sqlite >= 70_000))
    push_direct = consume[("memory", SMALL, PATHS[0])]
    push_proxy = consume[("memory", SMALL, PATHS[1])]
    rows.append(
        (
            "PUSH->CONFIRM via the proxy >= 80% of direct",
            f"{rate(push_proxy)}/s = {push_proxy / push_direct:.0%} of {rate(push_direct)}/s",
            push_proxy >= 0.8 * push_direct,
        )
    )
    if memory:
        per_put = memory["bytes_per_put"]
        rows.append(("SDK <= 200 B per buffered 100-B PUT", f"{per_put:.0f} B", per_put <= 200))
    depth = scale.get("depth")
    if depth:
        held = depth["bytes_per_message"]
        rows.append(("broker <= 200 B per queued 100-B message", f"{held:.0f} B", held <= 200))
        early, rest = depth["bytes_first_quarter"], depth["bytes_rest"]
        rows.append(
            (
                "broker memory linear in depth: the rest of the fill within 20% per message",
                f"{rest:.0f} B vs {early:.0f} B",
                rest <= 1.2 * early,
            )
        )
    if history:
        per_guid = history["bytes_per_guid"]
        rows.append(
            (
                "GUID history <= 32 B per GUID (RSS growth over 1M GUIDs)",
                f"{per_guid:.1f} B",
                per_guid <= 32,
            )
        )
    for name, key in (("sessions", "sessions"), ("open queues", "queues")):
        curve = scale.get(key) or []
        if curve:
            worst = min(row["rate"] for row in curve) / curve[0]["rate"]
            points = ", ".join(str(row[key]) for row in curve)
            rows.append(
                (
                    f"{name}: throughput within 20% of one across {points}",
                    f"worst {worst:.2f}x",
                    worst >= 0.8,
                )
            )
    redis = scale.get("redis")
    if redis:
        rows.append(
            (
                "Redis store, one node >= 50% of sqlite",
                f"{rate(redis['one_node'])}/s = {redis['one_node'] / sqlite:.0%}",
                redis["one_node"] >= 0.5 * sqlite,
            )
        )
        rows.append(
            (
                "Redis: two nodes on one Redis >= 1.0x one node (#33)",
                f"{redis['ratio']:.2f}x",
                redis["ratio"] >= 1.0,
            )
        )
        control = redis.get("control") or {}
        if "paced_two_nodes_ratio" in control:
            # The second node alone: the same producers, one node against two.
            worst = min(control["two_nodes_ratio"], control["paced_two_nodes_ratio"])
            rows.append(
                (
                    "Redis: two nodes >= 1.0x one node with the same two producers,"
                    " saturating and paced (#33)",
                    f"{control['two_nodes_ratio']:.2f}x, paced"
                    f" {control['paced_two_nodes_ratio']:.2f}x",
                    worst >= 1.0,
                )
            )
            rows.append(
                (
                    "Redis: paced, two nodes (two producers) >= 1.0x one node (one producer)",
                    f"{redis['paced_ratio']:.2f}x",
                    redis["paced_ratio"] >= 1.0,
                )
            )
    return rows
