"""The compiled token-id message parser (streamdp/_counts_decode_kernel.py), the fast path of
messages.DocumentBatch, against the msgpack path it must never differ from.

* soundness: any message the parser accepts decodes (msgpack.unpackb + decode_document +
  documents_to_counts) to a counts document with the same id, ts, ids and counts;
* coverage: every valid message of the common shape is accepted, in any msgpack encoding
  (non-minimal ints, str8/16/32, map16/32, array16/32, float32 or int ts, any key order), so
  the tests below exercise the fast path and not only its fallback;
* DocumentBatch with the parser equals decode_document per message + documents_to_counts
  (rows bit for bit, ts, ids, token counts, every error class and message) on batches that
  mix accepted, declined and malformed messages (byte flips, truncations, insertions).
"""
import struct

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdp import messages
from streamdp.messages import (DocumentBatch, InvalidMessage, decode_document, documents_to_counts,
                               encode_document)
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary

D = 300
VOCAB = Vocabulary([f"w{i:03d}x" for i in range(D)])
MAX_BYTES, MAX_TOKENS = 4096, 1000
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- a msgpack writer with choices
def _int(v: int, how: int) -> bytes:
    """msgpack int ``v`` in the ``how``-th of the encodings that can hold it (0 = minimal)."""
    opts = []
    if 0 <= v <= 0x7F:
        opts.append(bytes([v]))
    if -32 <= v < 0:
        opts.append(struct.pack(">b", v))
    for tag, fmt, lo, hi in ((0xCC, ">B", 0, 2**8 - 1), (0xCD, ">H", 0, 2**16 - 1),
                             (0xCE, ">I", 0, 2**32 - 1), (0xCF, ">Q", 0, 2**64 - 1),
                             (0xD0, ">b", -2**7, 2**7 - 1), (0xD1, ">h", -2**15, 2**15 - 1),
                             (0xD2, ">i", -2**31, 2**31 - 1), (0xD3, ">q", -2**63, 2**63 - 1)):
        if lo <= v <= hi:
            opts.append(bytes([tag]) + struct.pack(fmt, v))
    return opts[how % len(opts)]


def _str(s: str, how: int) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    opts = []
    if len(b) < 32:
        opts.append(bytes([0xA0 | len(b)]) + b)
    if len(b) < 256:
        opts.append(bytes([0xD9, len(b)]) + b)
    opts.append(b"\xda" + struct.pack(">H", len(b)) + b)
    opts.append(b"\xdb" + struct.pack(">I", len(b)) + b)
    return opts[how % len(opts)]


def _header(n: int, fix: int, tag16: int, how: int) -> bytes:
    opts = ([bytes([fix | n])] if n < 16 else []) + [bytes([tag16]) + struct.pack(">H", n),
                                                    bytes([tag16 + 1]) + struct.pack(">I", n)]
    return opts[how % len(opts)]


