"""Release service: cost of one poll of the state topic against the history behind it.

The release service polls the sketchers' checkpoints on the state topic every step
(:class:`streamdp.services.state_view.PartitionView`). This builds, on the embedded broker, the
history a deployment leaves after E closed epochs — per epoch, one checkpoint of every sketcher
(``--partitions`` keys, ``--state-kb`` each, chunked as in production; the previous generation
tombstoned) and one release-state record — and times a poll after one more epoch's records were
written, for the incremental reader (the default) and for a full re-read of the topic
(``StateStore(incremental=False)``, the behaviour before issue 13). Median of ``--polls`` polls;
``cpu s`` is the reading process's CPU time (the client's work; the rest of the wall time is the
broker's answer — the embedded Tansu broker's ListOffsets and Fetch take time linear in the log).

    python benchmarks/release_poll.py --epochs 10,100,1000 --json benchmarks/results/release_poll.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_json  # noqa: E402

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from streamdp.kafka.broker import EmbeddedBroker  # noqa: E402
from streamdp.kafka.state_store import StateStore  # noqa: E402
from streamdp.kafka.topics import client_config  # noqa: E402
from streamdp.services.partition_state import state_key  # noqa: E402
from streamdp.services.state_view import PartitionView  # noqa: E402

DOCS = "documents"


class History:
    """A state topic and the writers of its records (sketchers, the release service)."""

    def __init__(self, bootstrap: str, partitions: int, state_bytes: int):
        self.bs, self.partitions, self.state_bytes = bootstrap, partitions, state_bytes
        self.topic = f"bench.state.{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic(self.topic, 3, 1,
                                               config={"cleanup.policy": "compact"})]).values():
            f.result(10)
        self.prod = Producer(client_config(bootstrap, "producer", **{
            "enable.idempotence": True, "linger.ms": 5}))
        self.writer = StateStore(self.prod, bootstrap, self.topic)
        self.epochs = 0

    def records(self) -> int:
        """Records on the topic (the log end offsets: chunks, manifests, tombstones)."""
        c = Consumer(client_config(self.bs, "consumer", **{"group.id": uuid.uuid4().hex}))
        try:
            return sum(c.get_watermark_offsets(TopicPartition(self.topic, q), timeout=10)[1]
                       for q in range(3))
        finally:
            c.close()

    def add_epoch(self) -> None:
        self.epochs += 1
        e = self.epochs
        for p in range(self.partitions):
            self.writer.write(state_key(DOCS, p), os.urandom(self.state_bytes), {
                "partition": p, "next_offset": 1000 * e + p, "fence": 1,
                "progress": float(e), "epochs": [e + 1]})
        self.writer.write("release/state", os.urandom(self.state_bytes // 4), {"epoch": e})


def time_polls(view: PartitionView, history: History, polls: int) -> tuple[float, float]:
    """Median wall time of a poll, and median CPU time of this (the reading) process."""
    view.read(now=1e12)                          # a running service has polled before
    times, cpu = [], []
    for _ in range(polls):
        history.add_epoch()                      # what happened since the last poll
        t, c = time.perf_counter(), time.process_time()
        states = view.read(now=1e12)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        assert states[0].meta["next_offset"] == 1000 * history.epochs
    return statistics.median(times), statistics.median(cpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", default="10,100,1000", help="closed epochs of history")
    ap.add_argument("--partitions", type=int, default=4, help="documents partitions (sketcher keys)")
    ap.add_argument("--state-kb", type=int, default=64, help="size of one sketcher checkpoint")
    ap.add_argument("--polls", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    targets = sorted(map(int, args.epochs.split(",")))
    rows = []
    broker = EmbeddedBroker().start()
    try:
        hist = History(broker.bootstrap, args.partitions, args.state_kb * 1024)
        t0 = time.perf_counter()
        for target in targets:
            while hist.epochs < target:
                hist.add_epoch()
            built = time.perf_counter() - t0
            row = {"epochs of history": target, "records": None}
            for name, incremental in (("incremental", True), ("full re-read", False)):
                view = PartitionView(StateStore(hist.prod, broker.bootstrap, hist.topic,
                                                incremental=incremental), DOCS)
                row[f"{name} poll s"], row[f"{name} cpu s"] = time_polls(view, hist, args.polls)
            row["records"] = hist.records()
            row["ratio"] = row["full re-read poll s"] / row["incremental poll s"]
            rows.append(row)
            print(f"{target} epochs ({row['records']} records, history built in {built:.0f} s): "
                  f"incremental {row['incremental poll s'] * 1e3:.1f} ms, full re-read "
                  f"{row['full re-read poll s'] * 1e3:.1f} ms", flush=True)
        hist.prod.flush(10)
    finally:
        broker.stop()
    cols = ["epochs of history", "records", "incremental poll s", "incremental cpu s",
            "full re-read poll s", "full re-read cpu s", "ratio"]
    print()
    print(markdown_table(rows, cols))
    print(f"\n{args.partitions} sketcher keys of {args.state_kb} KiB, {args.polls} polls (median); "
          f"load average {os.getloadavg()}")
    write_json(args.json, {"partitions": args.partitions, "state_kb": args.state_kb,
                           "polls": args.polls, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
