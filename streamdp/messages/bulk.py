"""The sketcher's hot path: a poll batch of document messages decoded and validated in bulk.

:class:`DocumentBatch` gives the same documents, rows and errors as
:func:`~streamdp.messages.schema.decode_document` per message followed by
:func:`~streamdp.messages.counts.documents_to_counts`, at a fraction of the per-message
Python work; the common token-id shape goes through a compiled parser
(:mod:`streamdp._counts_decode_kernel`).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import scipy.sparse as sp

from streamdp.documents import as_count_batch
from streamdp.messages.counts import CountBatch, documents_to_counts
from streamdp.messages.errors import InvalidMessage
from streamdp.messages.schema import (DEFAULT_MAX_BYTES, DEFAULT_MAX_TOKENS, Document,
                                      MAX_ID_CHARS, SCHEMA_VERSION, decode_document)
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary

#: Σcounts per document is summed in int64: the bulk path needs max_tokens² < 2⁶³
_BULK_MAX_TOKENS = 1 << 31


def _ints_fit(values: Sequence) -> bool:
    """Every element an exact ``int`` (not bool) that fits int64 (a slow per-document check,
    used only when the batch-wide check of :class:`DocumentBatch` failed)."""
    return (not values or (set(map(type, values)) == {int}
                           and -(1 << 63) <= min(values) and max(values) < (1 << 63)))


class DocumentBatch:
    """The document messages of one poll batch, decoded and validated in bulk.

    Same results as :func:`decode_document` per message followed by
    :func:`documents_to_counts` — the same documents, the same CSR rows bit for bit, the same
    error class and message for every rejected message — at a fraction of the per-message
    Python work (the sketcher's hot path, docs/benchmarks.md "End-to-end sketcher speed"):

    * every message is unpacked once (arrays as tuples) and its header (``v``, ``id``, ``ts``,
      the optional ``user``) and payload *shape* checked inline; ``counts`` documents keep
      their id and count tuples;
    * all ids and counts of the batch are then checked at once: exact ``int`` types (one
      ``set(map(type, …))`` over the concatenation), counts in [1, max_tokens], ids in
      [0, d), Σcounts ≤ max_tokens, ids strictly increasing within a document (so no
      duplicates; unsorted documents get a set-based duplicate check and a sorted row), the
      ``counts.vocab`` id; the CSR batch is built directly from the concatenated arrays;
    * anything the bulk checks do not prove valid — every malformed message, every bad
      value, every ``tokens`` payload not of plain non-empty str — is decoded again by
      :func:`decode_document` and, if valid, goes through :func:`documents_to_counts`,
      so a bad message gets exactly the error it always got, at its own position, and never
      affects the other rows.

    Order of checks (and so which error a message that is wrong in several ways gets) is the
    per-message one: decoding (message, schema, counts ≥ 1, ids ≥ 0, Σcounts, duplicates),
    then whatever the caller rejects with :meth:`reject` (the sketcher: record time in the
    future), then :meth:`to_counts` (text too long, ids outside the vocabulary, vocabulary id).

    Parameters
    ----------
    values : message values (bytes); positions are the batch positions
    vocabulary : the service's vocabulary (the ids' range and ``counts.vocab``)
    rejected : position → error for messages refused before decoding (not decoded)
    """

    def __init__(self, values: Sequence[Any], vocabulary: Vocabulary, *,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_tokens: int = DEFAULT_MAX_TOKENS,
                 rejected: Mapping[int, InvalidMessage] | None = None) -> None:
        n = len(values)
        self.n, self.vocabulary = n, vocabulary
        self.max_bytes, self.max_tokens = max_bytes, max_tokens
        self.errors: dict[int, InvalidMessage] = dict(rejected or {})
        self.docs: dict[int, Document] = {}        # position -> Document (text, tokens, slow counts)
        self.ts = np.full(n, np.nan)
        loads = msgpack.unpackb
        errors, docs, ts_out = self.errors, self.docs, self.ts
        bulk = max_tokens <= _BULK_MAX_TOKENS
        # the compiled parser takes the valid token-id messages of the common shape; the
        # loop below decodes every message it declines (and only those)
        parsed = _parse_counts_fast(values, self.errors, vocabulary, max_bytes, max_tokens) \
            if bulk and n else None
        f_pos: list[int] = []
        f_id: list[str] = []
        f_ts: list[float] = []
        f_ids: list[tuple] = []
        f_cnt: list[tuple] = []
        f_voc: list[tuple[int, str]] = []            # (fast row, counts.vocab) where given
        slow: list[int] = []
        self._f_user = f_user = {}                   # fast counts position -> its user id
        inf = math.inf
        todo = range(n) if parsed is None else parsed.declined.tolist()
        for i in todo:
            if i in errors:
                continue
            raw = values[i]
            obj = None
            if type(raw) is bytes and len(raw) <= max_bytes:
                try:
                    # ser.loads' decoder settings, with arrays as tuples (fewer allocations)
                    obj = loads(raw, raw=False, use_list=False, strict_map_key=True,
                                max_bin_len=max_bytes, max_str_len=max_bytes)
                except Exception:       # noqa: BLE001 — decode_document names the error below
                    obj = None
            if type(obj) is dict:
                v, did, ts, user = obj.get("v"), obj.get("id"), obj.get("ts"), obj.get("user")
                if (type(v) is int and v == SCHEMA_VERSION and type(did) is str
                        and 0 < len(did) <= MAX_ID_CHARS and (type(ts) is float or type(ts) is int)
                        and (user is None and "user" not in obj
                             or type(user) is str and 0 < len(user) <= MAX_ID_CHARS)):
                    ts = float(ts)
                    if 0.0 <= ts < inf:
                        has_text, has_tokens = "text" in obj, "tokens" in obj
                        if "counts" in obj:
                            c = obj["counts"]
                            if not (has_text or has_tokens) and type(c) is dict and bulk:
                                ids, cnt = c.get("ids"), c.get("counts")
                                if (type(ids) is tuple and type(cnt) is tuple
                                        and 0 < len(ids) == len(cnt) <= max_tokens):
                                    if "vocab" in c:    # must be this vocabulary's id
                                        f_voc.append((len(f_pos), c["vocab"]))
                                    f_pos.append(i)
                                    if user is not None:
                                        f_user[i] = user
                                    f_id.append(did)
                                    f_ts.append(ts)
                                    f_ids.append(ids)
                                    f_cnt.append(cnt)
                                    continue
                        elif has_text and not has_tokens:
                            text = obj["text"]
                            if type(text) is str and text.strip():
                                docs[i] = Document(did, ts, "text", text, user=user)
                                ts_out[i] = ts
                                continue
                        elif has_tokens and not has_text:
                            toks = obj["tokens"]
                            if (type(toks) is tuple and 0 < len(toks) <= max_tokens
                                    and set(map(type, toks)) == {str} and all(toks)):
                                docs[i] = Document(did, ts, "tokens", toks, user=user)
                                ts_out[i] = ts
                                continue
            slow.append(i)
        bad_rows = self._check_counts_bulk(f_ids, f_cnt, f_voc)
        if bad_rows.size:
            slow.extend(f_pos[j] for j in bad_rows)
            keep = np.ones(len(f_pos), dtype=bool)
            keep[bad_rows] = False
            f_pos = [p for p, k in zip(f_pos, keep.tolist()) if k]
            f_id = [x for x, k in zip(f_id, keep.tolist()) if k]
            f_ts = [x for x, k in zip(f_ts, keep.tolist()) if k]
        self._f_pos = np.asarray(f_pos, dtype=np.intp)
        self._f_id = f_id
        self._f_ts = np.asarray(f_ts, dtype=np.float64)
        if parsed is not None and parsed.pos.size:
            self._merge_parsed(parsed)
        self._f_alive = np.ones(self._f_pos.size, dtype=bool)
        if self._f_pos.size:
            ts_out[self._f_pos] = self._f_ts
        for i in sorted(slow):
            try:
                doc = decode_document(values[i], max_bytes=max_bytes, max_tokens=max_tokens)
            except InvalidMessage as exc:
                errors[i] = exc
                continue
            docs[i] = doc
            ts_out[i] = doc.ts

    # -- the bulk checks of the counts documents ------------------------------------------
    def _check_counts_bulk(self, f_ids: list, f_cnt: list, f_voc: list) -> np.ndarray:
        """Check the ``counts`` documents found by the decoding loop all at once; keep their
        arrays (``_ids``, ``_cnt``, ``_lens``, ``_sort``) and return the rows that the bulk
        checks cannot prove valid (decoded again, one by one, by the caller)."""
        nf = len(f_ids)
        self._lens = lens = np.fromiter(map(len, f_ids), dtype=np.int64, count=nf)
        flat_ids = list(itertools.chain.from_iterable(f_ids))
        flat_cnt = list(itertools.chain.from_iterable(f_cnt))
        suspect = np.zeros(nf, dtype=bool)
        # exact int types (a bool is not an id) ...
        ok = not flat_ids or set(map(type, flat_ids)) == {int} == set(map(type, flat_cnt))
        if ok:
            try:            # ... that fit int64 (fromiter raises OverflowError otherwise)
                ids = np.fromiter(flat_ids, dtype=np.int64, count=len(flat_ids))
                cnt = np.fromiter(flat_cnt, dtype=np.int64, count=len(flat_cnt))
            except OverflowError:
                ok = False
        if not ok:
            # a bool, float, str, array or huge int somewhere: find its documents
            suspect = np.fromiter((not (_ints_fit(a) and _ints_fit(b)) for a, b in zip(f_ids, f_cnt)),
                                  dtype=bool, count=nf)
            keep = np.repeat(~suspect, lens).tolist()
            flat_ids = list(itertools.compress(flat_ids, keep))
            flat_cnt = list(itertools.compress(flat_cnt, keep))
            ids = np.fromiter(flat_ids, dtype=np.int64, count=len(flat_ids))
            cnt = np.fromiter(flat_cnt, dtype=np.int64, count=len(flat_cnt))
        ok_rows = np.flatnonzero(~suspect)
        ok_lens = lens[ok_rows]
        bad = suspect.copy()
        sort_rows = np.zeros(nf, dtype=bool)
        if ids.size:
            d = len(self.vocabulary)
            starts = np.concatenate([[0], np.cumsum(ok_lens)[:-1]])
            elem_bad = (cnt < 1) | (cnt > self.max_tokens) | (ids < 0) | (ids >= d)
            row_bad = np.add.reduceat(elem_bad, starts) > 0
            row_bad |= np.add.reduceat(cnt, starts) > self.max_tokens
            # ids strictly increasing inside each document: no duplicates, already CSR order
            down = np.ones(ids.size, dtype=bool)
            down[1:] = ids[1:] <= ids[:-1]
            down[starts] = False
            unsorted = (np.add.reduceat(down, starts) > 0) & ~row_bad
            bad[ok_rows] = row_bad
            for r in ok_rows[unsorted].tolist():
                if len(set(f_ids[r])) != len(f_ids[r]):
                    bad[r] = True                   # duplicates: decode_document names them
                else:
                    sort_rows[r] = True
        vid = self.vocabulary.id
        for r, voc in f_voc:
            if voc != vid:
                bad[r] = True
        # arrays of the rows that stay (suspect rows were never in ids/cnt)
        keep_elems = np.repeat(~bad[ok_rows], ok_lens)
        self._ids, self._cnt = ids[keep_elems], cnt[keep_elems]
        self._lens, self._sort = lens[~bad], sort_rows[~bad]
        return np.flatnonzero(bad)

    # -- after decoding --------------------------------------------------------------------
    def _merge_parsed(self, parsed: "_ParsedCounts") -> None:
        """Put the rows of the compiled parser and those of the Python loop (already in
        ``_f_pos`` … ``_sort``) into one set of arrays, rows in batch order."""
        if not self._f_pos.size:
            self._f_pos, self._f_id, self._f_ts = parsed.pos, parsed.doc_ids, parsed.ts
            self._ids, self._cnt, self._lens = parsed.ids, parsed.cnt, parsed.lens
            self._sort = np.zeros(parsed.pos.size, dtype=bool)
            return
        pos = np.concatenate([parsed.pos, self._f_pos])
        order = np.argsort(pos, kind="stable")
        lens = np.concatenate([parsed.lens, self._lens])
        src = np.zeros(lens.size, dtype=np.int64)            # each row's first element ...
        np.cumsum(lens[:-1], out=src[1:])                    # ... in the concatenation
        lens = lens[order]
        dst = np.zeros(lens.size, dtype=np.int64)
        np.cumsum(lens[:-1], out=dst[1:])
        take = np.repeat(src[order] - dst, lens) + np.arange(int(lens.sum()))
        self._ids = np.concatenate([parsed.ids, self._ids])[take]
        self._cnt = np.concatenate([parsed.cnt, self._cnt])[take]
        self._lens = lens
        self._sort = np.concatenate([np.zeros(parsed.pos.size, dtype=bool), self._sort])[order]
        self._f_pos = pos[order]
        self._f_ts = np.concatenate([parsed.ts, self._f_ts])[order]
        all_ids = parsed.doc_ids + self._f_id
        self._f_id = [all_ids[j] for j in order.tolist()]

    def _fast_row(self, i: int) -> int | None:
        """Row of position ``i`` among the token-id rows built in bulk (None if not one)."""
        r = int(np.searchsorted(self._f_pos, i))
        return r if r < self._f_pos.size and self._f_pos[r] == i else None

    @property
    def valid(self) -> np.ndarray:
        """Positions of the messages decoded and not rejected so far (ascending)."""
        pos = self._f_pos[self._f_alive]
        if self.docs:
            pos = np.sort(np.concatenate([pos, np.fromiter(self.docs, dtype=np.intp, count=len(self.docs))]))
        return np.asarray(pos, dtype=np.intp)

    def user(self, i: int) -> str | None:
        """The ``user`` field of the decoded message at position ``i`` (None if absent)."""
        doc = self.docs.get(i)
        return doc.user if doc is not None else self._f_user.get(i)

    def reject(self, i: int, exc: InvalidMessage) -> None:
        """Refuse the decoded message at position ``i`` (e.g. its time is in the future)."""
        r = self._fast_row(i)
        if r is not None and self._f_alive[r]:
            self._f_alive[r] = False
        elif self.docs.pop(i, None) is None:
            raise KeyError(f"position {i} is not a decoded document")
        self.errors[i] = exc
        self.ts[i] = np.nan

    def to_counts(self, tokenizer: Tokenizer) -> CountBatch:
        """One CSR count batch of every document still valid, rows in batch order; ``index``
        holds batch positions and ``errors`` every rejected position (ascending), as
        :func:`documents_to_counts` would for the decoded documents."""
        vocabulary, d = self.vocabulary, len(self.vocabulary)
        alive = self._f_alive
        nf = int(alive.sum())
        if nf:
            lens = self._lens[alive]
            elems = np.repeat(alive, self._lens) if nf < alive.size else slice(None)
            indptr = np.zeros(nf + 1, dtype=np.int64)
            np.cumsum(lens, out=indptr[1:])
            idx_dtype = np.int32 if max(d, int(indptr[-1])) < (1 << 31) else np.int64
            Xf = sp.csr_matrix((self._cnt[elems].astype(np.float64), self._ids[elems].astype(idx_dtype),
                                indptr.astype(idx_dtype)), shape=(nf, d))
            if self._sort[alive].any():
                Xf.has_sorted_indices = False
                Xf.sort_indices()
            else:
                Xf.has_sorted_indices = True
            Xf.has_canonical_format = True
            f_tokens = np.add.reduceat(self._cnt[elems], indptr[:-1]) if lens.size else np.zeros(0, np.int64)
            f_pos = self._f_pos[alive]
            f_ts = self._f_ts[alive]
            f_ids = list(self._f_id) if nf == alive.size else \
                [x for x, a in zip(self._f_id, alive.tolist()) if a]
        errors = dict(self.errors)
        if self.docs:
            slow_pos = sorted(self.docs)
            cb = documents_to_counts([self.docs[i] for i in slow_pos], tokenizer, vocabulary,
                                     max_tokens=self.max_tokens)
            for j, exc in cb.errors:
                errors[slow_pos[j]] = exc
            s_pos = np.asarray(slow_pos, dtype=np.intp)[cb.index]
        if not self.docs or cb.n_docs == 0:
            if nf:
                out_X, pos, ts, ids = Xf, f_pos, f_ts, tuple(f_ids)
                n_tok, n_unk = f_tokens.astype(np.int64), np.zeros(nf, dtype=np.int64)
            else:
                out_X = sp.csr_matrix((0, d), dtype=np.float64)
                pos, ts, ids = np.zeros(0, np.intp), np.zeros(0), ()
                n_tok = n_unk = np.zeros(0, dtype=np.int64)
        elif not nf:
            out_X, pos, ts, ids = cb.counts, s_pos, cb.timestamps, cb.doc_ids
            n_tok, n_unk = cb.n_tokens, cb.n_unknown
        else:                               # both kinds: merge the rows into batch order
            pos_all = np.concatenate([f_pos, s_pos])
            order = np.argsort(pos_all, kind="stable")
            out_X = sp.vstack([Xf, cb.counts], format="csr")[order]
            out_X = as_count_batch(out_X, n_features=d)
            out_X.sort_indices()
            pos = pos_all[order]
            ts = np.concatenate([f_ts, cb.timestamps])[order]
            all_ids = f_ids + list(cb.doc_ids)
            ids = tuple(all_ids[j] for j in order.tolist())
            n_tok = np.concatenate([f_tokens.astype(np.int64), cb.n_tokens])[order]
            n_unk = np.concatenate([np.zeros(nf, np.int64), cb.n_unknown])[order]
        return CountBatch(counts=out_X, timestamps=np.asarray(ts, dtype=np.float64), doc_ids=ids,
                          index=np.asarray(pos, dtype=np.intp), n_tokens=n_tok, n_unknown=n_unk,
                          errors=tuple(sorted(errors.items())))


# --------------------------------------------------------------------------- compiled fast path
@dataclass(frozen=True, eq=False)
class _ParsedCounts:
    """What the compiled parser accepted: rows in batch order (see :func:`_parse_counts_fast`)."""

    pos: np.ndarray             # intp (m,): batch positions
    ts: np.ndarray              # float64 (m,)
    doc_ids: list[str]
    lens: np.ndarray            # int64 (m,): words per document
    ids: np.ndarray             # int64 (Σ lens,): word ids, document after document
    cnt: np.ndarray             # int64 (Σ lens,)
    declined: np.ndarray        # intp: positions left to the Python loop (not in ``errors``)


def _counts_kernel():
    """The compiled parser (:mod:`streamdp._counts_decode_kernel`), imported on first use so
    that ``import streamdp`` does not pay for numba."""
    from streamdp._counts_decode_kernel import parse_counts_messages
    return parse_counts_messages


def warm_bulk_decoder() -> None:
    """Load (or compile) the compiled parser now (≈ 0.1–0.5 s once per process, ≈ 3 s to
    compile): a service pays it at start-up, not inside its first batch."""
    DocumentBatch([b""], Vocabulary(["x"]))


def _parse_counts_fast(values: Sequence[Any], errors: Mapping[int, InvalidMessage],
                       vocabulary: Vocabulary, max_bytes: int, max_tokens: int) -> _ParsedCounts:
    """Run the compiled parser over the batch: every valid token-id message of the common
    shape (:mod:`streamdp._counts_decode_kernel`) is parsed and checked there; the others are
    returned in ``declined`` for the full path."""
    n = len(values)
    raws = values if set(map(type, values)) == {bytes} else [v if type(v) is bytes else b"" for v in values]
    joined = b"".join(raws)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, raws), dtype=np.int64, count=n), out=starts[1:])
    skip = np.zeros(n, dtype=bool)
    if errors:
        skip[np.fromiter(errors, dtype=np.intp, count=len(errors))] = True
    ok = np.zeros(n, dtype=bool)
    ts = np.empty(n)
    id_span = np.empty((n, 2), dtype=np.int64)
    lens = np.empty(n, dtype=np.int64)
    cap = len(joined) // 2 + 1              # each (id, count) pair takes ≥ 2 bytes
    ids, cnt = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
    used = _counts_kernel()(np.frombuffer(joined, dtype=np.uint8), starts, skip, max_bytes,
                            max_tokens, MAX_ID_CHARS, len(vocabulary),
                            np.frombuffer(vocabulary.id.encode("utf-8"), dtype=np.uint8),
                            ok, ts, id_span, lens, ids, cnt)
    pos = np.flatnonzero(ok)
    text = joined.decode("latin-1")         # accepted ids are ASCII: one char per byte
    doc_ids = [text[a:b] for a, b in id_span[pos].tolist()]
    return _ParsedCounts(pos=pos, ts=ts[pos], doc_ids=doc_ids, lens=lens[pos], ids=ids[:used],
                         cnt=cnt[:used], declined=np.flatnonzero(~ok & ~skip))
