#!/usr/bin/env python3
"""A durable alert consumer: read vidsentry alerts from JetStream, print them, acknowledge them.

    python samples/alert_consumer.py --nats-url nats://127.0.0.1:4222
    python samples/alert_consumer.py --durable pager --from-start --count 10

It is a durable pull consumer on `vidsentry.*.alerts` in the JetStream stream VIDSENTRY: alerts
raised while it was down are delivered when it comes back, from where it left off. Each alert
is acknowledged only after it was handled (printed here; paged, e-mailed... in real life), so
a crash in between means the alert comes again, never that it is lost: deduplicate on `ce-id`
if handling twice matters. Ctrl-C or SIGTERM stop it between two fetches.

Output: one JSON line per alert on stdout, `{"subject", "id", "type", "source", "data"}`.
Only nats-py is needed (pip install nats-py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from urllib.parse import unquote

import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

STREAM = "VIDSENTRY"
SUBJECT = "vidsentry.*.alerts"
FETCH_BATCH = 16
FETCH_WAIT_S = 1.0  # also how long a stop request may wait
ACK_WAIT_S = 30.0  # an alert not acked within this is delivered again


def alert_line(msg: Msg) -> str:
    headers = msg.headers or {}
    try:
        data = json.loads(msg.data)
    except ValueError:
        data = msg.data.decode("utf-8", errors="replace")
    return json.dumps(
        {
            "subject": msg.subject,
            "id": headers.get("ce-id"),
            "type": headers.get("ce-type"),
            "source": unquote(headers.get("ce-source", "")),
            "data": data,
        },
        ensure_ascii=False,
    )


async def consume(url: str, durable: str, *, from_start: bool, count: int | None, stop: asyncio.Event) -> int:
    """Handle alerts until `stop` is set or `count` were handled; returns how many were."""
    nc = await nats.connect(url, name=f"alert-consumer-{durable}", max_reconnect_attempts=-1)
    handled = 0
    try:
        js = nc.jetstream()
        config = ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ACK_WAIT_S,
            # Used only when the durable consumer is first created; afterwards it resumes where it was.
            deliver_policy=DeliverPolicy.ALL if from_start else DeliverPolicy.NEW,
        )
        sub = None
        while sub is None and not stop.is_set():
            try:
                sub = await js.pull_subscribe(SUBJECT, durable=durable, stream=STREAM, config=config)
            except nats.js.errors.NotFoundError:
                print(f"alert-consumer: no stream {STREAM} yet (has vidsentry run?); retrying", file=sys.stderr)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2.0)
        if sub is None:
            return handled
        print(f"alert-consumer: waiting for alerts on {SUBJECT} (durable {durable!r})", file=sys.stderr, flush=True)
        while not stop.is_set() and (count is None or handled < count):
            batch = FETCH_BATCH if count is None else min(FETCH_BATCH, count - handled)
            try:
                messages = await sub.fetch(batch, timeout=FETCH_WAIT_S)
            except TimeoutError:  # nats-py's own, or asyncio's when its deadline passes between two pulls
                continue  # nothing new; look at `stop` again
            except nats.js.errors.APIError as exc:  # a JetStream status other than "nothing yet"
                print(f"alert-consumer: fetch refused ({exc}); trying again", file=sys.stderr)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
                continue
            for msg in messages:
                print(alert_line(msg), flush=True)
                # After handling, and confirmed by the server: a crash before this means redelivery, not loss.
                try:
                    await msg.ack_sync(timeout=5.0)
                except nats.errors.TimeoutError:
                    print("alert-consumer: ack unconfirmed; the alert may come again", file=sys.stderr)
                handled += 1
    finally:
        # Every ack was confirmed above, so closing loses nothing. (drain() would also wait for the
        # pull subscription's outstanding fetch, up to its drain timeout.)
        await nc.close()
    return handled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--durable", default="alert-consumer", help="consumer name; it remembers its position")
    parser.add_argument("--from-start", action="store_true", help="a new consumer starts with the oldest kept alert")
    parser.add_argument("--count", type=int, help="exit after handling this many alerts")
    args = parser.parse_args(argv)

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        handled = await consume(args.nats_url, args.durable, from_start=args.from_start, count=args.count, stop=stop)
        print(f"alert-consumer: handled {handled} alert(s)", file=sys.stderr)
        return 0

    try:
        return asyncio.run(run())
    except (OSError, nats.errors.NoServersError) as exc:
        print(f"alert-consumer: cannot reach NATS at {args.nats_url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
