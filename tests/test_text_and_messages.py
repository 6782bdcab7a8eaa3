"""Tokenizer, public vocabulary, input-document messages, batching and DLQ headers."""
import hashlib
import pickle
import unicodedata
from collections import Counter

import msgpack
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdp.documents import as_count_batch
from streamdp.messages import (
    DLQ_HEADERS, ERROR_CLASSES, MALFORMED_MSGPACK, MAX_DLQ_MESSAGE_BYTES, CountBatch, Document,
    DocumentBatch, InvalidMessage, decode_document, dlq_headers, documents_to_counts, encode_document)
from streamdp.serialization import SchemaError
from streamdp.text.tokenizer import DEFAULT_PATTERN, ENGLISH_STOP_WORDS, Tokenizer
from streamdp.text.vocabulary import HEADER, Vocabulary


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def base(**overrides):
    msg = {"v": 1, "id": "doc-1", "ts": 1700000000.5, "text": "alpha beta gamma"}
    msg.update(overrides)
    return {k: v for k, v in msg.items() if v is not _DROP}


_DROP = object()


def error_class(raw, **kw):
    with pytest.raises(InvalidMessage) as info:
        decode_document(raw, **kw)
    return info.value.error_class


# --------------------------------------------------------------------------- tokenizer
class TestTokenizer:
    def test_default_lowercases_and_keeps_letter_runs(self):
        t = Tokenizer()
        assert t.pattern == DEFAULT_PATTERN
        assert t.tokenize("The QUICK brown-fox, 42 jumps_over x2 mp3 a I!") == \
            ["the", "quick", "brown", "fox"]

    def test_case_preserved_when_not_lowercasing(self):
        assert Tokenizer(lowercase=False).tokenize("Apple apple APPLE") == ["Apple", "apple", "APPLE"]

    def test_custom_pattern_whole_match_groups_ignored(self):
        t = Tokenizer(pattern=r"(\w)(\w+)")  # groups must not change the token
        assert t.tokenize("ab1 cd") == ["ab1", "cd"]
        assert Tokenizer(pattern=r"\S+").tokenize("C++ is #1") == ["c++", "is", "#1"]

    def test_empty_matches_skipped(self):
        assert Tokenizer(pattern=r"[a-z]*").tokenize("ab, cd") == ["ab", "cd"]

    def test_invalid_pattern_names_the_pattern(self):
        with pytest.raises(ValueError, match=r"invalid token pattern '\(\[a-'"):
            Tokenizer(pattern="([a-")

    def test_stop_words(self):
        text = "The cat and the hat are on the mat"
        assert Tokenizer(stop_words="english").tokenize(text) == ["cat", "hat", "mat"]
        assert Tokenizer(stop_words=None).tokenize(text)[:2] == ["the", "cat"]
        # custom lists are lowercased along with the text
        assert Tokenizer(stop_words=frozenset({"CAT", "Mat"})).tokenize(text) == \
            ["the", "and", "the", "hat", "are", "on", "the"]
        assert Tokenizer(stop_words={"Cat"}, lowercase=False).tokenize("Cat cat") == ["cat"]
        with pytest.raises(ValueError, match="unknown stop-word list"):
            Tokenizer(stop_words="german")

    def test_english_list_is_lowercase_function_words(self):
        assert all(w == w.lower() and w.isalpha() for w in ENGLISH_STOP_WORDS)
        assert {"the", "and", "of", "is", "would", "between"} <= ENGLISH_STOP_WORDS
        assert not {"people", "government", "data", "model"} & ENGLISH_STOP_WORDS

    def test_unicode(self):
        t = Tokenizer()
        nfd = unicodedata.normalize("NFD", "Café")
        assert nfd != "Café"
        assert t.tokenize(f"Café {nfd} Ünïcode ΑΘΗΝΑ Straße") == ["café", "café", "ünïcode", "αθηνα", "straße"]
        # without normalisation the combining accent (not a letter) ends the word early
        assert Tokenizer(normalize=None).tokenize(nfd) == ["cafe"]
        assert t.tokenize("emoji 🙂 between") == ["emoji", "between"]

    def test_max_token_length_drops(self):
        t = Tokenizer(max_token_length=5)
        assert t.tokenize("short muchlonger tiny") == ["short", "tiny"]
        assert len(Tokenizer(max_token_length=None).tokenize("a" * 10_000)) == 1
        with pytest.raises(ValueError):
            Tokenizer(max_token_length=0)

    def test_immutable_hashable_config_round_trip(self):
        t = Tokenizer(stop_words="english", max_token_length=20)
        assert Tokenizer.from_config(t.config()) == t
        assert hash(t) == hash(Tokenizer(stop_words=ENGLISH_STOP_WORDS, max_token_length=20))
        with pytest.raises(AttributeError):
            t.lowercase = False
        assert "words>" in repr(t)

    def test_rejects_non_str(self):
        with pytest.raises(TypeError):
            Tokenizer().tokenize(b"bytes")


