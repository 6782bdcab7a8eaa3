"""Turn raw document text into tokens, the same way for the public corpus and the stream.

The vocabulary (``streamdp.text.vocabulary``) is built from a *public* corpus with a
tokenizer, and stream documents sent as ``text`` are tokenized by the sketcher with a
tokenizer. The two must be configured identically, otherwise words silently fall out of the
vocabulary; :meth:`Tokenizer.config` gives a plain dict to store next to the vocabulary.

Processing order for one document:

1. Unicode normalisation (``normalize``, default NFC, so "café" typed with a combining accent
   and "café" typed precomposed are the same token);
2. lowercasing (``str.lower``) if ``lowercase``;
3. every non-empty match of ``pattern`` (``re.finditer``, whole match, groups ignored);
4. tokens longer than ``max_token_length`` characters are dropped (not truncated);
5. stop words are dropped.

The default pattern ``(?u)\\b[^\\W\\d_]{2,}\\b`` keeps runs of two or more Unicode letters
between word boundaries: digits, underscores and punctuation separate tokens, and words that
contain digits or underscores (``mp3``, ``covid19``, ``snake_case``) are not tokens at all,
because the ``\\b`` boundaries do not match inside them. Apostrophes split words ("don't" -> "don", the lone "t" is
dropped for being one letter). Scripts written without spaces (Chinese, Japanese, Thai) are not
segmented: a whole run of letters is one token, so such corpora need a custom pattern or
pre-tokenized ``tokens`` messages.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PATTERN = r"(?u)\b[^\W\d_]{2,}\b"
DEFAULT_MAX_TOKEN_LENGTH = 64
_NORMAL_FORMS = ("NFC", "NFKC", "NFD", "NFKD")

# Common English function words: articles, pronouns and their possessive and reflexive forms,
# auxiliary and modal verbs with their inflections, prepositions, conjunctions, determiners,
# quantifiers and frequent adverbs. Written for streamdp (it is not a copy of any published
# stop-word file; the idea follows the usual lists such as the Glasgow IR one), lowercase, and
# deliberately modest: content words that are merely frequent ("new", "said", "people") are left
# to the vocabulary's document-frequency cut-off. One-letter words are listed for completeness
# although the default pattern never produces them. Contractions appear as the pieces the
# default pattern produces ("don", "isn", "ll", "ve", "re").
ENGLISH_STOP_WORDS: frozenset[str] = frozenset("""
a an the
i me my mine myself we us our ours ourselves
you your yours yourself yourselves
he him his himself she her hers herself it its itself
they them their theirs themselves
one ones oneself
this that these those
who whom whose which what whatever whoever whichever
am is are was were be been being
have has had having
do does did doing done
will would shall should can could may might must ought
don doesn didn isn aren wasn weren hasn haven hadn wouldn shan shouldn
cannot couldn mightn mustn needn ll ve re
not no nor
and or but if then else so than too very
because since unless until while whereas although though
as at by for from in into of off on onto out over under
to up down with within without about above below across after against along
among around before behind beneath beside besides between beyond during
except inside near outside per through throughout toward towards upon via
again further once
here there where when why how
all any both each either neither every few more most other others some such
much many several own same
only just also even still yet already ever never always often sometimes
now however therefore thus hence
whether
etc
""".split())


def _normalise_stop_words(stop_words: Any, lowercase: bool) -> frozenset[str]:
    if stop_words is None:
        return frozenset()
    if isinstance(stop_words, str):
        if stop_words == "english":
            words: Iterable[str] = ENGLISH_STOP_WORDS
        else:
            raise ValueError(f"unknown stop-word list {stop_words!r}: use 'english', None, "
                             "or a collection of words")
    else:
        words = stop_words
    out = set()
    for w in words:
        if not isinstance(w, str):
            raise TypeError(f"stop words must be strings, got {type(w).__name__}")
        out.add(w.lower() if lowercase else w)
    return frozenset(out)


@dataclass(frozen=True)
class Tokenizer:
    """Regex tokenizer with lowercasing, Unicode normalisation and stop words.

    Parameters
    ----------
    pattern : str
        Regular expression for one token (default :data:`DEFAULT_PATTERN`: two or more
        letters). The whole match is the token; groups are ignored and empty matches skipped.
        It is applied to the normalised, lowercased text.
    lowercase : bool
        Lowercase with ``str.lower`` before matching (stop words are lowercased too).
    stop_words : "english", collection of str, or None
        Tokens to drop. ``"english"`` is :data:`ENGLISH_STOP_WORDS`.
    max_token_length : int or None
        Drop (not truncate) tokens longer than this many characters; None disables.
    normalize : "NFC", "NFKC", "NFD", "NFKD" or None
        Unicode normal form applied first (None: the text is used as given).

    Instances are immutable, hashable and compare by configuration.
    """

    pattern: str = DEFAULT_PATTERN
    lowercase: bool = True
    stop_words: Any = None
    max_token_length: int | None = DEFAULT_MAX_TOKEN_LENGTH
    normalize: str | None = "NFC"
    _regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            raise TypeError(f"pattern must be a str, got {type(self.pattern).__name__}")
        try:
            regex = re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"invalid token pattern {self.pattern!r}: {exc}") from exc
        if self.max_token_length is not None:
            if isinstance(self.max_token_length, bool) or not isinstance(self.max_token_length, int) \
                    or self.max_token_length < 1:
                raise ValueError(f"max_token_length must be a positive int or None, "
                                 f"got {self.max_token_length!r}")
        if self.normalize is not None and self.normalize not in _NORMAL_FORMS:
            raise ValueError(f"normalize must be one of {_NORMAL_FORMS} or None, got {self.normalize!r}")
        object.__setattr__(self, "lowercase", bool(self.lowercase))
        object.__setattr__(self, "stop_words", _normalise_stop_words(self.stop_words, self.lowercase))
        object.__setattr__(self, "_regex", regex)

    def __repr__(self) -> str:
        return (f"Tokenizer(pattern={self.pattern!r}, lowercase={self.lowercase}, "
                f"stop_words=<{len(self.stop_words)} words>, "
                f"max_token_length={self.max_token_length}, normalize={self.normalize!r})")

    def tokenize(self, text: str) -> list[str]:
        """Tokens of one document, in order of appearance (duplicates kept)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.normalize is not None:
            text = unicodedata.normalize(self.normalize, text)
        if self.lowercase:
            text = text.lower()
        regex = self._regex
        # Without groups, findall returns exactly the whole matches finditer yields (empty ones
        # included), in one C call.
        tokens = regex.findall(text) if regex.groups == 0 else [m.group(0) for m in regex.finditer(text)]
        maxlen, stop = self.max_token_length, self.stop_words
        if not stop and "" not in tokens and (maxlen is None or max(map(len, tokens), default=0) <= maxlen):
            return tokens          # nothing to drop: the filters below would copy the list unchanged
        if maxlen is not None or stop:
            tokens = [t for t in tokens
                      if t and (maxlen is None or len(t) <= maxlen) and t not in stop]
        else:
            tokens = [t for t in tokens if t]
        return tokens

    __call__ = tokenize

    def config(self) -> dict[str, Any]:
        """Plain, msgpack/JSON-friendly configuration (stop words sorted)."""
        return {"pattern": self.pattern, "lowercase": self.lowercase,
                "stop_words": sorted(self.stop_words), "max_token_length": self.max_token_length,
                "normalize": self.normalize}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Tokenizer":
        return cls(**config)
