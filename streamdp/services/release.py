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

Modules (one idea each; this class orchestrates them and keeps the order above):

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
from dataclasses import replace
from pathlib import Path

from confluent_kafka import Producer

from streamdp import serialization as ser
from streamdp.continual import ContinualRelease, EpochSums
from streamdp.trends import TrendTracker
from streamdp.moments.clipping import ClipBounds
from streamdp.observability.health import HealthState
from streamdp.observability.http_server import ObservabilityServer
from streamdp.observability.service_metrics import ServiceMetrics
from streamdp.kafka.state_errors import WriterFenced, WriterReinitialised
from streamdp.privacy.accountant import BudgetExhausted
from streamdp.privacy.spend import SpendSession, recommit_kept
from streamdp.privacy.noise import make_sampler
from streamdp.privacy.rounding import DocumentCountExceeded
from streamdp.privacy.tree import HorizonExceeded
from streamdp.privacy.plan import BudgetSplit, warmup_plan
from streamdp.release import DenoiseConfig
from streamdp.refinement import (PUBLIC_START_EPOCH, FoldInModels, RefinementModel,
                                  model_epoch_for)
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
from streamdp.services import public_records, public_release, release_state, state_loss
from streamdp.services.state_auth import StateAuth
from streamdp.services.release_merge import (SketchMismatch, check_refine_sums,  # noqa: F401
                                             load_states, merge_epoch_sums, merge_refine_sums,
                                             merge_warmups)
from streamdp.services.release_policy import IDLE_GRACE_SECONDS, ClosingPolicy  # noqa: F401
from streamdp.services.release_sinks import ReleaseSinks
from streamdp.services import release_start, snapshot_privacy
from streamdp.services.release_writer import (SPENT_KEYS, WRITER_KEY, Fenced,  # noqa: F401
                                              WriterWatch,
                                              LeaseHeld, ReleaseLease, ReleaseWriter, bind_ledger,
                                              check_ledger, check_ledger_budget,
                                              check_ledger_present,
                                              check_release_records, spent_records,
                                              writer_transactional_id)
from streamdp.snapshot import TopicSnapshot
from streamdp.tensor.power_method import PowerMethodConfig
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import PREMISE_LABEL, WarmupDraw, WarmupSketch, premise_decision

log = logging.getLogger("streamdp.release")

#: release record -> the public record sketchers read instead (streamdp.services.public_records)
MIRRORS = {control.SUBSPACE_KEY: public_records.SUBSPACE_KEY,
           control.VOCABULARY_KEY: public_records.VOCABULARY_KEY}

#: why releases ended (the ``reason`` label of ``streamdp_releases_ended``)
ENDED_BUDGET, ENDED_HORIZON, ENDED_OTHER = "budget", "horizon", "other"


