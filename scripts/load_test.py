"""The load generator and the reconciliation of scripts/load-test (see that script).

Runs against an API server already listening on 127.0.0.1:<port> (embedded backend, its
log written to --log with RUST_LOG=info and NO_COLOR=1), in three phases:

1. LOAD: --concurrency asyncio workers, each on its own keep-alive HTTP/1.1 connection
   (a minimal client on asyncio streams: the standard library's http.client would cost
   a thread per connection), send a seeded random mix of requests for --duration
   seconds, then stop. Every response is recorded: kind, status, latency,
   x-transaction-id, and what it means for the outbox (see `expect`).
2. SETTLE: waits (first look after 1 s, the first check delay) until the in-process
   control worker has logged "control message handled" for every transaction id the
   responses named, at most --settle-timeout seconds.
3. RECONCILE: reads every "dispatched message" line of the log (the API's
   LoggingPublisher logs each message the embedded queue accepted, inline or by the
   worker) and checks, by stable message id `<txn>:<n>`:
   - every committed change (201 create, 200 add of a new line, 200 first cancel) has
     exactly one message, `<txn>:0`, published exactly once, with the right type and
     order id, and `GET /transactions/<txn>` (with `?item=` its `x-transaction-item`, for
     a change in entity mode) says `dispatched`;
   - every transaction named but not committed (a 409 or 412 its commit met) has no
     message and says `tombstoned`; a refusal decided by the reads (404, 409, 412, and the
     200 answers that changed nothing) names no transaction: nothing of it was sent;
   - no message was published for a transaction no response named;
   - each order's final version (`GET /orders/<id>`) is 1 + its committed changes, and
     it has exactly that many events.

With --backend emulator (scripts/load-test with LOAD_TEST_BACKEND=emulator) the server
runs on the AWS backend against the emulators on loopback (DynamoDB Local for DynamoDB,
moto for SQS), with the control worker a separate
process (`control-worker poll`, its log in --worker-log). Then SETTLE reads the worker's
log and waits until every named transaction's control message has had a final outcome
(not `deferred`), and RECONCILE reads the published events from the events queue
(--events-queue-url): ReceiveMessage until the queue has been empty for --drain-quiet
seconds, deleting what it reads, each event's message id and transaction id taken from
its message attributes `outbox-message-id` and `outbox-txn-id`. SQS delivers at least
once, so there every committed change's `<txn>:0` must be there AT LEAST once (copies of
a message id are counted and reported, not a failure); the other checks are the same.
The requests/s figure of that mode measures the emulators on this machine (DynamoDB
Local, a JVM, and moto, a Python process, sharing its cores with the API, the worker and
this client), not DynamoDB or SQS.

Exits 1 on any 5xx, any unexpected status, any transport error, or any difference.
Standard library only on the embedded backend; the emulator mode needs boto3 (run it with
the project's .venv/bin/python).
"""

import argparse
import asyncio
import datetime
import collections
import json
import os
import random
import re
import sys
import time
import uuid


class Conn:
    """One keep-alive HTTP/1.1 connection to the server."""

    def __init__(self, port):
        self.port = port
        self.reader = None
        self.writer = None

    async def request(self, method, path, body=None, headers=None):
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}")
        raw = ("\r\n".join(head) + "\r\n\r\n").encode() + data
        for attempt in (0, 1):
            fresh = self.writer is None
            if fresh:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                self.writer.write(raw)
                return await self._response()
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                # A kept-alive connection the server closed before reading this request:
                # resend once on a new one. Never on a fresh connection (it may have run).
                if fresh or attempt == 1:
                    raise
        raise AssertionError("unreachable")

    async def _response(self):
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            body = b"".join(parts)
        else:
            body = b""
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, body

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Pool:
    """A set with O(1) add, remove and random choice."""

    def __init__(self):
        self.items, self.index = [], {}

    def add(self, item):
        if item not in self.index:
            self.index[item] = len(self.items)
            self.items.append(item)

    def remove(self, item):
        at = self.index.pop(item, None)
        if at is not None:
            last = self.items.pop()
            if at < len(self.items):
                self.items[at] = last
                self.index[last] = at

    def choice(self, rng, hot=0):
        """A random member; with `hot`, half the time one of the `hot` newest members (a
        rough recency bias, so that concurrent requests meet on the same orders)."""
        if not self.items:
            return None
        if hot and rng.random() < 0.5:
            return self.items[rng.randrange(max(0, len(self.items) - hot), len(self.items))]
        return self.items[rng.randrange(len(self.items))]

    def __len__(self):
        return len(self.items)