# --------------------------------------------------------------------------- vocabulary
class TestVocabulary:
    def test_basic_protocol(self):
        v = Vocabulary(["apple", "banana", "cherry"])
        assert len(v) == 3 and v.words == ("apple", "banana", "cherry")
        assert v.index("banana") == 1 and v[np.int64(2)] == "cherry" and list(v) == list(v.words)
        assert "apple" in v and "durian" not in v and v.get("durian") is None
        with pytest.raises(KeyError):
            v.index("durian")

    def test_id_is_stable_content_hash(self, tmp_path):
        v = Vocabulary(["apple", "banana", "cherry"])
        expected = hashlib.sha256(f"{HEADER}\napple\nbanana\ncherry\n".encode()).hexdigest()[:16]
        assert v.id == v.vocabulary_id == expected
        assert Vocabulary(["apple", "banana", "cherry"]).id == v.id
        assert Vocabulary(["banana", "apple", "cherry"]).id != v.id  # order is identity
        path = tmp_path / "v.txt"
        v.save(path)
        assert hashlib.sha256(path.read_bytes()).hexdigest()[:16] == v.id

    def test_round_trip_with_and_without_header(self, tmp_path):
        words = ["zebra", "äpfel", "東京", "c++", "#tag", "new york"]
        v = Vocabulary(words)
        p = tmp_path / "v.txt"
        v.save(p)
        assert p.read_text("utf-8").splitlines()[0] == HEADER
        assert Vocabulary.load(p) == v
        p2 = tmp_path / "plain.txt"
        p2.write_bytes(("\r\n".join(words) + "\r\n").encode())  # no header, CRLF
        assert Vocabulary.load(p2) == v
        p3 = tmp_path / "nofinalnewline.txt"
        p3.write_bytes("\n".join(words).encode())
        assert Vocabulary.load(p3).id == v.id

    @pytest.mark.parametrize("content, line, what", [
        ("apple\nbanana\napple\n", 3, "duplicate word 'apple' \\(first on line 1\\)"),
        (f"{HEADER}\napple\n\nbanana\n", 3, "empty line"),
        ("apple\nbanana\n\n", 3, "empty line"),
        ("apple\n banana\n", 2, "whitespace"),
        (f"apple\n{HEADER}\n", 2, "header"),
    ])
    def test_bad_files_name_the_line(self, tmp_path, content, line, what):
        p = tmp_path / "bad.txt"
        p.write_text(content, encoding="utf-8")
        with pytest.raises(ValueError, match=f"bad.txt:{line}: .*{what}"):
            Vocabulary.load(p)

    def test_bad_utf8_names_the_line(self, tmp_path):
        p = tmp_path / "bad.txt"
        p.write_bytes(b"apple\nban\xffana\n")
        with pytest.raises(ValueError, match="bad.txt:2: not valid UTF-8"):
            Vocabulary.load(p)

    def test_constructor_validation(self):
        with pytest.raises(ValueError, match="duplicate"):
            Vocabulary(["a", "b", "a"])
        for bad in ["", "two\nlines", " padded"]:
            with pytest.raises(ValueError):
                Vocabulary(["ok", bad])
        with pytest.raises(TypeError):
            Vocabulary(["ok", 3])

    def test_build_ranks_by_df_with_codepoint_ties(self):
        docs = [["b", "a", "a", "c"], ["a", "b"], ["c", "d"], ["b", "e"]]
        v = Vocabulary.build(docs)
        assert v.words == ("b", "a", "c", "d", "e")  # df 3, 2, 2, 1, 1
        assert Vocabulary.build(docs, min_df=2).words == ("b", "a", "c")
        assert Vocabulary.build(docs, max_words=2).words == ("b", "a")

    def test_build_is_deterministic_under_permutation(self, rng):
        words = [f"w{i}" for i in range(60)]
        docs = [list(rng.choice(words, size=rng.integers(1, 20))) for _ in range(300)]
        v1 = Vocabulary.build(docs, max_words=25, min_df=2)
        perm = rng.permutation(len(docs))
        v2 = Vocabulary.build((docs[i][::-1] for i in perm), max_words=25, min_df=2)
        assert v1 == v2 and v1.id == v2.id
        with pytest.raises(TypeError, match="tokenize"):
            Vocabulary.build(["raw text documents"])
        with pytest.raises(ValueError):
            Vocabulary.build(docs, min_df=0)

    def test_vectorize_matches_counter(self, rng):
        vocab = Vocabulary(f"w{i}" for i in range(40))
        pool = [f"w{i}" for i in range(50)]  # w40..w49 unknown
        docs = [list(rng.choice(pool, size=rng.integers(0, 30))) for _ in range(200)]
        docs[3] = []
        X, unknown = vocab.vectorize(docs)
        assert isinstance(X, sp.csr_matrix) and X.dtype == np.float64 and X.shape == (200, 40)
        assert X.has_sorted_indices
        dense = np.zeros((200, 40))
        expected_unknown = np.zeros(200, dtype=np.int64)
        for i, doc in enumerate(docs):
            for w, c in Counter(doc).items():
                if w in vocab:
                    dense[i, vocab.index(w)] = c
                else:
                    expected_unknown[i] += c
        np.testing.assert_array_equal(X.toarray(), dense)
        np.testing.assert_array_equal(unknown, expected_unknown)
        assert unknown.dtype == np.int64
        canon = as_count_batch(X, n_features=40)
        assert (canon != X).nnz == 0 and canon.nnz == X.nnz

    def test_vectorize_edge_cases(self):
        vocab = Vocabulary(["a", "b"])
        X, unk = vocab.vectorize([])
        assert X.shape == (0, 2) and unk.shape == (0,)
        X, unk = vocab.vectorize([["zz", "zz"], []])
        assert X.nnz == 0 and list(unk) == [2, 0]
        with pytest.raises(TypeError, match="tokenize first"):
            vocab.vectorize(["a b"])
        np.testing.assert_array_equal(vocab.lookup(["b", "x", "a"]), [1, -1, 0])

    def test_vectorize_large_batch_matches_counter(self):
        # A large batch (its speed is measured in benchmarks/throughput.py, not here):
        # every row equals a per-document Counter over the known words.
        rng = np.random.default_rng(0)
        vocab = Vocabulary(f"w{i}" for i in range(20_000))
        pool = np.array([f"w{i}" for i in range(25_000)], dtype=object)
        docs = [list(pool[rng.integers(0, 25_000, size=50)]) for _ in range(2_000)]
        X, unknown = vocab.vectorize(docs)
        assert X.shape == (2_000, 20_000)
        for i in rng.choice(len(docs), size=200, replace=False):
            c = Counter(w for w in docs[i] if w in vocab)
            row = X.getrow(i)
            got = {vocab.words[j]: v for j, v in zip(row.indices, row.data)}
            assert got == c
            assert unknown[i] == sum(1 for w in docs[i] if w not in vocab)


