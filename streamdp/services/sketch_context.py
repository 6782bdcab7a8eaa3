"""What every partition of a sketcher shares (:class:`SketchContext`): the vocabulary, the
subspace and clip bounds, the refinement models, the release service's control messages and the
state store — each read from the signed public records and authenticated control messages only
(the rules: :mod:`streamdp.services.sketch_strategy`'s module docstring). The per-partition work
that uses it is :class:`streamdp.services.sketch_strategy.SketchStrategy`.
"""
from __future__ import annotations

import logging

from streamdp.kafka.state_store import StateStore
from streamdp.moments.clipping import ClipBounds
from streamdp.refinement import FoldInModels, RefinementModel
from streamdp.services import control, public_records, public_release
from streamdp.services.state_auth import StateAuth, StateIntegrityError
from streamdp.services import vocabulary as vocab_mod
from streamdp.services.config import ConfigError, ServiceConfig
from streamdp.services.dedup import IdHasher
from streamdp.services.consumer_client import RateLimitedLog
from streamdp.whitening.subspace import Subspace

log = logging.getLogger("streamdp.sketcher")


def load_subspace(store: StateStore, auth: StateAuth, vocabulary_id: str | None = None,
                  on_forged=None) -> tuple[Subspace, ClipBounds] | None:
    """The public subspace record (streamdp.services.public_records), or None if there is none
    or it has no valid MAC (``on_forged(message)`` is called then: a foreign writer)."""
    rec, ok = public_records.read(store, auth, public_records.SUBSPACE_KEY)
    if rec is None:
        return None
    if not ok:
        if on_forged is not None:
            on_forged("ignored the public subspace record: no valid MAC under this deployment's "
                      "control key (a foreign writer on the state topic, or another key)")
        return None
    found = rec.meta.get("vocabulary_id")
    if vocabulary_id is not None and found is not None and found != vocabulary_id:
        raise ConfigError(f"the deployment's subspace was built for vocabulary {found}, this "
                          f"sketcher's vocabulary file is {vocabulary_id}: every service must use "
                          "the same vocabulary (a new vocabulary needs a new deployment)")
    sub = Subspace.from_bytes(rec.payload)
    return sub, ClipBounds.from_dict(rec.meta["clip"])


def initial_vocabulary(cfg: ServiceConfig):
    """(vocabulary, candidates) at start-up: the file's vocabulary (``file`` mode), or none
    yet and, in ``private`` mode, the public candidate list it will be selected from."""
    if cfg.vocabulary_mode == "file":
        return cfg.load_vocabulary(), None
    if cfg.vocabulary_mode == "private":
        try:
            return None, vocab_mod.candidates(cfg)
        except vocab_mod.VocabularyError as exc:
            raise ConfigError(str(exc)) from None
    return None, None