MAX_LINES_SENT = 40  # new lines sent per order at most (the API holds 50)

# kind: weight. Kinds that need an order in some state fall back to `create` without one.
MIX = {
    "create": 22,
    "add_new": 30,        # a new SKU on an open order: 200 with ItemAdded, or 409 (a lost race)
    "add_same": 7,        # a line the order already holds as asked: 200, nothing changes
    "add_stale": 6,       # If-Match with a superseded version: 412
    "add_cancelled": 5,   # adding to a cancelled order: 409
    "cancel": 7,          # 200 with OrderCancelled, or 409 (a lost race)
    "cancel_again": 3,    # an order already cancelled: 200, nothing changes
    "unknown_order": 5,   # 404, after the transaction began
    "invalid": 8,         # 422 or 400, refused before any transaction
    "get": 7,             # GET /orders/{id}: 200
}

# (kind, status) -> what the answer means: "commit" (one event, <txn>:0, dispatched),
# "abandon" (no event: decided by the reads, it names no transaction, nothing of it having
# been sent; refused at its commit, it names one, tombstoned), "none" (no transaction).
EXPECTED = {
    ("create", 201): "commit",
    ("add_new", 200): "commit",
    ("add_new", 409): "abandon",
    ("add_same", 200): "abandon",
    ("add_same", 409): "abandon",  # cancelled meanwhile
    ("add_stale", 412): "abandon",
    ("add_cancelled", 409): "abandon",
    ("cancel", 200): "commit",
    ("cancel", 409): "abandon",
    ("cancel_again", 200): "abandon",
    ("unknown_order", 404): "abandon",
    ("invalid", 422): "none",
    ("invalid", 400): "none",
    ("get", 200): "none",
}
EVENT_OF = {"create": "OrderPlaced", "add_new": "ItemAdded", "cancel": "OrderCancelled"}


class Order:
    __slots__ = ("id", "lines_sent", "lines", "changes", "cancelling", "cancelled")

    def __init__(self, order_id):
        self.id = order_id
        self.lines_sent = 1
        self.lines = []          # lines the API confirmed (200 with a change, or the create)
        self.changes = []        # committed transactions on it, the create first
        self.cancelling = False
        self.cancelled = False


