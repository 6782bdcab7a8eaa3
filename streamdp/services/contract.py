"""The deployment contract: the configuration fields a deployment can never change.

Every field here changes which documents are counted (routing, limits, tokenizer,
vocabulary), how they are routed to epochs, or what is released (model size, budget,
aggregator, refinement, unit of privacy). A restart that changes one of them silently
re-counts or drops documents, renumbers epochs, or re-spends the budget (issue 25: a
moved ``stream_start`` dropped 515 of 2,000 documents; ``epoch_seconds`` halved released
an already released time range twice).

The first service of a deployment to start (release service or sketcher) records the
contract on the state topic under :data:`CONTRACT_KEY`; every service, at every start,
compares its configuration with the record *before it writes anything* (ledger, marker,
transactional init, HTTP server, Kafka records) and is refused with a message naming the
field, the recorded value and its own. There is no in-place migration: a changed contract
is a new deployment (new ``topic_prefix`` and ledger; docs/operations.md "The deployment
contract"). A deployment started before the contract existed records it at its next start.

The record carries a MAC under the deployment's control key (:mod:`streamdp.services.state_auth`,
the one MAC), so every start also proves that the service holds the key the deployment was
recorded with (issue 25 item 5): a sketcher with another key would ignore every control message
and keep the raw sums of released epochs; it is refused at start instead, naming
``control_key_file``. A contract recorded before it was signed is signed by the next release
service to start (a sketcher cannot prove its key until then and says so).

This module is the one place that lists the fields (docs/operations.md has the table).
"""
from __future__ import annotations

import json
import logging

from streamdp.services import state_auth
from streamdp.services.config import ConfigError, ServiceConfig

log = logging.getLogger("streamdp.contract")

CONTRACT_KEY = "deployment/contract"
CONTRACT_VERSION = 1

#: field -> why a change breaks the deployment (the refusal message says it)
CONTRACT_FIELDS: dict[str, str] = {
    "stream_start": "documents before it are warm-up, after it are routed to epochs",
    "epoch_seconds": "epoch numbers and boundaries of every sum and release",
    "lateness": "which late documents are still counted and when epochs close",
    "closing": "when epochs are released (operator -> schedule would release every past epoch at once)",
    "max_future_seconds": "which future-dated documents are dead-lettered",
    "max_document_bytes": "which documents are dead-lettered as too large",
    "max_document_tokens": "which documents are dead-lettered as too long",
    "tokenizer": "the words each document contributes",
    "vocabulary_mode": "how the vocabulary is chosen",
    "vocabulary": "the vocabulary (its vocabulary_id) every sum is indexed by",
    "vocabulary_size": "the size of a chosen vocabulary",
    "vocabulary_lang": "the candidate list of a chosen vocabulary",
    "vocabulary_candidates": "the candidate list of a chosen vocabulary",
    "vocabulary_max_words_per_document": "the sensitivity of the vocabulary selection",
    "vocabulary_out_of_list": "the vocabulary selection",
    "selection_end": "which documents select the vocabulary",
    "n_topics": "the shape of every sum and release",
    "alpha0": "the moments every release is computed from",
    "oversampling": "the shape of the whitening subspace",
    "seed": "the power method's starts: a restart would redo a release differently",
    "max_documents_per_sum": "the rounding premise of every noised sum",
    "non_private": "a private deployment is never switched to non-private",
    "epsilon": "the budget the ledger and every noise scale were calibrated to",
    "delta": "the budget the ledger and every noise scale were calibrated to",
    "horizon": "the number of epochs the budget is split over",
    "continual_aggregator": "how epoch sums are aggregated and noised",
    "sampler": "how the noise is drawn and what the accountant charges for it",
    "clip_quantile": "the warm-up clip bounds",
    "clip_budget_share": "the budget split of the warm-up",
    "warmup_share": "the budget split of the warm-up",
    "refinement": "which sums are sketched and released",
    "refinement_share": "the budget split of each release",
    "refinement_share_public": "the budget split of each release with a public start",
    "refinement_model_lag": "which model each epoch is refined against",
    "start": "which model epochs 1..refinement_model_lag are refined against (the start)",
    "public_start_file": "the public start's topics (its content id), the model of the first epochs",
    "privacy_unit": "the unit every sum and ledger event is calibrated to",
    "max_docs_per_user_epoch": "the user-level sensitivity",
    "max_docs_per_user": "the user-level sensitivity",
    "user_weights": "the user-level sensitivity",
    "max_users": "which users' documents count (first-K admission) and the user weights",
    "dedup_window_epochs": "which re-sent document ids count again (the unit of privacy)",
}


