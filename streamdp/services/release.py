"""The release service: closes the warm-up and the epochs, spends budget, publishes snapshots.

Order of operations for one epoch close (crash-safety argument in docs/services.md)
----------------------------------------------------------------------------------
1. the epoch is *due* by THE schedule (:mod:`~streamdp.services.release_policy`:
   its close time + a fixed grace on the service clock, or an operator's order —
   public inputs only); then wait until every documents partition's latest
   complete sketcher state covers its cut (progress past the close time, or
   caught up);
2. merge the epoch's sketch sums over partitions;
3. the spend protocol (:mod:`streamdp.privacy.spend`), one place for every
   private release: ``ContinualRelease.close_epoch`` *reserves* the tree nodes
   under the idempotency key ``tree:epoch=<t>`` (durable ledger line), *draws*
   the noise;
4. *persists* the release state (noised tree nodes + last snapshot + the
   ledger head + this writer's epoch) to the state topic, in a transaction;
5. *commits* the reservation on the ledger;
6. publishes the snapshot (snapshots topic, file directory, HTTP) and
   ``epochs_closed`` so sketchers drop their raw sketches.

A crash before 3 changes nothing. A crash between 3 and 4 leaves the reservation
uncommitted and its draw lost — no output derived from it left the process — so
the restarted service *fulfils* it: re-closing the epoch reserves the same key,
gets the same reservation back uncharged, and draws afresh. A crash between 4
and 5 is repaired at start-up (the state holds epoch t: ``tree:epoch=t`` is
committed). A crash after 4 republishes the last snapshot on restart (consumers
deduplicate by release_id). The warm-up follows the same protocol (keys
``warmup-clip-histogram``, ``warmup``; persisted = the subspace record), and so does
the private vocabulary selection (key ``vocabulary``; persisted = the vocabulary record).

Vocabulary (issue 11, :mod:`streamdp.services.vocabulary`): ``vocabulary_mode: public``
builds the wordfreq list at the first start and persists it as the vocabulary record
(no budget); ``private`` waits until the selection window (``ts < selection_end``)
closes — the same rule as the warm-up close, with ``selection_end`` for
``stream_start`` — merges the partitions' selection histograms, runs the selection
(reserve → draw → persist the record → commit) and announces ``vocabulary_ready``.
Only then can the warm-up close. ``file``: the vocabulary file, as before.

Modules (one idea each; this class holds the release's state, runs the phases' flows and
keeps the order above):

* :mod:`~streamdp.services.release_vocabulary`, :mod:`~streamdp.services.release_warmup`,
  :mod:`~streamdp.services.release_epochs` — the flows of the three phases (selection window,
  warm-up, epochs), each the code of one phase over this service's state;
* :mod:`~streamdp.services.release_restore` — what a (re)start reads back from the persisted
  records, and the recovery that applies it (:class:`RecoveryFlow`);
* :mod:`~streamdp.services.release_records` — persisting release records (then committing
  their reservations), the public records sketchers read;
* :mod:`~streamdp.services.release_announce` — the control announcements to the sketchers;

* :mod:`~streamdp.services.release_writer` — the single writer: the Kafka fence
  (transactional id, writer epoch), the ledger bound to the deployment, the local lease;
* :mod:`~streamdp.services.release_inputs` — what it reads: the operator's commands on the
  control topic, the documents partitions (sketcher states, caught-up probe);
* :mod:`~streamdp.services.release_policy` — when an epoch is closable (pure);
* :mod:`~streamdp.services.release_merge` — merging the partitions' states (pure);
* :mod:`~streamdp.services.release_start` — the start: its rule at the warm-up close, the
  restart check, its report and the fold-in models it implies (pure);
* :mod:`~streamdp.services.snapshot_privacy` — what a snapshot's privacy section adds to the
  release's report: budget context, vocabulary, refinement model, start (pure);
* :mod:`~streamdp.services.release_sinks` — publishing (snapshots topic, snapshot files, the
  HTTP view) and control announcements; :attr:`ReleaseSinks.published` is the only "latest
  snapshot" of the service (:attr:`ReleaseService.latest` reads it).

Refinement (DESIGN §8, docs/services.md §Refinement in the services): the sketchers
fold each stream document of epoch e into the model of the snapshot of epoch e − L
(:func:`streamdp.refinement.model_epoch_for`, L = ``refinement_model_lag``), read from
this service's release state record, which keeps the models of the last L snapshots
(``refinement_models``: every model a sketcher can still need, so a restarted one can
rebuild them), and checkpoint per-epoch k × d refinement sums; an epoch close merges them
with the sketch sums into one :class:`~streamdp.epoch_sums.EpochSums` leaf of the tree.
Epoch e is closed with ``refined=True`` iff e − L ≥ 1 — the same public rule, never a
document count — so snapshots 1…L are spectral and later ones refined, topic i continuing
topic i.

"""
from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from streamdp.continual import ContinualRelease
from streamdp.trends import TrendTracker
from streamdp.moments.clipping import ClipBounds
from streamdp.observability.health import HealthState
from streamdp.observability.http_server import ObservabilityServer
from streamdp.observability.service_metrics import ServiceMetrics
from streamdp.privacy.accountant import BudgetExhausted
from streamdp.privacy.spend import SpendSession
from streamdp.privacy.noise import make_sampler
from streamdp.privacy.plan import warmup_plan
from streamdp.refinement import FoldInModels
from streamdp.services import control
from streamdp.services.contract import check_contract, record_contract
from streamdp.services.record_limits import check_limits, vocabulary_size
from streamdp.kafka.clients import open_state_store, service_client_config
from streamdp.kafka.connectivity import BrokerProbe, OutageGuard, check_bootstrap
from streamdp.services.config import ConfigError, ServiceConfig
from streamdp.services.start_checks import (check_privacy_mode, check_stream_start,
                                            documents_partition_count)