class Load:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.orders = {}
        self.open = Pool()          # placed, not being cancelled
        self.addable = Pool()       # open, fewer than MAX_LINES_SENT lines sent
        self.changed = Pool()       # version > 1 confirmed: If-Match "1" is stale
        self.cancelled = Pool()
        self.records = []
        self.sku = 0

    def new_sku(self):
        self.sku += 1
        return f"SKU-{self.sku}"

    def line(self):
        return {"sku": self.new_sku(), "quantity": self.rng.randint(1, 5), "unit_price_cents": self.rng.randint(100, 9999)}

    def plan(self):
        """The next request: (kind, method, path, body, headers, order, context)."""
        rng = self.rng
        kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
        hot = self.args.concurrency * 2
        if kind == "add_new" and len(self.addable):
            order = self.orders[self.addable.choice(rng, hot)]
            order.lines_sent += 1
            if order.lines_sent >= MAX_LINES_SENT:
                self.addable.remove(order.id)
            line = self.line()
            return kind, "POST", f"/orders/{order.id}/items", line, None, order, line
        if kind == "add_same":
            order_id = self.open.choice(rng, hot)
            if order_id is not None:
                order = self.orders[order_id]
                line = dict(rng.choice(order.lines))
                return kind, "POST", f"/orders/{order.id}/items", line, None, order, line
        if kind == "add_stale" and len(self.changed):
            order = self.orders[self.changed.choice(rng, hot)]
            return kind, "POST", f"/orders/{order.id}/items", self.line(), {"If-Match": '"1"'}, order, None
        if kind == "add_cancelled" and len(self.cancelled):
            order = self.orders[self.cancelled.choice(rng)]
            return kind, "POST", f"/orders/{order.id}/items", self.line(), None, order, None
        if kind == "cancel" and len(self.open) > self.args.concurrency:
            order = self.orders[self.open.choice(rng, hot)]
            order.cancelling = True
            self.open.remove(order.id)
            self.addable.remove(order.id)
            return kind, "POST", f"/orders/{order.id}/cancel", None, None, order, None
        if kind == "cancel_again" and len(self.cancelled):
            order = self.orders[self.cancelled.choice(rng)]
            return kind, "POST", f"/orders/{order.id}/cancel", None, None, order, None
        if kind == "unknown_order":
            path = f"/orders/{uuid.uuid4()}/" + rng.choice(["items", "cancel"])
            body = self.line() if path.endswith("items") else None
            return kind, "POST", path, body, None, None, None
        if kind == "invalid":
            choice = rng.randrange(4)
            if choice == 0:
                return kind, "POST", "/orders", {"customer_id": "c-1", "items": []}, None, None, None
            if choice == 1:
                return kind, "POST", "/orders", b'{"customer_id": "c-1", "items": [', None, None, None
            order_id = self.open.choice(rng) or str(uuid.uuid4())
            body = {"sku": "lower-case", "quantity": 1, "unit_price_cents": 1} if choice == 2 else {"sku": "SKU-X", "quantity": 0, "unit_price_cents": 1}
            return kind, "POST", f"/orders/{order_id}/items", body, None, None, None
        if kind == "get" and len(self.open):
            order_id = self.open.choice(rng, hot)
            return kind, "GET", f"/orders/{order_id}", None, None, None, None
        lines = [self.line() for _ in range(rng.randint(1, 3))]
        return "create", "POST", "/orders", {"customer_id": f"c-{rng.randrange(1000)}", "items": lines}, None, None, lines

    def learn(self, kind, status, order, context, txn, body):
        """Updates the pool from an answer."""
        if kind == "create" and status == 201:
            view = json.loads(body)
            order = Order(view["id"])
            order.lines = list(context)
            order.changes.append(txn)
            self.orders[order.id] = order
            self.open.add(order.id)
            self.addable.add(order.id)
            return order.id
        if kind == "add_new" and status == 200:
            order.lines.append(context)
            order.changes.append(txn)
            self.changed.add(order.id)
        elif kind == "cancel":
            order.cancelling = False
            if status == 200:
                order.cancelled = True
                order.changes.append(txn)
                self.cancelled.add(order.id)
            elif not order.cancelled:
                self.open.add(order.id)
                if order.lines_sent < MAX_LINES_SENT:
                    self.addable.add(order.id)
        return order.id if order else None

    async def worker(self, deadline):
        conn = Conn(self.args.port)
        try:
            while time.monotonic() < deadline:
                kind, method, path, body, headers, order, context = self.plan()
                started = time.perf_counter()
                began = time.monotonic()
                try:
                    status, answer_headers, answer = await conn.request(method, path, body, headers)
                except (OSError, asyncio.IncompleteReadError, ValueError) as error:
                    conn.close()
                    self.records.append({"kind": kind, "status": None, "error": repr(error), "path": path})
                    if kind == "cancel":
                        order.cancelling = False
                    continue
                latency = time.perf_counter() - started
                txn = answer_headers.get("x-transaction-id")
                order_id = self.learn(kind, status, order, context, txn, answer)
                record = {"kind": kind, "status": status, "latency": latency, "txn": txn, "order": order_id, "path": path,
                          "began": began, "item": answer_headers.get("x-transaction-item")}
                if (kind, status) not in EXPECTED or status >= 500:
                    record["body"] = answer.decode(errors="replace")[:300]
                self.records.append(record)
        finally:
            conn.close()

    async def run(self):
        deadline = time.monotonic() + self.args.duration
        started = time.monotonic()
        cpu = time.process_time()
        server_cpu = server_cpu_seconds(self.args.server_pid)
        others_cpu = {name: server_cpu_seconds(pid) for name, pid in self.args.other_pid}
        machine = machine_cpu()
        self.loadavg_before = loadavg()
        self.rss = {"start": rss_mib(self.args.server_pid)}

        async def middle():
            await asyncio.sleep(self.args.duration / 2)
            self.rss["middle"] = rss_mib(self.args.server_pid)

        sampler = asyncio.ensure_future(middle())
        await asyncio.gather(*(self.worker(deadline) for _ in range(self.args.concurrency)))
        self.rss["end"] = rss_mib(self.args.server_pid)
        sampler.cancel()
        self.wall = time.monotonic() - started
        self.client_cpu = time.process_time() - cpu
        self.server_cpu = server_cpu_seconds(self.args.server_pid) - server_cpu
        self.others_cpu = {name: server_cpu_seconds(pid) - others_cpu[name] for name, pid in self.args.other_pid}
        busy, total = (after - before for after, before in zip(machine_cpu(), machine))
        self.machine_busy = busy / total * os.cpu_count() * self.wall if total else float("nan")
        self.loadavg_after = loadavg()


