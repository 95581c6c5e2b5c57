"""One trace end to end (run by scripts/trace-e2e, which starts the emulators and
bootstraps the table and queues).

1. Starts an OTLP/HTTP receiver on loopback (scripts/otlp_receiver.py).
2. Starts, exporting to it (`OTEL_EXPORTER_OTLP_ENDPOINT`): the orders API twice, one
   publishing after the answer and one not publishing at all (the control worker does),
   the control worker, and the shipping consumer on the events queue.
3. Places an order through each API, each request with a `traceparent` of its own (and
   one more order with none, which must start a trace of its own).
4. Waits for each order's spans and asserts, per trace: the request's span is a child of
   the caller's span; the transaction's `begin` and `commit` are the request's children;
   the publish is inline (under `after_answer`, a child of the request's commit) or the
   worker's (`dispatch`, in service control-worker, a child of the span that emitted the
   message, its control message's span linking the transaction's trace); the consumer's
   processing (`consumed_message`, service shipping) is a child of that same emitting
   span, with its `commit` and `publish` below it; and the ShipmentRequested message on
   the shipments queue carries the consumer's context (`traceparent` and `AWSTraceHeader`).
5. Prints each trace as a tree.
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request

import boto3
from otlp_receiver import Receiver


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, process, log, timeout=120):
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"the process for port {port} exited:\n{open(log).read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    sys.exit(f"nothing listens on port {port}")


def post_order(port, traceparent, n):
    body = json.dumps(
        {"customer_id": f"c-trace-{n}", "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 990}]}
    ).encode()
    headers = {"content-type": "application/json"}
    if traceparent:
        headers["traceparent"] = traceparent
    request = urllib.request.Request(f"http://127.0.0.1:{port}/orders", data=body, method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201, response.status
        return json.loads(response.read())["id"], response.headers["x-transaction-id"]


def add_item(port, order, traceparent):
    body = json.dumps({"sku": "SKU-2", "quantity": 1, "unit_price_cents": 500}).encode()
    headers = {"content-type": "application/json", "traceparent": traceparent}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/orders/{order}/items", data=body, method="POST", headers=headers
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 201), response.status
        return response.headers["x-transaction-id"]


def batch_of(all_spans, spans):
    """The worker's publish_batch spans linking a dispatch of `spans`, as lines."""
    dispatches = {(s["trace"], s["span"]) for s in spans if s["name"] == "dispatch"}
    lines = []
    for batch in all_spans:
        if batch["name"] == "publish_batch" and dispatches & set(batch["links"]):
            children = [s for s in all_spans if s["parent"] == batch["span"]]
            lines.append(
                f"  published in the worker's batch: publish_batch [{batch['service']}] {batch['span']} "
                f"(trace {batch['trace']}), linking {len(batch['links'])} dispatches"
            )
            lines += [
                f"    └─ {c['name']} [{c['service']}] {c['span']} messages={c['attributes'].get('messages')}" for c in children
            ]
    return "\n".join(lines)


def tree(spans, root_parent):
    """The spans as an indented tree, children in start order; spans whose parent is not
    in the trace hang under `root_parent` (the caller's span)."""
    by_parent = {}
    ids = {span["span"] for span in spans}
    for span in spans:
        parent = span["parent"] if span["parent"] in ids else "-"
        by_parent.setdefault(parent, []).append(span)
    lines = [f"(caller {root_parent})"]

    def walk(parent, depth):
        for span in sorted(by_parent.get(parent, []), key=lambda s: s["start"]):
            shown = {k: v for k, v in span["attributes"].items() if k in ("txn_id", "outcome", "messages", "route", "http.route")}
            extra = f" {shown}" if shown else ""
            links = f" links={len(span['links'])}" if span["links"] else ""
            ms = (span["end"] - span["start"]) / 1e6
            lines.append(f"{'  ' * depth}└─ {span['name']} [{span['service']}] {span['span']} {ms:.1f} ms{extra}{links}")
            walk(span["span"], depth + 1)

    walk("-", 1)
    return "\n".join(lines)


class Check:
    def __init__(self, label):
        self.label = label
        self.problems = []
        self.batched = False

    def that(self, condition, text):
        if not condition:
            self.problems.append(f"{self.label}: {text}")
        return condition