def contract_of(cfg: ServiceConfig, *, load_vocabulary: bool = True) -> dict:
    """The contract ``cfg`` would record (plain JSON values, comparable after a round trip).
    ``load_vocabulary=False``: ``vocabulary`` is None instead of the file's id (a client that
    has no vocabulary file, e.g. ``streamdp produce``)."""
    values = {name: getattr(cfg, name) for name in CONTRACT_FIELDS}
    values["tokenizer"] = cfg.tokenizer_().config()
    if cfg.vocabulary_mode == "file" and load_vocabulary:
        vocab, _ = cfg.load_vocabulary_file()
        values["vocabulary"] = vocab.vocabulary_id
    else:
        values["vocabulary"] = None
    if cfg.vocabulary_mode != "private":
        # file: the vocabulary_id says it all; public: the vocabulary record on the state topic,
        # built once, decides and a later start reads it (test_public_vocabulary_is_built_once_
        # and_shared restarts with another vocabulary_size): the selection fields mean nothing
        for name in ("vocabulary_size", "vocabulary_lang", "vocabulary_candidates",
                     "vocabulary_max_words_per_document", "vocabulary_out_of_list", "selection_end"):
            values[name] = None
    # the start as it acts: "auto" without a public start IS the tensor start (the services
    # have no clustering start), so switching between the two is harmless and accepted; a
    # change to or from a public start is refused (epochs 1..L were folded into the start)
    values["start"] = "tensor" if cfg.start_rule() is False else cfg.start
    # the public start's share means nothing where the start cannot be public
    if cfg.start_rule() is False:
        values["refinement_share_public"] = None
    # the public start by content (start_id), not by path: a moved file is the same start
    # (checked here, before any side effect: its k and, in file mode, its vocabulary)
    values["public_start_file"] = (cfg.load_public_start(values["vocabulary"]).start_id
                                   if cfg.public_start_file else None)
    if cfg.privacy_unit != "user":      # the user bounds mean nothing for documents
        for name in ("max_docs_per_user_epoch", "max_docs_per_user", "user_weights", "warmup_share",
                     "max_users"):
            values[name] = None
    else:
        values["max_docs_per_user_epoch"], values["max_docs_per_user"] = cfg.user_bounds
    return json.loads(json.dumps(values))


def _show(v) -> str:
    s = repr(v) if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return s if len(s) <= 120 else s[:117] + "..."


def contract_differences(recorded: dict, mine: dict) -> list[str]:
    """Messages for every contract field whose recorded value differs from ``mine``."""
    out = []
    for name, why in CONTRACT_FIELDS.items():
        if name not in recorded:        # a field added to the contract after the record
            continue
        if recorded[name] != mine.get(name):
            out.append(f"configuration field {name!r}: the deployment recorded {_show(recorded[name])}, "
                       f"this service has {_show(mine.get(name))} ({why})")
    return out


def check_contract(cfg: ServiceConfig, store, *, role: str) -> tuple[dict, bool]:
    """Refuse (ConfigError) a configuration that differs from the recorded contract.

    Read-only: returns ``(contract, needs_recording)``; call :func:`record_contract` once
    every other start-up check has passed."""
    mine = contract_of(cfg)
    rec = store.read_latest(CONTRACT_KEY)
    if rec is None:
        return mine, True
    signed = check_key(cfg, rec, role=role)
    recorded = dict(rec.meta.get("fields") or {})
    diffs = contract_differences(recorded, mine)
    if diffs:
        raise ConfigError(
            f"the deployment contract ({store_name(cfg)} key {CONTRACT_KEY!r}) refuses this "
            f"{role}: " + "; ".join(diffs) + ". These fields cannot change in a running "
            "deployment: configure the recorded values, or start a new deployment (new "
            "topic_prefix and ledger; docs/operations.md \"The deployment contract\")")
    # a contract recorded before it was signed: the release service signs it (re-records it)
    return mine, (any(name not in recorded for name in CONTRACT_FIELDS)
                  or (not signed and role.startswith("release")))