def rss_mib(pid):
    """The resident set size of process `pid` in MiB, from /proc (None if unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_cpu():
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return sum(values) - idle, sum(values)
    except (OSError, ValueError, IndexError):
        return 0, 0


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def server_cpu_seconds(pid):
    """utime + stime of `pid`, in seconds (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def percentile(sorted_values, fraction):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


DISPATCHED = re.compile(r"dispatched message destination=(\S+) message_id=(\S+) txn_id=(\S+) entity=(\S+) seq=(\S+) body=(.*)$")
# The timestamp a log line starts with (tracing's default format, UTC).
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")
# SQS FIFO's deduplication window: a copy of a message id sent within it is dropped.
FIFO_WINDOW_S = 300
# The worker logs each outcome in its message's span: control_message{sqs_message_id=… txn_id=…}.
HANDLED = re.compile(r'control_message\{sqs_message_id=\S+ txn_id=([0-9a-f-]+)\}: .*control message handled outcome="([a-z_]+)"')


def stamp_of(line):
    """The line's time in seconds (None where it has no timestamp)."""
    match = STAMP.search(line)
    if not match:
        return None
    return datetime.datetime.fromisoformat(match.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()


def read_log(path, placed=None):
    """`placed` (when given) gets, in log order, (message id, entity, seq, time) of every
    send of a message placed in its entity's history."""
    published = collections.defaultdict(list)   # message_id -> [(txn, body, inline)]
    handled = collections.defaultdict(list)     # txn -> [outcome]
    levels = collections.Counter()
    problems = {}
    with open(path, errors="replace") as log:
        for line in log:
            match = DISPATCHED.search(line)
            if match:
                _, message_id, txn, entity, seq, body = match.groups()
                published[message_id].append((txn, body, "request{" in line))
                if placed is not None and entity != "-":
                    placed.append((message_id, entity, int(seq), stamp_of(line)))
                continue
            match = HANDLED.search(line)
            if match:
                handled[match.group(1)].append(match.group(2))
                continue
            for level in ("WARN", "ERROR"):
                if f" {level} " in line[:40]:
                    # Grouped by level, target and message (the text before the fields).
                    rest = line.split("}: ", 1)[1] if "}: " in line else line.split(f" {level} ", 1)[1]
                    message = re.split(r" \w+=", rest.strip(), maxsplit=1)[0]
                    levels[f"{level} {message}"] += 1
                    problems.setdefault(f"{level} {message}", line.rstrip())
    return published, handled, levels, problems


def read_logs(paths, placed=None):
    """read_log over several logs (the API's and, on the emulator, the worker's), merged."""
    published = collections.defaultdict(list)
    handled = collections.defaultdict(list)
    levels = collections.Counter()
    problems = {}
    for path in paths:
        more_published, more_handled, more_levels, more_problems = read_log(path, placed)
        for key, values in more_published.items():
            published[key] += values
        for key, values in more_handled.items():
            handled[key] += values
        levels.update(more_levels)
        for key, line in more_problems.items():
            problems.setdefault(key, line)
    return published, handled, levels, problems


def drain_events(queue_url, quiet, deadline_seconds):
    """Reads the events queue until it has been empty for `quiet` seconds (at most
    `deadline_seconds`), deleting what it reads. Returns ({message_id: [(txn, body, None)]},
    receives, whether it stopped at the deadline). The emulator mode only (boto3)."""
    import boto3  # the project's .venv; not needed on the embedded backend

    sqs = boto3.client("sqs", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ["AWS_REGION"])
    published = collections.defaultdict(list)
    receives = 0
    started = time.monotonic()
    quiet_since = time.monotonic()
    while True:
        if time.monotonic() - started > deadline_seconds:
            return published, receives, True
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                  MessageAttributeNames=["outbox-txn-id", "outbox-message-id"]).get("Messages", [])
        receives += 1
        for message in got:
            attributes = message.get("MessageAttributes", {})
            txn = attributes.get("outbox-txn-id", {}).get("StringValue")
            message_id = attributes.get("outbox-message-id", {}).get("StringValue") or f"(no message id: {message['MessageId']})"
            published[message_id].append((txn, message["Body"], None))
        if got:
            sqs.delete_message_batch(QueueUrl=queue_url, Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)])
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet:
            return published, receives, False