from streamdp.services import vocabulary as vocab_mod
from streamdp.services.partition_state import SELECTION, PartitionState
from streamdp.services.release_inputs import ControlCommands, DocumentsPartitions
from streamdp.services import state_loss
from streamdp.services.state_auth import StateAuth
# SketchMismatch, merge_epoch_sums and LeaseHeld are re-exported (tests/test_services imports them)
from streamdp.services.release_merge import (SketchMismatch, load_states,  # noqa: F401
                                             merge_epoch_sums)
from streamdp.services.release_policy import ClosingPolicy
from streamdp.services.release_sinks import ReleaseSinks
from streamdp.services import release_start, snapshot_privacy
from streamdp.services.release_announce import ENDED_BUDGET, ENDED_OTHER, Announcer
from streamdp.services.release_epochs import EpochFlow
from streamdp.services.release_vocabulary import VocabularyFlow
from streamdp.services.release_warmup import WarmupFlow
from streamdp.services.release_records import ReleaseRecords
from streamdp.services.release_restore import RecoveryFlow
from streamdp.services.release_writer import (LeaseHeld, ReleaseLease,  # noqa: F401
                                              ReleaseWriter, WriterWatch, bind_ledger,
                                              check_ledger, check_ledger_budget,
                                              check_ledger_present, check_release_records,
                                              spent_records)
from streamdp.snapshot import TopicSnapshot
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupDraw

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["ReleaseService", "LeaseHeld", "SketchMismatch", "merge_epoch_sums"]

log = logging.getLogger("streamdp.release")



