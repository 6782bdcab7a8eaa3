"""Kafka services: the sketcher (consumer-group member), the release service, the demo.

Thin loops around the pure engine: messages → counts (``streamdp.messages``) →
sketches (``streamdp.services.partition_state``) → checkpoints
(``streamdp.kafka.state_store``) → epoch closes and releases
(``streamdp.continual``) → snapshots. Semantics: docs/services.md.
"""