# --------------------------------------------------------------------------- messages
VOCAB = Vocabulary(["alpha", "beta", "gamma", "delta", "epsilon"])


class TestDecode:
    def test_valid_kinds_round_trip(self):
        d = decode_document(encode_document("a", 5, text="Alpha beta"))
        assert d == Document("a", 5.0, "text", "Alpha beta") and isinstance(d.ts, float)
        d = decode_document(encode_document("b", 1.5, tokens=("alpha", "zeta")))
        assert (d.kind, d.payload) == ("tokens", ("alpha", "zeta"))
        d = decode_document(encode_document("c", 0, counts={3: 2, 0: 1}, vocabulary_id=VOCAB.id),
                            vocabulary=VOCAB)
        assert (d.kind, d.payload, d.vocabulary_id) == ("counts", ((3, 0), (2, 1)), VOCAB.id)
        d = decode_document(encode_document("d", 0, counts=(np.array([1, 2]), np.array([1, 1]))))
        assert d.payload == ((1, 2), (1, 1))

    def test_unknown_keys_ignored_and_payload_not_in_repr(self):
        d = decode_document(pack(base(extra={"x": [1]}, text="secret words here")))
        assert d.payload == "secret words here" and "secret" not in repr(d)

    @pytest.mark.parametrize("raw, cls", [
        (b"\xc1", "malformed_msgpack"),                       # never-used msgpack byte
        (b"\x93\x01", "malformed_msgpack"),                   # truncated array
        (b"", "malformed_msgpack"),
        (pack(base()) + b"\x00", "malformed_msgpack"),        # trailing data
        (b"\x81\x01\x02", "malformed_msgpack"),               # int map key (strict_map_key)
        (None, "malformed_msgpack"),                          # tombstone
        (pack(base(v=2)), "unsupported_version"),
        (pack(base(v=0)), "unsupported_version"),
        (pack(base(v=_DROP)), "missing_field"),
        (pack(base(id=_DROP)), "missing_field"),
        (pack(base(ts=_DROP)), "missing_field"),
        (pack(base(text=_DROP)), "missing_field"),
        (pack(base(text=_DROP, counts={"ids": [1]})), "missing_field"),
        (pack([1, "id", 2.0]), "wrong_type"),
        (pack(base(v="1")), "wrong_type"),
        (pack(base(v=True)), "wrong_type"),
        (pack(base(v=1.0)), "wrong_type"),
        (pack(base(ts="2024-01-01")), "wrong_type"),
        (pack(base(ts=True)), "wrong_type"),
        (pack(base(ts=None)), "wrong_type"),
        (pack(base(id=7)), "wrong_type"),
        (pack(base(text=["alpha"])), "wrong_type"),
        (pack(base(text=_DROP, tokens="alpha beta")), "wrong_type"),
        (pack(base(text=_DROP, tokens=["alpha", 3])), "wrong_type"),
        (pack(base(text=_DROP, counts=[[1], [2]])), "wrong_type"),
        (pack(base(text=_DROP, counts={"ids": [1.0], "counts": [1]})), "wrong_type"),
        (pack(base(text=_DROP, counts={"ids": [1], "counts": [True]})), "wrong_type"),
        (pack(base(text=b"caf\xe9 au lait")), "invalid_utf8"),  # bin with latin-1 bytes
        (pack(base(text=b"valid but bin")), "invalid_utf8"),    # bin where str expected
        (pack(base(id=b"\xff")), "invalid_utf8"),
        (pack(base(text=_DROP, tokens=["ok", b"\xfe"])), "invalid_utf8"),
        (b"\x84\xa1v\x01\xa2id\xa1x\xa2ts\x00\xa4text\xa2\xc3\x28", "invalid_utf8"),  # str type, bad bytes
        (pack(base(text="")), "empty_document"),
        (pack(base(text=" \n\t ")), "empty_document"),
        (pack(base(text=_DROP, tokens=[])), "empty_document"),
        (pack(base(text=_DROP, counts={"ids": [], "counts": []})), "empty_document"),
        (pack(base(text="word " * 300_000)), "too_large"),       # > 1 MiB default
        (pack(base(text=_DROP, tokens=["alpha"] * 101)), "too_large"),
        (pack(base(text=_DROP, counts={"ids": [0, 1], "counts": [60, 50]})), "too_large"),
        (pack(base(ts=float("nan"))), "invalid_value"),
        (pack(base(ts=float("inf"))), "invalid_value"),
        (pack(base(ts=-1)), "invalid_value"),
        (pack(base(id="")), "invalid_value"),
        (pack(base(id="x" * 257)), "invalid_value"),
        (pack(base(tokens=["alpha"])), "invalid_value"),          # two payloads
        (pack(base(text=_DROP, tokens=["alpha", ""])), "invalid_value"),
        (pack(base(text=_DROP, counts={"ids": [0, 1], "counts": [2, -1]})), "invalid_value"),
        (pack(base(text=_DROP, counts={"ids": [0, 1], "counts": [2, 0]})), "invalid_value"),
        (pack(base(text=_DROP, counts={"ids": [-3], "counts": [1]})), "invalid_value"),
        (pack(base(text=_DROP, counts={"ids": [0, 99], "counts": [1, 1]})), "invalid_value"),
        (pack(base(text=_DROP, counts={"ids": [0, 1], "counts": [1]})), "invalid_value"),
        (pack(base(text=_DROP, counts={"ids": [2, 2], "counts": [1, 1]})), "invalid_value"),
        (pack(base(text=_DROP, counts={"ids": [1], "counts": [1], "vocab": "0" * 16})), "invalid_value"),
    ])
    def test_error_classes(self, raw, cls):
        assert cls in ERROR_CLASSES
        assert error_class(raw, max_tokens=100, vocabulary=VOCAB) == cls

    def test_every_error_class_is_exercised(self):
        params = next(m for m in TestDecode.test_error_classes.pytestmark if m.name == "parametrize")
        assert {cls for _, cls in params.args[1]} == set(ERROR_CLASSES)

    def test_raw_size_limit_checked_before_unpacking(self):
        raw = pack(base(text="alpha " * 50))
        assert error_class(raw, max_bytes=len(raw) - 1) == "too_large"
        assert decode_document(raw, max_bytes=len(raw)).kind == "text"

    def test_out_of_range_ids_need_the_vocabulary(self):
        raw = pack(base(text=_DROP, counts={"ids": [0, 99], "counts": [1, 1]}))
        assert decode_document(raw).payload == ((0, 99), (1, 1))  # no vocabulary known here

    def test_invalid_message_is_a_schema_error_and_pickles(self):
        exc = InvalidMessage("too_large", "big")
        assert isinstance(exc, SchemaError) and isinstance(exc, ValueError)
        assert str(exc) == "too_large: big"
        back = pickle.loads(pickle.dumps(exc))
        assert (back.error_class, back.message) == ("too_large", "big")
        with pytest.raises(ValueError):
            InvalidMessage("no_such_class", "x")

    def test_non_bytes_is_a_programming_error(self):
        with pytest.raises(TypeError):
            decode_document("a str")

    def test_encode_refuses_what_decode_rejects(self):
        with pytest.raises(ValueError, match="exactly one"):
            encode_document("a", 1, text="x", tokens=["x"])
        with pytest.raises(InvalidMessage) as info:
            encode_document("a", -1, text="alpha")
        assert info.value.error_class == "invalid_value"
        with pytest.raises(TypeError):
            encode_document("a", 1, counts=([0], [1.5]))  # no silent truncation
        with pytest.raises(ValueError):
            encode_document("a", 1, text="lone \ud800 surrogate")
        with pytest.raises(ValueError, match="vocabulary_id"):
            encode_document("a", 1, text="x", vocabulary_id=VOCAB.id)


