"""Loading for ``streamdp report``: a thin layer over the public reader API
(:mod:`streamdp.snapshots`), which reads a snapshot folder or file, the release service over
HTTP, or the snapshots topic. Every failure becomes a :class:`ReportInputError` with a one-line
message naming the input and the fix (the CLI prints it; no traceback)."""
from __future__ import annotations

import os
from pathlib import Path

from streamdp import snapshots as reader
from streamdp.snapshot import TopicSnapshot
from streamdp.text.vocabulary import Vocabulary


class ReportInputError(ValueError):
    """The report's input is missing or is not what it should be."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def open_source(source: str | os.PathLike | reader.Source, *, timeout: float = 30.0) -> reader.Source:
    """A :class:`streamdp.snapshots.Source` for a folder or file path, an ``http(s)://`` URL of
    the release service, or ``kafka://BOOTSTRAP/TOPIC``."""
    if isinstance(source, reader.Source):
        return source
    s = str(source)
    try:
        if s.startswith(("http://", "https://")):
            return reader.HttpSource(s, timeout=timeout)
        if s.startswith("kafka://"):
            return reader.open_source(s, timeout=timeout)
    except ValueError as exc:
        raise ReportInputError(_one_line(exc)) from None
    p = Path(s)
    if not p.exists():
        raise ReportInputError(f"no snapshot folder or file at {s!r}: pass the release service's "
                               "snapshot_dir, one epoch-*.msgpack file, its HTTP address "
                               "(http://HOST:PORT) or --bootstrap for the snapshots topic")
    if p.is_file() and p.read_bytes()[:64].lstrip()[:1] == b"{":
        raise ReportInputError(f"{p} is JSON, not a snapshot (latest.json holds only the top "
                               "words): pass the snapshot folder or an epoch-*.msgpack file")
    return reader.DirectorySource(p)


def load_snapshots(source: reader.Source) -> list[TopicSnapshot]:
    """Every release the source holds, in release order, each release once."""
    try:
        snaps = list(reader.releases(source))
    except (reader.SourceError, ValueError) as exc:
        raise ReportInputError(_one_line(exc)) from None
    if not snaps:
        where = source.path if isinstance(source, reader.DirectorySource) else source
        raise ReportInputError(f"no snapshots in {where} (the release service writes "
                               "epoch-*.msgpack files to its snapshot_dir and publishes to "
                               "<topic_prefix>.snapshots)")
    return snaps


def load_vocabulary(path: str | os.PathLike | None, source: reader.Source | None = None) -> Vocabulary:
    """The vocabulary file ``path``, else the source's own (a folder's vocabulary.txt, the
    release service's GET /vocabulary.txt); the snapshots topic has none."""
    if path is None:
        try:
            vocab = None if source is None else reader.vocabulary(source)
        except (reader.SourceError, OSError, ValueError) as exc:
            raise ReportInputError(f"cannot read the vocabulary of {source}: {_one_line(exc)}") from None
        if vocab is None:
            raise ReportInputError(
                f"no vocabulary with the snapshots of {source}: pass --vocabulary FILE, the "
                "vocabulary they were released with (the release service writes "
                "<snapshot_dir>/vocabulary.txt; the snapshots topic does not carry it)")
        return vocab
    p = Path(path)
    if not p.is_file():
        raise ReportInputError(f"no vocabulary file at {str(p)!r} (--vocabulary): pass the "
                               "vocabulary the snapshots were released with")
    try:
        return Vocabulary.load(p)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReportInputError(f"cannot read the vocabulary file {str(p)!r}: {_one_line(exc)}") from None