def write(obj, how) -> bytes:
    """msgpack of ``obj`` (dict, list, str, int, float, None, bool, bytes) with the encodings
    picked by ``how()`` (a source of small ints); floats: float64, or float32 when exact."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, bytes):
        return msgpack.packb(obj, use_bin_type=True)
    if isinstance(obj, int):
        return _int(obj, how()) if -2**63 <= obj < 2**64 else msgpack.packb(obj)
    if isinstance(obj, float):
        with np.errstate(over="ignore"):
            f32 = np.float32(obj)
        if how() % 2 and np.isnan(obj) == np.isnan(f32) and (np.isnan(obj) or float(f32) == obj):
            return b"\xca" + struct.pack(">f", obj)
        return b"\xcb" + struct.pack(">d", obj)
    if isinstance(obj, str):
        return _str(obj, how())
    if isinstance(obj, list):
        return _header(len(obj), 0x90, 0xDC, how()) + b"".join(write(x, how) for x in obj)
    if isinstance(obj, dict):
        return _header(len(obj), 0x80, 0xDE, how()) + b"".join(
            write(k, how) + write(v, how) for k, v in obj.items())
    raise TypeError(type(obj))


def _how(data):
    return lambda: data.draw(st.integers(0, 3))


# ---------------------------------------------------------------- the parser alone
def parse(raws, vocabulary=VOCAB, errors=None, max_bytes=MAX_BYTES, max_tokens=MAX_TOKENS):
    return messages._parse_counts_fast(raws, errors or {}, vocabulary, max_bytes, max_tokens)


def assert_sound(raws, vocabulary=VOCAB, max_bytes=MAX_BYTES, max_tokens=MAX_TOKENS):
    """Every accepted message is what the msgpack path makes of it; returns the accepted positions."""
    got = parse(raws, vocabulary, max_bytes=max_bytes, max_tokens=max_tokens)
    starts = np.concatenate([[0], np.cumsum(got.lens)])
    for r, i in enumerate(got.pos.tolist()):
        doc = decode_document(raws[i], max_bytes=max_bytes, max_tokens=max_tokens, vocabulary=vocabulary)
        assert doc.kind == "counts" and doc.user is None
        assert doc.id == got.doc_ids[r] and type(got.doc_ids[r]) is str
        assert doc.ts == got.ts[r] and np.signbit(doc.ts) == np.signbit(got.ts[r])
        ids, cnt = doc.payload
        assert list(ids) == got.ids[starts[r]:starts[r + 1]].tolist()
        assert list(cnt) == got.cnt[starts[r]:starts[r + 1]].tolist()
        cb = documents_to_counts([doc], Tokenizer(), vocabulary, max_tokens=max_tokens)
        assert cb.errors == () and cb.n_docs == 1
    assert sorted(got.pos.tolist() + got.declined.tolist()) == list(range(len(raws)))
    return set(got.pos.tolist())


_ascii_ids = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), min_size=1, max_size=256)
_bodies = st.dictionaries(st.integers(0, D - 1), st.integers(1, 60), min_size=1, max_size=12).map(
    lambda m: {"ids": sorted(m), "counts": [m[i] for i in sorted(m)]})
_ts = st.floats(0, 1e12) | st.integers(0, 2**63 - 1) | st.just(-0.0) | st.floats(0, float(np.float32(1e30)), width=32).map(float)


@st.composite
def valid_common(draw):
    """A valid token-id message of the shape the parser takes, keys in any order."""
    body = draw(_bodies)
    if draw(st.booleans()):
        body["vocab"] = VOCAB.id
    body = dict(draw(st.permutations(list(body.items()))))
    obj = {"v": 1, "id": draw(_ascii_ids), "ts": draw(_ts), "counts": body}
    return dict(draw(st.permutations(list(obj.items()))))


@FUZZ
@given(valid_common(), st.data())
def test_every_valid_message_of_the_common_shape_is_accepted(obj, data):
    raw = write(obj, _how(data))
    assert assert_sound([raw]) == {0}, obj


@st.composite
def near_common(draw):
    """The common shape with one thing changed (a value, a key, a type, an extra or missing key)."""
    obj = draw(valid_common())
    what = draw(st.sampled_from(["top", "body", "drop", "extra", "user", "dup"]))
    junk = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() \
        | st.text(max_size=300) | st.binary(max_size=4) | st.lists(st.integers(-5, D + 5), max_size=4)
    if what == "top":
        obj[draw(st.sampled_from(["v", "id", "ts", "counts"]))] = draw(junk)
    elif what == "body":
        key = draw(st.sampled_from(["ids", "counts", "vocab"]))
        if key == "vocab":
            obj["counts"]["vocab"] = draw(junk | st.just(VOCAB.id + "x") | st.just(VOCAB.id[:-1]))
        else:
            vals = list(obj["counts"][key])
            j = draw(st.integers(0, len(vals) - 1))
            vals[j] = draw(st.integers(-3, D + 3) | st.integers(-2**63, 2**64 - 1) | junk
                           | st.just(vals[j - 1]))          # j = 0: the last one (a duplicate)
            if draw(st.booleans()):
                vals = vals[::-1]
            obj["counts"][key] = vals
    elif what == "drop":
        target = obj if draw(st.booleans()) else obj["counts"]
        target.pop(draw(st.sampled_from(sorted(target))))
    elif what == "extra":
        target = obj if draw(st.booleans()) else obj["counts"]
        target[draw(st.sampled_from(["text", "tokens", "user", "x", "vocab", "idss", "Ts"]))] = draw(junk)
    elif what == "user":
        obj["user"] = draw(st.text(min_size=1, max_size=8))
    return obj, what == "dup"


def _mutate(raw: bytes, data) -> bytes:
    how = data.draw(st.sampled_from(["none", "flip", "cut", "insert", "append"]))
    if how == "none" or not raw:
        return raw
    j = data.draw(st.integers(0, len(raw) - 1))
    if how == "flip":
        return raw[:j] + bytes([data.draw(st.integers(0, 255))]) + raw[j + 1:]
    if how == "cut":
        return raw[:j]
    if how == "insert":
        return raw[:j] + data.draw(st.binary(min_size=1, max_size=3)) + raw[j:]
    return raw + data.draw(st.binary(min_size=1, max_size=3))


def _duplicate_key(raw: bytes, obj: dict, how) -> bytes:
    """The map of ``obj`` with one of its entries written twice (header count + 1)."""
    items = list(obj.items())
    k, v = items[0]
    return _header(len(items) + 1, 0x80, 0xDE, 0) + b"".join(
        write(a, how) + write(b, how) for a, b in items + [(k, v)])


@FUZZ
@given(st.lists(st.tuples(near_common(), st.booleans()), min_size=1, max_size=6), st.data())
def test_accepted_messages_decode_identically(items, data):
    """Soundness over near-misses, duplicates and byte-level damage: whatever is accepted is
    exactly what decode_document makes of it."""
    raws = []
    for (obj, dup), mutate in items:
        raw = write(obj, _how(data))
        if dup:
            raw = _duplicate_key(raw, obj, _how(data))
        raws.append(_mutate(raw, data) if mutate else raw)
    assert_sound(raws)


@FUZZ
@given(st.binary(max_size=120))
def test_arbitrary_bytes(raw):
    assert_sound([raw, b"\x84" + raw, b"\x84\xa1v\x01" + raw])


def test_declines_what_it_does_not_handle_itself():
    """Valid messages outside the common shape go to the msgpack path (and are valid there)."""
    ok = {"v": 1, "id": "a", "ts": 1.0, "counts": {"ids": [1, 5], "counts": [2, 1]}}
    declined = [
        {**ok, "id": "é"},                                        # non-ASCII id
        {**ok, "user": "u1"},                                     # user-level unit: Python path
        {**ok, "extra": 1},                                       # unknown key (ignored there)
        {**ok, "counts": {"ids": [5, 1], "counts": [1, 2]}},      # unsorted ids
        {**ok, "counts": {**ok["counts"], "x": 0}},               # unknown key in counts
    ]
    raws = [msgpack.packb(ok)] + [msgpack.packb(o) for o in declined]
    got = parse(raws)
    assert got.pos.tolist() == [0] and got.declined.tolist() == list(range(1, len(raws)))
    for raw in raws[1:]:
        decode_document(raw, vocabulary=VOCAB)                    # valid all the same
    # ... and messages the parser declines for a bound it checks itself
    assert parse([msgpack.packb(ok)], max_bytes=10).pos.size == 0
    assert parse([msgpack.packb(ok)], max_tokens=2).pos.size == 0
    assert parse([msgpack.packb(ok)], vocabulary=Vocabulary(["a", "b", "c"])).pos.size == 0


@pytest.mark.parametrize("ts", [0.0, -0.0, 5e-324, 1.7e9 + 0.25, 2**53 + 1, 2**63 - 1, 3, float(np.float32(0.1))])
def test_timestamps_equal_the_msgpack_path(ts):
    for how in range(4):
        raw = write({"v": 1, "id": "t", "ts": ts, "counts": {"ids": [0], "counts": [1]}}, lambda: how)
        assert assert_sound([raw]) == {0}


@pytest.mark.parametrize("ts", [-1.0, -5, float("inf"), float("nan"), -1e-300, 2**64 - 1, True])
def test_bad_timestamps_declined(ts):
    raw = write({"v": 1, "id": "t", "ts": ts, "counts": {"ids": [0], "counts": [1]}}, lambda: 0)
    assert assert_sound([raw]) == set()


def test_every_truncation_and_extra_byte_is_declined():
    raw = encode_document("doc-7", 12.5, counts=([3, 40, 299], [1, 200, 7]), vocabulary_id=VOCAB.id)
    assert assert_sound([raw]) == {0}
    cuts = [raw[:j] for j in range(len(raw))] + [raw + b"\x00", raw + raw]
    assert assert_sound(cuts) == set()


def test_ints_in_every_encoding():
    """The parser's int reader against msgpack, on every encoding of every boundary value."""
    from streamdp._counts_decode_kernel import _read_int
    values = [0, 1, 31, 127, 128, 255, 256, 2**15 - 1, 2**15, 2**16 - 1, 2**16, 2**31 - 1, 2**31,
              2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -1, -32, -33, -128, -129, -2**15,
              -2**15 - 1, -2**31, -2**31 - 1, -2**63]
    for v in values:
        for how in range(8):
            raw = _int(v, how)
            ok, got, end = _read_int(np.frombuffer(raw + b"\x00", dtype=np.uint8), 0, len(raw))
            assert msgpack.unpackb(raw) == v
            assert (ok, end) == ((True, len(raw)) if v < 2**63 else (False, 0)), (v, raw)
            if ok:
                assert got == v, (v, raw)
            assert not _read_int(np.frombuffer(raw, dtype=np.uint8), 0, len(raw) - 1)[0]  # cut short