# --------------------------------------------------------------------------- batching
class TestDocumentsToCounts:
    def test_mixed_batch(self):
        tok = Tokenizer(stop_words="english")
        docs = [
            Document("t", 1.0, "text", "The alpha and the BETA, alpha! omega"),
            Document("k", 2.0, "tokens", ("gamma", "gamma", "Gamma", "zeta")),
            Document("c", 3.0, "counts", ((4, 0), (3, 1)), VOCAB.id),
            Document("bad-range", 4.0, "counts", ((5,), (1,))),
            Document("bad-vocab", 5.0, "counts", ((1,), (1,)), "f" * 16),
            Document("u", 6.0, "text", "nothing known here"),
        ]
        b = documents_to_counts(docs, tok, VOCAB)
        assert isinstance(b, CountBatch) and b.counts.shape == (4, 5) and b.n_docs == 4
        np.testing.assert_array_equal(b.counts.toarray(), [
            [2, 1, 0, 0, 0],
            [0, 0, 2, 0, 0],
            [1, 0, 0, 0, 3],
            [0, 0, 0, 0, 0],
        ])
        np.testing.assert_array_equal(b.index, [0, 1, 2, 5])
        np.testing.assert_array_equal(b.timestamps, [1.0, 2.0, 3.0, 6.0])
        assert b.doc_ids == ("t", "k", "c", "u")
        # stop words are gone before counting ("here" too); "omega" is unknown
        np.testing.assert_array_equal(b.n_tokens, [4, 4, 4, 2])
        np.testing.assert_array_equal(b.n_unknown, [1, 2, 0, 2])  # tokens matched verbatim
        assert b.total_tokens == 14 and b.total_unknown == 5 and b.n_empty == 1
        assert [(i, e.error_class) for i, e in b.errors] == [(3, "invalid_value"), (4, "invalid_value")]
        assert b.counts.dtype == np.float64 and b.counts.has_sorted_indices

    def test_text_token_limit_applies_after_tokenizing(self):
        docs = [Document("a", 0.0, "text", "alpha " * 11), Document("b", 0.0, "text", "alpha " * 10)]
        b = documents_to_counts(docs, Tokenizer(), VOCAB, max_tokens=10)
        assert [(i, e.error_class) for i, e in b.errors] == [(0, "too_large")]
        assert b.counts.toarray().tolist() == [[10, 0, 0, 0, 0]]

    def test_bad_document_leaves_good_rows_unchanged(self, rng):
        tok = Tokenizer()
        words = list(VOCAB.words) + ["other"]
        good = [Document(f"d{i}", float(i), "tokens", tuple(rng.choice(words, size=8)))
                for i in range(20)]
        bad = Document("bad", 0.0, "counts", ((99,), (1,)))
        alone = documents_to_counts(good, tok, VOCAB)
        mixed = documents_to_counts(good[:7] + [bad] + good[7:], tok, VOCAB)
        assert (alone.counts != mixed.counts).nnz == 0
        assert [i for i, _ in mixed.errors] == [7]

    def test_empty_batch(self):
        b = documents_to_counts([], Tokenizer(), VOCAB)
        assert b.counts.shape == (0, 5) and b.errors == () and b.timestamps.shape == (0,)

    def test_end_to_end_from_bytes(self):
        raws = [encode_document(f"d{i}", i, text=f"alpha beta gamma {'delta ' * i}") for i in range(5)]
        docs = [decode_document(r) for r in raws]
        b = documents_to_counts(docs, Tokenizer(), VOCAB)
        np.testing.assert_array_equal(b.counts[:, 3].toarray().ravel(), np.arange(5))