class ReleaseService:
    """The deployment's release service: ``run`` polls (``step``) until stopped; ``latest`` /
    ``latest_json()`` are the last *published* snapshot; ``close`` releases the writer, the
    clients and the lease.

    One ``step``: read the operator's commands, the partitions' states; close the selection
    window, the warm-up or every closable epoch in order (the closing policy), each through
    merge → reserve/draw → persist the release state (commit) → publish → announce. The
    modules listed in this module's docstring do each part; this class keeps the order.
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
            self._public_epoch: int | None = None     # epoch of the public release record written
            self._mirrors_pending: set[str] = set()   # public records whose write failed
            self._stop = threading.Event()
            self.server: ObservabilityServer | None = None
            self.watch: WriterWatch | None = None
            copy = Path(cfg.snapshot_dir) / "vocabulary.txt"
            if cfg.vocabulary_mode == "file" and not (copy.exists() and copy.samefile(cfg.vocabulary)):
                self._write_vocabulary_file()    # the folder is then readable on its own
            self.metrics.set_tree(0, cfg.horizon)
            self._restore()
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
        self._restore()

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

    def _publish(self, snap: TopicSnapshot, republish: bool = False) -> None:
        self.sinks.publish(snap)

    def _observe_trend(self, snap: TopicSnapshot) -> None:
        """Topic shares on /metrics and the significant-change counter (streamdp.trends):
        post-processing of the published release and the one before; never stops a release."""
        try:
            seen = self.trends.observe(snap)
        except Exception:                     # noqa: BLE001 - monitoring only
            log.exception("topic trends of release %s", snap.release_id)
            return
        if seen is not None:
            point, changes = seen
            self.metrics.set_topic_trend(point, changes)
            for c in changes:
                if c.significant:
                    log.warning("topic %d share changed significantly at epoch %s: %.1f%% -> "
                                "%.1f%% (z = %.1f)", c.topic, c.epoch, 100 * c.before,
                                100 * c.after, c.z)

    def _send_control(self, type_: str, **fields) -> None:
        self.sinks.announce(type_, **fields)
        if self.cfg.private and type_ in ("vocabulary_ready", "epochs_closed"):
            # sent only after a spent record is persisted: mark the documents topic as released
            # (state_loss: a later deployment on these documents is refused unless confirmed)
            self._mark_released()

    def _mark_released(self, wait: float = 15.0) -> None:
        """state_loss.mark_released, bounded: a synchronous offset commit waits for the group
        coordinator without a timeout of its own, and the release loop must not hang on it
        (best effort: refreshed at every release; one attempt in flight at a time)."""
        pending = getattr(self, "_marking", None)
        docs = self.cfg.topics.documents
        if pending is not None and pending.is_alive():
            log.error("the release marker of documents topic %r is still being committed; "
                      "retried at the next release", docs)
            return
        failed: list[Exception] = []

        def run() -> None:
            try:
                state_loss.mark_released(self.cfg)
            except Exception as e:        # noqa: BLE001 - logged below
                failed.append(e)
        t = threading.Thread(target=run, name="mark-released", daemon=True)
        t.start()
        t.join(wait)
        self._marking = t
        if t.is_alive():
            log.error("could not mark documents topic %r as released within %.0f s (retried at "
                      "the next release)", docs, wait)
        elif failed:
            log.error("could not mark documents topic %r as released (retried at the next "
                      "release): %s", docs, failed[0])

    def _write_vocabulary_file(self) -> None:
        self.sinks.write_vocabulary(self.vocabulary_report())

    # ------------------------------------------------------------ restore
    def _set_vocabulary(self, vocab) -> None:
        self.vocabulary = vocab
        self.d = len(vocab)
        self.k_prime = self.cfg.k_prime(self.d)

    def _restore_vocabulary(self) -> None:
        """public/private: the deployment's vocabulary record (public: built and persisted
        at the first start). A failed selection stops the service with its message."""
        if self.cfg.vocabulary_mode == "file" or self.vocabulary is not None:
            return
        try:
            got = vocab_mod.load_record(self.store)
        except vocab_mod.SelectionTooSmall as exc:
            self.exhausted = str(exc)
            log.error("%s", exc)
            self._releases_ended(ENDED_OTHER, self.exhausted)
            return
        except vocab_mod.VocabularyError as exc:
            raise ConfigError(str(exc)) from None
        if got is None and self.cfg.vocabulary_mode == "public":
            try:
                vocab, meta = vocab_mod.public_vocabulary(self.cfg)
            except vocab_mod.VocabularyError as exc:
                raise ConfigError(str(exc)) from None
            meta = {**meta, "writer_epoch": self.writer_epoch}
            if not self._persist(control.VOCABULARY_KEY, vocab.canonical_bytes(), meta):
                return
            log.info("public vocabulary %s: %d wordfreq words (%s %s), no budget", vocab.id,
                     len(vocab), meta.get("source"), meta.get("source_version"))
            got = vocab, meta
        if got is not None:
            self._set_vocabulary(got[0])
            self.vocabulary_meta = {k: v for k, v in got[1].items()
                                    if k not in ("ledger", "writer_epoch")}
            self._write_vocabulary_file()

    def _restore(self) -> None:
        self._restore_vocabulary()
        if self.cfg.public_start_file and self.vocabulary is not None and self.public_start is None:
            # wrong vocabulary or k: refused here, at start-up (ConfigError says what to fix)
            self.public_start = self.cfg.load_public_start(self.vocabulary.id)
        self._state_snapshot = None
        persisted = None                         # the release state record's content, if any
        rec = self.store.read_latest(control.SUBSPACE_KEY)
        self.warmup_draw = None
        self.warmup_premise_kept = None
        if rec is None:
            premise = self.store.read_latest(control.WARMUP_PREMISE_KEY)
            if premise is not None:       # ñ persisted before a crash: never drawn again
                self.warmup_premise_kept = float(ser.loads(premise.payload)["noisy_count"])
            drawn = self.store.read_latest(control.WARMUP_DRAW_KEY)
            if drawn is not None:
                if self.vocabulary is None or drawn.meta.get("vocabulary_id") != self.vocabulary.id:
                    raise ConfigError(f"the deployment's warm-up draw was made for vocabulary "
                                      f"{drawn.meta.get('vocabulary_id')}, this service has "
                                      f"{None if self.vocabulary is None else self.vocabulary.id}"
                                      ": use the same vocabulary file")
                # drawn and persisted before a crash: post-processed at the first step
                self.warmup_draw = WarmupDraw.from_bytes(drawn.payload)
        if rec is not None:
            self.subspace = Subspace.from_bytes(rec.payload)
            self.clip = ClipBounds.from_dict(rec.meta["clip"])
            if self.vocabulary is None:
                raise ConfigError(f"the state topic {self.topics.state!r} holds a warm-up subspace "
                                  f"(vocabulary {rec.meta.get('vocabulary_id')}) but no usable "
                                  f"vocabulary record for vocabulary_mode "
                                  f"{self.cfg.vocabulary_mode!r}: this deployment was started with "
                                  "another vocabulary_mode; restore that configuration")
            if rec.meta.get("vocabulary_id") != self.vocabulary.id:
                raise ConfigError(f"the deployment's subspace was built for vocabulary "
                                  f"{rec.meta.get('vocabulary_id')}, this service has "
                                  f"{self.vocabulary.id}: use the same vocabulary file")
            self._new_continual()
            self.start_choice = release_start.restored_start(rec.meta.get("start"), self.cfg,
                                                             self.public_start)
            self.refinement = release_start.node_refinement(self.cfg, self.start_choice)
            if self.refinement is not None:
                self.fold_models = release_start.fold_in_models(
                    self.refinement, self.public_start, self.public_start_chosen)
            state = self.store.read_latest(control.RELEASE_STATE_KEY)
            if state is not None:
                obj = persisted = release_state.decode(state.payload, refinement=self.refinement,
                                                       now=time.time())
                self._check_refinement_unchanged(obj)
                self.continual.load_state(obj["continual"])
                if self.refinement is not None:
                    for m in obj["refinement_models"]:
                        model = RefinementModel.from_dict(m)
                        if model.epoch == PUBLIC_START_EPOCH:
                            self.fold_models.models[PUBLIC_START_EPOCH] = model
                        else:
                            self.fold_models.released(model)
                    # a pending draw's epoch gets its model when it is post-processed
                    self.fold_models.close_through(self.continual.epoch
                                                   - (self.continual.pending is not None))
                if obj["last_snapshot"]:
                    snap = self._state_snapshot = TopicSnapshot.from_bytes(obj["last_snapshot"])
                    self.trends.seed(snap)          # the next release gets a point, no test
                    self._publish(snap, republish=True)      # persisted: safe to (re)publish
                    self.metrics.set_last_release_timestamp(snap.created_at)
                self.metrics.set_tree(self.continual.epoch, self.cfg.horizon)
        if self._public_behind():                # a crash between state persist and public record
            self._write_public()
        self._sync_mirrors()    # the same for the public subspace/vocabulary (or a migration)
        self.commands.restore(persisted)         # read control from the saved offset
        if self.spend is not None:
            # Crash recovery of the spend protocol: a reservation whose noised output is in
            # the persisted state is committed now; any other is fulfilled by the next draw.
            left = self.spend.recover(self._is_persisted)
            if left:
                log.warning("reservations to fulfil (output lost in a crash, not re-charged): %s",
                            ", ".join(left))
        if self.vocabulary is not None and self.cfg.vocabulary_mode != "file":
            self._send_control("vocabulary_ready", vocabulary_id=self.vocabulary.id)
        if self.subspace is not None:
            # a crash may have cut these short; sketchers handle repeats
            self._send_control("subspace_ready", subspace_id=self.subspace.id)
            self._send_control("epochs_closed", through=self.continual.epoch if self.continual else 0)
        if self.accountant is not None:
            self.metrics.set_budget_from_report(self.accountant.report())

    # ------------------------------------------------------------ the start (issue 22)
    @property
    def public_start_chosen(self) -> bool:
        return release_start.is_public(self.start_choice)

    def _is_persisted(self, key: str) -> bool:
        """Whether the output reserved under ``key`` is in the restored, persisted state."""
        if key.startswith(vocab_mod.SPEND_KEY):
            return self.store.read_latest(control.VOCABULARY_KEY) is not None
        if key.startswith("warmup"):
            return self.subspace is not None or self.warmup_draw is not None
        if key.startswith("tree:premise:epoch="):     # used by that epoch's persisted draw
            try:
                t = int(key.split("=", 1)[1])
            except ValueError:
                return False
            return self.continual is not None and t <= self.continual.epoch
        if key.startswith("tree:epoch="):
            try:
                t = int(key.split("=", 1)[1])
            except ValueError:
                return False
            return self.continual is not None and t <= self.continual.epoch
        return False

    def _refinement_dict(self) -> dict | None:
        return None if self.refinement is None else self.refinement.to_dict()

    def _check_refinement_unchanged(self, obj: dict) -> None:
        """The tree's per-node plan includes the refinement block: it cannot change mid-way."""
        had = obj["refinement"]
        if int(obj["continual"].get("epoch") or 0) == 0:
            return                          # nothing released yet: any setting is fine
        if had != self._refinement_dict():
            raise ConfigError(
                f"configuration fields 'refinement'/'refinement_share'/'refinement_model_lag': "
                f"this deployment's tree was "
                f"started with refinement {had!r}, the configuration says "
                f"{self._refinement_dict()!r}. Every tree node is noised with the plan it "
                "started with (the refinement block and its share of rho), so it cannot change "
                "mid-deployment: restore the original setting, or start a new deployment")

    def _new_continual(self) -> None:
        # with refinement, the spectral start spends nothing on z and m1 (as the engine)
        split = BudgetSplit.spectral_start() if self.refinement is not None else BudgetSplit()
        self.continual = ContinualRelease(
            self.subspace, self.clip, n_topics=self.cfg.n_topics, alpha0=self.cfg.alpha0,
            rho=self.plan.stream_rho, horizon=self.cfg.horizon, split=split, sampler=self.sampler,
            spender=self.spend, power=PowerMethodConfig(seed=self.cfg.seed),
            denoise=DenoiseConfig(), refinement=self.refinement,
            aggregator=self.cfg.continual_aggregator,
            max_documents=self.cfg.max_documents_per_sum, privacy_unit=self.cfg.privacy_unit,
            user_max_documents=(self.cfg.user_bounds[1] if self.cfg.privacy_unit == "user"
                                else None))
        premise = self.continual.premise
        if premise is not None and premise.threshold(self.cfg.max_documents_per_sum) <= 0:
            log.warning("max_documents_per_sum=%d is below the premise check's margin 12·σ_p = "
                        "%.3g: every epoch will be released from noise only; raise it (docs/"
                        "privacy.md 'The premise check')", self.cfg.max_documents_per_sum,
                        premise.z * premise.sigma)

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
        if self._public_epoch is not None and self.continual is not None \
                and self._public_epoch != self._published_epoch() and self._check_writer():
            self._write_public()          # a failed write of the public record, retried
        if self._mirrors_pending and self._check_writer():
            self._sync_mirrors()          # a failed write of a public subspace/vocabulary record
        if self.exhausted:
            return
        states, partitions = self._partition_view()
        if self.vocabulary is None:
            if (self.cfg.vocabulary_mode == "private" and self._closable(SELECTION, states, partitions)
                    and self._check_writer()):
                self._release_vocabulary(self._load_states(states))
            return
        if self.subspace is None:
            if self.warmup_draw is not None:
                # the warm-up was drawn and persisted, not yet post-processed (a failure, a
                # restart): finish it from its noised values; never draw it again
                if self._check_writer():
                    self._release_warmup_draw()
            elif self._closable(0, states, partitions) and self._check_writer():
                self._release_warmup(self._load_states(states))
            return
        if self.continual.pending is not None:
            # an epoch drawn and persisted, not yet post-processed (a failure, a restart):
            # finish it from its noised values before anything else; never draw it again
            if not self._check_writer() or not self._release_pending():
                return
        loaded = None      # partition states decoded once per step, however many epochs close
        while (not self._stop.is_set() and self.continual.epoch < self.continual.epoch_limit
               and self._closable(self.continual.epoch + 1, states, partitions)):
            # stop between epochs, never inside one: a kill mid-release wastes budget
            self.health.beat()
            # decoded once per (partition, generation): unchanged partitions are not decoded again
            loaded = loaded if loaded is not None else self.partitions.load(states, self.subspace)
            if not self._check_writer():        # a newer writer took over: spend nothing
                return
            if not self._close_epoch(self.continual.epoch + 1, loaded):
                return
        if self.continual.epoch >= self.continual.epoch_limit:
            self._releases_ended(ENDED_HORIZON, f"the tree horizon is reached: epoch "
                                 f"{self.continual.epoch} of {self.continual.epoch_limit} released")

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

    # ------------------------------------------------------------ vocabulary selection
    def _release_vocabulary(self, parts: list[PartitionState]) -> None:
        """Close the selection window: merge the partitions' histograms, select (spend
        protocol: reserve → draw → persist the vocabulary record → commit), announce."""
        try:
            merged = vocab_mod.merge_histograms((p.selection for p in parts), self.candidates)
        except vocab_mod.VocabularyError as exc:
            self.exhausted = str(exc)
            log.error("vocabulary selection refused: %s", exc)
            self._releases_ended(ENDED_OTHER, self.exhausted)
            return
        n_docs = 0 if merged is None else merged.n_docs
        if n_docs == 0 and self.cfg.private:
            # an empty window is selected on schedule from noise, like any window (issue 23
            # item 2): whether releases go on is then decided by the noised, charged selection
            # (SelectionTooSmall below), never by the exact count 0
            log.warning("the vocabulary-selection window closed with no usable documents (ts < "
                        "selection_end=%r): selecting from noise only", self.cfg.selection_end)
            merged = vocab_mod.SelectionHistogram.for_config(self.cfg, self.candidates).histogram(
                self.candidates)
        elif n_docs == 0:           # non-private (no guarantee to keep)
            self.exhausted = (
                f"the vocabulary-selection window closed with no usable documents (0 documents "
                f"with ts < selection_end={self.cfg.selection_end!r} across {len(parts)} "
                "partition state(s)): nothing to select from. Fix: produce text/tokens documents "
                "with ts < selection_end (and record time before it), move selection_end later, "
                "or use vocabulary_mode: public. Nothing was spent.")
            log.error("%s", self.exhausted)
            self._releases_ended(ENDED_OTHER, self.exhausted)
            return
        t0 = time.perf_counter()
        failure = None
        try:        # its own atom, with its whole budget (parallel composition)
            sel = vocab_mod.select(self.cfg, merged, accountant=self.accountant,
                                   sampler=self.sampler, spender=self.spend)   # reserve → draw
        except BudgetExhausted as exc:
            self._refused(exc)
            return
        except vocab_mod.SelectionTooSmall as exc:
            sel, failure = None, str(exc)
        meta = {"mode": "private", "selection_end": self.cfg.selection_end,
                "selection_documents": int(n_docs), "writer_epoch": self.writer_epoch}
        if self.accountant is not None:
            meta["ledger"] = self.accountant.head()
        if failure is not None:
            # the failure is the release of this draw: persisted and committed like a
            # vocabulary, so no restart draws again on the same documents for free
            meta.update(status=vocab_mod.FAILED, error=failure)
            if self._persist(control.VOCABULARY_KEY, b"", meta):
                self.exhausted = failure
                log.error("%s", failure)
                self._releases_ended(ENDED_OTHER, failure)
            return
        meta.update({k: v for k, v in sel.meta.items() if k != "events"},
                    events=sel.meta.get("events", []))
        if not self._persist(control.VOCABULARY_KEY, sel.vocabulary.canonical_bytes(), meta):
            return                                                 # ... → persist → commit
        self._set_vocabulary(sel.vocabulary)
        self.vocabulary_meta = {k: v for k, v in meta.items() if k not in ("ledger", "writer_epoch")}
        self._write_vocabulary_file()
        self._send_control("vocabulary_ready", vocabulary_id=sel.vocabulary.id)
        log.info("vocabulary selected: %d words (id %s), %s of them above the noise, from the "
                 "selection window in %.1f s", len(sel.vocabulary), sel.vocabulary.id,
                 sel.meta.get("n_candidates_above_cut"), time.perf_counter() - t0)
        if self.accountant is not None:
            self.metrics.set_budget_from_report(self.accountant.report())

    def vocabulary_report(self) -> dict:
        """What every snapshot's privacy report says about the vocabulary (snapshot_privacy)."""
        return snapshot_privacy.vocabulary_report(self.cfg.vocabulary_mode, self.vocabulary,
                                                  self.vocabulary_meta)

    # ------------------------------------------------------------ warm-up
    def _release_warmup(self, parts: list[PartitionState]) -> None:
        refused: dict[int, str] = {}
        merged = merge_warmups(parts, refused=refused, warmup_clip=self.cfg.warmup_clip,
                               max_documents=self.cfg.max_documents_per_sum)
        self._refused_states(refused, "the warm-up")
        if merged is None and self.cfg.private:
            # an empty warm-up is released on schedule from noise, like any warm-up: whether
            # releases go on must not reveal that the exact count is 0 (issue 23 item 2)
            log.warning("the warm-up closed with no usable documents (length >= 3): its subspace "
                        "and clip bounds are noise only; produce warm-up documents with ts < "
                        "stream_start")
            merged = WarmupSketch(self.d, self.k_prime, clip=self.cfg.warmup_clip, seed=self.cfg.seed)
        if merged is None:          # non-private (no guarantee to keep): cannot whiten nothing
            log.error("the warm-up closed with no usable documents (length >= 3): cannot whiten; "
                      "produce warm-up documents with ts < stream_start")
            self.exhausted = "no warm-up documents"
            self._releases_ended(ENDED_OTHER, self.exhausted)
            return
        t0 = time.perf_counter()
        if not self.cfg.private:    # no noise: nothing to keep between draw and post-processing
            self._publish_subspace(ClipBounds.unclipped(), merged.subspace(None), merged.n_docs, t0)
            return
        try:                        # spend protocol: reserve (keyed) → draw, here ...
            plan = self.plan
            # the rounding premise N_max: a noised, charged count decides, from ñ alone, whether
            # the warm-up is drawn from its sums or from noise only — never a refusal
            noisy = self.warmup_premise_kept
            if noisy is None:
                noisy = merged.draw_premise_count(plan.premise, self.sampler, self.spend,
                                                  partition=plan.premise_partition)
                self.warmup_premise_kept = noisy
                # persisted (and committed) before it decides anything: a crash or an
                # exception after this point never draws ñ again (kept_draws rule)
                meta = {"vocabulary_id": self.vocabulary.id, "writer_epoch": self.writer_epoch}
                if self.accountant is not None:
                    meta["ledger"] = self.accountant.head()
                if not self._persist(control.WARMUP_PREMISE_KEY,
                                     ser.dumps({"noisy_count": float(noisy)}), meta):
                    return
            else:
                recommit_kept(self.spend, [plan.premise.event(plan.premise_partition)],
                              label=PREMISE_LABEL)
            drawn, premise = premise_decision(merged, plan.premise, noisy,
                                              self.cfg.max_documents_per_sum)
            if not premise["passed"]:
                log.warning("the warm-up's premise check failed (ñ = %.6g > N_max − z·σ_p = %.6g): "
                            "its subspace and clip bounds are noise only; raise "
                            "max_documents_per_sum (docs/privacy.md 'The premise check')",
                            noisy, premise["threshold"])
            hist, hist_events = drawn.draw_histogram(plan.clip_rho, self.sampler, self.spend,
                                                     **plan.where)
            Y, events = drawn.draw_range(plan.subspace_rho, self.sampler, self.spend,
                                         max_documents=self.cfg.max_documents_per_sum,
                                         premise_checked=True, **plan.where)
        except (BudgetExhausted, DocumentCountExceeded) as exc:
            self._refused(exc)
            return
        draw = WarmupDraw(hist, hist_events, Y, events, omega_seed=merged.seed, clip=merged.clip,
                          n_docs=merged.n_docs, premise_check=premise)
        # ... → persist the noised values → commit, before any post-processing (issue 23
        # item 4): a failure or a crash in the orthonormalisation or later post-processes
        # this persisted draw again (_release_warmup_draw, at the next step or start)
        meta = {"vocabulary_id": self.vocabulary.id, "writer_epoch": self.writer_epoch}
        if self.accountant is not None:
            meta["ledger"] = self.accountant.head()
        if not self._persist(control.WARMUP_DRAW_KEY, draw.to_bytes(), meta):
            return
        self.warmup_premise_kept = None
        self.warmup_draw = draw
        self._release_warmup_draw(t0)

    def _release_warmup_draw(self, t0: float | None = None) -> None:
        """Post-process the persisted warm-up draw (quantiles, orthonormal basis) and publish
        the subspace. A function of noised values only: safe to repeat after a failure."""
        draw = self.warmup_draw
        clip, sub = draw.post_process(self.cfg.clip_quantile)
        if self._publish_subspace(clip, sub, draw.n_docs, t0, warmup_draw=draw):
            self.warmup_draw = None

    def _publish_subspace(self, clip: ClipBounds, sub: Subspace, n_docs: int,
                          t0: float | None, warmup_draw=None) -> bool:
        t0 = time.perf_counter() if t0 is None else t0
        # the start is chosen once, here, and persisted in the same write as the subspace
        choice = release_start.choose_start(
            self.cfg, self.public_start, self.refinement,
            None if warmup_draw is None else warmup_draw.hist, self.plan.stream_rho, self.k_prime,
            *(() if warmup_draw is None or not warmup_draw.events
              else (warmup_draw.Y, warmup_draw.events[0].sigma)))
        meta = {"clip": clip.to_dict(), "subspace_id": sub.id, "vocabulary_id": self.vocabulary.id,
                "warmup_documents": int(n_docs), "writer_epoch": self.writer_epoch,
                "start": choice}
        if self.accountant is not None:
            meta["ledger"] = self.accountant.head()
        if not self._persist(control.SUBSPACE_KEY, sub.to_bytes(), meta):   # ... → persist → commit
            return False
        self.start_choice = choice
        self.refinement = release_start.node_refinement(self.cfg, choice)
        self.subspace, self.clip = sub, clip
        self._new_continual()
        if self.refinement is not None:
            self.fold_models = release_start.fold_in_models(
                self.refinement, self.public_start, self.public_start_chosen)
        log.info("start: %s (%s)", choice["start"], choice.get("rule"))
        self._write_public()                 # epoch 0: the warm-up is released (and the start)
        self._send_control("subspace_ready", subspace_id=sub.id)
        self._send_control("epochs_closed", through=0)
        log.info("warm-up closed: %d documents, subspace %s (k'=%d) in %.1f s", n_docs,
                 sub.id, sub.dim, time.perf_counter() - t0)
        if self.accountant is not None:
            self.metrics.set_budget_from_report(self.accountant.report())
        return True

    # ------------------------------------------------------------ epochs
    def _close_epoch(self, epoch: int, parts: list[PartitionState]) -> bool:
        """Merge, then the spend protocol in its one order: reserve → draw (``close_epoch``) →
        persist the release state (``_write_state``, which commits) → publish (the sinks)."""
        t0 = time.perf_counter()
        # implausible partitions are left out (loudly) and the epoch releases on schedule
        refused: dict[int, str] = {}
        if self.refinement is not None:
            check_refine_sums(parts, epoch, self.cfg.max_documents_per_sum, refused)
        total, n_parts = merge_epoch_sums(parts, epoch, self.subspace, self.clip, refused=refused,
                                          max_documents=self.cfg.max_documents_per_sum)
        refine = None
        if self.refinement is not None:
            refine = merge_refine_sums(parts, epoch, (self.cfg.n_topics, self.d), skip=refused)
        self._refused_states(refused, f"epoch {epoch}")
        sums = None if total is None else EpochSums(total, refine)
        # THE public rule (streamdp.refinement.model_epoch_for, as StreamingSpectralLDA.close_epochs):
        # refined iff the epoch's documents have a model, the snapshot of epoch − L
        model_epoch = None if self.refinement is None else model_epoch_for(
            epoch, self.refinement.model_lag, self.public_start_chosen)
        refined = model_epoch is not None
        try:
            self.continual.draw_epoch(sums, refined=refined)   # reserve → draw
        except (BudgetExhausted, DocumentCountExceeded) as exc:
            # DocumentCountExceeded: the rounding premise max_documents_per_sum (nothing reserved)
            self._refused(exc)
            return False
        except HorizonExceeded as exc:
            self.exhausted = str(exc)
            self.metrics.release_outcome("refused_budget")
            log.error("%s", exc)
            self._releases_ended(ENDED_HORIZON, str(exc))
            return False
        # The draw is persisted (and its reservation committed) before any post-processing
        # (issue 23 item 4): if eigh, the power method, the projection or the denoising raise,
        # or the process dies, the next step or start post-processes these noised values
        # again; it never draws the epoch again (that would be rejection sampling).
        if not self._write_state():                      # → persist the draw → commit
            return False
        return self._release_pending(t0, n_parts)

    def _release_pending(self, t0: float | None = None, n_parts: int | None = None) -> bool:
        """Post-process the persisted draw of the last closed epoch, persist its snapshot,
        publish. A function of noised values only: safe to repeat after a failure."""
        t0 = time.perf_counter() if t0 is None else t0
        epoch = self.continual.epoch
        model_epoch = None if self.refinement is None else model_epoch_for(
            epoch, self.refinement.model_lag, self.public_start_chosen)
        snap = self.continual.post_process()
        privacy = snapshot_privacy.snapshot_privacy(
            snap.privacy, self.cfg, rho=self.rho, subspace=self.subspace,
            accountant=self.accountant,
            own_pending=0 if self.accountant is None else len(self.spend.pending),
            vocabulary=self.vocabulary, vocabulary_meta=self.vocabulary_meta,
            refinement=self.refinement, model_epoch=model_epoch, start_choice=self.start_choice,
            public_start=self.public_start)
        # keep stage, noise_to_signal, fold_in_topics, subspace_topics (replace, not rebuild)
        # created_at is the epoch's due time (THE schedule, release_policy): public inputs only,
        # never the moment the computation ended (that depends on data volume and load)
        drawn = replace(snap, privacy=privacy, vocabulary_id=self.vocabulary.id,
                        created_at=self.policy.due_at(epoch, self.commands.current))
        if self.refinement is not None:       # keep the last L models (all a sketcher may need)
            self.fold_models.add_snapshot(drawn)
        if not self._write_state(drawn):                 # → persist the snapshot
            return False                                 # (drawn never leaves the process)
        self._publish(drawn)                             # only after persist
        self._observe_trend(drawn)
        self._write_public()                             # the sketchers' models, after persist
        self._send_control("epochs_closed", through=epoch)
        seconds = time.perf_counter() - t0
        self.metrics.release_outcome("published", seconds)
        self.metrics.set_last_release_timestamp(drawn.created_at)
        self.metrics.epoch_closed(epoch)
        self.metrics.set_tree(epoch, self.cfg.horizon)
        if self.accountant is not None:
            self.metrics.set_budget_from_report(privacy["accountant"])
        log.info("epoch %d closed from %s partition sketch(es): release %s in %.2f s", epoch,
                 "the persisted draw of" if n_parts is None else n_parts, drawn.release_id, seconds)
        return True

    def _write_state(self, snapshot: TopicSnapshot | None = None) -> bool:
        """Durably record the tree, the last snapshot (``snapshot``, a new draw, or else the
        one already in the state) and the control position; then commit the reservations
        drawn for it (spend protocol steps 3-4)."""
        snap = self._state_snapshot if snapshot is None else snapshot
        # orders that cover no unreleased epoch are dropped once this state is durable (they
        # decide nothing more); those of the newest epoch stay: its created_at (due_at) may be
        # computed again after a restart
        orders = self.policy.prune(self.commands.current, self.continual.epoch - 1)
        meta = {"epoch": self.continual.epoch, "writer_epoch": self.writer_epoch,
                "release_id": None if snap is None else snap.release_id}
        if self.accountant is not None:
            meta["ledger"] = self.accountant.head()
        ok = self._persist(control.RELEASE_STATE_KEY, release_state.encode(
            continual=self.continual.state_dict(),
            last_snapshot=None if snap is None else snap.to_bytes(),
            **self.commands.state(orders), writer_epoch=self.writer_epoch,
            refinement_models=[] if self.fold_models is None else [
                self.fold_models.models[e].to_dict() for e in sorted(self.fold_models.models)],
            refinement=self._refinement_dict()), meta)
        if ok:
            self._state_snapshot = snap
            self.commands.keep(orders)
        return ok

    def _write_public(self) -> None:
        """The public release record (streamdp.services.public_release): the last released
        epoch and the released refinement models, signed; sketchers read it instead of the
        release state. Written after the state persist; a failure is logged and retried at the
        next start-up or release (sketchers then wait, they never read the private state)."""
        epoch = self._published_epoch()
        models = [] if self.fold_models is None else [
            self.fold_models.models[e].to_dict() for e in sorted(self.fold_models.models)]
        payload = public_release.encode(
            epoch, models, None if self.start_choice is None else self.start_choice["start"])
        meta = StateAuth(self._control_key(), self.cfg.topic_prefix).sign(
            public_release.KEY, payload, {"epoch": epoch})
        self._public_epoch = -1             # until written: step() retries
        try:
            self.store.write(public_release.KEY, payload, meta=meta)
            self._public_epoch = epoch
        except WriterFenced as exc:
            self.writer.fence(f"release writer epoch {self.writer_epoch} was fenced at Kafka while "
                              f"writing the public release record ({exc})")
        except Exception as exc:      # noqa: BLE001 - the release is durable; retried later
            log.warning("the public release record of epoch %d was not written (%s): sketchers "
                        "see the release when it is (next release or restart)", epoch, exc)

    def _published_epoch(self) -> int:
        """The last epoch whose snapshot is persisted (0: the warm-up): a persisted draw still
        to be post-processed (``continual.pending``) has no snapshot, hence no model, yet."""
        if self.continual is None:
            return 0
        return self.continual.epoch - (self.continual.pending is not None)

    def _public_behind(self) -> bool:
        """Whether the public release record lags the persisted release state (a crash between
        the two writes, or a deployment older than the record)."""
        if self.continual is None:
            return False
        rec = self.store.read_latest(public_release.KEY)
        return rec is None or int(rec.meta.get("epoch", -1)) != self._published_epoch()

    def _persist(self, key: str, payload: bytes, meta: dict) -> bool:
        """Spend protocol steps 3-4: write ``key`` in this writer's transaction, then commit
        the drawn reservations. False (nothing committed, nothing to publish) if fenced."""
        try:
            self.writer.write(key, payload, meta)       # signed (docs/privacy.md §Trust boundary)
        except WriterFenced as exc:
            self.writer.fence(f"release writer epoch {self.writer_epoch} was fenced at Kafka while "
                              f"persisting {key!r} ({exc}); nothing of it was published")
            return False
        except WriterReinitialised as exc:
            # nothing was committed; the new producer (same transactional.id, epoch bumped)
            # writes only after the state is re-validated and reloaded from Kafka
            log.warning("%s", exc)
            if self.spend is not None:
                self.spend.discard()     # uncommitted: fulfilled by the retried release
            self._resync()
            return False
        except BaseException:
            if self.spend is not None:
                self.spend.discard()     # uncommitted: fulfilled by the next start
            raise
        if self.spend is not None:
            self.spend.persisted()
        if key in MIRRORS:                  # what sketchers read: before any announcement
            self._write_mirror(MIRRORS[key], payload, meta)
        return True

    def _write_mirror(self, key: str, payload: bytes, meta: dict) -> None:
        """The public record ``key`` (streamdp.services.public_records) of a persisted release
        record: its released fields only, signed. A failure is logged and retried at the next
        step or start (sketchers wait; they never read the release records)."""
        try:
            public_records.write(self.store, self.writer.auth, key, payload, meta)
            self._mirrors_pending.discard(key)
            return
        except WriterFenced as exc:
            self.writer.fence(f"release writer epoch {self.writer_epoch} was fenced at Kafka while "
                              f"writing the public record {key!r} ({exc})")
        except Exception as exc:      # noqa: BLE001 - the release record is durable; retried
            log.warning("the public record %r was not written (%s): sketchers see it when it is",
                        key, exc)
        self._mirrors_pending.add(key)

    def _sync_mirrors(self) -> None:
        """Write every public record that is missing or differs from its persisted release
        record (a crash between the two writes; a deployment older than the public records)."""
        for private, key in MIRRORS.items():
            rec = self.store.read_latest(private)
            if rec is None:
                self._mirrors_pending.discard(key)
            elif public_records.same(self.store.read_latest(key), key, rec.payload, rec.meta):
                self._mirrors_pending.discard(key)
            else:
                self._write_mirror(key, rec.payload, rec.meta)

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