def test_duplicate_and_unsorted_ids_declined():
    for ids in ([1, 1], [2, 1], [0, 5, 5], [0, 7, 3]):
        raw = msgpack.packb({"v": 1, "id": "a", "ts": 1.0, "counts": {"ids": ids, "counts": [1] * len(ids)}})
        assert parse([raw]).pos.size == 0
        assert_batch_equal([raw, encode_document("b", 1.0, counts=([1], [1]))])


def test_id_length_limit():
    ok = {"v": 1, "ts": 1.0, "counts": {"ids": [1], "counts": [1]}}
    raws = [msgpack.packb({**ok, "id": "x" * n}) for n in (0, 1, 256, 257)]
    assert assert_sound(raws) == {1, 2}


# ---------------------------------------------------------------- DocumentBatch, end to end
def _reference(raws, max_bytes, max_tokens):
    docs, pos, errors = [], [], {}
    for i, raw in enumerate(raws):
        try:
            docs.append(decode_document(raw, max_bytes=max_bytes, max_tokens=max_tokens))
            pos.append(i)
        except InvalidMessage as exc:
            errors[i] = exc
    cb = documents_to_counts(docs, Tokenizer(), VOCAB, max_tokens=max_tokens)
    for j, exc in cb.errors:
        errors[pos[j]] = exc
    return cb, [pos[j] for j in cb.index], errors, pos