class ReleaseService:
    """The deployment's release service: ``run`` polls (``step``) until stopped; ``latest`` /
    ``latest_json()`` are the last *published* snapshot; ``close`` releases the writer, the
    clients and the lease.

    One ``step``: read the operator's commands, the partitions' states; close the selection
    window (:class:`VocabularyFlow`), the warm-up (:class:`WarmupFlow`) or every closable epoch
    in order (:class:`EpochFlow`; the closing policy), each through merge → reserve/draw →
    persist the release state (commit) → publish → announce. The flows read and set the
    release's state here (tests and operators read it as this service's attributes); the steps
    they share (``_persist``, ``_publish`` — the one publication, where crash tests hook —,
    ``_refused``, ``_releases_ended``) stay methods of this class.
    """

    def __init__(self, cfg: ServiceConfig) -> None:
        self._closed = False
        self.cfg = cfg
        # Every refusal comes before any side effect (issue 25): vocabulary, broker, key, then
        # the read-only checks (contract, privacy mode, release records, state loss, stream
        # start, a missing ledger), then lease, ledger, marker, contract record and - last - the
        # transactional init that fences the running writer.
        self._control_key_bytes = None
        self.topics = cfg.topics
        self.vocabulary = self.d = self.k_prime = None
        self.vocabulary_meta: dict = {}          # how the vocabulary was chosen (public)
        self.candidates = None
        if cfg.vocabulary_mode == "file":
            vocab, self.vocabulary_meta = cfg.load_vocabulary_file()
            self._set_vocabulary(vocab)
        elif cfg.vocabulary_mode == "private":
            try:
                self.candidates = vocab_mod.candidates(cfg)
            except vocab_mod.VocabularyError as exc:
                raise ConfigError(str(exc)) from None
        self.routing = cfg.routing
        self.policy = ClosingPolicy(self.routing.close_time, cfg.lateness, closing=cfg.closing)
        # fail fast, naming 'bootstrap', before any ledger write
        check_bootstrap(service_client_config(cfg.bootstrap, cfg.kafka, "admin"))
        self._control_key()                      # refused here, not after init_transactions
        reader = open_state_store(cfg.bootstrap, cfg.kafka, cfg.topics.state)
        try:
            # the privacy mode first: its messages name the ledger / marker that proves it
            check_privacy_mode(cfg, reader, role="release", record=False,
                               document_partitions=(documents_partition_count(cfg)
                                                    if cfg.privacy_unit == "user" else None))
            contract, record = check_contract(cfg, reader, role="release service")
            check_limits(cfg, vocabulary_size(cfg, self.vocabulary),
                         [cfg.topics.snapshots, cfg.topics.state, cfg.topics.control])
        finally:
            reader.close()
        self.lease: ReleaseLease | None = None     # taken after the last read-only refusal
        self.writer = ReleaseWriter(cfg, self._set_fenced)
        self.spend = None
        try:
            self.metrics = ServiceMetrics("release")
            self.health = HealthState(liveness_timeout=cfg.liveness_seconds)
            self.metrics.bind_health(self.health)
            # Checks that may refuse the start come first, on a plain reader, so that a
            # misconfigured second service refuses WITHOUT fencing the running writer.
            reader = open_state_store(cfg.bootstrap, cfg.kafka, cfg.topics.state)
            try:
                # a first start with stream_start far in the past would close its epochs
                # empty: refused before the marker or the ledger is written
                known = reader.read_all_latest(prefix="release/")
                # every release record verified before anything is decided from it
                check_release_records(cfg, known, StateAuth(self._control_key(), cfg.topic_prefix))
                # a lost state topic is refused before anything is written (marker, ledger)
                loss = reader.read_latest(state_loss.LOSS_KEY)
                lost = state_loss.check(cfg, spent_records(known), confirmed=loss is not None and
                                        StateAuth(self._control_key(), cfg.topic_prefix).authentic(
                                            state_loss.LOSS_KEY, loss.payload, loss.meta))
                ledger = Path(cfg.ledger)
                check_stream_start(cfg, first_start=not known and not (
                    ledger.is_file() and ledger.stat().st_size > 0))
                if cfg.private:
                    check_ledger_present(cfg, known)
                    check_ledger_budget(cfg)     # another (ε, δ, unit) than the ledger's
                # the first side effects, after every read-only refusal: the lease file (and
                # its folder), then the ledger, the privacy-mode marker and the contract record
                self.lease = ReleaseLease(cfg.ledger)
                self.accountant = bind_ledger(cfg, known) if cfg.private else None
                check_privacy_mode(cfg, reader, role="release",   # never private -> non-private;
                                   document_partitions=(         # the unit never changes
                                       documents_partition_count(cfg)
                                       if cfg.privacy_unit == "user" else None))
                if record:                       # first start (or first since the contract)
                    record_contract(cfg, reader, contract, role="release service")
            finally:
                reader.close()
            # Release records go through the deployment's one transactional producer:
            # init_transactions() fences every older release service of this deployment.
            self.writer.open()
            recs = self.writer.records()         # Kafka may have moved since the first check
            unsigned = check_release_records(cfg, recs, self.writer.auth)
            if self.accountant is not None:
                check_ledger(cfg, self.accountant, recs)
            self.writer.sign_unsigned(unsigned)  # sign_unsigned_state: the one-time migration
            if lost:                             # confirm_state_loss: recorded, signed
                state_loss.record(self.store, self.writer.auth, cfg, lost)
            self.spend = SpendSession(self.accountant, unit=cfg.privacy_unit) if cfg.private else None
            # persist (then commit) release records; the public records sketchers read
            self.records = ReleaseRecords(cfg, self.writer, self._control_key, self.spend,
                                          resync=self._resync)
            self.sampler = make_sampler(cfg.sampler, cfg.noise_seed) if cfg.private else None
            self.rho = self.accountant.rho_budget if cfg.private else None   # derived once, there
            # the ρ shares of warm-up and stream: THE rule of the estimator (user unit: the
            # warm-up on the stream partition, warmup_share of ρ; document unit: parallel)
            self.plan = warmup_plan(self.rho, privacy_unit=cfg.privacy_unit,
                                    warmup_share=cfg.warmup_share,
                                    clip_budget_share=cfg.clip_budget_share,
                                    user_max_documents=(cfg.user_bounds[1]
                                                        if cfg.privacy_unit == "user" else None))
            self.producer = Producer(service_client_config(cfg.bootstrap, cfg.kafka, "producer", **{
                "enable.idempotence": True, "acks": "all"}))
            self.sinks = ReleaseSinks(self.producer, self.topics, cfg.snapshot_dir,
                                      vocabulary=lambda: self.vocabulary,
                                      control_key=self._control_key)
            self.announcer = Announcer(cfg, self.sinks)   # vocabulary_ready, subspace_ready, ...
            self.commands = ControlCommands(cfg, key=self._control_key)   # flush / close
            self.partitions = DocumentsPartitions(   # sketcher states (MAC-checked), caught-up probe
                cfg, auth=lambda: StateAuth(self._control_key(), cfg.topic_prefix))
            self.subspace: Subspace | None = None
            self.warmup_draw: WarmupDraw | None = None    # drawn, persisted, not post-processed
            # the warm-up premise check's ñ, kept from its draw until the warm-up draw is
            # persisted: a retry after a refusal or an exception reuses it, never draws again
            self.warmup_premise_kept: float | None = None
            self.clip: ClipBounds | None = None
            self.continual: ContinualRelease | None = None
            # The snapshot in the durable release state (None before the first release). Not
            # a published one: it is set after the state write, before the publication, and
            # only the sinks say what was published (ReleaseService.latest).
            self._state_snapshot: TopicSnapshot | None = None
            # topic shares and share changes of consecutive releases (public values only)
            self.trends = TrendTracker()
            self.refinement = cfg.refinement_config()
            # the public models of the last L snapshots (refinement_model_lag), persisted in the
            # release state: every model a sketcher can still need (streamdp.refinement.FoldInModels)
            self.fold_models = None if self.refinement is None else FoldInModels(self.refinement.model_lag)
            # the start (issue 22; docs/services.md §The start): the public start of
            # public_start_file (checked against the vocabulary once it is known) and the
            # choice, made once at the warm-up close and persisted with the subspace
            self.public_start = None
            self.start_choice: dict | None = None
            self.exhausted: str | None = None
            self.releases_ended: str | None = None    # budget / horizon / other, once releases end
            self._stop = threading.Event()
            self.server: ObservabilityServer | None = None
            self.watch: WriterWatch | None = None
            copy = Path(cfg.snapshot_dir) / "vocabulary.txt"
            if cfg.vocabulary_mode == "file" and not (copy.exists() and copy.samefile(cfg.vocabulary)):
                self._write_vocabulary_file()    # the folder is then readable on its own
            # the phases' flows, each the code of one phase over this service's state
            self.vocabulary_flow = VocabularyFlow(self)
            self.warmup_flow = WarmupFlow(self)
            self.epoch_flow = EpochFlow(self)
            self.recovery = RecoveryFlow(self)
            self.metrics.set_tree(0, cfg.horizon)
            self.recovery.restore()
        except BaseException:
            if self.lease is not None:  # a failed start must not keep the single-writer lease
                self.lease.close()
            if self.writer.store is not None:
                try:
                    self.writer.store.close()
                except Exception:   # noqa: BLE001
                    pass
            raise

    # ------------------------------------------------------------ the writer (release_writer)
    @property
    def store(self):
        """The release state store, written through this service's transactional writer."""
        return self.writer.store

    @property
    def writer_epoch(self) -> int | None:
        return self.writer.writer_epoch

    @property
    def transactional_id(self) -> str:
        return self.writer.transactional_id

    @property
    def fenced(self) -> str | None:
        """Why this writer was fenced (None while it is the deployment's writer)."""
        return self.writer.fenced

    def _check_writer(self) -> bool:
        return self.writer.still_writer()

    def _set_fenced(self, why: str) -> None:
        """Called once by the writer when it learns it was taken over: spend nothing more."""
        self.exhausted = f"fenced: {why}"
        if self.spend is not None:
            self.spend.discard()
        log.error("%s", why)
        self.health.set_ready(False, "fenced")
        self._stop.set()

    def _taken_over(self, why: str) -> None:
        """From the writer watch: a newer writer registered. Not ready from now on (the gate),
        and the loop ends; the main thread fences itself at its next writer check, and a
        write it was making is fenced at Kafka (nothing of it is published)."""
        log.error("%s", why)
        self.writer.fenced = self.writer.fenced or why   # no new step spends (_check_writer)
        self.health.set_ready(False, f"fenced: {why}")
        self._stop.set()

    def _resync(self) -> None:
        """After an outage or a re-created producer: re-validate against Kafka, then reload
        the durable state exactly as at a restart (an interrupted release is redone from
        its persisted state, its reservation fulfilled, never re-charged)."""
        if not self._check_writer():
            return
        recs = self.writer.records()
        check_release_records(self.cfg, recs, self.writer.auth)
        if self.accountant is not None:
            check_ledger(self.cfg, self.accountant, recs)
        self.recovery.restore()

    # ------------------------------------------------------------ the published view (release_sinks)
    @property
    def published(self) -> tuple[TopicSnapshot, bytes] | None:
        """The last published snapshot and its bytes (:attr:`ReleaseSinks.published`)."""
        return self.sinks.published

    @property
    def latest(self) -> TopicSnapshot | None:
        """The last *published* snapshot: never a draw whose state write has not succeeded."""
        return self.sinks.latest

    def latest_json(self) -> dict | None:
        """``latest.json`` and ``GET /snapshot/latest`` (:meth:`ReleaseSinks.latest_json`)."""
        return self.sinks.latest_json()

    def _publish(self, snap: TopicSnapshot) -> None:
        """Publish a new release, after its persist (a restart republishes the persisted one
        through the sinks directly: tests/crash_helpers.py's after_publish hooks new ones)."""
        self.sinks.publish(snap)

    def _write_vocabulary_file(self) -> None:
        self.sinks.write_vocabulary(self.vocabulary_report())

    # ------------------------------------------------------------ the vocabulary (release_vocabulary)
    def _set_vocabulary(self, vocab) -> None:
        self.vocabulary = vocab
        self.d = len(vocab)
        self.k_prime = self.cfg.k_prime(self.d)

    # ------------------------------------------------------------ the start (issue 22)
    @property
    def public_start_chosen(self) -> bool:
        return release_start.is_public(self.start_choice)

    # ------------------------------------------------------------ lifecycle
    def stop(self, *_args) -> None:
        self._stop.set()

    def run(self, *, max_seconds: float | None = None, install_signals: bool = True,
            until_epoch: int | None = None) -> int:
        if install_signals:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        self.server = ObservabilityServer(self.metrics, self.health, host=self.cfg.metrics_host,
                                          port=self.cfg.metrics_port)
        self.sinks.add_http_routes(self.server)          # serves published snapshots only
        # metrics_port 0 lets the OS pick the port: this line is how an operator finds it
        log.info("release service HTTP on %s: GET /snapshot/latest (latest snapshot as JSON), "
                 "/snapshot/latest.msgpack, /vocabulary.txt, /metrics, /healthz, /readyz",
                 self.server.url)
        # never two ready writers (issue 23 item 9): ready only while the writer epoch is
        # confirmed on Kafka, and only once an older writer's readiness has lapsed
        cfg = self.cfg
        self.watch = WriterWatch(
            self.writer, lambda: open_state_store(cfg.bootstrap, cfg.kafka, cfg.topics.state),
            self._taken_over).start()
        self.health.add_ready_gate(self.watch.gate)
        self.health.set_ready(True, "serving")
        admin_config = service_client_config(self.cfg.bootstrap, self.cfg.kafka, "admin")
        self.broker_probe = BrokerProbe(self.health, admin_config, name="release",
                                        bound=self.cfg.readiness_broker_seconds,
                                        interval=self.cfg.readiness_broker_seconds / 2).start()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        guard = OutageGuard(self.health, admin_config, self._stop, name="release",
                            resync=self._resync, logger=log)     # outages: alive, not ready, retry
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                guard.run(self.step)
                if until_epoch is not None and self.continual is not None \
                        and self.continual.epoch >= until_epoch:
                    break
                self._stop.wait(self.cfg.poll_seconds)
        finally:
            self.close()
        return 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if getattr(self, "broker_probe", None) is not None:
            self.broker_probe.close()
        try:
            if getattr(self, "watch", None) is not None:
                self.watch.stop()
            self.commands.close()
            self.partitions.close()
            self.producer.flush(10)
            try:
                self.store.close()
            except Exception as exc:     # noqa: BLE001 - e.g. a fenced transactional producer
                log.warning("closing the release writer: %s", exc)
        finally:
            self.lease.close()
            if self.server is not None:
                self.server.close()

    # ------------------------------------------------------------ one step
    def step(self) -> None:
        self.health.beat()
        self.commands.read()
        if self.records.public_epoch is not None and self.continual is not None \
                and self.records.public_epoch != self._published_epoch() and self._check_writer():
            self._write_public()          # a failed write of the public record, retried
        if self.records.mirrors_pending and self._check_writer():
            self.records.sync_mirrors()   # a failed write of a public subspace/vocabulary record
        if self.exhausted:
            return
        states, partitions = self._partition_view()
        if self.vocabulary is None:
            if (self.cfg.vocabulary_mode == "private" and self._closable(SELECTION, states, partitions)
                    and self._check_writer()):
                self.vocabulary_flow.release(self._load_states(states))
            return
        if self.subspace is None:
            if self.warmup_draw is not None:
                # the warm-up was drawn and persisted, not yet post-processed (a failure, a
                # restart): finish it from its noised values; never draw it again
                if self._check_writer():
                    self.warmup_flow.release_draw()
            elif self._closable(0, states, partitions) and self._check_writer():
                self.warmup_flow.release(self._load_states(states))
            return
        self.epoch_flow.step(states, partitions)

    def _load_states(self, states: dict) -> list[PartitionState]:
        return load_states(states, self.subspace)

    def _control_key(self) -> bytes:
        """The deployment's control key (control.load_key), loaded first in ``__init__``: a
        production deployment without ``control_key_file`` is refused before any side effect."""
        key = self._control_key_bytes
        if key is None:
            try:
                key = self._control_key_bytes = control.load_key(self.cfg)
            except control.ControlKeyError as exc:
                raise ConfigError(str(exc)) from None
        return key

    # ------------------------------------------------------------ inputs (release_inputs)
    def _partition_view(self):
        """Latest accepted sketcher state per documents partition, and the partition list."""
        refused = self.partitions.unauthentic
        out = self.partitions.read(self.store)
        if self.partitions.unauthentic > refused:
            self.metrics.state_refused("mac", self.partitions.unauthentic - refused)
        return out

    def _caught_up(self, p: int, next_offset: int) -> bool:
        return self.partitions.caught_up(p, next_offset)

    @property
    def control_offset(self) -> int | None:
        return self.commands.offset

    @property
    def forced_through(self) -> int:
        return self.commands.forced_through

    @property
    def flush_requested(self) -> bool:
        return self.commands.flush_requested

    def _closable(self, epoch: int, states: dict, partitions: list[int]) -> bool:
        """The closing policy (:class:`ClosingPolicy`) on this step's view and commands."""
        return self.policy.closable(epoch, states, partitions, now=time.time(),
                                    caught_up=self._caught_up, commands=self.commands.current)

    def vocabulary_report(self) -> dict:
        """What every snapshot's privacy report says about the vocabulary (snapshot_privacy)."""
        return snapshot_privacy.vocabulary_report(self.cfg.vocabulary_mode, self.vocabulary,
                                                  self.vocabulary_meta)

    # ------------------------------------------------------------ steps the flows share
    def _write_public(self) -> None:
        """The public release record of the last released epoch (ReleaseRecords.write_public)."""
        self.records.write_public(self._published_epoch(), self._fold_model_dicts(),
                                  None if self.start_choice is None else self.start_choice["start"])

    def _fold_model_dicts(self) -> list[dict]:
        return [] if self.fold_models is None else [
            self.fold_models.models[e].to_dict() for e in sorted(self.fold_models.models)]

    def _published_epoch(self) -> int:
        """The last epoch whose snapshot is persisted (0: the warm-up): a persisted draw still
        to be post-processed (``continual.pending``) has no snapshot, hence no model, yet."""
        if self.continual is None:
            return 0
        return self.continual.epoch - (self.continual.pending is not None)

    def _public_behind(self) -> bool:
        """Whether the public release record lags the persisted release state."""
        return self.continual is not None and self.records.public_behind(self._published_epoch())

    def _persist(self, key: str, payload: bytes, meta: dict) -> bool:
        """Spend protocol steps 3-4 (ReleaseRecords.persist): False if nothing was committed."""
        return self.records.persist(key, payload, meta)

    def _refused_states(self, refused: dict[int, str], what: str) -> None:
        """Partitions whose sums failed the plausibility checks (streamdp.services.plausibility):
        left out of ``what`` before any noise is drawn; counted and logged, never silent."""
        for p, why in sorted(refused.items()):
            self.metrics.state_refused("implausible")
            log.error("partition %d: sums refused for %s, left out of the release (a buggy "
                      "sketcher or a foreign writer on the state topic): %s", p, what, why)

    def _refused(self, exc: Exception) -> None:
        self.exhausted = str(exc)
        self.metrics.release_outcome("refused_budget")
        log.error("release refused: %s", exc)
        self._releases_ended(ENDED_BUDGET if isinstance(exc, BudgetExhausted) else ENDED_OTHER,
                             str(exc))

    def _releases_ended(self, reason: str, why: str) -> None:
        """Say once (log, ``streamdp_releases_ended{reason}``) that no further release will
        come: sketchers holding partitions for a refinement model would wait forever
        (docs/operations.md §Releases have ended)."""
        if self.releases_ended is not None:
            return
        self.releases_ended = reason
        self.metrics.set_releases_ended(reason)
        log.error("releases have ended (%s): %s. No further snapshot will be published by this "
                  "deployment; sketchers waiting for a refinement model hold their partitions "
                  "until stopped. Plan the next deployment (docs/operations.md, 'Releases have "
                  "ended')", reason, why)