# --------------------------------------------------------------------------- DLQ headers
def test_dlq_headers():
    exc = InvalidMessage("wrong_type", "é" * 2000)
    headers = dlq_headers(exc, "docs", 3, 12345)
    assert [k for k, _ in headers] == list(DLQ_HEADERS)
    h = dict(headers)
    assert all(isinstance(v, bytes) for v in h.values())
    assert h["streamdp.error.class"] == b"wrong_type"
    assert len(h["streamdp.error.message"]) <= MAX_DLQ_MESSAGE_BYTES == 1024
    assert h["streamdp.error.message"].decode("utf-8") == "é" * 512  # cut on a character boundary
    assert (h["streamdp.source.topic"], h["streamdp.source.partition"], h["streamdp.source.offset"]) \
        == (b"docs", b"3", b"12345")
    assert DLQ_HEADERS == ("streamdp.error.class", "streamdp.error.message", "streamdp.source.topic",
                           "streamdp.source.partition", "streamdp.source.offset")
    with pytest.raises(TypeError):
        dlq_headers(ValueError("x"), "docs", 0, 0)


# --------------------------------------------------------------------------- fuzzing
msgpack_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
                   | st.floats(allow_nan=True) | st.text(max_size=20) | st.binary(max_size=20))
msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20)
field_values = {
    "v": st.sampled_from([1, 2, "1", None, True]) | msgpack_values,
    "id": st.text(max_size=300) | msgpack_values,
    "ts": st.floats(allow_nan=True) | st.integers(min_value=-5, max_value=2**64 - 1) | msgpack_values,
    "text": st.text(max_size=50) | msgpack_values,
    "tokens": st.lists(st.text(max_size=8) | msgpack_scalars, max_size=8) | msgpack_values,
    "counts": st.fixed_dictionaries(
        {}, optional={"ids": st.lists(st.integers(-3, 8) | msgpack_scalars, max_size=6) | msgpack_values,
                      "counts": st.lists(st.integers(-2, 40) | msgpack_scalars, max_size=6) | msgpack_values,
                      "vocab": st.just(VOCAB.id) | msgpack_values}) | msgpack_values,
}
document_like_maps = st.fixed_dictionaries({}, optional=field_values).flatmap(
    lambda d: st.dictionaries(st.text(max_size=6), msgpack_values, max_size=3).map(lambda extra: {**extra, **d}))