def assert_batch_equal(raws, max_bytes=MAX_BYTES, max_tokens=MAX_TOKENS):
    ref, ref_pos, ref_err, decoded = _reference(raws, max_bytes, max_tokens)
    db = DocumentBatch(raws, VOCAB, max_bytes=max_bytes, max_tokens=max_tokens)
    assert db.valid.tolist() == decoded     # before the vocabulary checks of to_counts
    got = db.to_counts(Tokenizer())
    assert got.index.tolist() == ref_pos
    for a in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(got.counts, a), getattr(ref.counts, a))
    assert got.counts.shape == ref.counts.shape and got.counts.has_canonical_format
    np.testing.assert_array_equal(got.timestamps, ref.timestamps)
    np.testing.assert_array_equal(np.signbit(got.timestamps), np.signbit(ref.timestamps))
    assert got.doc_ids == ref.doc_ids
    np.testing.assert_array_equal(got.n_tokens, ref.n_tokens)
    np.testing.assert_array_equal(got.n_unknown, ref.n_unknown)
    assert [(i, e.error_class, e.message) for i, e in got.errors] == \
        [(i, e.error_class, e.message) for i, e in sorted(ref_err.items())]
    return got


@FUZZ
@given(st.lists(st.one_of(valid_common().map(lambda o: (o, False)), near_common()), max_size=12),
       st.lists(st.booleans(), max_size=12), st.data())
def test_document_batch_equals_per_message_decoding(items, mutate, data):
    raws = []
    for j, (obj, dup) in enumerate(items):
        raw = write(obj, _how(data))
        if dup:
            raw = _duplicate_key(raw, obj, _how(data))
        raws.append(_mutate(raw, data) if j < len(mutate) and mutate[j] else raw)
    raws += data.draw(st.lists(st.sampled_from([b"", b"\xc0", None, encode_document("txt", 3.0, text="w001x w002x"),
                                                encode_document("tok", 4.0, tokens=["w003x", "zz"])]), max_size=3))
    raws = data.draw(st.permutations(raws))
    raws = [r for r in raws if r is not None]           # tombstones are refused by the caller
    assert_batch_equal(raws)


def test_document_batch_mixes_fast_and_python_rows_in_batch_order():
    raws = [encode_document("a", 1.0, counts=([1, 2], [1, 1])),
            msgpack.packb({"v": 1, "id": "b", "ts": 2.0, "counts": {"ids": [9, 3], "counts": [2, 1]}}),
            encode_document("c", 3.0, counts=([7], [4]), user="u"),
            b"\x81",
            encode_document("ü", 4.0, counts=([0, 299], [1, 2])),
            encode_document("e", 5.0, counts=([5, 6, 7], [1, 1, 30]))]
    assert parse(raws).pos.tolist() == [0, 5]
    got = assert_batch_equal(raws)
    assert got.doc_ids == ("a", "b", "c", "ü", "e") and got.index.tolist() == [0, 1, 2, 4, 5]
    db = DocumentBatch(raws, VOCAB)
    db.reject(5, InvalidMessage("invalid_value", "in the future"))
    assert db.valid.tolist() == [0, 1, 2, 4]
    with pytest.raises(KeyError):
        db.reject(3, InvalidMessage("invalid_value", "x"))


def test_user_field_of_every_message():
    """The user-level unit reads ``user`` per position: messages with one take the Python
    path (which keeps it), the parser's rows have none — as decode_document says."""
    raws = [encode_document("a", 1.0, counts=([1, 2], [1, 1])),
            encode_document("b", 2.0, counts=([3], [2]), user="alice"),
            encode_document("c", 3.0, text="w001x w002x", user="bob"),
            encode_document("d", 4.0, counts=([4, 9], [1, 3]))]
    assert parse(raws).pos.tolist() == [0, 3]
    db = DocumentBatch(raws, VOCAB)
    assert [db.user(i) for i in range(4)] == [decode_document(r).user for r in raws] == \
        [None, "alice", "bob", None]
    assert_batch_equal(raws)
