"""The commands that make a deployment's public inputs: ``vocab public``, ``vocab private``
(docs/vocabulary.md) and ``public-start`` (docs/services.md "The start").

``vocab private`` spends budget on its own documents (an accountant on --ledger or in memory);
the other two cost none.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from streamdp.cli.common import (HelpFormatter, positive_float, positive_int, probability,
                                 read_documents)
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.noise import (DEFAULT_SAMPLER, SAMPLER_KINDS, make_sampler,
                                    require_production_sampler)
from streamdp.public_start import PublicStart
from streamdp.start import save_public_start
from streamdp.text.public_vocab import public_vocabulary, write_sidecar
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocab_selection import (InsufficientSelection, SelectionConfig,
                                           default_candidates, select_from_documents)
from streamdp.text.vocabulary import Vocabulary


def _vocab_public(a) -> int:
    tok = Tokenizer(stop_words=None if a.keep_stop_words else "english")
    vocab, meta = public_vocabulary(a.lang, size=a.size, tokenizer=tok, wordlist=a.wordlist)
    vocab.save(a.out)
    side = write_sidecar(a.out, meta)
    print(f"wrote {a.out}: {len(vocab)} words, vocabulary id {vocab.vocabulary_id} "
          f"(wordfreq {meta['source_version']}, {a.wordlist!r} list, {a.lang}); provenance and "
          f"licence in {side}; privacy cost: none")
    return 0


def _public_start(a) -> int:
    """Fit the public start: topics without privacy on documents the operator declares public."""
    tok = Tokenizer.from_config(a.tokenizer) if a.tokenizer else Tokenizer()
    vocab = Vocabulary.load(a.vocabulary)
    docs = read_documents(a.input, tok)
    X, _ = vocab.vectorize(docs)
    keep = np.asarray(X.sum(axis=1)).ravel() >= 3          # the engine's MIN_DOC_LENGTH
    if keep.sum() < 2 * a.topics:
        raise SystemExit(f"{a.input}: {int(keep.sum())} documents with >= 3 vocabulary words; a "
                         f"public start of {a.topics} topics needs more public documents")
    start = PublicStart.fit(X[keep], a.topics, source=a.source, alpha0=a.alpha0, seed=a.seed)
    save_public_start(start, a.out, vocab)
    print(f"wrote {a.out}: {a.topics} topics on vocabulary {vocab.vocabulary_id}, fitted without "
          f"privacy on {int(keep.sum())} documents of {a.input} (source: {a.source!r}); privacy "
          f"cost: none - you declare these documents public (every snapshot's report says so)")
    return 0


def _vocab_private(a) -> int:
    tok = Tokenizer(stop_words="english")
    cfg = SelectionConfig(size=a.size, max_words_per_doc=a.max_words_per_doc,
                          candidates=a.candidates_mode, new_words=not a.no_new_words,
                          max_new_words_per_doc=a.max_new_words_per_doc,
                          min_words=a.min_words)
    cands = Vocabulary.load(a.candidates) if a.candidates else default_candidates(tok)
    docs = read_documents(a.input, tok)
    require_production_sampler(a.sampler, a.non_production, field="--sampler")
    accountant = Accountant(a.epsilon, a.delta, a.ledger if a.ledger else MemoryLedger())
    try:
        sel = select_from_documents(docs, epsilon=a.epsilon, delta=a.delta, config=cfg,
                                    candidates=cands, spender=accountant,
                                    sampler=make_sampler(a.sampler))
    except InsufficientSelection as exc:
        # the library's advice names the services' options; this command has its own
        why = str(exc).split(" Fix: ")[0].rstrip(". ")
        print(f"streamdp: error: {why}. Fix: more documents in --in, a larger --epsilon, a "
              "smaller --min-words, --candidates-mode public (all ρ for words outside the list), "
              "or a public vocabulary (`streamdp vocab public`), which costs nothing.",
              file=sys.stderr)
        return 2
    sel.vocabulary.save(a.out)
    report = {**sel.report, "tokenizer": tok.config(), "accountant": accountant.report(),
              "candidates_source": a.candidates or "wordfreq top 100,000 (streamdp vocab public)"}
    side = write_sidecar(a.out, report)
    above = sel.report.get("n_candidates_above_cut")
    filled = (len(sel.vocabulary) - sel.report["n_new_words"] - above) if above is not None else None
    counts = (f"{above:,} rose above the noise, {filled:,} filled in by public rank, "
              if filled is not None else "")
    print(f"wrote {a.out}: {len(sel.vocabulary)} words ({counts}{sel.report['n_new_words']} "
          f"outside the public list), vocabulary id {sel.vocabulary.vocabulary_id}; privacy report in {side}: "
          f"(ε={a.epsilon:g}, δ={a.delta:g}) per document of {a.input} "
          f"(ρ={sel.report['rho']:.4g}, δ of the partition selection "
          f"{sel.report['delta_approximate']:.3g})")
    return 0


def _add_vocab_private(vsub) -> None:
    vv = vsub.add_parser("private", help="DP selection of a vocabulary from documents",
                         formatter_class=HelpFormatter,
                         description="Select a vocabulary with differential privacy from the "
                                     "documents of --in (its own documents: do not also use them "
                                     "in the warm-up or the stream, docs/vocabulary.md): noisy "
                                     "document frequencies over a public candidate list (top "
                                     "--size) plus words outside it by OpenDP partition "
                                     "selection. Writes the vocabulary and FILE.json (privacy "
                                     "report). Exit 2 if the documents are too few for the budget.")
    vv.add_argument("--in", dest="input", required=True,
                    help="documents: JSONL ({'text': ...} or {'tokens': [...]}) or one per line")
    vv.add_argument("--out", required=True, help="vocabulary file to write (and OUT.json)")
    vv.add_argument("--epsilon", type=positive_float, required=True,
                    help="ε of the selection, per document of --in")
    vv.add_argument("--delta", type=probability, default=1e-6, help="δ of the selection")
    vv.add_argument("--size", type=positive_int, default=5000, help="words kept from the candidates")
    vv.add_argument("--candidates", help="public candidate vocabulary file (default: wordfreq "
                                         "top 100,000)")
    vv.add_argument("--candidates-mode", choices=("noisy", "public"), default="noisy",
                    help="noisy: top --size by noisy document frequency; public: the first --size "
                         "candidates, ρ all for new words")
    vv.add_argument("--max-words-per-doc", type=positive_int, default=32,
                    help="distinct candidate words one document contributes at most")
    vv.add_argument("--max-new-words-per-doc", type=positive_int, default=8,
                    help="distinct words outside the candidates one document contributes at most")
    vv.add_argument("--no-new-words", action="store_true",
                    help="only candidates (no partition selection, no δ spent)")
    vv.add_argument("--min-words", type=positive_int, default=10,
                    help="fewest words a useful selection has (exit 2 below it)")
    vv.add_argument("--ledger", help="privacy ledger file to charge (default: in memory)")
    vv.add_argument("--sampler", choices=SAMPLER_KINDS, default=DEFAULT_SAMPLER,
                    help="noise sampler (docs/privacy_accounting.md)")
    vv.add_argument("--non-production", action="store_true",
                    help="allow an unvetted --sampler (fast, google): tests and benchmarks only")
    vv.set_defaults(func=_vocab_private)


def add_vocab(sub) -> None:
    """``streamdp vocab public`` and ``streamdp vocab private``."""
    v = sub.add_parser("vocab", help="build a vocabulary: public (wordfreq) or privately selected",
                       description="Vocabularies that are not taken from the protected documents "
                                   "(docs/vocabulary.md).")
    vsub = v.add_subparsers(dest="vocab_command", required=True)
    vp = vsub.add_parser("public", help="the N most frequent public words (wordfreq), no budget",
                         formatter_class=HelpFormatter,
                         description="The --size most frequent words of wordfreq's list for "
                                     "--lang, tokenised exactly as streamdp's tokenizer does, minus "
                                     "its English stop words; provenance and licence in FILE.json.")
    vp.add_argument("--lang", default="en", help="wordfreq language code")
    vp.add_argument("--size", type=positive_int, default=5000, help="number of words")
    vp.add_argument("--wordlist", default="large", choices=("large", "best", "small"),
                    help="wordfreq word list")
    vp.add_argument("--keep-stop-words", action="store_true",
                    help="keep stop words (only if your tokenizer keeps them too)")
    vp.add_argument("--out", required=True, help="vocabulary file to write")
    vp.set_defaults(func=_vocab_public)
    _add_vocab_private(vsub)


def add_public_start(sub) -> None:
    """``streamdp public-start``."""
    ps = sub.add_parser("public-start", help="fit the public start: topics on documents you "
                                             "declare public, no privacy, no budget",
                        formatter_class=HelpFormatter,
                        description="Fits topics without privacy (streamdp.fit, non-private) on "
                                    "documents the operator declares public (e.g. its public help "
                                    "pages) and writes the public start file that 'start: public' "
                                    "(or auto) with 'public_start_file' reads. Costs no budget; "
                                    "recorded in every snapshot's privacy report as public input.")
    ps.add_argument("--in", dest="input", required=True,
                    help="public documents: JSONL ({\"text\": ...} per line) or one document per line")
    ps.add_argument("--vocabulary", required=True, help="the deployment's vocabulary file")
    ps.add_argument("--topics", type=positive_int, required=True, help="n_topics of the deployment")
    ps.add_argument("--source", required=True,
                    help="what the public documents are (goes into every privacy report)")
    ps.add_argument("--out", required=True, help="public start file to write (JSON)")
    ps.add_argument("--alpha0", type=positive_float, default=1.0, help="Dirichlet concentration α0")
    ps.add_argument("--seed", type=int, default=0, help="seed of the fit")
    ps.add_argument("--tokenizer", type=json.loads, default=None,
                    help="the deployment's 'tokenizer' settings as JSON (default: the default)")
    ps.set_defaults(func=_public_start)
