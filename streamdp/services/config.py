"""Configuration shared by the sketcher and release services.

One frozen, validated object; :func:`from_mapping` builds it from a JSON/TOML
mapping or CLI flags and fails at start-up with a message that names the field
and says what to fix.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from streamdp.errors import ConfigError
from streamdp.kafka.clients import open_state_store, partition_count
from streamdp.kafka.topics import TopicNames
from streamdp.moments.clipping import WARMUP_NORMALISING_CLIP, ClipBounds
from streamdp.privacy.epochs import EpochClock
from streamdp.privacy.noise import DEFAULT_SAMPLER, SAMPLER_KINDS, require_production_sampler
from streamdp.privacy.user_bounding import DEFAULT_MAX_USERS, SCHEDULES
from streamdp.privacy.plan import WARMUP_SHARE
from streamdp.services.partition_state import Routing


VOCABULARY_MODES = ("file", "public", "private")
PRIVACY_UNITS = ("document", "user")
#: user mode: kept documents per user per epoch when not configured (as the estimator)
DEFAULT_MAX_DOCS_PER_USER_EPOCH = 5


@dataclass(frozen=True)
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
    """

    bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = "streamdp"
    group_id: str = "streamdp-sketchers"
    vocabulary: str = ""
    vocabulary_mode: str = "file"                # file | public | private (docs/configuration.md)
    vocabulary_public_by_assumption: bool = False  # a corpus-built file, knowingly (benchmarks)
    vocabulary_size: int = 5000                  # d of a public / privately selected vocabulary
    vocabulary_lang: str = "en"
    vocabulary_candidates: int = 50_000          # public candidate list of the private selection
    vocabulary_max_words_per_document: int = 64  # m: distinct words one document contributes
    vocabulary_out_of_list: bool = False         # also DP partition selection outside the list
    selection_end: float | None = None           # private: ts < selection_end selects the words
    tokenizer: dict = field(default_factory=dict)
    n_topics: int = 10
    alpha0: float = 1.0
    oversampling: int | None = None
    seed: int = 0
    epsilon: float | None = 1.0
    non_private: bool = False
    delta: float = 1e-6
    horizon: int = 1024
    continual_aggregator: str = "blt"
    sampler: str = DEFAULT_SAMPLER
    noise_seed: int | None = None
    insecure_reproducible_noise: bool = False
    non_production: bool = False
    clip_quantile: float = 0.97
    clip_budget_share: float = 0.05
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
    closing: str = "schedule"
    ledger: str = "streamdp-ledger.jsonl"
    snapshot_dir: str = "snapshots"
    batch_size: int = 2000
    checkpoint_seconds: float = 5.0
    max_document_bytes: int = 1 << 20
    max_document_tokens: int = 100_000
    max_future_seconds: float = 300.0
    require_broker_time: bool | None = None     # None: required unless non_production (issue 15)
    control_key_file: str = ""                   # HMAC key of control messages (a Secret)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    poll_seconds: float = 1.0
    liveness_seconds: float = 120.0
    readiness_broker_seconds: float = 10.0      # /readyz fails without a broker round trip in this
    metrics_exact_counts: bool = True
    refinement: bool = True
    refinement_share: float = 0.5
    refinement_model_lag: int = 2                # L: epoch e is refined against snapshot e − L
    refinement_thread: bool = False              # sketcher: the fold-in on a second thread
    # the start of the refinement (issue 22; docs/configuration.md §The start): auto | tensor |
    # public (cluster: the estimator's only, refused here); public_start_file: a topics file
    # fitted without privacy on documents the operator declares public (`streamdp public-start`)
    start: str = "auto"
    public_start_file: str = ""
    max_documents_per_sum: int = 1_000_000_000   # rounding premise N_max (docs/privacy.md)
    # the unit of privacy (docs/privacy.md "The user-level unit"): document | user
    privacy_unit: str = "document"
    max_docs_per_user_epoch: int | None = None   # user: m, kept documents per user per epoch (5)
    max_docs_per_user: int | None = None         # user: M, kept documents per user in all (m)
    user_weights: str = "uniform"                # user: weight of the j-th kept doc: uniform|decaying
    max_users: int | None = DEFAULT_MAX_USERS    # user: None = all users; K = first-K admission
    warmup_share: float = WARMUP_SHARE           # user: share of rho of the warm-up (sequential)
    kafka: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        def bad(name, why):
            raise ConfigError(f"configuration field {name!r}: {why}")

        if not self.bootstrap or not isinstance(self.bootstrap, str):
            bad("bootstrap", "set the Kafka bootstrap servers, e.g. 127.0.0.1:9092")
        try:
            TopicNames.from_prefix(self.topic_prefix)
        except ValueError as exc:
            bad("topic_prefix", str(exc))
        if not (isinstance(self.n_topics, int) and self.n_topics >= 1):
            bad("n_topics", f"must be an integer >= 1, got {self.n_topics!r}")
        self._check_vocabulary_fields(bad)
        if not (self.alpha0 > 0 and math.isfinite(self.alpha0)):
            bad("alpha0", f"must be a finite number > 0, got {self.alpha0!r}")
        for name in ("non_private", "insecure_reproducible_noise", "non_production",
                     "metrics_exact_counts", "refinement", "confirm_backfill", "refinement_thread",
                     "sign_unsigned_state", "confirm_state_loss"):
            if not isinstance(getattr(self, name), bool):
                bad(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.epsilon is None:
            if not self.non_private:
                bad("epsilon", "is null/blank, which would run NON-PRIVATE (no clipping, no noise): "
                               "set a number > 0 (e.g. 1.0) for a private deployment; a non-private "
                               "deployment must say so with non_private: true (and epsilon: null)")
        elif self.non_private:
            bad("non_private", f"is true but epsilon is {self.epsilon!r}: a deployment is either "
                               "private (epsilon > 0, non_private false) or non-private "
                               "(non_private: true, epsilon: null) - remove one of the two")
        elif (isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float))
              or not (self.epsilon > 0 and math.isfinite(self.epsilon))):
            bad("epsilon", f"must be a number > 0 (e.g. 1.0), got {self.epsilon!r}; for a "
                           "non-private deployment set non_private: true and epsilon: null")
        if self.noise_seed is not None:
            if isinstance(self.noise_seed, bool) or not isinstance(self.noise_seed, int):
                bad("noise_seed", f"must be an integer or null, got {self.noise_seed!r}")
            if not (self.insecure_reproducible_noise and self.non_production):
                bad("noise_seed", "makes the noise reproducible: anyone who knows the seed can "
                                  "subtract it and read the raw statistics. It is for tests and "
                                  "benchmarks only and needs BOTH insecure_reproducible_noise: true "
                                  "and non_production: true; in production remove noise_seed")
        if self.insecure_reproducible_noise and not self.non_production:
            bad("insecure_reproducible_noise", "needs non_production: true (never in production)")
        if not 0 < self.delta < 1:
            bad("delta", f"must be in (0, 1), got {self.delta!r}")
        if not (isinstance(self.horizon, int) and self.horizon >= 1):
            bad("horizon", f"must be an integer number of epochs >= 1, got {self.horizon!r}")
        if self.continual_aggregator not in ("blt", "tree"):
            bad("continual_aggregator", "must be 'blt' (BLT matrix factorization, default) or "
                f"'tree' (binary tree), got {self.continual_aggregator!r}")
        if self.sampler not in SAMPLER_KINDS:
            bad("sampler", f"must be one of {SAMPLER_KINDS} ('opendp-lattice': vetted, rounding charged, default; "
                f"'opendp': vetted, exact, slower; 'google': "
                f"fast, opt-in, per-draw failure probability not charged; 'fast': not vetted), got {self.sampler!r}")
        elif self.epsilon is not None:
            try:        # the one rule (streamdp.privacy.noise): unvetted only when non_production
                require_production_sampler(self.sampler, self.non_production is True)
            except ValueError as exc:
                bad("sampler", str(exc).removeprefix("sampler "))
        if not 0 < self.clip_quantile <= 1:
            bad("clip_quantile", f"must be in (0, 1], got {self.clip_quantile!r}")
        if (isinstance(self.refinement_share, bool) or not isinstance(self.refinement_share, (int, float))
                or not 0 < self.refinement_share < 1):
            bad("refinement_share", f"must be a number in (0, 1) (the share of each tree node's rho "
                                    f"spent on the refinement sums; default 0.5), got "
                                    f"{self.refinement_share!r}; to turn refinement off set "
                                    "refinement: false")
        if (isinstance(self.max_documents_per_sum, bool) or not isinstance(self.max_documents_per_sum, int)
                or not 1 <= self.max_documents_per_sum <= 10**12):
            bad("max_documents_per_sum", "must be an integer in [1, 10^12]: the most documents any "
                                         "one noised sum (a warm-up, a tree node) may hold; choose "
                                         "it above any realistic total (default 1000000000), got "
                                         f"{self.max_documents_per_sum!r}")
        if not 0 < self.clip_budget_share < 1:
            bad("clip_budget_share", f"must be in (0, 1), got {self.clip_budget_share!r}")
        try:
            EpochClock(float(self.stream_start), float(self.epoch_seconds))
            Routing(EpochClock(float(self.stream_start), float(self.epoch_seconds)), float(self.lateness))
        except (ValueError, TypeError) as exc:
            bad("stream_start/epoch_seconds/lateness", str(exc))
        if self.closing not in ("schedule", "operator"):
            bad("closing", f"must be 'schedule' (epochs close at their close time + "
                           f"{5:g} s on the service clock) or 'operator' (only by `streamdp "
                           f"control flush/close`, e.g. a replayed feed), got {self.closing!r}")
        for name in ("batch_size", "max_document_bytes", "max_document_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                bad(name, f"must be an integer >= 1, got {v!r}")
        if not isinstance(self.kafka, dict) or not all(isinstance(k, str) for k in self.kafka):
            bad("kafka", "must be a mapping of librdkafka client properties, e.g. "
                         '{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}')
        if "bootstrap.servers" in self.kafka or "group.id" in self.kafka:
            bad("kafka", "set bootstrap servers with 'bootstrap' and the group with 'group_id', "
                         "not inside 'kafka'")
        for name in ("checkpoint_seconds", "poll_seconds", "max_future_seconds", "liveness_seconds",
                     "readiness_broker_seconds"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                bad(name, f"must be a number of seconds > 0, got {v!r}")
        if self.require_broker_time is not None and not isinstance(self.require_broker_time, bool):
            bad("require_broker_time", f"must be true, false or null (= true unless non_production), "
                                       f"got {self.require_broker_time!r}")
        if not isinstance(self.control_key_file, str):
            bad("control_key_file", f"must be the path of the control-key file, got {self.control_key_file!r}")
        if not (isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535):
            bad("metrics_port", f"must be a TCP port 0..65535 (0 = any free port), got {self.metrics_port!r}")
        self._check_refinement_lag(bad)      # after the time fields it relies on
        self._check_user_fields(bad)
        self._check_start_fields(bad)

    def _check_start_fields(self, bad) -> None:
        from streamdp.start import SERVICE_START_CHOICES
        if self.start not in SERVICE_START_CHOICES:
            bad("start", f"must be one of {SERVICE_START_CHOICES}, got {self.start!r}")
        if self.start == "cluster":
            bad("start", "'cluster' (the private clustering start) runs in streamdp.fit / "
                         "StreamingSpectralLDA only; the services do not have it yet "
                         "(docs/services.md §The start): use 'tensor', 'public' with "
                         "public_start_file, or 'auto'")
        if not isinstance(self.public_start_file, str):
            bad("public_start_file", f"must be the path of a public start file, got "
                                     f"{self.public_start_file!r}")
        if self.start == "public" and not self.public_start_file:
            bad("public_start_file", "start: public needs public_start_file: a topics file fitted "
                                     "without privacy on documents you declare public (write it "
                                     "with `streamdp public-start`)")
        if self.public_start_file:
            if self.start == "tensor":
                bad("public_start_file", "is set but start is 'tensor', which never reads it: "
                                         "remove it, or set start: public or auto")
            if not self.refinement:
                bad("public_start_file", "a public start is the model the refinement folds "
                                         "documents into: it needs refinement: true")
            if self.vocabulary_mode == "private":
                bad("public_start_file", "the private vocabulary is selected after the start, so no "
                                         "topics file can be fitted on it beforehand: use "
                                         "vocabulary_mode file or public with a public start")
            if not Path(self.public_start_file).is_file():
                bad("public_start_file", f"no file at {self.public_start_file!r}")

    _USER_FIELDS = ("max_docs_per_user_epoch", "max_docs_per_user", "user_weights", "max_users",
                    "warmup_share")

    def _check_user_fields(self, bad) -> None:
        """privacy_unit and the user-level bounding (docs/configuration.md, docs/privacy.md)."""
        unit = self.privacy_unit
        if unit not in PRIVACY_UNITS:
            bad("privacy_unit", f"must be 'document' (add/remove one document) or 'user' "
                                f"(add/remove every document of one user id), got {unit!r}")
        defaults = {f.name: f.default for f in dataclasses.fields(self)
                    if f.name in self._USER_FIELDS}
        if unit == "document":
            changed = sorted(n for n in self._USER_FIELDS if getattr(self, n) != defaults[n])
            if changed:
                bad(changed[0], f"bounds users, but privacy_unit is 'document': set privacy_unit: "
                                f"user to use {', '.join(changed)}, or remove them")
            return
        for name in ("max_docs_per_user_epoch", "max_docs_per_user"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                bad(name, f"must be an integer >= 1 (or null for the default), got {v!r}")
        if self.user_weights not in SCHEDULES:
            bad("user_weights", f"must be one of {', '.join(SCHEDULES)} (weight of a user's j-th "
                                f"kept document: 1/M, or proportional to 1/j^2), got "
                                f"{self.user_weights!r}")
        if self.max_users is not None and (isinstance(self.max_users, bool)
                                           or not isinstance(self.max_users, int)
                                           or self.max_users < 1):
            bad("max_users", f"must be null (default: every user admitted, about 400 bytes of "
                             f"sketcher memory per distinct user) or an integer K >= 1 (first-K "
                             f"admission: only the first K distinct users of each partition "
                             f"count and every user weight is halved), got {self.max_users!r}")
        ws = self.warmup_share
        if isinstance(ws, bool) or not isinstance(ws, (int, float)) or not 0 < ws < 1:
            bad("warmup_share", f"must be a number in (0, 1): the share of rho spent on the "
                                f"warm-up, charged to the stream partition in user mode "
                                f"(default {WARMUP_SHARE}), got {ws!r}")
        if not self.private:
            bad("privacy_unit", "is 'user' but the deployment is non-private (epsilon null): a "
                                "unit of privacy needs a private deployment; remove privacy_unit "
                                "or set epsilon")
        if self.vocabulary_mode == "private":
            bad("vocabulary_mode", "is 'private', but a user-level vocabulary selection is not "
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
        from streamdp.privacy.user_bounding import UserBounder
        m, M = self.user_bounds
        return UserBounder(max_docs_per_epoch=m, max_docs=M, schedule=self.user_weights,
                           max_users=self.max_users)

    def user_bounding_report(self) -> dict | None:
        """What the privacy report says about the bounding (None in document mode)."""
        b = self.user_bounder()
        if b is None:
            return None
        from streamdp.privacy.user_bounding import bounding_report
        return {**bounding_report(b), "warmup_share": float(self.warmup_share),
                "partition_rule": "partition_for_user: BLAKE2b-64(user) mod the deployment's "
                                  "partition count; documents elsewhere are dead-lettered"}

    def _check_refinement_lag(self, bad) -> None:
        """L ≥ 1, and (with refinement) a hold can always end: a sketcher holds a partition at a
        document of epoch e until epoch e − L is closed, and closing e − L needs that
        partition's progress — at least the held record's time rt — past e − L's close time.
        An on-time document of epoch e has rt ≥ start(e) − max_future_seconds, so
        (L − 1)·epoch_seconds ≥ lateness + max_future_seconds makes every hold end; otherwise
        a held partition can block the very epoch it waits for (docs/privacy.md)."""
        lag = self.refinement_model_lag
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
            bad("refinement_model_lag", f"must be an integer number of epochs >= 1 (default 2), "
                                        f"got {lag!r}")
        if not self.refinement or not all(isinstance(getattr(self, n), (int, float)) for n in (
                "epoch_seconds", "lateness", "max_future_seconds")):
            return                     # bad time fields were named above
        need = float(self.lateness) + float(self.max_future_seconds)
        if (lag - 1) * float(self.epoch_seconds) >= need:
            return
        smallest = 1 + math.ceil(need / float(self.epoch_seconds)) if self.epoch_seconds > 0 else None
        why = (f"is {lag}, but (refinement_model_lag - 1) x epoch_seconds = "
               f"{(lag - 1) * float(self.epoch_seconds):g} s is less than lateness + "
               f"max_future_seconds = {need:g} s: a sketcher holding a document of epoch e until "
               f"epoch e - {lag} is released could block that very release (a document may be "
               f"stamped up to max_future_seconds before its event time). Set "
               f"refinement_model_lag to at least {smallest}, or lower lateness/max_future_seconds, "
               f"or turn refinement off")
        if not self.non_production:
            bad("refinement_model_lag", why)
        import logging
        logging.getLogger("streamdp.config").warning(
            "configuration field 'refinement_model_lag' %s (accepted because non_production is "
            "true: only safe when each epoch's documents are produced after the release of "
            "epoch e - L)", why)

    def _check_vocabulary_fields(self, bad) -> None:
        mode = self.vocabulary_mode
        if mode not in VOCABULARY_MODES:
            bad("vocabulary_mode", f"must be one of {', '.join(VOCABULARY_MODES)}, got {mode!r}: "
                                   "'public' (a wordfreq list, no budget), 'private' (selected with "
                                   "DP from the documents before selection_end) or 'file'")
        for name in ("vocabulary_public_by_assumption", "vocabulary_out_of_list"):
            if not isinstance(getattr(self, name), bool):
                bad(name, f"must be true or false, got {getattr(self, name)!r}")
        for name in ("vocabulary_size", "vocabulary_candidates", "vocabulary_max_words_per_document"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, f"must be an integer >= 1, got {v!r}")
        if not (isinstance(self.vocabulary_lang, str) and self.vocabulary_lang):
            bad("vocabulary_lang", f"must be a wordfreq language code such as 'en', got "
                                   f"{self.vocabulary_lang!r}")
        if mode == "file":
            if self.selection_end is not None:
                bad("selection_end", "is set but vocabulary_mode is 'file': the selection window is "
                                     "used only by vocabulary_mode: private - remove selection_end "
                                     "or set vocabulary_mode: private")
            return
        if self.vocabulary:
            bad("vocabulary", f"is set ({self.vocabulary!r}) but vocabulary_mode is {mode!r}, which "
                              "builds the vocabulary itself: remove 'vocabulary', or set "
                              "vocabulary_mode: file to use that file")
        if self.vocabulary_public_by_assumption:
            bad("vocabulary_public_by_assumption", f"only applies to vocabulary_mode: file (a file "
                                                   f"you declare public); the mode is {mode!r}")
        if self.n_topics > self.vocabulary_size:
            bad("vocabulary_size", f"is {self.vocabulary_size}, smaller than n_topics="
                                   f"{self.n_topics}: a vocabulary needs at least n_topics words")
        if mode == "public":
            if self.selection_end is not None:
                bad("selection_end", "is set but vocabulary_mode is 'public' (no selection "
                                     "window): remove it, or set vocabulary_mode: private")
            return
        # private
        if self.epsilon is None:
            bad("vocabulary_mode", "is 'private' but the deployment is non-private (epsilon null): "
                                   "a DP selection needs a budget; use vocabulary_mode: public")
        if self.vocabulary_candidates < self.vocabulary_size:
            bad("vocabulary_candidates", f"is {self.vocabulary_candidates}, below vocabulary_size="
                                         f"{self.vocabulary_size}: the selection picks "
                                         "vocabulary_size words out of the candidates; raise it "
                                         "(e.g. 10 x vocabulary_size)")
        se = self.selection_end
        if se is None or isinstance(se, bool) or not isinstance(se, (int, float)) or not math.isfinite(se):
            bad("selection_end", f"vocabulary_mode: private needs selection_end, the unix time (s) "
                                 f"that ends the selection window: documents with ts < "
                                 f"selection_end choose the words, those in [selection_end, "
                                 f"stream_start) are the warm-up; got {se!r}")
        try:
            start = float(self.stream_start)
        except (TypeError, ValueError):
            return                        # reported by the stream_start check below
        if not se < start:
            bad("selection_end", f"must be before stream_start ({start!r}), got {se!r}: the "
                                 "warm-up window [selection_end, stream_start) would be empty; "
                                 "set selection_end earlier (e.g. stream_start - 86400)")

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
        from streamdp.start import PublicStartFileError, load_public_start
        try:
            return load_public_start(self.public_start_file, vocabulary_id=vocabulary_id,
                                     n_topics=self.n_topics)
        except PublicStartFileError as exc:
            raise ConfigError(f"configuration field 'public_start_file': {exc}") from None

    def refinement_config(self):
        """The engine's RefinementConfig of this deployment, or None (refinement off)."""
        if not self.refinement:
            return None
        from streamdp.refinement import RefinementConfig
        return RefinementConfig(share=float(self.refinement_share),
                                model_lag=int(self.refinement_model_lag))

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
        from streamdp.services.vocabulary import VocabularyError, file_provenance
        from streamdp.text.vocabulary import Vocabulary
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
        from streamdp.text.tokenizer import Tokenizer
        try:
            return Tokenizer.from_config(self.tokenizer) if self.tokenizer else Tokenizer()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"configuration field 'tokenizer': {exc}") from exc

    def replace(self, **changes) -> "ServiceConfig":
        return dataclasses.replace(self, **changes)


def from_mapping(values: dict, *, env: dict | None = None) -> ServiceConfig:
    """Build a config from a mapping, then ``STREAMDP_<FIELD>`` environment overrides."""
    names = {f.name: f for f in dataclasses.fields(ServiceConfig)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError("unknown configuration field(s): " + "; ".join(
            f"{key!r}{_closest(str(key), names)}" for key in unknown)
            + " (docs/configuration.md lists every field)")
    merged = dict(values)
    env = os.environ if env is None else env
    unknown_env = sorted(v for v, raw in env.items() if _unknown_variable(v, raw, names))
    if unknown_env:
        raise ConfigError("unknown environment variable(s): " + "; ".join(
            v + _closest(v[len("STREAMDP_"):].lower(), names, "STREAMDP_{}", str.upper)
            for v in unknown_env)
            + " (a configuration field is STREAMDP_<FIELD>, the field name in upper case; "
              "docs/configuration.md lists every field): correct or unset it")
    for name, f in names.items():
        raw = env.get(f"STREAMDP_{name.upper()}")
        if raw is None:
            continue
        default = getattr(ServiceConfig, name, None) if not isinstance(f.default_factory, type) else None
        if not raw.strip():
            raise ConfigError(
                f"environment STREAMDP_{name.upper()} is set but blank: unset it to keep the "
                f"configuration file's {name!r}, or give it a value"
                + (" (a number > 0; a non-private deployment sets STREAMDP_NON_PRIVATE=true and "
                   "STREAMDP_EPSILON=null)" if name == "epsilon" else ""))
        try:
            merged[name] = _parse_env(raw, f.type, default)
        except ValueError as exc:
            raise ConfigError(f"environment STREAMDP_{name.upper()}={raw!r}: {exc}") from exc
    for name, v in merged.items():
        if isinstance(v, str) and not v.strip() and not str(names[name].type).startswith("str"):
            raise ConfigError(f"configuration field {name!r} is blank: give it a value or remove it"
                              + (" (epsilon: a number > 0; a non-private deployment says "
                                 "non_private: true and epsilon: null)" if name == "epsilon" else ""))
    if merged.get("non_private") is True and "epsilon" not in merged:
        merged["epsilon"] = None        # non_private: true alone means what it says
    try:
        return ServiceConfig(**merged)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


#: STREAMDP_* variables that are not configuration fields: the progress switch
#: (streamdp/progress.py), the image's user id (services/Dockerfile) and the test harness's.
NON_FIELD_VARIABLES = frozenset({
    "STREAMDP_NO_PROGRESS", "STREAMDP_UID", "STREAMDP_TANSU_BIN", "STREAMDP_CHROMIUM",
    "STREAMDP_TEST_ARTIFACTS", "STREAMDP_REQUIRE_BROWSER"})
#: Kubernetes injects <SERVICE>_SERVICE_HOST, <SERVICE>_PORT=tcp://..., <SERVICE>_PORT_9400_TCP...
#: for every Service of the namespace (the deployment's are named streamdp-*): never a field.
_SERVICE_LINK = re.compile(r"_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)_"
                           r"(PROTO|PORT|ADDR))$")
_SERVICE_LINK_URL = re.compile(r"_PORT(_\d+_(TCP|UDP|SCTP))?$")   # their value: tcp://ip:port


def _unknown_variable(name: str, value: str, fields) -> bool:
    """An environment variable that looks meant for streamdp but names no field: a typo such
    as STREAMDP_EPSLION would otherwise be ignored and the file's value used instead."""
    if not name.startswith("STREAMDP_") or name in NON_FIELD_VARIABLES:
        return False
    field_name = name[len("STREAMDP_"):].lower()
    if field_name in fields and name == f"STREAMDP_{field_name.upper()}":
        return False
    if _SERVICE_LINK.search(name) or (_SERVICE_LINK_URL.search(name)
                                      and re.match(r"(tcp|udp|sctp)://", str(value))):
        return False
    return True


def _closest(key: str, fields, spelling: str = "{!r}", case=str) -> str:
    """`` (did you mean 'epsilon'?)`` for a typo'd key: the nearest field names (at most two,
    difflib's ratio >= 0.6), or that none is near. ``spelling`` writes a field as the user
    would (``STREAMDP_{}`` with ``case=str.upper`` for a variable)."""
    near = difflib.get_close_matches(key, list(fields), n=2, cutoff=0.6)
    if not near:
        return " (no field has a similar name)"
    return " (did you mean " + " or ".join(spelling.format(case(n)) for n in near) + "?)"


PRIVACY_MODE_KEY = "deployment/privacy"


def _privacy_marker(cfg: ServiceConfig, document_partitions: int | None) -> dict:
    meta = {"private": True, "epsilon": cfg.epsilon, "delta": cfg.delta,
            "privacy_unit": cfg.privacy_unit}
    if cfg.privacy_unit == "user":
        if document_partitions is None:
            raise ValueError("user mode: the documents topic's partition count is required")
        m, M = cfg.user_bounds
        meta.update(document_partitions=int(document_partitions), max_docs_per_user_epoch=m,
                    max_docs_per_user=M, user_weights=cfg.user_weights,
                    max_users=cfg.max_users)
    return meta


def check_unit(cfg: ServiceConfig, marker: dict, document_partitions: int | None, *,
               store_name: str = "the state topic") -> None:
    """Refuse a service whose unit of privacy, user bounding or documents-partition count
    differs from what the deployment recorded at its first start (``deployment/privacy``).

    The unit is part of the privacy mode: every sum and every ledger event of a deployment is
    calibrated to one unit. In user mode the partition count is fixed too: the rule
    ``partition_for_user(user, n)`` puts a user on one partition only for one n (Kafka can add
    partitions, which re-maps users: a user on two partitions gets two weight sequences)."""
    had = marker.get("privacy_unit", "document")     # markers before issue 16: documents
    if had != cfg.privacy_unit:
        raise ConfigError(
            f"configuration field 'privacy_unit': {store_name!r} records a deployment with "
            f"privacy_unit {had!r}, this service is configured with {cfg.privacy_unit!r}. Every "
            "sum and ledger event of a deployment is calibrated to its unit, which cannot change: "
            f"configure privacy_unit: {had}, or start a new deployment (new topic_prefix and "
            "ledger)")
    if cfg.privacy_unit != "user":
        return
    m, M = cfg.user_bounds
    for name, mine in (("max_docs_per_user_epoch", m), ("max_docs_per_user", M),
                       ("user_weights", cfg.user_weights)):
        if marker.get(name) != mine:
            raise ConfigError(
                f"configuration field {name!r}: the deployment was started with {name} "
                f"{marker.get(name)!r} ({store_name!r}), this service has {mine!r}; the user "
                f"bounding cannot change mid-deployment: configure {marker.get(name)!r}")
    # the admission rule (issue 23): markers before it have no max_users, and their deployments
    # admitted every user they counted (the cap failed closed), so they read as null
    had_k = marker.get("max_users")
    if had_k != cfg.max_users:
        raise ConfigError(
            f"configuration field 'max_users': the deployment was started with max_users "
            f"{had_k!r} ({store_name!r}; null = every user admitted), this service has "
            f"{cfg.max_users!r}. The admission rule decides which users' documents are in sums "
            f"already partly released, so it cannot change mid-deployment: configure "
            f"max_users: {'null' if had_k is None else had_k}, or start a new deployment (new "
            "topic_prefix and ledger)")
    n = marker.get("document_partitions")
    if document_partitions is not None and n != document_partitions:
        raise ConfigError(
            f"the documents topic {cfg.topics.documents!r} has {document_partitions} partitions, "
            f"but this user-level deployment was started with {n} ({store_name!r} records it): "
            "the rule partition_for_user(user, n) keeps each user on one partition only for a "
            "fixed n, so the partition count cannot change. Restore the topic with "
            f"{n} partitions, or start a new deployment (new topic_prefix and ledger)")


def recorded_partitions(store) -> int | None:
    """The documents-partition count a user-level deployment recorded, or None."""
    rec = store.read_latest(PRIVACY_MODE_KEY)
    return None if rec is None else rec.meta.get("document_partitions")


def documents_partition_count(cfg: ServiceConfig) -> int:
    """The documents topic's partition count (ConfigError if the topic does not exist)."""
    n = partition_count(cfg.bootstrap, cfg.kafka, cfg.topics.documents, timeout=10)
    if n is None:
        raise ConfigError(f"privacy_unit: user needs the documents topic "
                          f"{cfg.topics.documents!r} to exist before the services start (its "
                          "partition count is fixed for the deployment): create the topics "
                          "first (streamdp topics / --create-topics)")
    return n


def check_privacy_mode(cfg: ServiceConfig, store=None, *, role: str = "release",
                       document_partitions: int | None = None, record: bool = True) -> None:
    """Start-up check of the deployment's privacy mode (call before any budget is spent).

    * non-private or reproducible-noise configurations log a WARNING, in words;
    * a non-private service refuses to start on a deployment that is private: its
      ledger (release service) holds a budget or spending, or its state topic holds the
      private-deployment marker, a private (DP range finder) subspace or clip bounds;
    * a private release service writes the marker (``deployment/privacy``) to the state
      topic once, so a later non-private service is refused even if the ledger is lost;
      the marker records the unit of privacy, and in user mode the bounding (m, M, weights)
      and the documents topic's partition count (``document_partitions``, required then):
      a service configured otherwise is refused (:func:`check_unit`). In user mode a sketcher
      that starts first writes the marker too. ``record=False``: check only, write nothing
      (the read-only pass before any side effect; the writing call comes after it).
    """
    import logging
    log = logging.getLogger(f"streamdp.{role}")
    if cfg.noise_seed is not None and record:     # said once, by the writing call
        log.warning("INSECURE REPRODUCIBLE NOISE: noise_seed=%s with insecure_reproducible_noise "
                    "and non_production set. Anyone who knows the seed can remove the noise; "
                    "these snapshots carry no privacy guarantee. Never run this in production.",
                    cfg.noise_seed)
    if cfg.private:
        if store is not None:
            rec = store.read_latest(PRIVACY_MODE_KEY)
            # the release service writes the marker; in user mode a sketcher may come first and
            # must not sketch before the partition count is recorded (it writes the same record)
            if rec is None and record and (role == "release" or cfg.privacy_unit == "user"):
                store.write(PRIVACY_MODE_KEY, b"", meta=_privacy_marker(cfg, document_partitions))
                rec = store.read_latest(PRIVACY_MODE_KEY)
            if rec is not None:
                check_unit(cfg, rec.meta, document_partitions, store_name=cfg.topics.state)
        return
    if record:
        log.warning("NON-PRIVATE deployment (non_private: true): no clipping and no noise; every "
                    "snapshot is an exact function of the documents and is marked non-private. "
                    "Never use this mode for data that needs protection.")
    evidence = []
    if role == "release" and cfg.ledger and Path(cfg.ledger).is_file():
        from streamdp.privacy.ledger import FileLedger
        kinds = sorted({r.kind for r in FileLedger(cfg.ledger).read()})
        if kinds:
            evidence.append(f"the ledger {cfg.ledger!r} holds private budget records ({', '.join(kinds)})")
    if store is not None:
        rec = store.read_latest(PRIVACY_MODE_KEY)
        if rec is not None and rec.meta.get("private"):
            evidence.append(f"the state topic {cfg.topics.state!r} records a private deployment "
                            f"(epsilon={rec.meta.get('epsilon')})")
        from streamdp.services import control, public_records
        # a sketcher reads only public records (docs/privacy.md §Trust boundary)
        sub = store.read_latest(control.SUBSPACE_KEY if role == "release"
                                else public_records.SUBSPACE_KEY)
        if sub is not None:
            from streamdp.whitening.subspace import Subspace
            events = Subspace.from_bytes(sub.payload).provenance.get("events") or []
            clip = sub.meta.get("clip") or {}
            if events or clip != ClipBounds.unclipped().to_dict():
                evidence.append(f"the state topic {cfg.topics.state!r} holds a private warm-up "
                                "subspace (noised, with clip bounds)")
    if evidence:
        raise ConfigError(
            "configuration field 'non_private': this deployment is private - " + "; ".join(evidence)
            + ". A private deployment can never be switched to non-private (un-noised releases "
              "would reveal the documents already promised privacy). Keep its epsilon, or start a "
              "new deployment (new topic_prefix and ledger) for non-private runs.")


def check_stream_start(cfg: ServiceConfig, *, first_start: bool, now: float | None = None) -> None:
    """Refuse a new deployment whose ``stream_start`` lies more than one epoch in the past.

    On its first start the release service would close every epoch since ``stream_start``
    at once: epochs without documents are released empty and each uses up one epoch of the
    horizon (the README's old example closed 322 empty daily epochs in two minutes). A
    replay of past documents (a backfill) says so with ``confirm_backfill: true``. A
    deployment that has started before (``first_start`` false: release state or a ledger
    exists) is never refused: its epochs are already counted.
    """
    import datetime
    import time
    if not first_start or cfg.confirm_backfill:
        return
    now = time.time() if now is None else float(now)
    behind = now - float(cfg.stream_start)
    if behind <= float(cfg.epoch_seconds):
        return
    n = int(behind // float(cfg.epoch_seconds))

    def utc(t: float) -> str:
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    current = float(cfg.stream_start) + n * float(cfg.epoch_seconds)
    raise ConfigError(
        f"configuration field 'stream_start': {cfg.stream_start:.0f} ({utc(cfg.stream_start)}) is "
        f"{n} epoch(s) of {cfg.epoch_seconds:g} s in the past, and this deployment has no release "
        f"state yet: once the warm-up closes, the release service would close those {n} epochs at "
        f"once, releasing every epoch without documents empty and using up {min(n, cfg.horizon)} "
        f"of the horizon's {cfg.horizon} epochs. Fix: set stream_start to now or later (the "
        f"current epoch began at {current:.0f}, {utc(current)}; warm-up documents go before it), "
        "or, if you are replaying documents from that time on purpose, set confirm_backfill: "
        "true (STREAMDP_CONFIRM_BACKFILL=true)")


def load_file(path: str | os.PathLike) -> dict:
    """Read a configuration file into a plain mapping (JSON, or TOML by its ``.toml`` suffix).

    JSON: one object, ``null`` for "not set" (e.g. ``"epsilon": null`` = non-private).
    A relative ``vocabulary`` path is resolved against the file's folder.
    TOML: top-level keys; TOML has no null, so a field that accepts ``None``
    (``epsilon``, ``oversampling``, ``noise_seed``) takes the string ``"none"``
    for it. Errors are :class:`ConfigError` naming the file and the position.
    """
    import json
    import tomllib

    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {str(path)!r}: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".toml":
        try:
            values = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"configuration file {str(path)!r} is not valid TOML: {exc}") from None
        optional = {f.name for f in dataclasses.fields(ServiceConfig) if "None" in str(f.type)}
        for name in optional & set(values):
            if isinstance(values[name], str) and values[name].strip().lower() in ("none", "null"):
                values[name] = None
    else:
        try:
            values = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            hint = " (TOML files need the .toml suffix)" if path.suffix.lower() != ".json" else ""
            raise ConfigError(f"configuration file {str(path)!r} is not valid JSON: {exc}{hint}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"configuration file {str(path)!r} must hold one object/table of fields, "
                          f"got {type(values).__name__}")
    # A file path written in a configuration file is the author's path next to that file,
    # wherever the service is started from (flags and STREAMDP_* variables keep the working
    # directory: the person typing them means their own).
    for name in RELATIVE_TO_CONFIG_FILE:
        v = values.get(name)
        if isinstance(v, str) and v.strip():
            v = os.path.expanduser(v)
            values[name] = v if os.path.isabs(v) else str(path.resolve().parent / v)
    return values


#: Fields whose relative paths in a configuration file resolve against the file's folder.
RELATIVE_TO_CONFIG_FILE = ("vocabulary",)


def from_file(path: str | os.PathLike, overrides: dict | None = None, *,
              env: dict | None = None) -> ServiceConfig:
    """:func:`load_file`, then ``overrides`` (e.g. CLI flags), then ``STREAMDP_<FIELD>`` variables."""
    values = load_file(path)
    values.update(overrides or {})
    return from_mapping(values, env=env)


def _parse_env(raw: str, typ, default):
    import json
    t = str(typ)
    if raw.strip().lower() in ("null", "none") and "None" in t:
        return None
    if t.startswith("bool"):
        low = raw.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ValueError("must be true or false")
    if t.startswith("int"):
        return int(raw)
    if t.startswith("float"):
        return float(raw)
    if t.startswith("dict"):
        return json.loads(raw)
    return raw