valid_payloads = (
    st.fixed_dictionaries({"text": st.text(min_size=1, max_size=40).filter(str.strip)})
    | st.fixed_dictionaries({"tokens": st.lists(st.sampled_from(["alpha", "beta", "zeta", "Gamma"]),
                                                min_size=1, max_size=10)})
    | st.fixed_dictionaries({"counts": st.dictionaries(st.integers(0, 4), st.integers(1, 5), min_size=1)
                             .map(lambda m: {"ids": list(m), "counts": list(m.values())})}))
valid_maps = st.tuples(
    st.fixed_dictionaries({"v": st.just(1), "id": st.text(min_size=1, max_size=20),
                           "ts": st.floats(0, 1e10) | st.integers(0, 2**40)}),
    valid_payloads).map(lambda t: {**t[0], **t[1]})


@st.composite
def mutated_maps(draw):
    """A valid document with one field deleted or replaced (also nested counts fields)."""
    obj = draw(valid_maps)
    key = draw(st.sampled_from(sorted(set(obj) | {"text", "tokens", "counts", "v", "extra"})))
    if "counts" in obj and draw(st.booleans()):
        sub = draw(st.sampled_from(["ids", "counts", "vocab"]))
        if draw(st.booleans()):
            obj["counts"].pop(sub, None)
        else:
            obj["counts"][sub] = draw(field_values["counts"].map(lambda c: c.get(sub) if isinstance(c, dict)
                                                                 else c) | msgpack_values)
    elif draw(st.booleans()):
        obj.pop(key, None)
    else:
        obj[key] = draw(field_values.get(key, msgpack_values))
    return obj


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_or_class(raw):
    try:
        doc = decode_document(raw, max_bytes=4096, max_tokens=30, vocabulary=VOCAB)
    except InvalidMessage as exc:
        assert exc.error_class in ERROR_CLASSES
        return None
    b = documents_to_counts([doc], Tokenizer(), VOCAB, max_tokens=30)  # must not raise either
    assert b.n_docs + len(b.errors) == 1
    return doc


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes(raw):
    _decode_or_class(raw)


@FUZZ
@given(st.binary(max_size=60))
def test_fuzz_map_prefixed_bytes(tail):
    _decode_or_class(b"\x84" + tail)  # a 4-entry map header followed by anything


@FUZZ
@given(msgpack_values)
def test_fuzz_arbitrary_msgpack_values(value):
    _decode_or_class(pack(value))