class SketchContext:
    """What every partition of a sketcher shares: the vocabulary, the subspace and clip
    bounds, the refinement models, the release service's control messages and the state
    store. Announcements that change the partitions' states (vocabulary published, warm-up
    or epochs closed) are applied to the partitions of every strategy in ``strategies``."""

    metrics = None      # the sketcher's ServiceMetrics (set by the Sketcher): counts rejections

    def __init__(self, cfg: ServiceConfig, *, instance: str, store, control_consumer,
                 control_key, vocabulary=None, candidates=None,
                 user_partitions: int | None = None) -> None:
        self.cfg, self.instance = cfg, instance
        # user mode (privacy_unit: user): the deployment's documents-partition count, the n of
        # partition_for_user; None in document mode
        self.user_partitions = user_partitions
        self.tokenizer = cfg.tokenizer_()
        self.vocabulary = self.d = self.k_prime = None
        self.candidates = candidates            # private: the public candidate list
        if vocabulary is not None:
            self.set_vocabulary(vocabulary)
        self.routing = cfg.routing
        self.topics = cfg.topics
        self.subspace: Subspace | None = None
        self.clip: ClipBounds | None = None
        self.closed_through = 0
        self.warmup_closed = False
        self.refinement = cfg.refinement_config()
        # the public models by snapshot epoch and the epoch the release state confirms closed
        # the start (issue 22): public → epochs 1…L fold into the public start (model epoch 0);
        # None (auto with a public start) until the public release record says which
        self.models = None if self.refinement is None else FoldInModels(
            self.refinement.model_lag, public_start=cfg.start_rule())
        self.model_epoch: int | None = None            # the newest model loaded (its epoch)
        self.control_key = control_key
        # sketch state records are signed with it (docs/privacy.md §Trust boundary)
        self.state_auth = StateAuth(control_key, cfg.topic_prefix)
        # keyed hashes of document ids for deduplication (secret key: no crafted collisions)
        self.id_hasher = IdHasher(control_key)
        self.control_rejected = 0           # unauthenticated / unconfirmed control messages
        self.broker_time = cfg.broker_time_required
        self.store = store
        self.control_consumer = control_consumer
        self.strategies: list = []         # every SketchStrategy of this sketcher
        self._bad_log = RateLimitedLog()

    def _each_state(self, change) -> None:
        """Apply ``change`` to every partition state held now (and mark it unsaved)."""
        for strategy in self.strategies:
            for p, st in strategy.states.items():
                change(st)
                strategy.dirty.add(p)

    def _forget_closed(self) -> None:
        """Every partition held now drops what the closed warm-up and epochs make useless: raw
        sketches, and ids out of the dedup window (the gauge follows at once)."""
        for strategy in self.strategies:
            for p, st in strategy.states.items():
                st.forget_closed(self.closed_through, True)
                strategy.dirty.add(p)
                if strategy.metrics is not None:
                    strategy.metrics.set_dedup_ids(p, len(st.seen_ids))

    # ------------------------------------------------------------ vocabulary, subspace
    def set_vocabulary(self, vocab) -> None:
        self.vocabulary = vocab
        self.d = len(vocab)
        self.k_prime = self.cfg.k_prime(self.d)

    def refresh_vocabulary(self) -> None:
        """public/private: load the deployment's vocabulary record (content id checked)."""
        if self.vocabulary is not None:
            return
        try:
            got = vocab_mod.load_record(self.store, key=public_records.VOCABULARY_KEY,
                                        auth=self.state_auth)
        except vocab_mod.VocabularyError as exc:
            log.error("%s: %s", self.instance, exc)
            return
        except StateIntegrityError as exc:      # a foreign writer: wait for the real record
            self.reject_control("%s", exc)
            return
        if got is None:
            return
        vocab, meta = got
        self.set_vocabulary(vocab)
        # the release service consumed the selection histograms (the record exists)
        self._each_state(lambda st: st.forget_selection())
        log.info("%s: vocabulary %s (%d words, %s) loaded", self.instance, vocab.id, len(vocab),
                 meta.get("mode"))
        self.refresh_subspace()

    def refresh_subspace(self) -> None:
        if self.vocabulary is None:
            return                      # no warm-up before the vocabulary
        self.refresh_model()
        got = load_subspace(self.store, self.state_auth, self.vocabulary.id, self.reject_control)
        if got is not None:
            self.subspace, self.clip = got
            self.warmup_closed = True
            # The warm-up is closed: drop the warm-up sketches of the partitions held now,
            # as a restart would (SketchStrategy.restore), so a warm-up document that still
            # arrives is late whether or not this process restarted in between.
            self._forget_closed()
            log.info("%s: subspace %s (k'=%d) loaded", self.instance, self.subspace.id, self.subspace.dim)

    # ------------------------------------------------------------ refinement models
    def public_release(self, rec=None):
        """(epoch, model dicts) of the public release record (streamdp.services.public_release),
        or None if there is none or it has no valid MAC (logged: a foreign writer). Sketchers
        never read the release service's private state. ``rec``: the record if already read."""
        rec = self.store.read_latest(public_release.KEY) if rec is None else rec
        if rec is None:
            return None
        if not self.state_auth.authentic(public_release.KEY, rec.payload, rec.meta):
            self.reject_control("ignored the public release record: no valid MAC under this "
                                "deployment's control key (a foreign writer on the state topic)")
            return None
        if self.models is not None and self.models.public_start is None:
            # start: auto with a public start: the release service's choice, made once at the
            # warm-up close, is in the same record as the models (never changes afterwards)
            self.models.public_start = public_release.decode_start(rec.payload) == "public"
        return public_release.decode(rec.payload)

    def refresh_model(self, public=None) -> None:
        """Load the fold-in models and the closed epoch from the public release record (models
        of the last L snapshots; see the module docstring). ``public``: its (epoch, models) if
        the caller already read it."""
        if self.models is None or self.d is None:
            return
        public = self.public_release() if public is None else public
        if public is None:
            return
        closed, raw = public
        if closed <= self.models.closed_through and self.model_epoch is not None:
            return                      # nothing new
        for m in raw or []:
            model = RefinementModel.from_dict(m, fold_in_iter=self.refinement.fold_in_iter)
            if model.shape != (self.cfg.n_topics, self.d):
                log.error("%s: the released model of epoch %s has shape %s, this sketcher expects "
                          "(%d, %d): not folding documents into it", self.instance, model.epoch,
                          model.shape, self.cfg.n_topics, self.d)
                continue
            if model.epoch is not None and model.epoch <= closed:
                self.models.models.setdefault(model.epoch, model)
        self.models.close_through(closed)
        if self.models.models:
            newest = max(self.models.models)
            if newest != self.model_epoch:
                log.info("%s: release closed through epoch %d; models of epochs %s (lag %d)",
                         self.instance, closed, sorted(self.models.models), self.models.lag)
            self.model_epoch = newest
        lost = [m for m in range(max(1, closed + 1 - self.models.lag), closed + 1)
                if m not in self.models.models]
        if lost:
            log.warning("%s: the public release record (epoch %d) holds no model for epoch(s) %s "
                        "(written before the refinement model rule, or of another shape): documents of "
                        "epochs %s get no refinement term", self.instance, closed, lost,
                        [m + self.models.lag for m in lost])

    # ------------------------------------------------------------ control
    def poll_control(self) -> None:
        through = None
        for m in self.control_consumer.consume(num_messages=100, timeout=0):
            if m.error() is not None:
                continue
            try:
                msg = control.decode(m.value())
            except Exception as exc:            # noqa: BLE001 — bad control input is logged, never fatal
                self.reject_control("ignored bad control message at offset %d: %s", m.offset(), exc)
                continue
            if msg["type"] not in control.RELEASE_TYPES:
                continue                        # operator → release messages
            if not control.authentic(msg, self.control_key):
                self.reject_control("ignored unauthenticated %s control message at offset %d "
                                    "(no valid MAC under this deployment's control key)",
                                    msg["type"], m.offset())
                continue
            if msg["type"] == "vocabulary_ready" and self.vocabulary is None:
                self.refresh_vocabulary()
            elif msg["type"] == "subspace_ready" and self.subspace is None:
                self.refresh_subspace()
            elif msg["type"] == "epochs_closed" and (msg["through"] > self.closed_through
                                                     or not self.warmup_closed):
                through = max(msg["through"], -1 if through is None else through)
        if through is not None:
            self.apply_epochs_closed(through)

    def reject_control(self, fmt: str, *args) -> None:
        self.control_rejected += 1
        if self.metrics is not None:        # a key mismatch shows (alert StreamdpControlRejected)
            self.metrics.control_rejected()
        self._bad_log.warning(fmt, *args)

    def apply_epochs_closed(self, through: int) -> None:
        """Drop raw sketches through ``through`` — but only as far as the release state on
        the state topic confirms (the control message is a hint, the release state the truth)."""
        released = self.confirmed_release()
        if released is None:
            self.reject_control("epochs_closed through %d not confirmed: no subspace/release state "
                                "on the state topic; keeping every raw sketch", through)
            return
        if through > released:
            self.reject_control("epochs_closed through %d, but the release state confirms only %d: "
                                "dropping raw sketches through %d only", through, released, released)
        through = min(through, released)
        self.closed_through = max(self.closed_through, through)
        self.warmup_closed = True
        self._forget_closed()

    def confirmed_release(self) -> int | None:
        """The last epoch the release state on the state topic records as released
        (0 = only the warm-up), or None if not even the warm-up is released: from the public
        records only (the public subspace record says the warm-up is released)."""
        if self.subspace is None and self.store.read_latest(public_records.SUBSPACE_KEY) is None:
            return None
        public = self.public_release()
        if public is not None:
            self.refresh_model(public)   # the same record holds the released models
        return 0 if public is None else public[0]
