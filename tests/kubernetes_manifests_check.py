"""Checks Kubernetes manifests as far as a machine with no cluster allows.

Usage: kubernetes_manifests_check.py --help_text IMAGE=FILE... MANIFEST.yaml...

1. Typed decoding by kubectl's own API types, offline: workloads go through
   `kubectl set serviceaccount --local`, Services through
   `kubectl set selector --local` (both decode into the Go structs of the
   API and print the object back). A field of the wrong type fails the
   decode; a field the API does not have is dropped, so every field of the
   manifest must come back unchanged.
2. Kinds kubectl cannot decode offline (NetworkPolicy, Namespace,
   ServiceAccount, Secret, PersistentVolumeClaim) get a structural check of
   their known fields.
3. Cross references: Service selectors and NetworkPolicy selectors match
   pods; target ports are container ports; a StatefulSet's serviceName is
   a headless Service; mounts name volumes; Secret volumes name Secrets
   that exist, and their items name keys that exist; claim volumes name
   PersistentVolumeClaims that exist.
4. Every --flag in a container's args, and every CHORUS_* variable in its
   env, appears in the --help of the program its image runs.
Prints one "ok: ..." or "FAIL: ..." line per check and exits 1 on a failure.
"""

import json
import re
import subprocess
import sys

import yaml

failures = 0


def ok(message):
    print(f"ok: {message}")


def fail(message):
    global failures
    failures += 1
    print(f"FAIL: {message}")


