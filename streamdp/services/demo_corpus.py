"""A small, readable demo corpus: English-word topics sampled from an LDA model.

No download (the machine reaches only package registries): six hand-written
topics of everyday words, documents drawn by the LDA generative process and
written as plain text, so the demo exercises the tokenizer and vocabulary and
its released topics can be read by a person and compared with the truth.
"""
from __future__ import annotations

import numpy as np

TOPICS = {
    "football": "match goal team league coach striker keeper season score penalty referee stadium "
                "fans midfield defender transfer cup final win draw",
    "cooking": "recipe oven flour butter sugar garlic onion pepper salt bake simmer sauce pasta "
               "kitchen chef dough roast soup spice cream",
    "space": "rocket orbit planet moon launch satellite astronaut telescope galaxy star mission "
             "mars solar gravity comet crater lunar probe cosmic nebula",
    "markets": "stock market shares investor price bank interest inflation bond profit trading "
               "economy dividend earnings rate fund currency debt growth crash",
    "music": "guitar song album band concert drum singer melody chorus piano lyrics tour stage "
             "rhythm bass record studio vinyl festival jazz",
    "weather": "rain storm wind cloud forecast snow temperature sunny thunder flood humidity "
               "frost breeze drought hail fog heatwave climate season showers",
}
FILLER = ("today people said new year time week report good great really just many first "
          "also still local city").split()


def demo_vocabulary() -> list[str]:
    words = []
    for ws in TOPICS.values():
        for w in ws.split():
            if w not in words:
                words.append(w)
    return words + [w for w in FILLER if w not in words]


def topic_matrix(vocabulary: list[str], rng: np.random.Generator) -> np.ndarray:
    """(k, d) true topics: each topic's own words get most of the mass, filler a little."""
    index = {w: i for i, w in enumerate(vocabulary)}
    k, d = len(TOPICS), len(vocabulary)
    beta = np.full((k, d), 1e-4)
    for t, ws in enumerate(TOPICS.values()):
        own = [index[w] for w in ws.split()]
        beta[t, own] += rng.dirichlet(np.full(len(own), 2.0)) * 0.85
        filler = [index[w] for w in FILLER]
        beta[t, filler] += rng.dirichlet(np.ones(len(filler))) * 0.15
    return beta / beta.sum(axis=1, keepdims=True)


def sample_texts(n: int, *, alpha0: float = 1.0, mean_length: int = 40, seed: int = 0,
                 progress=None):
    """``n`` documents as text, with the (k, d) true topics and the vocabulary.
    ``progress`` (optional) is called with 1000 after every 1,000 documents (and the rest)."""
    rng = np.random.default_rng(seed)
    vocab = demo_vocabulary()
    topics = topic_matrix(vocab, rng)
    k = topics.shape[0]
    theta = rng.dirichlet(np.full(k, alpha0 / k), size=n)
    lengths = rng.poisson(mean_length, size=n) + 3
    texts = []
    words = np.array(vocab)
    for i in range(n):
        z = rng.choice(k, size=lengths[i], p=theta[i])
        ids = [rng.choice(len(vocab), p=topics[t]) for t in z] if lengths[i] < 8 else \
            _draw(rng, topics, z)
        texts.append(" ".join(words[ids]))
        if progress is not None and (i + 1) % 1000 == 0:
            progress(1000)
    if progress is not None and n % 1000:
        progress(n % 1000)
    return texts, topics, vocab


def _draw(rng, topics, z):
    out = np.empty(z.size, dtype=np.int64)
    for t in np.unique(z):
        m = z == t
        out[m] = rng.choice(topics.shape[1], size=int(m.sum()), p=topics[t])
    return out


def zipf_users(n: int, *, exponent: float = 2.0, max_per_user: int = 500,
               seed: int = 0) -> list[str]:
    """``n`` author ids: each user's number of documents drawn from a Zipf law (P(k) ∝ k^-a,
    capped at ``max_per_user``: most users write one or two documents, a few write hundreds),
    then the documents shuffled, so a user's documents are spread over the feed."""
    rng = np.random.default_rng(seed)
    counts: list[int] = []
    total = 0
    while total < n:
        c = int(min(rng.zipf(exponent), max_per_user, n - total))
        counts.append(c)
        total += c
    users = np.repeat(np.arange(len(counts)), counts)
    rng.shuffle(users)
    return [f"user-{u}" for u in users.tolist()]
