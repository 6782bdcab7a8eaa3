"""Public vocabularies from wordfreq (issue 11, part 1)."""
import hashlib
import importlib.metadata
import json

import pytest

from streamdp.cli import main
from streamdp.text.public_vocab import public_vocabulary, public_words
from streamdp.text.tokenizer import ENGLISH_STOP_WORDS, Tokenizer
from streamdp.text.vocabulary import Vocabulary

wordfreq = pytest.importorskip("wordfreq")


def test_words_are_what_the_tokenizer_emits_and_no_stop_words():
    tok = Tokenizer(stop_words="english")
    words = public_words("en", size=3000, tokenizer=tok)
    assert len(words) == len(set(words)) == 3000
    for w in words:
        assert tok.tokenize(w) == [w]          # the tokenizer maps the word to itself
        assert w not in ENGLISH_STOP_WORDS
    # order follows wordfreq's rank: the first word kept is the first non-stop entry that
    # tokenises to something
    first = next(t for e in wordfreq.top_n_list("en", 1000, wordlist="large")
                 for t in tok.tokenize(e))
    assert words[0] == first


def test_entries_are_normalised_like_documents():
    # "don't" becomes the stop word "don" (dropped); uppercase/composed forms are lowercased NFC
    tok = Tokenizer(stop_words="english")
    words = set(public_words("en", size=20000, tokenizer=tok))
    assert "don't" not in words and "don" not in words
    assert all(w == w.lower() for w in words)
    doc = tok.tokenize("The Government said the economy GREW, café owners and people agreed.")
    assert {"government", "economy", "people"} <= words & set(doc)


def test_cli_writes_vocabulary_with_content_id_and_sidecar(tmp_path, capsys):
    out = tmp_path / "v.txt"
    assert main(["vocab", "public", "--lang", "en", "--size", "500", "--out", str(out)]) == 0
    v = Vocabulary.load(out)
    assert len(v) == 500
    assert hashlib.sha256(out.read_bytes()).hexdigest()[:16] == v.vocabulary_id
    meta = json.loads((tmp_path / "v.txt.json").read_text())
    assert meta["vocabulary_id"] == v.vocabulary_id
    assert meta["source"] == "wordfreq"
    assert meta["source_version"] == importlib.metadata.version("wordfreq")
    assert "CC BY-SA 4.0" in meta["licence"]
    assert Tokenizer.from_config(meta["tokenizer"]) == Tokenizer(stop_words="english")
    assert v == public_vocabulary("en", size=500)[0]


def test_bad_requests_fail_clearly():
    with pytest.raises(ValueError, match="size"):
        public_words("en", size=0)
    with pytest.raises(ValueError, match="fewer than|yields only"):
        public_words("en", size=10**7, wordlist="small")
    with pytest.raises(ValueError, match="language|list"):
        public_words("xx-not-a-language", size=10)
