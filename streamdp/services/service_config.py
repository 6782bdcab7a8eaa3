"""The configuration shared by the sketcher and release services: :class:`ServiceConfig`, one
frozen, validated object — its fields, their single-field rules and the rules that relate
fields — refusing with a one-line :class:`ConfigError` that names the field and says what to
fix. Where a configuration comes from (file, mapping, ``STREAMDP_*`` environment) is
:mod:`streamdp.services.config`.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import math
from dataclasses import field
from pathlib import Path
from typing import Literal, NoReturn

from pydantic import ConfigDict, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass

from streamdp.errors import ConfigError
from streamdp.kafka.clients import open_state_store
from streamdp.kafka.topics import TopicNames
from streamdp.moments.clipping import WARMUP_NORMALISING_CLIP, ClipBounds
from streamdp.privacy.epochs import EpochClock
from streamdp.privacy.noise import DEFAULT_SAMPLER, SAMPLER_KINDS, require_production_sampler
from streamdp.privacy.user_bounding import (DEFAULT_MAX_USERS, SCHEDULES, UserBounder,
                                            bounding_report)
from streamdp.privacy.plan import WARMUP_SHARE
from streamdp.refinement import PUBLIC_START_SHARE, RefinementConfig
from streamdp.services.routing import Routing
from streamdp.services.vocabulary import VocabularyError, file_provenance
from streamdp.start import PublicStartFileError, load_public_start
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary


#: user mode: kept documents per user per epoch when not configured (as the estimator)
DEFAULT_MAX_DOCS_PER_USER_EPOCH = 5


def _field(default, hint: str = "", **rules):
    """A field with pydantic's single-field rules (``ge``, ``gt``, ``allow_inf_nan`` ...) and the
    hint its refusal shows (``{got}`` marks where the value goes, else it ends the message).
    pydantic reads a dataclass field's metadata as ``Field`` arguments; the annotation and the
    default stay plain, as docs/configuration.md shows them (tests/test_deploy.py)."""
    return field(default=default, metadata={**rules, **({"description": hint} if hint else {})})


_INT_GE_1 = "must be an integer >= 1"
_SECONDS = "must be a number of seconds > 0"
_SECONDS_RULES = {"gt": 0, "allow_inf_nan": False}


@dataclass(frozen=True, config=ConfigDict(strict=True, extra="forbid"))
class ServiceConfig:
    """Everything a streamdp deployment must agree on (sketchers and release service).

    Model (public): vocabulary, n_topics, alpha0, oversampling, seed.
    Vocabulary (issue 11, docs/configuration.md §The vocabulary): ``vocabulary_mode`` ``file``
    (a file whose header/sidecar says it is public or DP-selected, or any file with
    ``vocabulary_public_by_assumption: true``), ``public`` (wordfreq, built by the release
    service at start-up) or ``private`` (DP selection over the public candidates from the
    documents with ts < ``selection_end``, before the warm-up).
    Privacy: epsilon, delta, horizon, continual_aggregator, sampler, ledger. Non-private only when asked for in so
    many words: ``non_private=True`` together with ``epsilon=None``. Reproducible noise
    (``noise_seed``) only with ``insecure_reproducible_noise=True`` and ``non_production=True``.
    Trust boundary: ``metrics_exact_counts=False`` drops data-dependent exact counts from /metrics.
    Time: stream_start, epoch_seconds, lateness; ``confirm_backfill`` lets a new deployment
    start with stream_start more than one epoch in the past (see :func:`check_stream_start`).
    Refinement (DESIGN §8): ``refinement`` (default on) folds every stream document into a
    released model and releases the k × d refinement sums in the tree with
    ``refinement_share`` of each node's ρ. The model of a document of epoch e is the snapshot of
    epoch e − L, L = ``refinement_model_lag`` (streamdp.refinement.model_epoch_for); from epoch
    L + 1 on snapshots are ``stage="refined"``.
    Rounding premise: ``max_documents_per_sum`` (N_max), the most documents in any one noised
    sum; the sensitivities cover float64 rounding up to it and larger sums are refused.
    Kafka: bootstrap, topic_prefix, group_id.

    Validation (pydantic, strict: no "3" for an int, no true for a number): the types and the
    single-field rules are in the annotations and :func:`_field`; the rules that relate fields
    are the validators below, in the order their first refusal is shown. Any refusal is a
    :class:`ConfigError` naming the field (:func:`_config_error`).
    """

    bootstrap: str = _field("127.0.0.1:9092", "set the Kafka bootstrap servers, e.g. 127.0.0.1:9092",
                            min_length=1)
    topic_prefix: str = "streamdp"
    group_id: str = "streamdp-sketchers"
    vocabulary: str = ""
    # file | public | private (docs/configuration.md)
    vocabulary_mode: Literal["file", "public", "private"] = _field(
        "file", "must be one of file, public, private, got {got}: 'public' (a wordfreq "
                "list, no budget), 'private' (selected with DP from the documents before "
                "selection_end) or 'file'")
    vocabulary_public_by_assumption: bool = False  # a corpus-built file, knowingly (benchmarks)
    vocabulary_size: int = _field(5000, _INT_GE_1, ge=1)   # d of a public / private vocabulary
    vocabulary_lang: str = _field("en", "must be a wordfreq language code such as 'en'", min_length=1)
    vocabulary_candidates: int = _field(50_000, _INT_GE_1, ge=1)   # candidates of the selection
    vocabulary_max_words_per_document: int = _field(64, _INT_GE_1, ge=1)   # m: words per document
    vocabulary_out_of_list: bool = False         # also DP partition selection outside the list
    # private: ts < selection_end selects the words
    selection_end: float | None = _field(None, "must be a finite unix time (s) or null",
                                         allow_inf_nan=False)
    tokenizer: dict = field(default_factory=dict)
    n_topics: int = _field(10, _INT_GE_1, ge=1)
    alpha0: float = _field(1.0, "must be a finite number > 0", gt=0, allow_inf_nan=False)
    oversampling: int | None = None
    seed: int = 0
    epsilon: float | None = _field(
        1.0, "must be a number > 0 (e.g. 1.0), got {got}; for a non-private deployment set "
             "non_private: true and epsilon: null", gt=0, allow_inf_nan=False)
    non_private: bool = False
    delta: float = _field(1e-6, "must be in (0, 1)", gt=0, lt=1, allow_inf_nan=False)
    horizon: int = _field(1024, "must be an integer number of epochs >= 1", ge=1)
    continual_aggregator: Literal["blt", "tree"] = _field(
        "blt", "must be 'blt' (BLT matrix factorization, default) or 'tree' (binary tree)")
    sampler: Literal["opendp-lattice", "opendp", "google", "fast"] = _field(
        DEFAULT_SAMPLER, f"must be one of {SAMPLER_KINDS} ('opendp-lattice': vetted, rounding "
                         "charged, default; 'opendp': vetted, exact, slower; 'google': fast, "
                         "opt-in, per-draw failure probability not charged; 'fast': not vetted)")
    noise_seed: int | None = None
    insecure_reproducible_noise: bool = False
    non_production: bool = False
    clip_quantile: float = _field(0.97, "must be in (0, 1]", gt=0, le=1, allow_inf_nan=False)
    clip_budget_share: float = _field(0.05, "must be in (0, 1)", gt=0, lt=1, allow_inf_nan=False)
    stream_start: float = 0.0
    confirm_backfill: bool = False               # first start with stream_start > 1 epoch ago
    # one-time migration: sign release/* records written before they were signed (issue 23)
    sign_unsigned_state: bool = False
    # start over knowingly after the state topic was lost, on a new ledger (state_loss.py)
    confirm_state_loss: bool = False
    epoch_seconds: float = 3600.0
    lateness: float = 0.0
    # when epochs close (docs/services.md §How epochs close): "schedule" — at close time + a
    # fixed grace on the service clock; "operator" — only by control flush/close (a replay)
    closing: Literal["schedule", "operator"] = _field(
        "schedule", f"must be 'schedule' (epochs close at their close time + {5:g} s on the "
                    "service clock) or 'operator' (only by `streamdp control flush/close`, e.g. a "
                    "replayed feed)")
    ledger: str = "streamdp-ledger.jsonl"
    snapshot_dir: str = "snapshots"
    batch_size: int = _field(2000, _INT_GE_1, ge=1)
    checkpoint_seconds: float = _field(5.0, _SECONDS, **_SECONDS_RULES)
    max_document_bytes: int = _field(1 << 20, _INT_GE_1, ge=1)
    max_document_tokens: int = _field(100_000, _INT_GE_1, ge=1)
    max_future_seconds: float = _field(300.0, _SECONDS, **_SECONDS_RULES)
    # None: required unless non_production (issue 15)
    require_broker_time: bool | None = _field(None, "must be true, false or null (= true unless "
                                                    "non_production)")
    control_key_file: str = ""                   # HMAC key of control messages (a Secret)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = _field(0, "must be a TCP port 0..65535 (0 = any free port)", ge=0, le=65535)
    poll_seconds: float = _field(1.0, _SECONDS, **_SECONDS_RULES)
    liveness_seconds: float = _field(120.0, _SECONDS, **_SECONDS_RULES)
    # /readyz fails without a broker round trip in this
    readiness_broker_seconds: float = _field(10.0, _SECONDS, **_SECONDS_RULES)
    metrics_exact_counts: bool = True
    refinement: bool = True
    refinement_share: float = _field(
        0.5, "must be a number in (0, 1) (the share of each tree node's rho spent on the "
             "refinement sums; default 0.5), got {got}; to turn refinement off set refinement: "
             "false", gt=0, lt=1)
    # the share with a public start (issue 22 item 3): the continual selection rule almost never
    # publishes the spectral half of a release refined from a public start, so its nodes give
    # the refinement sums more of their rho (docs/privacy.md "The public start's node plan")
    refinement_share_public: float = _field(
        PUBLIC_START_SHARE, "must be a number in (0, 1) (the share of each tree node's rho "
                            "spent on the refinement sums when the start is public; default "
                            "0.9), got {got}", gt=0, lt=1)
    # L: epoch e is refined against snapshot e − L
    refinement_model_lag: int = _field(2, "must be an integer number of epochs >= 1 (default 2)",
                                       ge=1)
    refinement_thread: bool = False              # sketcher: the fold-in on a second thread
    # the start of the refinement (issue 22; docs/configuration.md §The start): auto | tensor |
    # public (cluster: the estimator's only, refused here); public_start_file: a topics file
    # fitted without privacy on documents the operator declares public (`streamdp public-start`)
    start: Literal["auto", "tensor", "cluster", "public"] = "auto"
    public_start_file: str = ""
    # rounding premise N_max (docs/privacy.md)
    max_documents_per_sum: int = _field(
        1_000_000_000, "must be an integer in [1, 10^12]: the most documents any one noised sum "
                       "(a warm-up, a tree node) may hold; choose it above any realistic total "
                       "(default 1000000000)", ge=1, le=10**12)
    # deduplication by document id (streamdp.services.dedup): None = for the deployment's life;
    # N = a copy within N epochs of its counted copy (memory: the ids of about N epochs)
    dedup_window_epochs: int | None = _field(
        None, "must be null (default: an id counts once for the deployment's life) or an integer "
              "number of epochs >= 1 (a copy within that many epochs of its counted copy is a "
              "duplicate)", ge=1)
    # the unit of privacy (docs/privacy.md "The user-level unit"): document | user
    privacy_unit: Literal["document", "user"] = _field(
        "document", "must be 'document' (add/remove one document) or 'user' (add/remove every "
                    "document of one user id)")
    # user: m, kept documents per user per epoch (5); M, kept documents per user in all (m)
    max_docs_per_user_epoch: int | None = _field(None, "must be an integer >= 1 (or null for the "
                                                       "default)", ge=1)
    max_docs_per_user: int | None = _field(None, "must be an integer >= 1 (or null for the "
                                                 "default)", ge=1)
    # user: weight of the j-th kept doc: uniform|decaying
    user_weights: Literal["uniform", "decaying"] = _field(
        "uniform", f"must be one of {', '.join(SCHEDULES)} (weight of a user's j-th kept "
                   "document: 1/M, or proportional to 1/j^2)")
    # user: None = all users; K = first-K admission
    max_users: int | None = _field(
        DEFAULT_MAX_USERS, "must be null (default: every user admitted, about 400 bytes of "
                           "sketcher memory per distinct user) or an integer K >= 1 (first-K "
                           "admission: only the first K distinct users of each partition count "
                           "and every user weight is halved)", ge=1)
    # user: share of rho of the warm-up (sequential)
    warmup_share: float = _field(
        WARMUP_SHARE, "must be a number in (0, 1): the share of rho spent on the warm-up, charged "
                      f"to the stream partition in user mode (default {WARMUP_SHARE})", gt=0, lt=1)
    kafka: dict = field(default_factory=dict)

    # ------------------------------------------------- rules of one field that are not a type
    @field_validator("topic_prefix")
    @classmethod
    def _topic_prefix(cls, prefix: str) -> str:
        try:
            TopicNames.from_prefix(prefix)
        except ValueError as exc:
            raise ConfigError(f"configuration field 'topic_prefix': {exc}") from None
        return prefix

    @field_validator("kafka")
    @classmethod
    def _kafka(cls, props: dict) -> dict:
        if not all(isinstance(k, str) for k in props):
            raise ConfigError("configuration field 'kafka': must be a mapping of librdkafka client "
                              'properties, e.g. {"security.protocol": "SASL_SSL", '
                              '"sasl.mechanism": "SCRAM-SHA-512"}')
        if "bootstrap.servers" in props or "group.id" in props:
            raise ConfigError("configuration field 'kafka': set bootstrap servers with 'bootstrap' "
                              "and the group with 'group_id', not inside 'kafka'")
        return props

    # ------------------------------------------------- rules that relate fields (in this order)
    @model_validator(mode="after")
    def _cross_field_rules(self) -> "ServiceConfig":
        self._check_vocabulary_fields()
        self._check_privacy_mode_fields()
        try:
            Routing(EpochClock(self.stream_start, self.epoch_seconds), self.lateness)
        except ValueError as exc:
            _refuse("stream_start/epoch_seconds/lateness", str(exc))
        self._check_refinement_lag()         # after the time fields it relies on
        self._check_user_fields()
        self._check_start_fields()
        return self

    def _check_privacy_mode_fields(self) -> None:
        if self.epsilon is None:
            if not self.non_private:
                _refuse("epsilon", "is null/blank, which would run NON-PRIVATE (no clipping, no "
                                   "noise): set a number > 0 (e.g. 1.0) for a private deployment; "
                                   "a non-private deployment must say so with non_private: true "
                                   "(and epsilon: null)")
        elif self.non_private:
            _refuse("non_private", f"is true but epsilon is {self.epsilon!r}: a deployment is either "
                                   "private (epsilon > 0, non_private false) or non-private "
                                   "(non_private: true, epsilon: null) - remove one of the two")
        if self.noise_seed is not None and not (self.insecure_reproducible_noise
                                                and self.non_production):
            _refuse("noise_seed", "makes the noise reproducible: anyone who knows the seed can "
                                  "subtract it and read the raw statistics. It is for tests and "
                                  "benchmarks only and needs BOTH insecure_reproducible_noise: true "
                                  "and non_production: true; in production remove noise_seed")
        if self.insecure_reproducible_noise and not self.non_production:
            _refuse("insecure_reproducible_noise", "needs non_production: true (never in production)")
        if self.epsilon is not None:
            try:        # the one rule (streamdp.privacy.noise): unvetted only when non_production
                require_production_sampler(self.sampler, self.non_production)
            except ValueError as exc:
                _refuse("sampler", str(exc).removeprefix("sampler "))

    def _check_start_fields(self) -> None:
        if self.start == "cluster":
            _refuse("start", "'cluster' (the private clustering start) runs in streamdp.fit / "
                             "StreamingSpectralLDA only; the services do not have it yet "
                             "(docs/services.md §The start): use 'tensor', 'public' with "
                             "public_start_file, or 'auto'")
        if self.start == "public" and not self.public_start_file:
            _refuse("public_start_file", "start: public needs public_start_file: a topics file "
                                         "fitted without privacy on documents you declare public "
                                         "(write it with `streamdp public-start`)")
        if self.public_start_file:
            if self.start == "tensor":
                _refuse("public_start_file", "is set but start is 'tensor', which never reads it: "
                                             "remove it, or set start: public or auto")
            if not self.refinement:
                _refuse("public_start_file", "a public start is the model the refinement folds "
                                             "documents into: it needs refinement: true")
            if self.vocabulary_mode == "private":
                _refuse("public_start_file", "the private vocabulary is selected after the start, "
                                             "so no topics file can be fitted on it beforehand: use "
                                             "vocabulary_mode file or public with a public start")
            if not Path(self.public_start_file).is_file():
                _refuse("public_start_file", f"no file at {self.public_start_file!r}")

    _USER_FIELDS = ("max_docs_per_user_epoch", "max_docs_per_user", "user_weights", "max_users",
                    "warmup_share")

    def _check_user_fields(self) -> None:
        """privacy_unit and the user-level bounding (docs/configuration.md, docs/privacy.md)."""
        if self.privacy_unit == "document":
            defaults = {f.name: f.default for f in dataclasses.fields(self)
                        if f.name in self._USER_FIELDS}
            changed = sorted(n for n in self._USER_FIELDS if getattr(self, n) != defaults[n])
            if changed:
                _refuse(changed[0], f"bounds users, but privacy_unit is 'document': set "
                                    f"privacy_unit: user to use {', '.join(changed)}, or remove them")
            return
        if not self.private:
            _refuse("privacy_unit", "is 'user' but the deployment is non-private (epsilon null): a "
                                    "unit of privacy needs a private deployment; remove "
                                    "privacy_unit or set epsilon")
        if self.vocabulary_mode == "private":
            _refuse("vocabulary_mode", "is 'private', but a user-level vocabulary selection is not "
                                       "implemented (it counts each document's words): with "
                                       "privacy_unit: user use vocabulary_mode: public or a public "
                                       "vocabulary file")

    @property
    def user_bounds(self) -> tuple[int, int]:
        """(m, M) of user mode, defaults applied (m = 5, M = m; as the estimator)."""
        m = self.max_docs_per_user_epoch or DEFAULT_MAX_DOCS_PER_USER_EPOCH
        return m, self.max_docs_per_user or m

    def user_bounder(self):
        """A fresh bounder of this configuration (user mode), or None (document mode)."""
        if self.privacy_unit != "user":
            return None
        m, M = self.user_bounds
        return UserBounder(max_docs_per_epoch=m, max_docs=M, schedule=self.user_weights,
                           max_users=self.max_users)

    def user_bounding_report(self) -> dict | None:
        """What the privacy report says about the bounding (None in document mode)."""
        b = self.user_bounder()
        if b is None:
            return None
        return {**bounding_report(b), "warmup_share": float(self.warmup_share),
                "partition_rule": "partition_for_user: BLAKE2b-64(user) mod the deployment's "
                                  "partition count; documents elsewhere are dead-lettered"}

    def _check_refinement_lag(self) -> None:
        """With refinement, a hold can always end: a sketcher holds a partition at a document of
        epoch e until epoch e − L is closed, and closing e − L needs that partition's progress —
        at least the held record's time rt — past e − L's close time. An on-time document of
        epoch e has rt ≥ start(e) − max_future_seconds, so (L − 1)·epoch_seconds ≥ lateness +
        max_future_seconds makes every hold end; otherwise a held partition can block the very
        epoch it waits for (docs/privacy.md)."""
        lag = self.refinement_model_lag
        need = self.lateness + self.max_future_seconds
        if not self.refinement or (lag - 1) * self.epoch_seconds >= need:
            return
        why = (f"is {lag}, but (refinement_model_lag - 1) x epoch_seconds = "
               f"{(lag - 1) * self.epoch_seconds:g} s is less than lateness + "
               f"max_future_seconds = {need:g} s: a sketcher holding a document of epoch e until "
               f"epoch e - {lag} is released could block that very release (a document may be "
               f"stamped up to max_future_seconds before its event time). Set "
               f"refinement_model_lag to at least {1 + math.ceil(need / self.epoch_seconds)}, or "
               f"lower lateness/max_future_seconds, or turn refinement off")
        if not self.non_production:
            _refuse("refinement_model_lag", why)
        logging.getLogger("streamdp.config").warning(
            "configuration field 'refinement_model_lag' %s (accepted because non_production is "
            "true: only safe when each epoch's documents are produced after the release of "
            "epoch e - L)", why)

    def _check_vocabulary_fields(self) -> None:
        mode = self.vocabulary_mode
        if mode == "file":
            if self.selection_end is not None:
                _refuse("selection_end", "is set but vocabulary_mode is 'file': the selection "
                                         "window is used only by vocabulary_mode: private - remove "
                                         "selection_end or set vocabulary_mode: private")
            return
        if self.vocabulary:
            _refuse("vocabulary", f"is set ({self.vocabulary!r}) but vocabulary_mode is {mode!r}, "
                                  "which builds the vocabulary itself: remove 'vocabulary', or set "
                                  "vocabulary_mode: file to use that file")
        if self.vocabulary_public_by_assumption:
            _refuse("vocabulary_public_by_assumption", f"only applies to vocabulary_mode: file (a "
                                                       f"file you declare public); the mode is {mode!r}")
        if self.n_topics > self.vocabulary_size:
            _refuse("vocabulary_size", f"is {self.vocabulary_size}, smaller than n_topics="
                                       f"{self.n_topics}: a vocabulary needs at least n_topics words")
        if mode == "public":
            if self.selection_end is not None:
                _refuse("selection_end", "is set but vocabulary_mode is 'public' (no selection "
                                         "window): remove it, or set vocabulary_mode: private")
            return
        # private
        if self.epsilon is None:
            _refuse("vocabulary_mode", "is 'private' but the deployment is non-private (epsilon "
                                       "null): a DP selection needs a budget; use vocabulary_mode: "
                                       "public")
        if self.vocabulary_candidates < self.vocabulary_size:
            _refuse("vocabulary_candidates", f"is {self.vocabulary_candidates}, below "
                                             f"vocabulary_size={self.vocabulary_size}: the "
                                             "selection picks vocabulary_size words out of the "
                                             "candidates; raise it (e.g. 10 x vocabulary_size)")
        se = self.selection_end
        if se is None:
            _refuse("selection_end", "vocabulary_mode: private needs selection_end, the unix time "
                                     "(s) that ends the selection window: documents with ts < "
                                     "selection_end choose the words, those in [selection_end, "
                                     "stream_start) are the warm-up; got None")
        if not se < self.stream_start:
            _refuse("selection_end", f"must be before stream_start ({self.stream_start!r}), got "
                                     f"{se!r}: the warm-up window [selection_end, stream_start) "
                                     "would be empty; set selection_end earlier (e.g. "
                                     "stream_start - 86400)")

    # ------------------------------------------------------------- derived
    @property
    def private(self) -> bool:
        return self.epsilon is not None

    def privacy_fields(self) -> dict:
        """What every snapshot's privacy report says about this deployment's mode, in words."""
        out = {"private": self.private, "non_private": not self.private}
        if not self.private:
            out["privacy_mode"] = ("NON-PRIVATE: no clipping, no noise - this snapshot is an "
                                   "exact function of the documents and carries NO privacy guarantee")
        else:
            out["privacy_mode"] = "private"
        if self.noise_seed is not None:
            out["insecure_reproducible_noise"] = True
            out["non_production"] = True
            out["privacy_mode"] += (" (INSECURE reproducible noise from a known seed: "
                                    "non-production only, no privacy guarantee)")
        return out

    def start_rule(self) -> bool | None:
        """Whether epochs 1…L are folded into the public start (streamdp.refinement
        .model_epoch_for): True (start: public), False (tensor; auto without a public start,
        since the services have no clustering start), None (auto with a public start: the
        release service chooses at the warm-up close and publishes the choice)."""
        if not self.refinement or self.start == "tensor" or not self.public_start_file:
            return False
        return True if self.start == "public" else None

    def load_public_start(self, vocabulary_id: str | None):
        """The public start of ``public_start_file``, checked against the deployment's
        vocabulary (None: not known yet) and n_topics; ConfigError says what to fix."""
        try:
            return load_public_start(self.public_start_file, vocabulary_id=vocabulary_id,
                                     n_topics=self.n_topics)
        except PublicStartFileError as exc:
            raise ConfigError(f"configuration field 'public_start_file': {exc}") from None

    def refinement_config(self, public_start: bool = False):
        """The engine's RefinementConfig of this deployment, or None (refinement off); with
        ``public_start`` (the start is public) its share is ``refinement_share_public``."""
        if not self.refinement:
            return None
        share = self.refinement_share_public if public_start else self.refinement_share
        return RefinementConfig(share=float(share), model_lag=int(self.refinement_model_lag))

    def state_store(self):
        """The deployment's StateStore (kept for the tests; services call
        :func:`streamdp.kafka.clients.open_state_store` with the fields)."""
        return open_state_store(self.bootstrap, self.kafka, self.topics.state)

    @property
    def topics(self) -> TopicNames:
        return TopicNames.from_prefix(self.topic_prefix)

    @property
    def routing(self) -> Routing:
        return Routing(EpochClock(float(self.stream_start), float(self.epoch_seconds)),
                       float(self.lateness), float(self.max_future_seconds),
                       selection_end=(None if self.selection_end is None
                                      else float(self.selection_end)))

    @property
    def broker_time_required(self) -> bool:
        """Refuse producer-stamped (CreateTime) documents: unless non_production (docs/operations.md §Time)."""
        if self.require_broker_time is not None:
            return self.require_broker_time
        return not getattr(self, "non_production", False)

    def k_prime(self, d: int) -> int:
        over = self.n_topics if self.oversampling is None else self.oversampling
        k_prime = min(self.n_topics + over, d)
        if k_prime < self.n_topics:
            raise ConfigError(f"n_topics={self.n_topics} exceeds the vocabulary size {d}")
        return k_prime

    @property
    def warmup_clip(self) -> float:
        return WARMUP_NORMALISING_CLIP if self.private else ClipBounds.unclipped().warmup

    def load_vocabulary(self):
        """``vocabulary_mode: file``: the vocabulary file, refused unless it says it is public
        (a sidecar from ``streamdp vocab public``/``private``) or the configuration declares it
        public (``vocabulary_public_by_assumption: true``)."""
        return self.load_vocabulary_file()[0]

    def load_vocabulary_file(self):
        """(Vocabulary, provenance dict) of ``vocabulary_mode: file`` (see load_vocabulary)."""
        if self.vocabulary_mode != "file":
            raise ConfigError(f"configuration field 'vocabulary_mode' is {self.vocabulary_mode!r}: "
                              "the vocabulary comes from the deployment's vocabulary record, not "
                              "a file")
        if not self.vocabulary:
            raise ConfigError("configuration field 'vocabulary': set the path of the public "
                              "vocabulary file (one word per line; see docs/schemas.md), or use "
                              "vocabulary_mode: public or private (docs/configuration.md)")
        if not Path(self.vocabulary).is_file():
            raise ConfigError(f"configuration field 'vocabulary': no file at {self.vocabulary!r}")
        vocab = Vocabulary.load(self.vocabulary)
        try:
            prov = file_provenance(self.vocabulary, vocab)
        except VocabularyError as exc:
            raise ConfigError(f"configuration field 'vocabulary': {exc}") from None
        if prov is not None:
            return vocab, {"mode": "file", "vocabulary_id": vocab.id,
                           "selection": prov.get("selection"), "source": prov.get("source"),
                           **({"privacy_cost": prov["privacy_cost"]} if "privacy_cost" in prov else {})}
        if not self.vocabulary_public_by_assumption:
            raise ConfigError(
                f"configuration field 'vocabulary': {self.vocabulary!r} (vocabulary {vocab.id}) "
                f"does not say it is public: no sidecar {self.vocabulary + '.json'!r} from "
                "`streamdp vocab public` / `streamdp vocab private` describes it. A word list "
                "taken from the protected documents leaks which words they contain. Fix: use "
                "vocabulary_mode: public (a wordfreq list, no budget) or private (DP selection), "
                "build the file with `streamdp vocab public`, or - only for a list that really is "
                "public, or a benchmark that assumes so - set vocabulary_public_by_assumption: true")
        return vocab, {"mode": "file", "vocabulary_id": vocab.id, "selection": "public by assumption",
                       "public_by_assumption": True}

    def tokenizer_(self):
        try:
            return Tokenizer.from_config(self.tokenizer) if self.tokenizer else Tokenizer()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"configuration field 'tokenizer': {exc}") from exc

    def replace(self, **changes) -> "ServiceConfig":
        return dataclasses.replace(self, **changes)


def _refuse(name: str, why: str) -> NoReturn:
    raise ConfigError(f"configuration field {name!r}: {why}")


def _config_error(exc: ValidationError) -> ConfigError:
    """pydantic's ValidationError (every refusal, several lines) as the one-line ConfigError the
    services and the CLI show: its first error, a validator's own ConfigError as it is, a type
    or range error as ``configuration field 'x': <the field's hint>, got <value>``."""
    error = exc.errors(include_url=False)[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError) or not error["loc"]:
        return cause if isinstance(cause, ConfigError) else ConfigError(f"configuration: {error['msg']}")
    name, got = str(error["loc"][0]), repr(error["input"])
    names = {f.name for f in dataclasses.fields(ServiceConfig)}
    if name not in names:
        return ConfigError(f"unknown configuration field {name!r}{_closest(name, names)}")
    hint = ServiceConfig.__pydantic_fields__[name].description or (    # else pydantic's words
        "must be one of " + error["ctx"]["expected"] if error["type"] == "literal_error"
        else "must be " + error["msg"].removeprefix("Input should be "))
    why = hint.replace("{got}", got) if "{got}" in hint else f"{hint}, got {got}"
    return ConfigError(f"configuration field {name!r}: {why}")


def _raising_config_errors(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            raise _config_error(exc) from None
    return __init__


# every construction (ServiceConfig(...), dataclasses.replace, from_mapping) refuses with a
# ConfigError, never with pydantic's multi-line ValidationError
ServiceConfig.__init__ = _raising_config_errors(ServiceConfig.__init__)


def _closest(key: str, fields, spelling: str = "{!r}", case=str) -> str:
    """`` (did you mean 'epsilon'?)`` for a typo'd key: the nearest field names (at most two,
    difflib's ratio >= 0.6), or that none is near. ``spelling`` writes a field as the user
    would (``STREAMDP_{}`` with ``case=str.upper`` for a variable)."""
    near = difflib.get_close_matches(key, list(fields), n=2, cutoff=0.6)
    if not near:
        return " (no field has a similar name)"
    return " (did you mean " + " or ".join(spelling.format(case(n)) for n in near) + "?)"
