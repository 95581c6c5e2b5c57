"""The shipping consumer end to end on the emulators (run by scripts/consumer-e2e).

The API and the control worker run as processes (started by the shell script); this
drives them and the consumers:

1. places orders through the API, changes some (a line added, a line removed, cancelled)
   and reads all their events from the events queue;
2. delivers every event three times to the consumers' source queue with the same body
   and attributes, shuffled across orders (an order's ItemAdded often before its
   OrderPlaced): two copies in one SendMessageBatch (received together, processed
   concurrently), the third after the consumers started;
3. starts two shipping consumers (processes, `OUTBOX_CONSUMER_QUEUE_URL` the source
   queue), then a third for a second round of orders, which it kills with SIGKILL as
   soon as it has committed one message, mid-batch; what it held comes back after the
   source queue's visibility timeout;
4. when the source queue is empty, reconciles: exactly one shipment per order placed,
   each as its order ended (its lines, cancelled or not: the consumer applies each
   order's events in the order the order committed them, whatever the delivery order),
   one ShipmentRequested id per order received (every copy of it with one body), every
   consumer record dispatched, nothing lost;
5. with --billing, the third hop: every message shipping sent to its shipments queue
   (each with its place in its shipment's history) delivered three times to the billing
   consumers' source queue, shuffled across shipments (a ShipmentCancelled often before
   its ShipmentRequested), two copies in one batch; two billing consumers, then a third
   killed with SIGKILL mid-batch for the second half of the shipments; and the check:
   each invoice applied its shipment's messages once each, in chain order (its list of
   applied seqs is 1..n), void exactly when its shipment was cancelled, every billing
   record dispatched; with --control-worker, billing's state of five shipments' chains
   as `control-worker consumer-state` shows it: applied through the last seq, nothing
   kept;
6. with --fifo, every queue but the control queue is FIFO, grouped by entity (the events
   queue as the caller bootstrapped it, `--events-via sqs-fifo`): each entity's messages
   are delivered in their order, the entities still interleaved;
7. every hop's dead-letter queue is empty (the control queue's and the events queue's,
   and the consumers' source queues'), and one line per hop: messages, copies delivered,
   consumers killed, violations.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict

import boto3


def post_order(port, n):
    body = json.dumps(
        {"customer_id": f"c-{n}", "items": [{"sku": f"SKU-{n % 7}", "quantity": 1 + n % 3, "unit_price_cents": 250}]}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/orders", data=body, method="POST", headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201, response.status
        return json.loads(response.read())["id"]


def call(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 201), (method, path, response.status)
        return json.loads(response.read())


def change_orders(port, placed):
    """Changes some orders, each change one event: a line added to every third, the
    first line removed from every fifth, every fourth cancelled (after its other
    changes). Returns how many events the changes emitted."""
    events = 0
    for n, order in enumerate(placed):
        if n % 3 == 0:
            call(port, "POST", f"/orders/{order}/items", {"sku": "SKU-ADDED", "quantity": 2, "unit_price_cents": 100})
            events += 1
        if n % 5 == 0:
            call(port, "DELETE", f"/orders/{order}/items/SKU-{n % 7}")
            events += 1
        if n % 4 == 0:
            call(port, "POST", f"/orders/{order}/cancel")
            events += 1
    return events


def drain(sqs, url, want=None, quiet=3.0, timeout=60.0):
    """Receives and deletes until `want` messages came (if given) and the queue stayed
    empty for `quiet` seconds."""
    got = []
    deadline = time.time() + timeout
    last = time.time()
    while time.time() < deadline:
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
        )
        messages = reply.get("Messages", [])
        for message in messages:
            attributes = {name: value["StringValue"] for name, value in message.get("MessageAttributes", {}).items()}
            got.append((message["Body"], attributes))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        if messages:
            last = time.time()
        elif (want is None or len(got) >= want) and time.time() - last >= quiet:
            break
    return got


def send_copies(sqs, url, events, copies):
    """Sends copy number(s) `copies` of each event: one entry per copy, the copies of an
    event in one SendMessageBatch. To a FIFO queue, each in its entity's message group,
    each copy with a deduplication id of its own (so that SQS delivers every copy)."""
    for index, (body, attributes) in enumerate(events):
        entries = [
            {
                "Id": f"c{copy}",
                "MessageBody": body,
                "MessageAttributes": {name: {"DataType": "String", "StringValue": value} for name, value in attributes.items()},
            }
            for copy in copies
        ]
        if url.endswith(".fifo"):
            for entry in entries:
                entry["MessageGroupId"] = attributes.get("outbox-entity") or attributes["outbox-message-id"]
                entry["MessageDeduplicationId"] = f"{attributes['outbox-message-id']}-{entry['Id']}"
        reply = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert not reply.get("Failed"), reply


def fifo_order(messages):
    """`messages` (shuffled) as a FIFO queue grouped by entity delivers them: each entity's
    in their order in its history, in the places its messages had (the entities still
    interleaved)."""
    slots = defaultdict(list)
    for index, (_, attributes) in enumerate(messages):
        if "seq" in position_of(attributes):
            slots[attributes["outbox-entity"]].append(index)
    ordered = list(messages)
    for indexes in slots.values():
        in_order = sorted((messages[index] for index in indexes), key=lambda message: int(position_of(message[1])["seq"]))
        for index, message in zip(indexes, in_order):
            ordered[index] = message
    return ordered


def count_overtaken(events):
    """How many events come, in this delivery order, after a later event of their order
    (by their place in the order's history): each one an in-order consumer must hold."""
    seen = defaultdict(int)
    overtaken = 0
    for _, attributes in events:
        place = dict(field.split("=") for field in attributes.get("outbox-position", "").split(";") if "=" in field)
        if not place:
            continue
        entity, seq = attributes["outbox-entity"], int(place["seq"])
        overtaken += seq < seen[entity]
        seen[entity] = max(seen[entity], seq)
    return overtaken


def queue_depth(sqs, url):
    """The messages in the queue, visible or in flight, that are not delayed."""
    return queue_counts(sqs, url)[0]


def queue_counts(sqs, url):
    """The messages in the queue (visible or in flight), and the delayed ones apart: a kept
    message's reminder comes back only after its delay (15 minutes), whether or not the
    message was applied meanwhile, and then finds it applied."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    waiting = int(attributes.get("ApproximateNumberOfMessages", "0")) + int(
        attributes.get("ApproximateNumberOfMessagesNotVisible", "0")
    )
    return waiting, int(attributes.get("ApproximateNumberOfMessagesDelayed", "0"))


def scan(dynamodb, table, prefix):
    items = []
    kwargs = {"TableName": table}
    while True:
        page = dynamodb.scan(**kwargs)
        items += [item for item in page["Items"] if item["pk"]["S"].startswith(prefix)]
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api-port", type=int, required=True)
    parser.add_argument("--events-queue-url", required=True)
    parser.add_argument("--shipping", required=True, help="the shipping consumer's binary")
    parser.add_argument("--work", required=True, help="where the consumers' logs go")
    parser.add_argument("--orders", type=int, default=30, help="orders of the first round")
    parser.add_argument("--killed-orders", type=int, default=30, help="orders of the round whose consumer is killed")
    parser.add_argument(
        "--fifo",
        action="store_true",
        help="FIFO queues grouped by entity (the events queue is the caller's): the consumers' sources and shipments",
    )
    parser.add_argument("--billing", help="the billing consumer's binary: run the third hop, shipments to billing")
    parser.add_argument("--control-worker", help="the control worker's binary: show billing's state of a few chains with it")
    parser.add_argument(
        "--dead-letter-queue", action="append", default=[], help="a dead-letter queue's URL that must stay empty"
    )
    args = parser.parse_args()

    region = os.environ.get("AWS_REGION", "us-east-1")
    sqs = boto3.client("sqs", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=region)
    dynamodb = boto3.client("dynamodb", endpoint_url=os.environ["AWS_ENDPOINT_URL_DYNAMODB"], region_name=region)
    table = os.environ["OUTBOX_TABLE_NAME"]
    global SUFFIX
    SUFFIX = ".fifo" if args.fifo else ""
    source, source_dlq = source_queue(sqs, "shipping-source")
    shipments = sqs.create_queue(
        QueueName=f"shipping-shipments{SUFFIX}", Attributes={"FifoQueue": "true"} if args.fifo else {}
    )["QueueUrl"]
    shipments_target = f"sqs-fifo:{shipments}" if args.fifo else f"sqs:{shipments}"
    consumers = []

    def start_consumer(name, binary=args.shipping, consumer="shipping", queue=None, destinations=None):
        env = dict(os.environ)
        env.update(
            OUTBOX_CONSUMER_NAME=consumer,
            OUTBOX_CONSUMER_QUEUE_URL=queue or source,
            OUTBOX_DESTINATIONS=f"shipments={shipments_target}" if destinations is None else destinations,
            OUTBOX_SERVICE_NAME=name,
            RUST_LOG="info",
            NO_COLOR="1",
        )
        log = open(os.path.join(args.work, f"{name}.log"), "w")
        process = subprocess.Popen([binary], env=env, stdout=log, stderr=subprocess.STDOUT)
        consumers.append((name, process, log.name))
        return process, log.name

    def wait_for(log_path, text, process, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with open(log_path) as log:
                if text in log.read():
                    return True
            if process.poll() is not None:
                break
            time.sleep(0.05)
        with open(log_path) as log:
            print(log.read()[-3000:], file=sys.stderr)
        return False

    try:
        placed = [post_order(args.api_port, n) for n in range(args.orders)]
        changes = change_orders(args.api_port, placed)
        # A publisher sends an order's earlier events still waiting in it before its own,
        # so an event can arrive twice (its after-answer publish racing the next
        # change's): one copy of each, by its id.
        received = drain(sqs, args.events_queue_url, want=len(placed) + changes)
        events = list({attributes["outbox-message-id"]: (body, attributes) for body, attributes in received}.values())
        republished = len(received) - len(events)
        assert len(events) == len(placed) + changes, f"{len(events)} events for {len(placed)} orders and {changes} changes"
        random.Random(7).shuffle(events)
        if args.fifo:
            events = fifo_order(events)
        overtaken = count_overtaken(events)
        # Copies 1 and 2 of each event in one batch: received together, processed at once.
        send_copies(sqs, source, events, [1, 2])
        for name in ["consumer-1", "consumer-2"]:
            process, log = start_consumer(name)
            assert wait_for(log, "polling the source queue", process), f"{name} did not start"
        send_copies(sqs, source, events, [3])

        # The second round: a third consumer killed mid-batch.
        more = [post_order(args.api_port, args.orders + n) for n in range(args.killed_orders)]
        placed += more
        more_events = drain(sqs, args.events_queue_url, want=len(more))
        assert len(more_events) == len(more), f"{len(more_events)} events for {len(more)} orders"
        consumed_events = len(events) + len(more_events)
        doomed, doomed_log = start_consumer("consumer-killed")
        assert wait_for(doomed_log, "polling the source queue", doomed), "the third consumer did not start"
        send_copies(sqs, source, more_events, [1, 2, 3])
        assert wait_for(doomed_log, "committed messages=", doomed, timeout=60), "the third consumer committed nothing"
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait()
        # Committed, not yet dispatched: a pending record (the transactional mode) or an
        # outbox entry inside its shipment (entity mode).
        pending_at_kill = sum(
            1 for item in scan(dynamodb, table, "IN#") if item.get("state", {}).get("S") == "pending"
        )
        pending_at_kill += sum(len(item.get("outbox", {}).get("M", {})) for item in scan(dynamodb, table, "SHIPMENT#"))
        with open(doomed_log) as log:
            killed_after = log.read().count("committed messages=")

        wait_until_empty(sqs, source)
        left, reminders = queue_counts(sqs, source)

        out = drain(sqs, shipments)
        shipment_items = scan(dynamodb, table, "SHIPMENT#")
        # The consumer's records; its positions (IN#AT#...) and the messages it kept for
        # their predecessor (IN#KEPT#...: one whose consumer was killed after applying it,
        # before removing it, stays until it expires) are items of their own.
        records = [item for item in scan(dynamodb, table, "IN#") if not item["pk"]["S"].startswith(("IN#AT#", "IN#KEPT#"))]
        kept_left = len(scan(dynamodb, table, "IN#KEPT#"))
        positions = scan(dynamodb, table, "IN#AT#")
        orders = {order: call(args.api_port, "GET", f"/orders/{order}") for order in placed}
    finally:
        consumers_stopped(consumers)

    shipments_per_order = Counter(item["data"]["M"]["order_id"]["S"] for item in shipment_items)
    # Each run of the handler draws a new shipment id: the committed run's is the stored one.
    stored_shipment = {item["data"]["M"]["order_id"]["S"]: item["data"]["M"]["shipment_id"]["S"] for item in shipment_items}
    bodies_per_id = defaultdict(set)
    order_per_id = {}
    losers = 0
    cancelled_out = 0
    for body, attributes in out:
        message_id = attributes.get("outbox-message-id")
        requested = json.loads(body)
        if requested["type"] == "ShipmentCancelled":
            cancelled_out += 1
            continue
        bodies_per_id[message_id].add(body)
        order_per_id[message_id] = requested["order_id"]
        losers += requested["shipment_id"] != stored_shipment.get(requested["order_id"])
    # Each shipment as its order ended: its lines and whether it is cancelled.
    shipment_of = {item["data"]["M"]["order_id"]["S"]: item["data"]["M"] for item in shipment_items}
    unlike = []
    for order, view in orders.items():
        shipment = shipment_of.get(order)
        if shipment is None:
            continue
        lines = {sku: int(value["N"]) for sku, value in shipment["lines"]["M"].items()}
        want_lines = {item["sku"]: item["quantity"] for item in view["items"]}
        cancelled = shipment["status"]["S"] == "cancelled"
        if lines != want_lines or cancelled != (view["status"] == "cancelled"):
            unlike.append((order, view["status"], want_lines, shipment["status"]["S"], lines))
    received_orders = Counter(order_per_id.values())
    states = Counter(item["state"]["S"] for item in records)
    record_ids = {item["txn_id"]["S"] for item in records}
    consumed_lines = Counter()
    for name, _, log_path in consumers:
        with open(log_path) as log:
            for line in log:
                if "message consumed" in line:
                    found = re.search(r'outcome"?[=:]"?(\w+)', line)
                    consumed_lines[found.group(1) if found else "unread"] += 1
                elif "message failed" in line:
                    consumed_lines["failed"] += 1

    entries_left = sum(len(item.get("outbox", {}).get("M", {})) for item in shipment_items)
    lost = [order for order in placed if shipments_per_order[order] != 1 or received_orders[order] < 1]
    problems = []
    if left:
        problems.append(f"{left} messages left in the source queue")
    # Each delivery the consumer kept sent one reminder, delayed; no other message may wait.
    if reminders > consumed_lines["kept"]:
        problems.append(f"{reminders} delayed messages in the source queue, more than the {consumed_lines['kept']} kept deliveries' reminders")
    if sorted(shipments_per_order) != sorted(placed) or any(count != 1 for count in shipments_per_order.values()):
        problems.append(f"shipments per order: {dict(Counter(shipments_per_order.values()))} for {len(placed)} orders")
    if len(bodies_per_id) != len(placed) or sorted(received_orders) != sorted(placed):
        problems.append(f"{len(bodies_per_id)} ShipmentRequested ids received for {len(placed)} orders")
    if any(len(bodies) != 1 for bodies in bodies_per_id.values()):
        problems.append("an id was received with two bodies (a losing attempt's message)")
    if losers:
        problems.append(f"{losers} ShipmentRequested name a shipment id that was not committed (a losing run's)")
    if any(message_id.split(":")[0] not in record_ids for message_id in bodies_per_id):
        problems.append("an id names no consumer record")
    if states != Counter({"dispatched": consumed_events}):
        problems.append(f"consumer records: {dict(states)} for {consumed_events} events")
    if unlike:
        problems.append(f"{len(unlike)} shipments unlike their orders, e.g. {unlike[0]}")
    want_cancelled = sum(1 for view in orders.values() if view["status"] == "cancelled")
    if cancelled_out < want_cancelled:
        problems.append(f"{cancelled_out} ShipmentCancelled received for {want_cancelled} cancelled orders")
    if entries_left:
        problems.append(f"{entries_left} outbox entries left in shipments after every message was acknowledged")
    if lost:
        problems.append(f"lost: {len(lost)} orders")

    print(
        f"consumer end to end: {len(placed)} orders placed ({args.orders}, then {args.killed_orders} with a consumer killed"
        f" by SIGKILL after {killed_after} commit(s), {pending_at_kill} commit(s) then pending);"
        f" {3 * consumed_events} deliveries of {consumed_events} events (3 per event, 2 of them in one batch; the first"
        f" round's shuffled across orders, {overtaken} of its events delivered after a later event of their order);"
        f" {republished} events sent twice by the producer (an earlier event sent first by a later publisher);"
        f" {len(positions)} chain positions kept; {len(unlike)} shipments unlike their orders;"
        f" outcomes logged {dict(consumed_lines)};"
        f" shipments {sum(shipments_per_order.values())} ({len(shipments_per_order)} orders, at most {max(shipments_per_order.values(), default=0)} each);"
        f" ShipmentRequested received {len(out)} times under {len(bodies_per_id)} ids, one body each,"
        f" {losers} naming an uncommitted run's shipment;"
        f" consumer records {dict(states)}; outbox entries left in shipments {entries_left}; lost {len(lost)};"
        f" {reminders} kept messages' reminders still delayed in the source queue; {kept_left} kept messages left in the table"
    )
    hops = [
        # The first hop: the API and the control worker publish each event (some twice:
        # an earlier event sent first by a later publisher), nobody killed.
        ("orders API -> events", consumed_events, republished + consumed_events, 0, 0),
        ("events -> shipping", consumed_events, 3 * consumed_events, 1, len(problems)),
    ]
    if args.billing:
        billing_problems, billing_hop = run_billing(args, sqs, dynamodb, table, out, shipment_items, start_consumer, wait_for)
        hops.append(billing_hop)
        problems += billing_problems
        consumers_stopped(consumers)
    # Every hop's dead-letter queues, what no consumer could take: the first hop's (the
    # control queue's and the events queue's, named by the caller) and shipping's.
    for index, urls in [(0, args.dead_letter_queue), (1, [source_dlq])]:
        for url in urls:
            waiting, _ = queue_counts(sqs, url)
            if waiting:
                problems.append(f"{waiting} messages in the dead-letter queue {url}")
                hop, messages, copies, kills, violations = hops[index]
                hops[index] = (hop, messages, copies, kills, violations + 1)
    for hop, messages, copies, kills, violations in hops:
        kind = "FIFO queues" if args.fifo else "standard queues"
        print(f"hop {hop} ({kind}): {messages} messages, {copies} copies delivered, {kills} consumer(s) killed, {violations} violations")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        sys.exit(1)


# ".fifo" when the queues are FIFO (--fifo).
SUFFIX = ""


def source_queue(sqs, name):
    """A consumer's source queue `name` with its dead-letter queue (after 5 receives, as
    the template's): a 5-second visibility timeout, so that what a killed consumer held
    comes back soon; both FIFO with --fifo. Returns both URLs."""
    fifo = {"FifoQueue": "true"} if SUFFIX else {}
    dlq = sqs.create_queue(QueueName=f"{name}-dlq{SUFFIX}", Attributes=fifo)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "5"})
    attributes = {"VisibilityTimeout": "5", "RedrivePolicy": policy, **fifo}
    url = sqs.create_queue(QueueName=f"{name}{SUFFIX}", Attributes=attributes)["QueueUrl"]
    return url, dlq


def consumers_stopped(consumers):
    """Stops every consumer still running (SIGTERM, then SIGKILL after 30 s)."""
    for _, process, _ in consumers:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for _, process, _ in consumers:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def position_of(attributes):
    """The fields of a message's outbox-position attribute (producer, chain, seq, version,
    after), empty without one."""
    return dict(field.split("=", 1) for field in attributes.get("outbox-position", "").split(";") if "=" in field)


def wait_until_empty(sqs, url, timeout=180):
    """Waits until `url` holds no message, visible or in flight (delayed ones aside), for 6 s."""
    deadline = time.time() + timeout
    quiet_since = None
    while time.time() < deadline:
        if queue_depth(sqs, url) == 0:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since > 6:
                return
        else:
            quiet_since = None
        time.sleep(0.5)


def run_billing(args, sqs, dynamodb, table, shipped, shipment_items, start_consumer, wait_for):
    """The third hop: every message shipping sent (`shipped`, as its shipments queue
    delivered them) three times to the billing consumers, one of them killed; returns the
    problems found and the hop's figures."""
    problems = []
    # One copy of each message, by its id: shipping sends one again where a run of its
    # that committed it was interrupted before its acknowledgement.
    by_id = {}
    bodies = defaultdict(set)
    for body, attributes in shipped:
        by_id[attributes.get("outbox-message-id")] = (body, attributes)
        bodies[attributes.get("outbox-message-id")].add(body)
    messages = list(by_id.values())
    if any(len(texts) != 1 for texts in bodies.values()):
        problems.append("a shipping message id came with two bodies")
    # Each message's place in its shipment's history: entity SHIPMENT#<order>, chain
    # shipments, seq 1, 2, ... with no gap and no repeat.
    chain = defaultdict(list)
    unplaced = 0
    for body, attributes in messages:
        event = json.loads(body)
        place = position_of(attributes)
        if attributes.get("outbox-entity") != f"SHIPMENT#{event['order_id']}" or place.get("chain") != "shipments":
            unplaced += 1
            continue
        chain[event["order_id"]].append((int(place["seq"]), event["type"]))
    if unplaced:
        problems.append(f"{unplaced} shipping messages without their place in their shipment's history")
    broken = [order for order, seqs in chain.items() if sorted(s for s, _ in seqs) != list(range(1, len(seqs) + 1))]
    if broken:
        problems.append(f"{len(broken)} shipments whose messages' seqs are not 1..n, e.g. {chain[broken[0]]}")
    shipment_of = {item["data"]["M"]["order_id"]["S"]: item["data"]["M"] for item in shipment_items}
    source, source_dlq = source_queue(sqs, "billing-source")
    records_before = {item["pk"]["S"] for item in scan(dynamodb, table, "IN#")}

    # Two rounds, by shipment: the first to two consumers, the second with a third one that
    # is killed mid-batch.
    orders = sorted(chain)
    random.Random(11).shuffle(orders)
    second = set(orders[len(orders) // 2 :])
    first_round = [m for m in messages if json.loads(m[0])["order_id"] not in second]
    second_round = [m for m in messages if json.loads(m[0])["order_id"] in second]
    random.Random(13).shuffle(first_round)
    random.Random(17).shuffle(second_round)
    if args.fifo:
        first_round, second_round = fifo_order(first_round), fifo_order(second_round)
    overtaken = count_overtaken(first_round) + count_overtaken(second_round)
    billing = dict(binary=args.billing, consumer="billing", queue=source, destinations="")
    send_copies(sqs, source, first_round, [1, 2])
    for name in ["billing-1", "billing-2"]:
        process, log = start_consumer(name, **billing)
        assert wait_for(log, "polling the source queue", process), f"{name} did not start"
    send_copies(sqs, source, first_round, [3])
    doomed, doomed_log = start_consumer("billing-killed", **billing)
    assert wait_for(doomed_log, "polling the source queue", doomed), "the killed billing consumer did not start"
    send_copies(sqs, source, second_round, [1, 2, 3])
    assert wait_for(doomed_log, "committed messages=", doomed, timeout=60), "the killed billing consumer committed nothing"
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    with open(doomed_log) as log:
        killed_after = log.read().count("committed messages=")
    wait_until_empty(sqs, source)
    left, reminders = queue_counts(sqs, source)
    dead, _ = queue_counts(sqs, source_dlq)

    invoices = {item["data"]["M"]["order_id"]["S"]: item["data"]["M"] for item in scan(dynamodb, table, "INVOICE#")}
    records = [
        item
        for item in scan(dynamodb, table, "IN#")
        if item["pk"]["S"] not in records_before and not item["pk"]["S"].startswith(("IN#AT#", "IN#KEPT#"))
    ]
    states = Counter(item.get("state", {}).get("S") for item in records)
    # Each invoice: the seqs it applied are its shipment's 1..n, once each, in order, and
    # it is void exactly when its shipment was cancelled.
    unlike = []
    for order, seqs in chain.items():
        invoice = invoices.get(order)
        applied = [int(seq["N"]) for seq in invoice["applied"]["L"]] if invoice else None
        cancelled = shipment_of.get(order, {}).get("status", {}).get("S") == "cancelled"
        sent_cancel = any(kind == "ShipmentCancelled" for _, kind in seqs)
        want_status = "void" if cancelled else "open"
        if applied != list(range(1, len(seqs) + 1)) or invoice["status"]["S"] != want_status or cancelled != sent_cancel:
            unlike.append((order, applied, invoice and invoice["status"]["S"], want_status))
    extra = sorted(set(invoices) - set(chain))
    if unlike:
        problems.append(f"{len(unlike)} invoices unlike their shipments, e.g. {unlike[0]}")
    if extra:
        problems.append(f"{len(extra)} invoices of no shipment")
    if left:
        problems.append(f"{left} messages left in billing's source queue")
    if dead:
        problems.append(f"{dead} messages in billing's dead-letter queue")
    if states != Counter({"dispatched": len(messages)}):
        problems.append(f"billing's records: {dict(states)} for {len(messages)} messages")
    # Billing's state of a few shipments' chains, as an operator reads it (the control
    # worker's consumer-state command, on the table): applied through each shipment's last
    # seq by a transaction of billing's, nothing kept waiting.
    looked = sorted(chain)[:5] if args.control_worker else []
    unlike_state = 0
    for order in looked:
        shown = subprocess.run(
            [args.control_worker, "consumer-state", "billing", "shipments", f"SHIPMENT#{order}", "--item", f"INVOICE#{order}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:
            state = json.loads(shown.stdout)
        except ValueError:
            state = {}
        applied = state.get("applied") or {}
        if shown.returncode != 0 or applied.get("seq") != len(chain[order]) or state.get("kept") != [] or not applied.get("transaction_id"):
            unlike_state += 1
            problems.append(f"billing's state of SHIPMENT#{order} ({len(chain[order])} messages): {shown.stdout}{shown.stderr}")
    if looked:
        print(
            f"billing's state of {len(looked)} shipments' chains (control-worker consumer-state):"
            f" {len(looked) - unlike_state} applied through their last seq with nothing kept, {unlike_state} otherwise"
        )
    applied_total = sum(len(invoice["applied"]["L"]) for invoice in invoices.values())
    voided = sum(1 for invoice in invoices.values() if invoice["status"]["S"] == "void")
    print(
        f"billing end to end: {len(messages)} shipping messages of {len(chain)} shipments ({len(shipped)} received from"
        f" shipping's queue), each with its place in its shipment's history ({unplaced} without);"
        f" {3 * len(messages)} deliveries (3 per message, 2 of them in one batch, shuffled across shipments:"
        f" {overtaken} delivered after a later message of their shipment); a billing consumer killed by SIGKILL after"
        f" {killed_after} commit(s); invoices {len(invoices)} ({voided} void), {applied_total} messages applied;"
        f" billing records {dict(states)}; {reminders} kept messages' reminders still delayed; {len(unlike)} invoices"
        f" unlike their shipments"
    )
    return problems, ("shipments -> billing", len(messages), 3 * len(messages), 1, len(problems))


if __name__ == "__main__":
    main()