def one(spans, check, name, service, **where):
    found = [
        s
        for s in spans
        if s["name"] == name
        and s["service"] == service
        and all(s["attributes"].get(key) == value for key, value in where.items())
    ]
    check.that(len(found) == 1, f"one {name} span of {service} {where or ''}, found {len(found)}")
    return found[0] if found else None


def expected_spans_present(spans, mode, consumer_emits=True):
    names = {(s["service"], s["name"]) for s in spans}
    want = {("api", "request"), ("api", "commit"), ("shipping", "consumed_message")}
    if consumer_emits:
        want.add(("shipping", "publish"))
    want.add(("control-worker", "dispatch") if mode == "worker" else ("api", "publish"))
    return want <= names


def verify(spans, all_spans, mode, caller_span, txn_id, shipment, check, consumer_emits=True):
    """Asserts the shape of one transaction's trace; returns nothing, fills `check`.
    `consumer_emits`: an OrderPlaced, for which the consumer emits a ShipmentRequested;
    else an order's change (entity mode), which it acknowledges with nothing to do."""
    request = one(spans, check, "request", "api")
    if request is None:
        return
    check.that(request["parent"] == caller_span, f"the request's parent is {request['parent']}, not the caller's {caller_span}")
    begin = one(spans, check, "begin", "api")
    commit = one(spans, check, "commit", "api")
    for span, what in ((begin, "begin"), (commit, "commit")):
        if span:
            check.that(span["parent"] == request["span"], f"{what} is not the request's child")
    # The consumer applies each order's events in order: an event that came before its
    # predecessor was applied is kept (a span with outcome `kept`; `waiting` where it is
    # sent back instead) and processed once, right after its predecessor; the delivery
    # that kept it then finds it applied (`duplicate`). A second copy of the event (the
    # queue delivers at least once) that meets the processed one's commit sends its stored
    # messages and applies nothing (`resumed`, `adopted`).
    consumed = one(spans, check, "consumed_message", "shipping", outcome="processed")
    others = [
        s["attributes"].get("outcome")
        for s in spans
        if s["name"] == "consumed_message" and s["service"] == "shipping" and s is not consumed
    ]
    check.that(
        all(outcome in ("waiting", "kept", "duplicate", "resumed", "adopted") for outcome in others),
        f"other consumed_message spans: {others}",
    )
    emitted_in = None
    if mode == "inline":
        # Handed over at the commit, published after the answer in a span of its own.
        publish = one(spans, check, "publish", "api")
        after = one(spans, check, "after_answer", "api")
        if publish and after and commit:
            check.that(after["parent"] == commit["span"], "the publishing after the answer is not the commit's child")
            check.that(publish["parent"] == after["span"], "the inline publish is not under the publishing after the answer")
            check.that(commit["end"] < publish["end"], "the commit's span lasts as long as the publish after the answer")
        check.that(
            not [s for s in spans if s["service"] == "control-worker" and s["name"] == "dispatch"],
            "the worker dispatched a transaction published inline",
        )
        emitted_in = request["span"]
    else:
        dispatch = one(spans, check, "dispatch", "control-worker", txn_id=txn_id)
        if dispatch:
            check.that(dispatch["parent"] == request["span"], "the worker's dispatch is not a child of the span that emitted the message")
            # Its publish: the dispatch's child, or, where the worker's batch published
            # several transactions at once, under a publish_batch span linking it.
            publish = [s for s in spans if s["service"] == "control-worker" and s["name"] == "publish"]
            batches = [
                s
                for s in all_spans
                if s["service"] == "control-worker"
                and s["name"] == "publish_batch"
                and (dispatch["trace"], dispatch["span"]) in s["links"]
            ]
            under_batch = [s for s in all_spans if s["name"] == "publish" and batches and s["parent"] == batches[0]["span"]]
            check.that(
                (len(publish) == 1 and publish[0]["parent"] == dispatch["span"])
                or (not publish and len(batches) == 1 and len(under_batch) == 1),
                f"the worker's publish is neither the dispatch's child nor under a publish_batch linking it ({len(publish)}, {len(batches)})",
            )
            if batches:
                check.batched = True
        check.that(
            not [s for s in spans if s["service"] == "api" and s["name"] == "publish"],
            "the API published with inline publishing off",
        )
        emitted_in = request["span"]
    if consumed:
        check.that(consumed["parent"] == emitted_in, "the consumer's processing is not a child of the span that emitted the message")
        check.that(consumed["attributes"].get("outcome") == "processed", f"consumed outcome {consumed['attributes'].get('outcome')}")
        if not consumer_emits:
            check.that(
                not [s for s in spans if s["service"] == "shipping" and s["name"] == "publish"],
                "the consumer published for an order's change",
            )
            return
        for name in ("commit", "publish"):
            child = one(spans, check, name, "shipping")
            if child:
                check.that(child["parent"] == consumed["span"], f"the consumer's {name} is not its processing's child")
        if shipment is None:
            check.that(False, "no ShipmentRequested message for the order")
        else:
            parent = shipment.get("traceparent", "")
            check.that(
                parent == f"00-{consumed['trace']}-{consumed['span']}-01",
                f"ShipmentRequested carries traceparent {parent!r}, not the consumer's span",
            )
            # moto drops the system attributes of SendMessageBatch entries (it keeps
            # SendMessage's): where it kept one, it must be the consumer's; the entry's
            # AWSTraceHeader is checked on the request itself by the SQS adapter's unit
            # test (a_traced_message_goes_with_its_traceparent_and_its_xray_header).
            header = shipment.get("AWSTraceHeader")
            check.that(
                header is None
                or header.startswith(f"Root=1-{consumed['trace'][:8]}-{consumed['trace'][8:]};Parent={consumed['span']}"),
                f"ShipmentRequested carries AWSTraceHeader {header!r}",
            )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--consumer-settings", required=True)
    args = parser.parse_args()
    region = os.environ.get("AWS_REGION", "us-east-1")
    sqs = boto3.client("sqs", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=region)

    receiver = Receiver()
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "RUST_LOG": "info",
        "NO_COLOR": "1",
    }
    processes = []

    def start(name, binary, env_extra, argv=()):
        env = dict(os.environ)
        env.update(otel)
        env.update(env_extra)
        log_path = os.path.join(args.work, f"{name}.log")
        log = open(log_path, "w")
        process = subprocess.Popen([os.path.join(args.bin, binary), *argv], env=env, stdout=log, stderr=subprocess.STDOUT)
        processes.append((name, process))
        return process, log_path

    consumer_env = {}
    for line in args.consumer_settings.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            consumer_env[key] = value
    shipments_url = consumer_env["OUTBOX_DESTINATIONS"].split("=sqs:", 1)[1]

    apis = {}
    try:
        # The API publishing after the answer gets a first check 5 s after its begin, so
        # that its publish, however slow a debug build on the emulators, is its own.
        for mode, inline, delay in (("inline", "after", "5"), ("worker", "off", "1")):
            port = free_port()
            process, log = start(
                f"api-{mode}",
                "api",
                {
                    "OUTBOX_LISTEN_ADDR": f"127.0.0.1:{port}",
                    "OUTBOX_INLINE_PUBLISH": inline,
                    "OUTBOX_FIRST_CHECK_DELAY_SECONDS": delay,
                    "OTEL_SERVICE_NAME": "api",
                },
            )
            wait_for_port(port, process, log)
            apis[mode] = port
        start("control-worker", "control-worker", {"OTEL_SERVICE_NAME": "control-worker"}, ["poll"])
        start("shipping", "shipping", {**consumer_env, "OTEL_SERVICE_NAME": "shipping"})

        orders = {}
        for n, mode in enumerate(("inline", "worker")):
            trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
            order, txn = post_order(apis[mode], f"00-{trace_id}-{caller_span}-01", n)
            orders[mode] = {"trace": trace_id, "caller": caller_span, "order": order, "txn": txn}
        untraced_order, untraced_txn = post_order(apis["inline"], None, 9)
        # A change of each order: entity mode, its entry in the order's item.
        changes = {}
        for mode, placed in orders.items():
            trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
            txn = add_item(apis[mode], placed["order"], f"00-{trace_id}-{caller_span}-01")
            changes[mode] = {"trace": trace_id, "caller": caller_span, "order": placed["order"], "txn": txn}

        # The ShipmentRequested messages, with their attributes and X-Ray header.
        shipments = {}
        deadline = time.time() + 90
        while time.time() < deadline and len(shipments) < 3:
            reply = sqs.receive_message(
                QueueUrl=shipments_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["AWSTraceHeader"],
            )
            for message in reply.get("Messages", []):
                body = json.loads(message["Body"])
                attributes = {k: v["StringValue"] for k, v in message.get("MessageAttributes", {}).items()}
                if "AWSTraceHeader" in message.get("Attributes", {}):
                    attributes["AWSTraceHeader"] = message["Attributes"]["AWSTraceHeader"]
                shipments[body.get("order_id")] = attributes
                sqs.delete_message(QueueUrl=shipments_url, ReceiptHandle=message["ReceiptHandle"])

        # Every span of each order's trace, exported within the processor's delay.
        deadline = time.time() + 60
        while time.time() < deadline:
            placed = all(expected_spans_present(receiver.trace(o["trace"]), mode) for mode, o in orders.items())
            changed = all(expected_spans_present(receiver.trace(c["trace"]), mode, False) for mode, c in changes.items())
            handled = {
                s["attributes"].get("txn_id")
                for s in receiver.all()
                if s["name"] == "control_message" and s["service"] == "control-worker"
            }
            every_control = {t["txn"] for t in list(orders.values()) + list(changes.values())} <= handled
            if placed and changed and every_control:
                break
            time.sleep(0.5)
        time.sleep(1.5)  # what is still in flight (the dispatch's end, the worker's marking)
    finally:
        for name, process in reversed(processes):
            process.terminate()
        for name, process in reversed(processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()

    problems = []
    reports = [(mode, order, True) for mode, order in orders.items()]
    reports += [(mode, change, False) for mode, change in changes.items()]
    for mode, placed, is_order in reports:
        spans = receiver.trace(placed["trace"])
        check = Check(f"{mode} publish" if is_order else f"{mode} publish of a change (entity mode)")
        shipment = shipments.get(placed["order"]) if is_order else None
        verify(spans, receiver.all(), mode, placed["caller"], placed["txn"], shipment, check, consumer_emits=is_order)
        what = f"order {placed['order']}" if is_order else f"an item added to order {placed['order']} in entity mode"
        label = "published inline, after the answer" if mode == "inline" else "published by the control worker"
        print(f"\ntrace {placed['trace']}: {what}, transaction {placed['txn']}, {label}")
        print(tree(spans, placed["caller"]))
        if check.batched:
            print(batch_of(receiver.all(), spans))
        problems += check.problems

    # The worker's span for each control message links the transaction's trace.
    for mode, order in list(orders.items()) + [(f"{mode}, change", change) for mode, change in changes.items()]:
        control = [
            s
            for s in receiver.all()
            if s["name"] == "control_message"
            and s["service"] == "control-worker"
            and s["attributes"].get("txn_id") == order["txn"]
        ]
        linked = [s for s in control if any(trace == order["trace"] for trace, _ in s["links"])]
        if not linked:
            problems.append(f"{mode} publish: no control_message span of the worker links trace {order['trace']} ({len(control)} spans)")
        else:
            print(f"\ncontrol message of {order['txn']} ({mode}): span {linked[0]['span']} in trace {linked[0]['trace']}, linking {linked[0]['links']}")

    # A request without a traceparent starts a trace of its own, which its consumer continues.
    untraced = [s for s in receiver.all() if s["name"] == "commit" and s["service"] == "api" and s["attributes"].get("txn_id") == untraced_txn]
    if len(untraced) != 1:
        problems.append(f"untraced request: {len(untraced)} commit spans for {untraced_txn}")
    else:
        trace_id = untraced[0]["trace"]
        services = {s["service"] for s in receiver.trace(trace_id)}
        if trace_id in {o["trace"] for o in orders.values()} or not {"api", "shipping"} <= services:
            problems.append(f"untraced request: trace {trace_id} spans {sorted(services)}")
        else:
            print(f"\nan order placed without a traceparent: its own trace {trace_id}, spans from {sorted(services)}")

    print(f"\nreceiver: {len(receiver.all())} spans in {receiver.requests} export requests")
    if problems:
        print("\nFAILED:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("one trace per order, through the request, the commit, the publish and the consumer: ok")


if __name__ == "__main__":
    main()