@FUZZ
@given(document_like_maps)
def test_fuzz_document_like_maps(obj):
    doc = _decode_or_class(pack(obj))
    if doc is not None:  # anything accepted re-encodes to an equivalent document
        kw = {"counts": doc.payload, "vocabulary_id": doc.vocabulary_id} if doc.kind == "counts" \
            else {doc.kind: doc.payload}
        assert decode_document(encode_document(doc.id, doc.ts, **kw)) == doc


@FUZZ
@given(valid_maps)
def test_fuzz_valid_maps_are_accepted(obj):
    doc = _decode_or_class(pack(obj))
    assert doc is not None and doc.kind in obj


@FUZZ
@given(mutated_maps())
def test_fuzz_mutated_documents(obj):
    doc = _decode_or_class(pack(obj))
    if doc is not None:
        kw = {"counts": doc.payload, "vocabulary_id": doc.vocabulary_id} if doc.kind == "counts" \
            else {doc.kind: doc.payload}
        assert decode_document(encode_document(doc.id, doc.ts, **kw), vocabulary=VOCAB) == doc


# --------------------------------------------------------------------------- bulk decoding
def _reference_batch(raws, max_bytes, max_tokens, rejected=None, reject=None):
    """decode_document per message, then documents_to_counts: what DocumentBatch must equal.
    ``reject(doc) -> InvalidMessage | None`` is applied between the two, like the sketcher's
    record-time check."""
    docs, pos, errors = [], [], dict(rejected or {})
    for i, raw in enumerate(raws):
        if i in errors:
            continue
        try:
            doc = decode_document(raw, max_bytes=max_bytes, max_tokens=max_tokens)
        except InvalidMessage as exc:
            errors[i] = exc
            continue
        exc = reject(doc) if reject is not None else None
        if exc is not None:
            errors[i] = exc
            continue
        docs.append(doc)
        pos.append(i)
    cb = documents_to_counts(docs, Tokenizer(), VOCAB, max_tokens=max_tokens)
    for j, exc in cb.errors:
        errors[pos[j]] = exc
    return cb, [pos[j] for j in cb.index], errors


def _bulk_batch(raws, max_bytes, max_tokens, rejected=None, reject=None):
    db = DocumentBatch(raws, VOCAB, max_bytes=max_bytes, max_tokens=max_tokens, rejected=rejected)
    if reject is not None:
        for i in db.valid.tolist():
            exc = reject(Document("", float(db.ts[i]), "text", ""))
            if exc is not None:
                db.reject(i, exc)
    return db.to_counts(Tokenizer())


def _assert_same_batch(raws, max_bytes=4096, max_tokens=30, rejected=None, reject=None):
    ref, ref_pos, ref_err = _reference_batch(raws, max_bytes, max_tokens, rejected, reject)
    got = _bulk_batch(raws, max_bytes, max_tokens, rejected, reject)
    assert got.index.tolist() == ref_pos
    X, R = got.counts, ref.counts
    assert X.shape == R.shape and X.dtype == R.dtype == np.float64
    assert X.has_canonical_format
    np.testing.assert_array_equal(X.indptr, R.indptr)
    np.testing.assert_array_equal(X.indices, R.indices)
    np.testing.assert_array_equal(X.data, R.data)
    np.testing.assert_array_equal(got.timestamps, ref.timestamps)
    assert got.doc_ids == ref.doc_ids
    np.testing.assert_array_equal(got.n_tokens, ref.n_tokens)
    np.testing.assert_array_equal(got.n_unknown, ref.n_unknown)
    assert [(i, e.error_class, e.message) for i, e in got.errors] == \
        [(i, e.error_class, e.message) for i, e in sorted(ref_err.items())]
    return got


_counts_maps = st.tuples(
    st.fixed_dictionaries({"v": st.just(1), "id": st.text(min_size=1, max_size=5),
                           "ts": st.floats(0, 1e10)}),
    st.lists(st.tuples(st.integers(-1, 6), st.integers(0, 12)), min_size=0, max_size=8),
    st.sampled_from([None, VOCAB.id, "other-vocabulary"])).map(
    lambda t: {**t[0], "counts": {"ids": [i for i, _ in t[1]], "counts": [c for _, c in t[1]],
                                  **({} if t[2] is None else {"vocab": t[2]})}})
_with_user = st.tuples(valid_maps | _counts_maps,
                       st.text(min_size=1, max_size=8) | st.just("") | st.text(min_size=257, max_size=260)
                       | msgpack_values).map(lambda t: {**t[0], "user": t[1]})
_batch_raws = st.lists(
    valid_maps.map(pack) | _counts_maps.map(pack) | mutated_maps().map(pack) | _with_user.map(pack)
    | document_like_maps.map(pack) | st.binary(max_size=40) | st.just(b""), max_size=25)


