#!/usr/bin/env python3
"""The hand-written Strimzi schemas in k8s/schemas/strimzi/ -- their single source.

No package ships Strimzi's CRD schemas (the npm kubernetes-models packages have none), so the
Strimzi resources are checked against JSON schemas written here from Strimzi's documented fields
(Custom resource API reference) for the subset streamdp uses, cross-checked against the CRDs in
the strimzi-kafka-operator repository. They are stricter than the real CRDs: a field outside the
subset is rejected, so a typo fails, and so does a legitimate field nobody added here yet --
extend the subset below (from the Strimzi API reference), run this script, commit both.

    python k8s/schemas/strimzi_subset.py          # rewrite k8s/schemas/strimzi/*.json

tests/test_deploy.py fails if the JSON files differ from what this script writes.
"""
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "strimzi"
K8S = "https://kubernetes.io/api/_definitions.json#/$defs/"
OM = {"$ref": K8S + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
RR = {"$ref": K8S + "io.k8s.api.core.v1.ResourceRequirements"}
NPP = {"$ref": K8S + "io.k8s.api.networking.v1.NetworkPolicyPeer"}
SRC = {
  "strimzi_version": "1.0 (API kafka.strimzi.io/v1, introduced in 0.49; the only API served from 1.0)",
  "written_from": [
    "Strimzi documentation: Custom resource API reference (Kafka, KafkaNodePool, KafkaTopic, KafkaUser schema references)",
    "cross-checked against the openAPIV3Schema of the Strimzi CRDs in strimzi/strimzi-kafka-operator packaging/install/cluster-operator (040-Crd-kafka.yaml, 04A-Crd-kafkanodepool.yaml, 043-Crd-kafkatopic.yaml) and packaging/examples (kafka-persistent.yaml, topic/kafka-topic.yaml, which use kafka.strimzi.io/v1)",
  ],
  "scope": "Only the fields streamdp's manifests use or are likely to need. Anything else is rejected (stricter than the real CRD): extend this schema, from the Strimzi API reference, when a manifest needs a new field.",
}


def comment(kind):
    return (f"HAND-WRITTEN subset schema for Strimzi {kind} (kafka.strimzi.io/v1). No package ships "
            "Strimzi's CRD schemas, so this was written from Strimzi's documented fields; it is not "
            "the upstream CRD. Unknown fields are rejected (strict). See k8s/schemas/README.md.")


def meta(cluster_label):
    if not cluster_label:
        return OM
    return {"allOf": [OM, {"type": "object", "required": ["labels"],
            "properties": {"labels": {"type": "object", "required": ["strimzi.io/cluster"],
              "description": "The Strimzi operators only reconcile resources labelled with their Kafka cluster's name."}}}]}


def root(kind, spec, cluster_label):
    return {"$comment": comment(kind), "x-streamdp-source": SRC,
            "type": "object", "additionalProperties": False,
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"type": "string", "enum": ["kafka.strimzi.io/v1"]},
                           "kind": {"type": "string", "enum": [kind]},
                           "metadata": meta(cluster_label), "spec": spec}}


def obj(props, required=(), desc=None):
    d = {"type": "object", "additionalProperties": False, "properties": props}
    if required:
        d["required"] = list(required)
    if desc:
        d["description"] = desc
    return d


S = {"type": "string"}
B = {"type": "boolean"}
QTY = {"type": "string", "pattern": "^([0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"}
volume = obj({"id": {"type": "integer", "minimum": 0},
              "type": {"type": "string", "enum": ["ephemeral", "persistent-claim"]},
              "size": {"type": "string", "description": "Mandatory when type=persistent-claim, e.g. 100Gi."},
              "sizeLimit": QTY, "class": S, "deleteClaim": B,
              "kraftMetadata": {"type": "string", "enum": ["shared"]}},
             ["type"])
volume["allOf"] = [{"if": {"properties": {"type": {"const": "persistent-claim"}}},
                    "then": {"required": ["size"]}}]
storage = obj({"type": {"type": "string", "enum": ["ephemeral", "persistent-claim", "jbod"]},
               "volumes": {"type": "array", "minItems": 1, "items": volume},
               "size": S, "sizeLimit": QTY, "class": S, "deleteClaim": B,
               "kraftMetadata": {"type": "string", "enum": ["shared"]}}, ["type"],
              "Storage configuration (disk). Cannot be updated.")
