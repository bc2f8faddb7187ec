#!/usr/bin/env python3
"""Validate deploy/k8s offline.

* Built-in kinds against the Kubernetes OpenAPI schemas shipped by kubernetes-validate
  (strict: unknown fields fail), for the oldest and newest versions we support.
* KEDA ScaledObject, PodMonitor and PrometheusRule against small schemas of our own
  (deploy/k8s/schemas/), since their CRDs are not in those schemas.
* Cross-references a schema cannot see: names, ports, labels, the drain period, the
  stream and group KEDA watches, and the PrometheusRule matching the compose rules file.
"""
import json
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
# hostUsers with procMount: Unmasked needs 1.33+ (user namespaces on by default).
VERSIONS = ["1.33.0", kubernetes_validate.latest_version()]
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-scaledobject.schema.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.schema.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.schema.json",
}

errors: list[str] = []
checked = 0


def check(cond: bool, msg: str) -> None:
    global checked
    checked += 1
    if not cond:
        errors.append(msg)


def load_resources() -> dict[tuple[str, str], dict]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = kust["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    check(sorted(listed) == on_disk, f"kustomization resources {sorted(listed)} != files {on_disk}")
    out = {}
    for name in listed:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc is None:
                continue
            key = (doc["kind"], doc["metadata"]["name"])
            check(key not in out, f"{name}: duplicate {key}")
            out[key] = doc
            out[key]["__file"] = name
    return out


def validate_schemas(res: dict) -> None:
    for (kind, name), doc in res.items():
        fname = doc.pop("__file")
        crd = CRD_SCHEMAS.get((doc["apiVersion"], kind))
        if crd:
            schema = json.loads((SCHEMAS / crd).read_text())
            for err in jsonschema.Draft202012Validator(schema).iter_errors(doc):
                errors.append(f"{fname}: {kind}/{name}: {'.'.join(map(str, err.path))}: {err.message}")
            check(True, "")
            continue
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
                check(True, "")
            except kubernetes_validate.ValidationError as e:
                path = ".".join(map(str, e.path))
                errors.append(f"{fname}: {kind}/{name} (k8s {version}): {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError:
                errors.append(f"{fname}: {kind} {doc['apiVersion']} has no schema in k8s {version}")
        doc["__file"] = fname


def cross_check(res: dict) -> None:
    cm = res[("ConfigMap", "forkbox-worker")]["data"]
    dep = res[("Deployment", "forkbox-worker")]
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    (ctr,) = spec["containers"]
    sc = ctr["securityContext"]

    check(dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(),
          "Deployment selector does not match its pod labels")
    # Drain: the kubelet's SIGKILL must come after the node's own grace period.
    args = ctr["args"]
    grace = int(args[args.index("--grace") + 1]) if "--grace" in args else 30
    check(spec["terminationGracePeriodSeconds"] > grace,
          f"terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']} <= --grace {grace}")
    # What the sandbox needs (docs/operations.md, Kubernetes).
    check(sc["seccompProfile"]["type"] == "Unconfined", "worker seccompProfile must be Unconfined")
    check(sc["appArmorProfile"]["type"] in ("Unconfined", "Localhost"), "worker AppArmor must allow mount and userns")
    check(sc.get("procMount") == "Unmasked", "worker needs procMount: Unmasked")
    check(spec.get("hostUsers") is False, "procMount: Unmasked requires hostUsers: false")
    check(sc.get("allowPrivilegeEscalation") is False, "worker should set allowPrivilegeEscalation: false")
    check(sc.get("privileged") is not True, "worker must not be privileged")
    # Probes and metrics all name the port the node listens on.
    port = int(cm["FORKBOX_METRICS_ADDR"].rsplit(":", 1)[1])
    check(not cm["FORKBOX_METRICS_ADDR"].startswith("127."), "metrics must listen on the pod IP for probes")
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    check(ports.get("metrics") == port, f"container port 'metrics' != FORKBOX_METRICS_ADDR port {port}")
    for probe in ("readinessProbe", "livenessProbe"):
        http = ctr[probe]["httpGet"]
        check(http["path"] == "/healthz" and http["port"] == "metrics", f"{probe} must GET /healthz on metrics")
    check(ctr["envFrom"][0]["configMapRef"]["name"] == "forkbox-worker", "worker env does not come from the ConfigMap")

    # KEDA watches the stream and group the node consumes, sized by the node's slots.
    so = res[("ScaledObject", "forkbox-worker")]
    check(so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"], "ScaledObject targets another Deployment")
    queues = cm["FORKBOX_QUEUES"].split(",")
    kinds = set()
    for trig in so["spec"]["triggers"]:
        md = trig["metadata"]
        check(md["stream"] in {f"forkbox:{{{q}}}:jobs" for q in queues}, f"KEDA stream {md['stream']} is not a queue the workers read")
        check(md["consumerGroup"] == "workers", "KEDA consumerGroup must be workers")
        if "pendingEntriesCount" in md:
            kinds.add("pending")
            check(md["pendingEntriesCount"] == cm["FORKBOX_SLOTS"], "pendingEntriesCount should equal FORKBOX_SLOTS")
        if "lagCount" in md:
            kinds.add("lag")
        if ("Service", "forkbox-redis") in res:
            check(md["address"].split(".")[0] == "forkbox-redis", "KEDA address is not the forkbox-redis Service")
    check(kinds == {"pending", "lag"}, f"ScaledObject should scale on pending entries and lag, has {kinds}")
    check("forkbox-redis" in cm["FORKBOX_REDIS_URL"] or ("Service", "forkbox-redis") not in res,
          "FORKBOX_REDIS_URL does not point at the forkbox-redis Service")

    redis = res.get(("StatefulSet", "forkbox-redis"))
    if redis:
        rargs = redis["spec"]["template"]["spec"]["containers"][0]["args"]
        check(rargs[rargs.index("--appendonly") + 1] == "yes", "Redis must run with AOF on")
        check("noeviction" in rargs, "Redis must not evict queue keys (maxmemory-policy noeviction)")

    pm = res[("PodMonitor", "forkbox-worker")]
    check(pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(),
          "PodMonitor selector does not match the worker pods")
    check(all(e["port"] in ports for e in pm["spec"]["podMetricsEndpoints"]), "PodMonitor scrapes an unknown port")

    rules = yaml.safe_load((ROOT / "deploy/prometheus/forkbox-alerts.yml").read_text())
    pr = res[("PrometheusRule", "forkbox")]
    check(pr["spec"] == rules, "prometheusrule.yaml groups differ from deploy/prometheus/forkbox-alerts.yml")


def check_gateway(res: dict) -> None:
    """The gateway: restricted pod security, probes and Service on its port, the workers' queue."""
    cm = res[("ConfigMap", "forkbox-worker")]["data"]
    dep = res[("Deployment", "forkbox-gateway")]
    svc = res[("Service", "forkbox-gateway")]
    pod = dep["spec"]["template"]
    (ctr,) = pod["spec"]["containers"]
    sc = ctr["securityContext"]
    check(dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(),
          "gateway Deployment selector does not match its pod labels")
    check(svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items(),
          "gateway Service selector does not match the gateway pods")
    check(pod["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault",
          "the gateway runs no sandbox: it keeps the runtime's seccomp profile")
    check(sc.get("readOnlyRootFilesystem") is True and sc["capabilities"]["drop"] == ["ALL"]
          and sc.get("allowPrivilegeEscalation") is False, "gateway container must be restricted")
    check("hostUsers" not in pod["spec"] and "procMount" not in sc, "the gateway needs no user namespace tricks")
    args = ctr["args"]
    check(args[0] == "gateway" and "--listen" in args, "gateway args must start `gateway --listen ADDR`")
    port = int(args[args.index("--listen") + 1].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    check(ports.get("http") == port, f"container port 'http' != --listen port {port}")
    check(svc["spec"]["ports"][0]["targetPort"] == "http", "gateway Service must target port 'http'")
    for probe in ("readinessProbe", "livenessProbe"):
        http = ctr[probe]["httpGet"]
        check(http["path"] == "/healthz" and http["port"] == "http", f"gateway {probe} must GET /healthz on http")
    env = {e["name"]: e["valueFrom"]["configMapKeyRef"] for e in ctr["env"]}
    check(env["FORKBOX_REDIS_URL"]["key"] == "FORKBOX_REDIS_URL" and "FORKBOX_REDIS_URL" in cm,
          "gateway must use the workers' Redis")
    check(env["FORKBOX_QUEUE"]["key"] == "FORKBOX_QUEUES" and "," not in cm["FORKBOX_QUEUES"],
          "gateway queue must be the workers' (one queue)")


def self_test(res: dict) -> None:
    """The validators must reject known-bad documents, or a pass above means nothing."""
    import copy

    dep = copy.deepcopy(res[("Deployment", "forkbox-worker")])
    dep.pop("__file", None)
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["procMnt"] = "Unmasked"
    try:
        kubernetes_validate.validate(dep, VERSIONS[-1], strict=True)
        errors.append("self-test: strict validation accepted an unknown securityContext field")
    except kubernetes_validate.ValidationError:
        check(True, "")
    so = copy.deepcopy(res[("ScaledObject", "forkbox-worker")])
    so.pop("__file", None)
    so["spec"]["triggers"][0]["metadata"]["pendingEntriesCount"] = "4"
    schema = json.loads((SCHEMAS / CRD_SCHEMAS[("keda.sh/v1alpha1", "ScaledObject")]).read_text())
    check(not jsonschema.Draft202012Validator(schema).is_valid(so),
          "self-test: KEDA schema accepted a trigger with both lagCount and pendingEntriesCount")


def main() -> int:
    res = load_resources()
    self_test(res)
    validate_schemas(res)
    cross_check(res)
    check_gateway(res)
    for e in errors:
        print(f"FAIL: {e}")
    kinds = ", ".join(sorted({k for k, _ in res}))
    print(f"validated {len(res)} resources ({kinds}) against k8s {' and '.join(VERSIONS)}; {checked} checks, {len(errors)} failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
