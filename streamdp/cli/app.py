"""streamdp: differentially private streaming topic models on Kafka.

Start here:
  streamdp demo                      broker + 2 sketchers + release service on a readable corpus
  streamdp simulate --epsilon 1      the in-process engine on a synthetic LDA stream

Run a deployment (every service reads the same --config JSON file; flags override it,
STREAMDP_<FIELD> environment variables override both — see docs/configuration.md):
  streamdp broker                    the embedded Kafka-protocol broker (Tansu) on loopback
  streamdp sketcher --config c.json  a consumer-group member that sketches its partitions
  streamdp release  --config c.json  closes epochs, spends the budget, publishes snapshots
  streamdp produce  --config c.json corpus.jsonl     load documents into the documents topic
  streamdp control  --config c.json flush            ask the release service to close epochs
  streamdp topics   --snapshot-dir snapshots --vocabulary vocab.txt   print the latest topics
                                     (--json: the same as JSON; reading snapshots from code:
                                     streamdp.snapshots, docs/consumers.md)
  streamdp report   snapshots --out report.html    HTML page: topics, their history, privacy spent

Vocabularies (docs/vocabulary.md):
  streamdp vocab public  --lang en --size 5000 --out vocab.txt        from wordfreq, no budget
  streamdp vocab private --epsilon 1 --in docs.jsonl --out vocab.txt  DP selection from documents
"""
from __future__ import annotations

import argparse
import os
import sys

from streamdp.cli import deployment, first_steps, inputs, readers

# The module docstring above is the top-level --help text (description=__doc__).


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamdp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    # in the order --help lists them
    first_steps.add_simulate(sub)
    first_steps.add_demo(sub)
    deployment.add_broker(sub)
    inputs.add_vocab(sub)
    deployment.add_sketcher(sub)
    deployment.add_release(sub)
    inputs.add_public_start(sub)
    deployment.add_produce(sub)
    deployment.add_control(sub)
    readers.add_topics(sub)
    readers.add_report(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:       # includes ConfigError: bad configuration says what to fix
        print(f"streamdp: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:         # the reader went away (`streamdp topics --json | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        return 1