async def fetch_all(port, paths, concurrency):
    """GETs every path, `concurrency` at a time; {path: (status, body)}."""
    results = {}
    queue = collections.deque(paths)

    async def one():
        conn = Conn(port)
        try:
            while queue:
                path = queue.popleft()
                status, _, body = await conn.request("GET", path)
                results[path] = (status, body)
        finally:
            conn.close()

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return results


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--retention", type=float, default=604800,
                        help="the server's OUTBOX_RETENTION_SECONDS: a transaction's record may be gone (status "
                             "unknown) once this long has passed since its request began")
    parser.add_argument("--settle-timeout", type=float, default=30)
    parser.add_argument("--backend", choices=("embedded", "emulator"), default="embedded")
    parser.add_argument("--worker-log", help="the control worker's log (emulator)")
    parser.add_argument("--events-queue-url", help="the events queue (emulator)")
    parser.add_argument("--drain-quiet", type=float, default=3,
                        help="seconds the events queue must stay empty to end the drain (emulator)")
    parser.add_argument("--other-pid", action="append", default=[], type=lambda text: tuple(text.split("=", 1)),
                        metavar="NAME=PID", help="another process whose CPU use to report (repeatable)")
    args = parser.parse_args()
    args.other_pid = [(name, int(pid)) for name, pid in args.other_pid]
    emulator = args.backend == "emulator"
    if emulator and not (args.worker_log and args.events_queue_url):
        parser.error("--backend emulator needs --worker-log and --events-queue-url")
    logs = [args.log] + ([args.worker_log] if emulator else [])

    load = Load(args)
    print(f"load: {args.concurrency} connections for {args.duration:g} s, seed {args.seed}, loopback port {args.port}, "
          f"backend {'AWS on the emulators (DynamoDB Local, moto for SQS)' if emulator else 'embedded'}")
    if emulator:
        print("note: emulator mode: the figures below measure DynamoDB Local and moto (SQS) on this machine, "
              "sharing its cores with the API, the worker and this client, not DynamoDB or SQS")
    await load.run()
    records = load.records
    failures = []

    # --- throughput, latency, statuses ---
    answered = [r for r in records if r["status"] is not None]
    errors = [r for r in records if r["status"] is None]
    latencies = sorted(r["latency"] * 1000 for r in answered)
    print(f"requests: {len(answered)} answered in {load.wall:.1f} s = {len(answered) / load.wall:.0f} requests/s; transport errors: {len(errors)}")
    print(f"latency (client-side, ms): p50 {percentile(latencies, 0.5):.2f}  p90 {percentile(latencies, 0.9):.2f}  "
          f"p99 {percentile(latencies, 0.99):.2f}  max {latencies[-1] if latencies else float('nan'):.2f}")
    rss = {moment: load.rss.get(moment) for moment in ("start", "middle", "end")}
    print("server memory (RSS, MiB): " + ", ".join(
        f"{moment} {value:.0f}" if value is not None else f"{moment} ?" for moment, value in rss.items())
        + (f"; end/middle {rss['end'] / rss['middle']:.2f}" if rss["end"] and rss["middle"] else ""))
    ncpu = os.cpu_count()
    print(f"cpu during the load: client (this Python process) {100 * load.client_cpu / load.wall:.0f}% of one core; "
          f"server {100 * load.server_cpu / load.wall:.0f}%; "
          f"whole machine busy {100 * load.machine_busy / load.wall:.0f}% of {100 * ncpu}% ({ncpu} cores), "
          + "".join(f"{name} {100 * cpu / load.wall:.0f}%; " for name, cpu in load.others_cpu.items())
          + f"so other processes {100 * (load.machine_busy - load.client_cpu - load.server_cpu - sum(load.others_cpu.values())) / load.wall:.0f}%; "
          f"load average {load.loadavg_before} before, {load.loadavg_after} after")
    statuses = collections.Counter(r["status"] for r in answered)
    print("statuses: " + ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items())))
    fivexx = sum(count for status, count in statuses.items() if status >= 500)
    print(f"5xx: {fivexx}")
    if fivexx:
        failures.append(f"{fivexx} answers were 5xx")
    if errors:
        failures.append(f"{len(errors)} requests met a transport error, e.g. {errors[0]}")
    by_kind = collections.defaultdict(collections.Counter)
    kind_latency = collections.defaultdict(list)
    for r in answered:
        by_kind[r["kind"]][r["status"]] += 1
        kind_latency[r["kind"]].append(r["latency"] * 1000)
    print("by kind (status: count; p50/p99 ms):")
    for kind in MIX:
        if by_kind[kind]:
            values = sorted(kind_latency[kind])
            counts = ", ".join(f"{s}: {c}" for s, c in sorted(by_kind[kind].items()))
            print(f"  {kind:<14} {counts:<28} {percentile(values, 0.5):7.2f} / {percentile(values, 0.99):7.2f}")
    unexpected = [r for r in answered if (r["kind"], r["status"]) not in EXPECTED]
    if unexpected:
        failures.append(f"{len(unexpected)} unexpected answers, e.g. " + "; ".join(
            f"{r['kind']} {r['path']} -> {r['status']} {r.get('body', '')}" for r in unexpected[:3]))

    # --- what the outbox must have done ---
    committed, abandoned = {}, {}
    refused_unsent = 0
    for r in answered:
        meaning = EXPECTED.get((r["kind"], r["status"]))
        txn = r["txn"]
        if meaning == "commit" and not txn:
            failures.append(f"{r['kind']} {r['path']} -> {r['status']} named no transaction")
        elif meaning == "abandon" and not txn:
            refused_unsent += 1
        elif meaning == "none" and txn:
            failures.append(f"{r['kind']} {r['path']} -> {r['status']} named transaction {txn}, refused before any")
        elif meaning == "commit":
            if txn in committed or txn in abandoned:
                failures.append(f"transaction {txn} named by two answers")
            committed[txn] = r
        elif meaning == "abandon":
            if txn in committed or txn in abandoned:
                failures.append(f"transaction {txn} named by two answers")
            abandoned[txn] = r
    named = set(committed) | set(abandoned)

    # --- settle: the worker handles every control message ---
    settle_started = time.monotonic()
    await asyncio.sleep(1.0)
    while True:
        published, handled, levels, problems = read_logs(logs)
        if emulator:
            # A deferred control message comes back later: wait for a final outcome.
            left = [txn for txn in named if not any(o != "deferred" for o in handled.get(txn, []))]
        else:
            left = [txn for txn in named if txn not in handled]
        if not left or time.monotonic() - settle_started > args.settle_timeout:
            break
        await asyncio.sleep(0.5)
    print(f"settle: {time.monotonic() - settle_started:.1f} s until the control worker had handled "
          f"{len(named) - len(left)} of {len(named)} transactions' control messages"
          + (" (a final outcome, not deferred)" if emulator else ""))
    if left:
        failures.append(f"{len(left)} transactions' control messages not handled after {args.settle_timeout:g} s, e.g. {left[0]}")
    outcomes = collections.Counter(outcome for txn in named for outcome in handled.get(txn, []))
    print("control worker outcomes: " + (", ".join(f"{o}: {c}" for o, c in sorted(outcomes.items())) or "none"))
    repeats = sum(1 for txn in named if len(handled.get(txn, [])) > 1)
    if repeats:
        print(f"  ({repeats} transactions' control messages were handled more than once: deferrals or redeliveries)")

    if emulator:
        # The published events: what the events queue holds (the AWS backend logs no
        # "dispatched message" lines).
        drain_started = time.monotonic()
        published, receives, cut = drain_events(args.events_queue_url, args.drain_quiet, args.settle_timeout)
        print(f"drain: {time.monotonic() - drain_started:.1f} s, {receives} ReceiveMessage calls, "
              f"{sum(len(s) for s in published.values())} events read and deleted from the events queue "
              f"(until empty for {args.drain_quiet:g} s)")
        if cut:
            failures.append(f"the events queue was still not empty after {args.settle_timeout:g} s of draining")

    # --- order per entity: each order's events in the order they were first sent ---
    placed = []
    if not emulator:
        read_logs(logs, placed)
    first = {}
    copies, late_copies = 0, []
    for index, (message_id, entity, seq, at) in enumerate(placed):
        if message_id in first:
            copies += 1
            first_at = first[message_id][3]
            if at is None or first_at is None or at - first_at > FIFO_WINDOW_S:
                late_copies.append(f"{message_id} sent again {'?' if at is None or first_at is None else f'{at - first_at:.0f}'} s after its first send")
            continue
        first[message_id] = (index, entity, seq, at)
    seqs_of = collections.defaultdict(list)
    for _, entity, seq, _ in sorted(first.values()):
        seqs_of[entity].append(seq)
    inversions = [f"{entity}: seq {seqs}" for entity, seqs in seqs_of.items() if any(b < a for a, b in zip(seqs, seqs[1:]))]
    gaps = [f"{entity}: seq {sorted(seqs)}" for entity, seqs in seqs_of.items() if sorted(seqs) != list(range(1, len(seqs) + 1))]
    if not emulator:
        print(f"order per entity: {len(first)} placed events of {len(seqs_of)} orders, first sent in each order's commit order: "
              f"{len(inversions)} inversions, {len(gaps)} orders with a gap or a fork in their chain; "
              f"{copies} copies of a message id sent again (an earlier event sent first by a later change's publisher), "
              f"{len(late_copies)} beyond FIFO's {FIFO_WINDOW_S // 60}-minute deduplication window")
        for label, items in (("inversions of an order's events", inversions), ("chains with a gap or a fork", gaps),
                             ("copies beyond FIFO's deduplication window", late_copies)):
            if items:
                failures.append(f"{len(items)} {label}: " + "; ".join(items[:3]))

    # --- reconcile by message id ---
    by_txn = collections.defaultdict(list)
    for message_id, sends in published.items():
        txn, _, index = message_id.rpartition(":")
        by_txn[txn].append((message_id, sends))
    inline = sum(1 for sends in published.values() for _, _, path in sends if path)
    total_sends = sum(len(sends) for sends in published.values())
    missing, duplicated, wrong, for_rejected, stray = [], [], [], [], []
    for txn, r in committed.items():
        messages = by_txn.get(txn, [])
        ids = sorted(message_id for message_id, _ in messages)
        if ids != [f"{txn}:0"]:
            (missing if not ids else wrong).append(f"{txn} ({r['kind']}): published {ids}")
            continue
        sends = messages[0][1]
        if len(sends) > 1:
            duplicated.append(f"{txn}:0 published {len(sends)} times")
        if any(sent_txn != txn for sent_txn, _, _ in sends):
            wrong.append(f"{txn}:0 carries transaction ids {sorted({str(t) for t, _, _ in sends})}")
        body = json.loads(sends[0][1])
        if body.get("type") != EVENT_OF[r["kind"]] or body.get("order_id") != r["order"]:
            wrong.append(f"{txn}:0 is {body.get('type')} of {body.get('order_id')}, expected {EVENT_OF[r['kind']]} of {r['order']}")
    for txn in abandoned:
        if txn in by_txn:
            for_rejected.append(f"{txn} ({abandoned[txn]['kind']} -> {abandoned[txn]['status']}): {[m for m, _ in by_txn[txn]]}")
    for txn in by_txn:
        if txn not in named:
            stray.append(f"{txn}: {[m for m, _ in by_txn[txn]]}")

    # --- the transactions' status, and the orders' final state ---
    fetch_started = time.monotonic()
    # A change in entity mode names its item: its status is found there once its entry
    # settled into a sent mark (it has no record of its own).
    item_of = {r["txn"]: r["item"] for r in records if r.get("txn") and r.get("item")}
    status_path = {txn: f"/transactions/{txn}" + (f"?item={item_of[txn]}" if txn in item_of else "") for txn in named}
    status_paths = [status_path[txn] for txn in sorted(named)]
    order_paths = [f"/orders/{order_id}" for order_id in sorted(load.orders)]
    fetched = await fetch_all(args.port, status_paths + order_paths, args.concurrency)
    fetched_by = time.monotonic()
    wrong_status = collections.Counter()
    examples = []
    began = {r["txn"]: r["began"] for r in records if r.get("txn")}
    expired = 0
    for txn in named:
        status, body = fetched[status_path[txn]]
        state = json.loads(body).get("status") if status == 200 else f"HTTP {status}"
        expected = "dispatched" if txn in committed else "tombstoned"
        # A record is written after its request began and kept for the retention from
        # then at least: past that (with a margin), it may have expired, and its status
        # is `unknown`; never the other outcome.
        if state == "unknown" and began.get(txn, 0) + args.retention - 2 < fetched_by:
            expired += 1
            continue
        if state != expected:
            wrong_status[(expected, state)] += 1
            if len(examples) < 3:
                examples.append(f"{txn}: {state}, expected {expected}")
    events_of_order = collections.Counter()
    for sends in published.values():
        try:
            events_of_order[json.loads(sends[0][1]).get("order_id")] += 1
        except ValueError:
            pass
    state_mismatch = []
    for order_id, order in load.orders.items():
        status, body = fetched[f"/orders/{order_id}"]
        view = json.loads(body) if status == 200 else {}
        expected_status = "cancelled" if order.cancelled else "placed"
        if (view.get("version") != len(order.changes) or view.get("status") != expected_status
                or events_of_order[order_id] != len(order.changes)):
            state_mismatch.append(f"{order_id}: version {view.get('version')}, {view.get('status')}, "
                                  f"{events_of_order[order_id]} events; expected {len(order.changes)} committed changes, {expected_status}")
    print(f"checked {len(status_paths)} transaction statuses and {len(order_paths)} orders in {time.monotonic() - fetch_started:.1f} s"
          + (f" ({expired} statuses `unknown`: their records had expired, {args.retention:g} s after their request)" if expired else ""))

    if emulator:
        print(f"messages published: {total_sends} events on the events queue for {len(published)} message ids "
              f"({total_sends - len(published)} copies of a message id already read: at-least-once, "
              f"not a failure)")
    else:
        print(f"messages published: {total_sends} sends of {len(published)} message ids "
              f"({inline} inline in the request, {total_sends - inline} by the control worker)")
    what_logs = "API and control worker logs" if emulator else "API log"
    if levels:
        print(f"{what_logs}, WARN and ERROR lines (count, level target: message; the first in full):")
        for key, count in levels.most_common():
            print(f"  {count:6} {key}")
            print(f"         {problems[key][:400]}")
    else:
        print(f"{what_logs}: no WARN or ERROR lines")
    # On the emulator the events come from SQS, at least once: a copy is not a failure. On
    # the embedded backend a copy is one only beyond FIFO's deduplication window (above).
    for label, items in (("missing", missing), ("wrong message", wrong),
                         ("for rejected requests", for_rejected), ("for no answered transaction", stray),
                         ("order state", state_mismatch)):
        if items:
            failures.append(f"{len(items)} {label}: " + "; ".join(items[:3]))
    if wrong_status:
        failures.append("transaction status differs: " + ", ".join(f"{c} {e}->{s}" for (e, s), c in wrong_status.items())
                        + "; e.g. " + "; ".join(examples))
    print(f"refusals decided by the reads (no transaction named, nothing sent): {refused_unsent}; "
          f"abandoned transactions (refused at their commit): {len(abandoned)}, all tombstoned: "
          f"{'yes' if not any(e == 'tombstoned' for e, _ in wrong_status) else 'NO'}")
    print(f"orders: {len(load.orders)} created; final version, status and event count match the committed changes: "
          f"{'yes' if not state_mismatch else 'NO'}")
    print(f"reconciliation{' (at least once, from the events queue)' if emulator else ''}: "
          f"{len(committed)} committed transactions, {total_sends} messages published, "
          f"{len(missing)} missing, {len(duplicated)} duplicated"
          + (f" message ids ({total_sends - len(published)} extra copies; reported, not a failure)" if emulator else "")
          + f", {len(for_rejected)} for rejected requests"
          + (f", {len(stray)} for unknown transactions" if stray else ""))
    if duplicated:
        print("  duplicated, e.g.: " + "; ".join(duplicated[:3]))
    if failures:
        print("FAILED:", file=sys.stderr)
        for failure in failures:
            print("  " + failure[:1000], file=sys.stderr)
        return 1
    print("load test: passed")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