def subset_diff(want, got, path=""):
    """The first place where `want` is not contained in `got`, or None."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{path or '.'}: expected an object, got {got!r}"
        for key, value in want.items():
            if key not in got:
                return f"{path}.{key}: dropped (not a field of this API type)"
            diff = subset_diff(value, got[key], f"{path}.{key}")
            if diff:
                return diff
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{path}: list changed: {want!r} -> {got!r}"
        for i, (w, g) in enumerate(zip(want, got)):
            diff = subset_diff(w, g, f"{path}[{i}]")
            if diff:
                return diff
        return None
    if want != got and str(want) != str(got):
        return f"{path}: {want!r} came back as {got!r}"
    return None


def kubectl_round_trip(doc):
    kind = doc["kind"]
    if kind in ("StatefulSet", "DaemonSet", "Deployment"):
        account = doc["spec"]["template"]["spec"].get("serviceAccountName", "default")
        command = ["kubectl", "set", "serviceaccount", "--local", "-f", "-", account, "-o", "json"]
    elif kind == "Service":
        selector = ",".join(f"{k}={v}" for k, v in sorted(doc["spec"]["selector"].items()))
        command = ["kubectl", "set", "selector", "--local", "-f", "-", selector, "-o", "json"]
    else:
        return None
    result = subprocess.run(command, input=json.dumps(doc), capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0:
        # One line, without kubectl's own log lines ("W1125 12:00:00.0 ...").
        lines = [l for l in result.stderr.splitlines() if not re.match(r"[IWE]\d{4} ", l)]
        return ("error", " ".join(l.strip() for l in lines))
    return ("ok", json.loads(result.stdout))


KNOWN_FIELDS = {
    "NetworkPolicy": {
        "spec": {"podSelector", "policyTypes", "ingress", "egress"},
        "rule": {"from", "to", "ports"},
        "peer": {"podSelector", "namespaceSelector", "ipBlock"},
        "port": {"port", "protocol", "endPort"},
    },
}


def check_network_policy(doc, name):
    known = KNOWN_FIELDS["NetworkPolicy"]
    spec = doc.get("spec", {})
    problems = [f"spec.{k}" for k in spec if k not in known["spec"]]
    if "podSelector" not in spec:
        problems.append("spec.podSelector missing")
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for i, rule in enumerate(spec.get(direction, [])):
            problems += [f"spec.{direction}[{i}].{k}" for k in rule if k not in known["rule"]]
            for j, peer in enumerate(rule.get(peers_key, [])):
                problems += [f"spec.{direction}[{i}].{peers_key}[{j}].{k}" for k in peer
                             if k not in known["peer"]]
            for j, port in enumerate(rule.get("ports", [])):
                problems += [f"spec.{direction}[{i}].ports[{j}].{k}" for k in port
                             if k not in known["port"]]
                if port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
                    problems.append(f"spec.{direction}[{i}].ports[{j}].protocol")
    for t in spec.get("policyTypes", []):
        if t not in ("Ingress", "Egress"):
            problems.append(f"spec.policyTypes: {t}")
    if problems:
        fail(f"{name}: unknown or bad fields: {', '.join(problems)}")
    else:
        ok(f"{name}: NetworkPolicy fields known")


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def main(argv):
    help_texts = {}
    files = []
    args = iter(argv)
    for arg in args:
        if arg == "--help_text":
            image, path = next(args).split("=", 1)
            with open(path) as f:
                help_texts[image] = f.read()
        else:
            files.append(arg)

    docs = []
    for path in files:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    docs.append(doc)
    ok(f"{len(docs)} objects parsed from {len(files)} file(s)")

    for doc in docs:
        for field in ("apiVersion", "kind", "metadata"):
            if field not in doc:
                fail(f"an object lacks {field}: {str(doc)[:80]}")
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}

    # 1 and 2: each object's own fields.
    for (kind, name), doc in named.items():
        label = f"{kind}/{name}"
        if doc["metadata"].get("namespace", "chorus") != "chorus" and kind != "Namespace":
            fail(f"{label}: namespace {doc['metadata']['namespace']}")
        result = kubectl_round_trip(doc)
        if result is not None:
            status, value = result
            if status == "error":
                fail(f"{label}: kubectl cannot decode it: {value}")
            else:
                diff = subset_diff(doc, value)
                if diff:
                    fail(f"{label}: {diff}")
                else:
                    ok(f"{label}: kubectl decodes every field")
        elif kind == "NetworkPolicy":
            check_network_policy(doc, label)
        elif kind == "Secret":
            if doc.get("type", "Opaque") == "kubernetes.io/tls" and not {
                    "tls.crt", "tls.key"} <= set(doc.get("data", {})):
                fail(f"{label}: a TLS Secret needs tls.crt and tls.key")
            else:
                ok(f"{label}: keys {sorted(doc.get('data', {}))}")
        elif kind == "PersistentVolumeClaim":
            known = {"accessModes", "resources", "storageClassName", "volumeMode", "selector",
                     "dataSource", "volumeName"}
            spec = doc.get("spec", {})
            modes = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
            problems = [f"spec.{k}" for k in spec if k not in known]
            problems += [f"spec.accessModes: {m}" for m in spec.get("accessModes", [])
                         if m not in modes]
            if "storage" not in spec.get("resources", {}).get("requests", {}):
                problems.append("spec.resources.requests.storage missing")
            (fail if problems else ok)(f"{label}: PersistentVolumeClaim fields "
                                       f"{', '.join(problems) or 'known'}")
        elif kind in ("Namespace", "ServiceAccount"):
            extra = set(doc) - {"apiVersion", "kind", "metadata", "automountServiceAccountToken"}
            (fail if extra else ok)(f"{label}: fields {sorted(doc)}")
        else:
            fail(f"{label}: no check for kind {kind}")

    # 3: references between objects.
    workloads = [d for d in docs if d["kind"] in ("StatefulSet", "DaemonSet", "Deployment")]
    pods = [(d, d["spec"]["template"]) for d in workloads]
    for workload, template in pods:
        label = f"{workload['kind']}/{workload['metadata']['name']}"
        selector = workload["spec"]["selector"]["matchLabels"]
        if not labels_match(selector, template["metadata"]["labels"]):
            fail(f"{label}: selector {selector} does not match its pod labels")
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in volumes and mount["name"] not in claims:
                    fail(f"{label}: mount {mount['name']} names no volume")
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if ("PersistentVolumeClaim", claim) not in named:
                    fail(f"{label}: volume {volume['name']} names no PersistentVolumeClaim {claim}")
            if "secret" not in volume:
                continue
            secret = named.get(("Secret", volume["secret"]["secretName"]))
            if secret is None:
                fail(f"{label}: volume {volume['name']} names no Secret "
                     f"{volume['secret']['secretName']}")
                continue
            for item in volume["secret"].get("items", []):
                if item["key"] not in secret.get("data", {}):
                    fail(f"{label}: Secret {secret['metadata']['name']} has no key {item['key']}")
        if workload["kind"] == "StatefulSet":
            service = named.get(("Service", workload["spec"]["serviceName"]))
            if service is None or service["spec"].get("clusterIP") != "None":
                fail(f"{label}: serviceName {workload['spec']['serviceName']} is no headless Service")
        ok(f"{label}: selectors, volumes, Secrets and keys resolve")

    for doc in docs:
        if doc["kind"] == "Service":
            label = f"Service/{doc['metadata']['name']}"
            targets = [t for w, t in pods if labels_match(doc["spec"]["selector"],
                                                          t["metadata"]["labels"])]
            if not targets:
                fail(f"{label}: selects no pod")
                continue
            ports = {p.get("name") for t in targets for c in t["spec"]["containers"]
                     for p in c.get("ports", [])}
            ports |= {p["containerPort"] for t in targets for c in t["spec"]["containers"]
                      for p in c.get("ports", [])}
            for port in doc["spec"]["ports"]:
                if port.get("targetPort", port["port"]) not in ports:
                    fail(f"{label}: targetPort {port.get('targetPort')} is no container port")
            ok(f"{label}: selects {len(targets)} pod template(s), ports resolve")
        if doc["kind"] == "NetworkPolicy":
            label = f"NetworkPolicy/{doc['metadata']['name']}"
            selected = [t for w, t in pods if labels_match(
                doc["spec"]["podSelector"].get("matchLabels", {}), t["metadata"]["labels"])]
            (ok if selected else fail)(f"{label}: applies to {len(selected)} pod template(s)")

    # 4: flags and variables the programs know.
    for workload, template in pods:
        for container in template["spec"]["containers"]:
            image = container["image"].split(":")[0]
            label = f"{workload['kind']}/{workload['metadata']['name']} ({image})"
            text = help_texts.get(image)
            if text is None:
                fail(f"{label}: no --help given for image {image}")
                continue
            unknown = [a.split("=")[0] for a in container.get("args", [])
                       if a.startswith("--") and a.split("=")[0] not in text]
            unknown += [e["name"] for e in container.get("env", [])
                        if e["name"].startswith("CHORUS_") and e["name"] not in text]
            if unknown:
                fail(f"{label}: the program does not know {unknown}")
            else:
                ok(f"{label}: every flag and CHORUS_ variable is the program's")

    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