@FUZZ
@given(_batch_raws)
def test_bulk_decoding_equals_per_message_decoding(raws):
    _assert_same_batch(raws)
    # the Documents the bulk path builds itself (text, tokens) equal decode_document's, user included
    db = DocumentBatch(raws, VOCAB, max_bytes=4096, max_tokens=30)
    for i, doc in db.docs.items():
        assert doc == decode_document(raws[i], max_bytes=4096, max_tokens=30)
        assert doc.user == decode_document(raws[i], max_bytes=4096, max_tokens=30).user


@FUZZ
@given(_batch_raws, st.data())
def test_bulk_decoding_with_rejections(raws, data):
    """Positions refused before decoding, and documents refused after it by their ts (the
    sketcher's future check), get exactly those errors; the rest is unchanged."""
    pre = data.draw(st.sets(st.integers(0, max(len(raws) - 1, 0)), max_size=3)) if raws else set()
    rejected = {i: InvalidMessage(MALFORMED_MSGPACK, "null record value") for i in pre}
    cut = data.draw(st.floats(0, 1e10))

    def reject(doc):
        return InvalidMessage("invalid_value", f"ts {doc.ts!r} after {cut!r}") if doc.ts > cut else None
    _assert_same_batch(raws, rejected=rejected, reject=reject)


def test_bulk_decoding_each_bad_counts_document_alone(rng):
    """A bad message in the middle of a batch of counts documents gets its own error and the
    good rows are bit-identical to the batch without it (every way a counts document can be
    wrong that the bulk checks handle, and the per-message fallbacks)."""
    good = [encode_document(f"d{i}", 100.0 + i, counts=(sorted(rng.choice(5, 3, replace=False).tolist()),
                                                        rng.integers(1, 4, 3).tolist()))
            for i in range(12)]
    good.append(pack({"v": 1, "id": "unsorted", "ts": 5, "counts": {"ids": [4, 0, 2], "counts": [1, 2, 3]}}))
    good.append(pack({"v": 1, "id": "voc", "ts": 5, "counts": {"ids": [1], "counts": [3], "vocab": VOCAB.id}}))
    bads = {
        "duplicate id": {"ids": [1, 1], "counts": [1, 1]},
        "unsorted duplicate": {"ids": [3, 1, 3], "counts": [1, 1, 1]},
        "zero count": {"ids": [1, 2], "counts": [0, 1]},
        "negative id": {"ids": [-1, 2], "counts": [1, 1]},
        "id out of range": {"ids": [1, 5], "counts": [1, 1]},
        "too many tokens": {"ids": [1, 2], "counts": [20, 11]},
        "one huge count": {"ids": [1], "counts": [2**63 + 5]},
        "huge id": {"ids": [2**64 - 1], "counts": [1]},
        "bool id": {"ids": [True, 2], "counts": [1, 1]},
        "bool count": {"ids": [1, 2], "counts": [1, True]},
        "float count": {"ids": [1, 2], "counts": [1.0, 1]},
        "str id": {"ids": ["1"], "counts": [1]},
        "nested": {"ids": [[1]], "counts": [1]},
        "lengths differ": {"ids": [1, 2], "counts": [1]},
        "empty": {"ids": [], "counts": []},
        "other vocabulary": {"ids": [1], "counts": [1], "vocab": "v-other"},
        "nil vocabulary": {"ids": [1], "counts": [1], "vocab": None},
    }
    alone = _assert_same_batch(good)
    for name, body in bads.items():
        bad = pack({"v": 1, "id": name, "ts": 7.0, "counts": body})
        for at in (0, 5, len(good)):
            raws = good[:at] + [bad] + good[at:]
            got = _assert_same_batch(raws)
            assert [i for i, _ in got.errors] == [at], name
            assert (got.counts != alone.counts).nnz == 0, name


def test_bulk_decoding_mixed_kinds_keep_batch_order():
    raws = [encode_document("c0", 1, counts={0: 2, 3: 1}),
            encode_document("t1", 2, text="alpha beta beta zeta"),
            None,
            encode_document("k3", 3, tokens=["gamma", "delta", "zeta"]),
            encode_document("c4", 4, counts={4: 5}, vocabulary_id=VOCAB.id)]
    got = _assert_same_batch(raws)
    assert got.index.tolist() == [0, 1, 3, 4] and got.doc_ids == ("c0", "t1", "k3", "c4")
    assert [(i, e.error_class) for i, e in got.errors] == [(2, MALFORMED_MSGPACK)]
    with pytest.raises(KeyError):
        DocumentBatch(raws, VOCAB).reject(2, InvalidMessage("invalid_value", "x"))
