"""Issue 15, zombie sketchers: a sketcher paused (SIGSTOP) long enough to lose its
partitions resumes after they were reassigned. No document may be counted twice or
dropped: in non-private mode the released ``n_docs`` of every epoch equals the exact
number of stream documents of epochs 1..t.

Two variants:

* ``paused_anywhere``: SIGSTOP from outside while the sketcher is busy with new
  documents (it holds sketched, not yet checkpointed documents);
* ``paused_after_commit``: the sketcher stops itself at its worst moment, *after*
  its offset commit (the write fence) succeeded and *before* the state write, so on
  SIGCONT the zombie's checkpoint does reach the state topic, after the new
  owner's. Readers must then keep the new owner's record (``select_state``), and
  the stale write must not cost or duplicate a document.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from streamdp.services import control
from streamdp.services.produce import produce
from streamdp.snapshot import TopicSnapshot

from crash_helpers import SketcherProcess, committed_offsets
from crash_helpers import read_topic as read_all
from service_helpers import Pipeline, make_config, make_corpus, read_topic, wait_for

STOPPER = r'''
import os, signal, sys
from pathlib import Path

marker = Path(sys.argv[2])
from streamdp.kafka.state_store import StateStore

_write = StateStore.write

def write(self, key, payload, meta=None):
    # armed by the test: stop right here, after the checkpoint's offset commit succeeded
    if key.startswith("sketch/") and marker.exists():
        marker.unlink()
        Path(str(marker) + ".stopped").write_text(f"{key} fence={(meta or {}).get('fence')} "
                                                  f"next_offset={(meta or {}).get('next_offset')}")
        print(f"ZOMBIE: stopping before the write of {key}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        print(f"ZOMBIE: resumed, writing {key} (fence {(meta or {}).get('fence')}, "
              f"next_offset {(meta or {}).get('next_offset')})", flush=True)
        out = _write(self, key, payload, meta)
        Path(str(marker) + ".written").write_text(str(out))
        return out
    return _write(self, key, payload, meta)

StateStore.write = write
from streamdp.cli import main
sys.exit(main(["sketcher", "--config", sys.argv[1], "--log-level", "INFO"]))
'''


class StoppableSketcher(SketcherProcess):
    """A sketcher subprocess that SIGSTOPs itself before its next state write once armed."""

    def __init__(self, cfg, workdir: Path, name: str):
        self.marker = Path(workdir) / f"{name}.stop-before-write"
        super().__init__(cfg, workdir, name, script=STOPPER, marker=self.marker)

    def arm(self) -> None:
        self.marker.write_text("armed")

    def stopped(self) -> bool:
        return Path(str(self.marker) + ".stopped").exists()

    def zombie_written(self) -> bool:
        return Path(str(self.marker) + ".written").exists()


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["paused_anywhere", "paused_after_commit"])
def test_zombie_sketcher_neither_double_counts_nor_drops(kafka_broker, kafka_topics, tmp_path, variant):
    bootstrap, names = kafka_broker.bootstrap, kafka_topics
    corpus = make_corpus(400, 4000, 3, seed=21 if variant == "paused_anywhere" else 22)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=None, batch_size=64)
    records = corpus.records()
    n_warm = corpus.n_warm
    cut1 = n_warm + int(0.3 * corpus.n_stream)
    cut2 = n_warm + int(0.6 * corpus.n_stream)
    parts = [records[:cut1], records[cut1:cut2], records[cut2:]]

    def group_at(n_produced: int) -> dict[int, int]:
        """Records per documents partition once ``n_produced`` are on the topic (read, not
        listed: Tansu under-reports ListOffsets)."""
        docs = read_all(bootstrap, names.documents, expected=n_produced)
        return {p: len(recs) for p, recs in docs.items()}

    def wait_checkpointed(n_produced: int, what: str, check) -> None:
        ends = group_at(n_produced)

        def done():
            return committed_offsets(bootstrap, cfg.group_id, names.documents, ends) == ends
        wait_for(done, 60, what, interval=0.3, check=check)

    pipe = Pipeline(cfg, sketchers=0, release=True)     # the release service, in-process
    a = b = None
    t0 = time.monotonic()
    stopped = False
    try:
        pipe.start()
        a = (StoppableSketcher if variant == "paused_after_commit" else SketcherProcess)(cfg, tmp_path, "A")
        assert a.wait_assigned(1) == [0, 1]
        b = SketcherProcess(cfg, tmp_path, "B")
        b_parts = b.wait_assigned(1)
        wait_for(lambda: len(a.assignments()) >= 2, 45, "A's share after B joined", check=a.check_alive)
        a_parts = a.assignments()[-1]
        assert sorted(a_parts + b_parts) == [0, 1] and a_parts and b_parts, (a_parts, b_parts)

        def check():
            pipe.check()
            b.check_alive()
            if not stopped:
                a.check_alive()

        # --- part 1: warm-up + 30 % of the stream, sketched and checkpointed by both
        produce(bootstrap, names.documents, parts[0])
        # test deployments close by operator order (closing: operator, the public schedule of
        # issue 23): the operator closes the warm-up, as test_time_and_fencing does
        from service_helpers import send_control
        send_control(bootstrap, names, "close", through=0)
        wait_for(lambda: pipe.release.subspace is not None, 60, "the warm-up to close", check=check)
        wait_checkpointed(cut1, "part 1 to be checkpointed", check)
        assert (a.documents_processed() or 0) > 0 and (b.documents_processed() or 0) > 0

        # --- part 2 arrives; A is paused while (or right after) sketching it
        if variant == "paused_after_commit":
            a.arm()
            produce(bootstrap, names.documents, parts[1])
            wait_for(a.stopped, 30, "A to stop itself between its offset commit and its state write",
                     check=check)
            stopped = True
        else:
            produce(bootstrap, names.documents, parts[1])
            n_a = a.documents_processed() or 0
            wait_for(lambda: (a.documents_processed() or 0) > n_a, 20, "A to sketch part 2", interval=0.01,
                     check=check)
            os.kill(a.pid, signal.SIGSTOP)
            stopped = True
        t_stop = time.monotonic()
        # the group reassigns A's partition to B after the session timeout (6 s)
        wait_for(lambda: b.assignments()[-1] == [0, 1], 60, "B to take over A's partition",
                 interval=0.1, check=check)
        t_takeover = time.monotonic() - t_stop

        # --- part 3 arrives while A is still paused; B sketches everything
        produce(bootstrap, names.documents, parts[2])
        wait_checkpointed(len(records), "B to checkpoint every document", check)
        time.sleep(1.0)

        # --- A resumes: a zombie holding sketched documents of a partition it lost
        n_assign = len(a.assignments())
        os.kill(a.pid, signal.SIGCONT)
        stopped = False
        if variant == "paused_after_commit":
            wait_for(a.zombie_written, 30, "the zombie's state write (after the commit fence)",
                     check=check)
        wait_for(lambda: len(a.assignments()) > n_assign, 60, "A to rejoin the group", check=check)
        wait_for(lambda: sorted(a.assignments()[-1] + b.assignments()[-1]) == [0, 1], 60,
                 "the partitions to be split again", check=check)
        wait_checkpointed(len(records), "every document checkpointed after the rebalance", check)

        # --- flush: close every epoch; non-private counts are exact
        from confluent_kafka import Producer
        from streamdp.kafka.topics import client_config
        p = Producer(client_config(bootstrap, "producer"))
        p.produce(names.control, value=control.encode("flush", key=control.load_key(cfg),
                                                      through=corpus.epochs))
        assert p.flush(10) == 0
        last = pipe.wait_released(corpus.epochs, timeout=120)
        assert b.terminate() == 0, b.tail()
        assert a.terminate() == 0, a.tail()
    finally:
        for proc in (a, b):
            if proc is not None:
                if proc.proc.poll() is None:
                    try:
                        os.kill(proc.pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                proc.ensure_dead()
        pipe.stop()

    for proc in (a, b):
        assert "Traceback" not in proc.log(), proc.tail(60)
    # every stream document counted exactly once, in its own epoch
    by_epoch: dict[int, list[TopicSnapshot]] = {}
    for r in read_topic(bootstrap, names.snapshots):
        snap = TopicSnapshot.from_bytes(r.value)
        by_epoch.setdefault(snap.epoch, []).append(snap)
    assert all(len({s.release_id for s in snaps}) == 1 for snaps in by_epoch.values())
    per_epoch = np.bincount(np.floor((corpus.ts[corpus.stream_slice] - corpus.stream_start)
                                     / corpus.epoch_seconds).astype(int) + 1, minlength=corpus.epochs + 1)
    expected = list(np.cumsum(per_epoch[1:corpus.epochs + 1]).astype(float))
    assert sorted(by_epoch) == list(range(1, corpus.epochs + 1))
    got = [by_epoch[e][-1].n_docs for e in range(1, corpus.epochs + 1)]
    assert got == expected, (got, expected, a.tail(40), b.tail(40))
    assert last.n_docs == corpus.n_stream
    zombie_lines = [ln for ln in a.log().splitlines()
                    if "no longer ours" in ln or "ZOMBIE" in ln or "lost" in ln.lower()]
    print(f"\nzombie ({variant}): B took over {t_takeover:.1f} s after SIGSTOP; released n_docs "
          f"{got} == {expected}; A assignments {a.assignments()}, B {b.assignments()}; "
          f"A's fencing lines: {zombie_lines[:6]}; total {time.monotonic() - t0:.1f} s")