def check_key(cfg: ServiceConfig, rec, *, role: str) -> bool:
    """Refuse (ConfigError) a service whose control key does not verify the contract record's
    MAC: it holds another key than the deployment's. Returns whether the record is signed."""
    if state_auth.MAC_FIELD not in (rec.meta or {}):
        log.warning("the deployment contract (%s key %r) is not signed yet (recorded before "
                    "contracts were signed): this %s cannot prove it holds the deployment's "
                    "control key until the release service restarts and signs it", store_name(cfg),
                    CONTRACT_KEY, role)
        return False
    auth = state_auth.for_config(cfg)
    if not auth.authentic(CONTRACT_KEY, rec.payload, rec.meta):
        by = (rec.meta or {}).get("recorded_by") or "the first service"
        raise ConfigError(
            f"configuration field 'control_key_file': this {role}'s control key is not the key "
            f"deployment {cfg.topic_prefix!r} was started with (the deployment contract, "
            f"{store_name(cfg)} key {CONTRACT_KEY!r}, recorded by {by}, carries a MAC this key "
            "does not verify). With another key a sketcher ignores every control message and "
            "the release service refuses every sketch record. Give every service the "
            "deployment's control key (the same Secret, control_key_file; docs/operations.md "
            "§Kafka ACLs); a deployment cannot change its key")
    return True


def check_producer_arguments(cfg: ServiceConfig, store, given: set[str]) -> None:
    """``streamdp produce``: refuse (ConfigError) before sending anything when a contract field
    the producer was *given* (``given``: the names set in its config file, its ``STREAMDP_*``
    environment or its flags) differs from the deployment's recorded contract — the producer
    then believes in another stream_start, epoch length, tokenizer, document limits, ... than
    the services that will count its documents. Fields it was not given are not compared (a
    producer needs only bootstrap and topic_prefix). Nothing recorded yet: nothing to check."""
    rec = store.read_latest(CONTRACT_KEY)
    if rec is None:
        return
    recorded = dict(rec.meta.get("fields") or {})
    asked = {name: recorded[name] for name in CONTRACT_FIELDS if name in given and name in recorded}
    if not asked:
        return
    mine = contract_of(cfg, load_vocabulary="vocabulary" in asked)
    diffs = contract_differences(asked, mine)
    if diffs:
        raise ConfigError(
            f"streamdp produce: this configuration disagrees with the deployment contract "
            f"recorded on {store_name(cfg)}: " + "; ".join(diffs) + ". Nothing was sent. Use the "
            "deployment's configuration file (or leave those fields out: produce needs only "
            "bootstrap and topic_prefix), or produce to another deployment (topic_prefix)")


def record_contract(cfg: ServiceConfig, store, contract: dict, *, role: str) -> None:
    """Write the contract (first start), then re-read it: of two services that started at
    once with different contracts, the one whose write was overtaken is refused."""
    meta = {"version": CONTRACT_VERSION, "fields": contract, "recorded_by": role}
    store.write(CONTRACT_KEY, b"", meta=state_auth.for_config(cfg).sign(CONTRACT_KEY, b"", meta))
    rec = store.read_latest(CONTRACT_KEY)
    check_key(cfg, rec, role=role)
    diffs = contract_differences(dict(rec.meta.get("fields") or {}), contract)
    if diffs:
        raise ConfigError("the deployment contract was recorded by another service at the same "
                          "time and differs: " + "; ".join(diffs))


def store_name(cfg: ServiceConfig) -> str:
    return f"state topic {cfg.topics.state!r}"
