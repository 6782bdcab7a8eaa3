"""Public vocabularies built from a published word-frequency list (``wordfreq``), not from the
protected documents.

Source: the ``wordfreq`` package (Robyn Speer et al., PyPI), whose English "large" list ranks
about 200,000 words by their frequency in public text (Wikipedia, subtitles, news, books, web
text, Reddit, Twitter up to 2021). Code Apache-2.0; the frequency data CC BY-SA 4.0 (wordfreq's
README). Nothing here reads the stream, so such a vocabulary costs no privacy budget.

Words must match what streamdp's tokenizer emits, otherwise a word of the list would never
occur in a count row. Every wordfreq entry, in rank order, is therefore passed through the same
:class:`~streamdp.text.tokenizer.Tokenizer` that counts the documents (Unicode normalisation,
lowercasing, the token pattern, the length limit and its stop words), and every token it yields
is kept at the rank of the first entry that produced it ("don't" yields "don", a stop word, so
nothing; "e-mail" yields "mail"). Stop words are therefore the tokenizer's own list
(``stop_words="english"``: :data:`~streamdp.text.tokenizer.ENGLISH_STOP_WORDS`, a public list
written for streamdp, in its source); wordfreq ships no stop-word list.

The vocabulary file is the usual one (:mod:`streamdp.text.vocabulary`: same format, same content
id). Its provenance goes into a JSON sidecar ``<file>.json`` (:func:`write_sidecar`): source,
version, licence, list, language, size, tokenizer configuration and the vocabulary id, so the
sidecar names the exact file it describes.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
from typing import Any

from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary

WORDFREQ_LICENCE = ("wordfreq (https://github.com/rspeer/wordfreq): code Apache-2.0; word "
                    "frequency data CC BY-SA 4.0, built from public text (Wikipedia, OpenSubtitles, "
                    "news, books, web text, Reddit, Twitter). Attribution: Robyn Speer, wordfreq.")
DEFAULT_WORDLIST = "large"


def _wordfreq():
    try:
        import wordfreq
    except ImportError as exc:   # a dependency, but say what to do if it is missing
        raise ImportError("public vocabularies need the 'wordfreq' package: "
                          "pip install 'wordfreq>=3.1'") from exc
    return wordfreq


def wordfreq_version() -> str:
    return importlib.metadata.version("wordfreq")


def public_words(lang: str = "en", *, size: int | None = None, tokenizer: Tokenizer | None = None,
                 wordlist: str = DEFAULT_WORDLIST) -> list[str]:
    """The ``size`` most frequent wordfreq words of ``lang`` as ``tokenizer`` emits them.

    ``size=None``: every word of the list. Raises ValueError if the list has fewer than
    ``size`` usable words (the message gives the count).
    """
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"size must be a positive int, got {size!r}")
    tok = tokenizer if tokenizer is not None else Tokenizer(stop_words="english")
    wf = _wordfreq()
    try:
        ranked = wf.top_n_list(lang, 10**7, wordlist=wordlist)
    except (LookupError, ValueError) as exc:
        raise ValueError(f"wordfreq has no {wordlist!r} list for language {lang!r}: {exc}") from None
    if not ranked:
        raise ValueError(f"wordfreq has no {wordlist!r} word list for language {lang!r}; "
                         f"languages with one: {sorted(wf.available_languages(wordlist))}")
    out: list[str] = []
    seen: set[str] = set()
    for entry in ranked:
        for t in tok.tokenize(entry):
            if t not in seen:
                seen.add(t)
                out.append(t)
        if size is not None and len(out) >= size:
            return out[:size]
    if size is not None and len(out) < size:
        raise ValueError(f"wordfreq's {wordlist!r} list for {lang!r} yields only {len(out)} "
                         f"distinct tokens after tokenisation and stop words, fewer than "
                         f"size={size}: ask for at most {len(out)}")
    return out


def public_vocabulary(lang: str = "en", *, size: int = 5000, tokenizer: Tokenizer | None = None,
                      wordlist: str = DEFAULT_WORDLIST) -> tuple[Vocabulary, dict[str, Any]]:
    """(vocabulary of the ``size`` most frequent public words, its provenance dict)."""
    tok = tokenizer if tokenizer is not None else Tokenizer(stop_words="english")
    vocab = Vocabulary(public_words(lang, size=size, tokenizer=tok, wordlist=wordlist))
    meta = {"vocabulary_id": vocab.vocabulary_id, "size": len(vocab), "selection": "public",
            "privacy_cost": "none (no protected document is read)",
            "source": "wordfreq", "source_version": wordfreq_version(), "wordlist": wordlist,
            "lang": lang, "licence": WORDFREQ_LICENCE,
            "ranking": "wordfreq frequency rank; each entry tokenised by the tokenizer below, "
                       "a token kept at the rank of its first entry",
            "stop_words": "the tokenizer's own list (tokenizer.stop_words)",
            "tokenizer": tok.config()}
    return vocab, meta


def sidecar_path(path: str | os.PathLike) -> str:
    return os.fspath(path) + ".json"


def write_sidecar(path: str | os.PathLike, meta: dict[str, Any]) -> str:
    """Write ``meta`` as ``<path>.json`` (atomically); returns the sidecar's path."""
    side = sidecar_path(path)
    tmp = f"{side}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=2, sort_keys=True, default=float)
        fh.write("\n")
    os.replace(tmp, side)
    return side
