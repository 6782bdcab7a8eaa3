"""Compiled parser for the common token-id document message (numba): the fast path of
:class:`streamdp.messages.DocumentBatch`.

Imported lazily by :mod:`streamdp.messages` (numba's import and loading the cached machine
code cost time; ``import streamdp`` does not pay for it).

It recognises exactly one shape of message — a msgpack map with the keys ``v`` (= 1),
``id`` (1 … MAX_ID_CHARS ASCII characters), ``ts`` (finite, ≥ 0) and ``counts``, a map with ``ids`` and ``counts``
(equally long, non-empty arrays of int; ids strictly increasing in [0, d); counts in
[1, max_tokens] with Σ ≤ max_tokens) and optionally ``vocab`` (equal to the service's
vocabulary id), each key once, nothing after the map — and accepts a message only if it
is *valid* in that shape. Everything else (another key, a duplicate key, another payload
kind, a ``user`` (the user-level unit's checks stay in one place, the Python path), a
non-ASCII id, unsorted ids, any bad value, any malformed byte) is declined, and the
caller decodes that message with the full msgpack path, which gives it exactly the result
or error it always got. So the parser can only make valid messages faster: for a message
it accepts, ``msgpack.unpackb`` + :func:`streamdp.messages.decode_document` return the same
id, ts, ids and counts (tests/test_counts_decoder.py checks both directions on fuzzed,
mutated and truncated messages).

Each message is parsed from its own bytes only (no state crosses messages but the output
cursor), so a message's result does not depend on the rest of the batch.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _read_int(buf, p, end):
    """(ok, value, next position) of a msgpack int at ``p`` that fits int64."""
    if p >= end:
        return False, np.int64(0), p
    b = np.int64(buf[p])
    if b <= 0x7F:
        return True, b, p + 1
    if b >= 0xE0:
        return True, b - 256, p + 1
    if b == 0xCC or b == 0xD0:
        n = 1
    elif b == 0xCD or b == 0xD1:
        n = 2
    elif b == 0xCE or b == 0xD2:
        n = 4
    elif b == 0xCF or b == 0xD3:
        n = 8
    else:
        return False, np.int64(0), p
    if p + 1 + n > end:
        return False, np.int64(0), p
    if b == 0xCF and buf[p + 1] >= 0x80:      # uint64 above int64's range
        return False, np.int64(0), p
    v = np.int64(0)
    for j in range(n):
        v = (v << 8) | np.int64(buf[p + 1 + j])
    if b >= 0xD0 and n < 8:                    # sign-extend int8/16/32 (int64 wraps by itself)
        half = np.int64(1) << (8 * n - 1)
        if v >= half:
            v -= half << 1
    return True, v, p + 1 + n


@njit(cache=True, nogil=True)
def _read_str(buf, p, end):
    """(ok, start, length) of a msgpack str at ``p`` (the str ends at start + length)."""
    if p >= end:
        return False, p, 0
    b = buf[p]
    if 0xA0 <= b <= 0xBF:
        n, h = np.int64(b & 0x1F), 1
    elif b == 0xD9:
        if p + 2 > end:
            return False, p, 0
        n, h = np.int64(buf[p + 1]), 2
    elif b == 0xDA:
        if p + 3 > end:
            return False, p, 0
        n, h = (np.int64(buf[p + 1]) << 8) | np.int64(buf[p + 2]), 3
    elif b == 0xDB:
        if p + 5 > end:
            return False, p, 0
        n = np.int64(0)
        for j in range(4):
            n = (n << 8) | np.int64(buf[p + 1 + j])
        h = 5
    else:
        return False, p, 0
    if p + h + n > end:
        return False, p, 0
    return True, p + h, n


@njit(cache=True, nogil=True)
def _read_container(buf, p, end, fix_lo, fix_hi, tag16, tag32):
    """(ok, entries, next position) of a msgpack map or array header at ``p``."""
    if p >= end:
        return False, np.int64(0), p
    b = buf[p]
    if fix_lo <= b <= fix_hi:
        return True, np.int64(b - fix_lo), p + 1
    if b == tag16:
        if p + 3 > end:
            return False, np.int64(0), p
        return True, (np.int64(buf[p + 1]) << 8) | np.int64(buf[p + 2]), p + 3
    if b == tag32:
        if p + 5 > end:
            return False, np.int64(0), p
        n = np.int64(0)
        for j in range(4):
            n = (n << 8) | np.int64(buf[p + 1 + j])
        return True, n, p + 5
    return False, np.int64(0), p


@njit(cache=True, nogil=True)
def _ascii_name(buf, s, n, max_chars):
    """True if the str buf[s:s+n] is 1 … max_chars ASCII characters."""
    if n < 1 or n > max_chars:
        return False
    for j in range(n):
        if buf[s + j] >= 0x80:
            return False
    return True


@njit(cache=True, nogil=True)
def _key(buf, s, n):
    """Code of a known key: 1 v, 2 id, 3 ts, 4 user, 5 counts, 6 ids, 7 vocab; 0 other."""
    if n == 1:
        return 1 if buf[s] == 118 else 0                                    # v
    if n == 2:
        if buf[s] == 105 and buf[s + 1] == 100:                             # id
            return 2
        if buf[s] == 116 and buf[s + 1] == 115:                             # ts
            return 3
        return 0
    if n == 3:
        return 6 if buf[s] == 105 and buf[s + 1] == 100 and buf[s + 2] == 115 else 0     # ids
    if n == 4:
        return 4 if (buf[s] == 117 and buf[s + 1] == 115 and buf[s + 2] == 101
                     and buf[s + 3] == 114) else 0                                        # user
    if n == 5:
        return 7 if (buf[s] == 118 and buf[s + 1] == 111 and buf[s + 2] == 99
                     and buf[s + 3] == 97 and buf[s + 4] == 98) else 0                    # vocab
    if n == 6:
        return 5 if (buf[s] == 99 and buf[s + 1] == 111 and buf[s + 2] == 117 and buf[s + 3] == 110
                     and buf[s + 4] == 116 and buf[s + 5] == 115) else 0                  # counts
    return 0


@njit(cache=True, nogil=True)
def _int_array(buf, p, end, out, base, cap):
    """Parse an array of int at ``p`` into out[base:]: (ok, entries, next position)."""
    ok, n, p = _read_container(buf, p, end, 0x90, 0x9F, 0xDC, 0xDD)
    if not ok or n > end - p or base + n > cap:       # every int takes ≥ 1 byte
        return False, np.int64(0), p
    for j in range(n):
        ok, v, p = _read_int(buf, p, end)
        if not ok:
            return False, np.int64(0), p
        out[base + j] = v
    return True, n, p


@njit(cache=True, nogil=True)
def parse_counts_messages(buf, starts, skip, max_bytes, max_tokens, max_chars, d, vocab_id,
                          ok_out, ts_out, id_span, lens_out, ids_out, cnt_out):
    """Parse message i = buf[starts[i]:starts[i+1]] for every i not in ``skip``.

    Fills, for every accepted message: ok_out[i] = True, ts_out[i], id_span[i] = (start, end)
    of the id's bytes, lens_out[i] = number of words, and its ids and counts at the next free positions of ids_out and cnt_out (in
    message order). Returns the number of (id, count) entries written.
    """
    n_msg = starts.shape[0] - 1
    cap = ids_out.shape[0]
    cursor = np.int64(0)
    bits64 = np.empty(1, dtype=np.uint64)
    as_f64 = bits64.view(np.float64)
    bits32 = np.empty(1, dtype=np.uint32)
    as_f32 = bits32.view(np.float32)
    for i in range(n_msg):
        ok_out[i] = False
        if skip[i]:
            continue
        p, end = starts[i], starts[i + 1]
        if end - p > max_bytes:
            continue
        ok, n_keys, p = _read_container(buf, p, end, 0x80, 0x8F, 0xDE, 0xDF)
        if not ok:
            continue
        seen = 0                        # bit per top-level key code
        ts = -1.0
        id_s = id_n = 0
        m = np.int64(-1)
        good = True
        for _ in range(n_keys):
            ok, ks, kn = _read_str(buf, p, end)
            if not ok:
                good = False
                break
            code = _key(buf, ks, kn)
            if code == 0 or code == 4 or code > 5 or (seen >> code) & 1:
                good = False
                break
            seen |= 1 << code
            p = ks + kn
            if code == 1:                                       # v
                ok, v, p = _read_int(buf, p, end)
                if not ok or v != 1:
                    good = False
                    break
            elif code == 2:                                     # id
                ok, s, sn = _read_str(buf, p, end)
                if not ok or not _ascii_name(buf, s, sn, max_chars):
                    good = False
                    break
                id_s, id_n = s, sn
                p = s + sn
            elif code == 3:                                     # ts
                if p >= end:
                    good = False
                    break
                b = buf[p]
                if b == 0xCB:
                    if p + 9 > end:
                        good = False
                        break
                    u = np.uint64(0)
                    for j in range(8):
                        u = (u << np.uint64(8)) | np.uint64(buf[p + 1 + j])
                    bits64[0] = u
                    ts = as_f64[0]
                    p += 9
                elif b == 0xCA:
                    if p + 5 > end:
                        good = False
                        break
                    u32 = np.uint32(0)
                    for j in range(4):
                        u32 = (u32 << np.uint32(8)) | np.uint32(buf[p + 1 + j])
                    bits32[0] = u32
                    ts = np.float64(as_f32[0])
                    p += 5
                else:
                    ok, iv, p = _read_int(buf, p, end)
                    if not ok:
                        good = False
                        break
                    ts = np.float64(iv)
                if not (ts >= 0.0 and ts < np.inf):            # NaN fails too
                    good = False
                    break
            else:                                               # counts
                ok, n_sub, p = _read_container(buf, p, end, 0x80, 0x8F, 0xDE, 0xDF)
                if not ok:
                    good = False
                    break
                sub_seen = 0
                m_ids = m_cnt = np.int64(-1)
                for _ in range(n_sub):
                    ok, ks, kn = _read_str(buf, p, end)
                    if not ok:
                        good = False
                        break
                    code = _key(buf, ks, kn)
                    if not (code == 5 or code == 6 or code == 7) or (sub_seen >> code) & 1:
                        good = False
                        break
                    sub_seen |= 1 << code
                    p = ks + kn
                    if code == 6:
                        ok, m_ids, p = _int_array(buf, p, end, ids_out, cursor, cap)
                    elif code == 5:
                        ok, m_cnt, p = _int_array(buf, p, end, cnt_out, cursor, cap)
                    else:
                        ok, s, sn = _read_str(buf, p, end)
                        if ok:
                            ok = sn == vocab_id.shape[0]
                            j = 0
                            while ok and j < sn:
                                ok = buf[s + j] == vocab_id[j]
                                j += 1
                            p = s + sn
                    if not ok:
                        good = False
                        break
                if not good:
                    break
                if m_ids < 1 or m_ids != m_cnt or m_ids > max_tokens:
                    good = False
                    break
                total = np.int64(0)
                prev = np.int64(-1)
                for j in range(m_ids):
                    w, c = ids_out[cursor + j], cnt_out[cursor + j]
                    if w <= prev or w >= d or c < 1 or c > max_tokens:
                        good = False
                        break
                    prev = w
                    total += c
                if not good or total > max_tokens:
                    good = False
                    break
                m = m_ids
        if not good or p != end or (seen & 0b101110) != 0b101110:   # v, id, ts, counts
            continue
        ok_out[i] = True
        ts_out[i] = ts
        id_span[i, 0], id_span[i, 1] = id_s, id_s + id_n
        lens_out[i] = m
        cursor += m
    return cursor