storage["allOf"] = [{"if": {"properties": {"type": {"const": "jbod"}}}, "then": {"required": ["volumes"]}}]
jvm = obj({"-Xms": {"type": "string", "pattern": "^[0-9]+[mMgG]?$"},
           "-Xmx": {"type": "string", "pattern": "^[0-9]+[mMgG]?$"},
           "-XX": {"type": "object", "additionalProperties": {"type": "string"}},
           "gcLoggingEnabled": B,
           "javaSystemProperties": {"type": "array", "items": obj({"name": S, "value": S})}})
nodepool = root("KafkaNodePool", obj({
    "replicas": {"type": "integer", "minimum": 0},
    "roles": {"type": "array", "minItems": 1, "uniqueItems": True,
              "items": {"type": "string", "enum": ["controller", "broker"]}},
    "storage": storage, "resources": RR, "jvmOptions": jvm}, ["replicas", "roles", "storage"]), True)

auth = obj({"type": {"type": "string", "enum": ["tls", "scram-sha-512", "oauth", "custom"]}}, ["type"],
           "Listener authentication (subset: the type only, enough for tls and scram-sha-512).")
listener = obj({
    "name": {"type": "string", "pattern": "^[a-z0-9]{1,11}$"},
    "port": {"type": "integer", "minimum": 9092, "not": {"enum": [9404, 9999]},
             "description": "9092 and higher, except 9404 and 9999 (Prometheus and JMX)."},
    "type": {"type": "string", "enum": ["internal", "route", "loadbalancer", "nodeport", "ingress", "cluster-ip"]},
    "tls": B, "authentication": auth,
    "networkPolicyPeers": {"type": "array", "items": NPP}}, ["name", "port", "type", "tls"])
operator = obj({"watchedNamespace": S, "reconciliationIntervalMs": {"type": "integer", "minimum": 0},
                "resources": RR})
kafka = root("Kafka", obj({
    "kafka": obj({
        "version": S, "metadataVersion": S, "image": S,
        "listeners": {"type": "array", "minItems": 1, "items": listener},
        "config": {"type": "object", "description": "Kafka broker configuration (free-form; Strimzi forbids some prefixes such as listeners, advertised., sasl., ssl.)."},
        "authorization": obj({"type": {"type": "string", "enum": ["simple", "keycloak", "custom"]},
                              "superUsers": {"type": "array", "items": S}}, ["type"]),
        "rack": obj({"topologyKey": S}, ["topologyKey"]),
    }, ["listeners"]),
    "entityOperator": obj({"topicOperator": operator, "userOperator": operator}),
}, ["kafka"]), False)

topic = root("KafkaTopic", obj({
    "partitions": {"type": "integer", "minimum": 1},
    "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
    "config": {"type": "object", "description": "Topic configuration (free-form, x-kubernetes-preserve-unknown-fields in the CRD)."},
    "topicName": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,249}$"}}), True)

acl = obj({"resource": obj({"type": {"type": "string", "enum": ["topic", "group", "cluster", "transactionalId"]},
                            "name": S, "patternType": {"type": "string", "enum": ["literal", "prefix"]}}, ["type"]),
           "operations": {"type": "array", "minItems": 1, "items": {"type": "string", "enum": [
               "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "AlterConfigs",
               "DescribeConfigs", "IdempotentWrite", "All"]}},
           "host": S, "type": {"type": "string", "enum": ["allow", "deny"]}}, ["resource", "operations"])
user = root("KafkaUser", obj({
    "authentication": obj({"type": {"type": "string", "enum": ["tls", "tls-external", "scram-sha-512"]},
                           "password": obj({"valueFrom": obj({"secretKeyRef": {"$ref": K8S + "io.k8s.api.core.v1.SecretKeySelector"}}, ["secretKeyRef"])}, ["valueFrom"])},
                          ["type"]),
    "authorization": obj({"type": {"type": "string", "enum": ["simple"]},
                          "acls": {"type": "array", "items": acl}}, ["type", "acls"])}), True)

SCHEMAS = {"Kafka": kafka, "KafkaNodePool": nodepool, "KafkaTopic": topic, "KafkaUser": user}


def files() -> dict[str, str]:
    """``{file name: JSON text}`` of every schema."""
    return {f"{kind.lower()}-kafka.strimzi.io-v1.json": json.dumps(schema, indent=1) + "\n"
            for kind, schema in SCHEMAS.items()}


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, text in files().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
