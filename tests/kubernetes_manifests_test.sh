#!/usr/bin/env bash
# deploy/kubernetes, validated without a cluster (kubectl has no API server
# to ask here): `kubectl kustomize` renders the installed manifests,
# make-secrets.sh makes the Secrets they mount (a CA-signed certificate for
# the Service's names, checked with openssl), and
# kubernetes_manifests_check.py decodes every workload and Service into
# kubectl's API types (`kubectl set ... --local`: no field dropped or
# mistyped), checks the other kinds' fields, the references between the
# objects, and that every flag and CHORUS_ variable is one the installed
# programs know. The Secrets' TLS certificate and tokens serve a real
# coordinator. A manifest with an unknown field must be caught.
#
# Usage (from Bazel): kubernetes_manifests_test.sh INSTALL CHECK_PY
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

INSTALL=$1
CHECK=$2
PREFIX="${TMP}/opt/chorus"
K8S="${PREFIX}/share/chorus/kubernetes"
PY=/usr/bin/python3  # Debian's, with python3-yaml
for tool in kubectl openssl; do
  command -v "${tool}" >/dev/null || { fail "${tool} missing: run deploy/setup.sh"; finish; }
done
"${PY}" -c 'import yaml' 2>/dev/null || { fail "python3-yaml missing: run deploy/setup.sh"; finish; }
# Nothing here may reach a cluster: a configuration that names none (an
# absent file would do too, but kubectl 1.20, Debian's, warns about it on
# every call).
export KUBECONFIG="${TMP}/no-cluster"
printf 'apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n' > "${KUBECONFIG}"

"${INSTALL}" --prefix "${PREFIX}" >"${TMP}/install.log" 2>&1 \
  || { fail "install: $(cat "${TMP}/install.log")"; finish; }

kubectl kustomize "${K8S}" > "${TMP}/cpu.yaml" 2>"${TMP}/kustomize.err" \
  && pass "kubectl kustomize: $(grep -c '^kind:' "${TMP}/cpu.yaml") objects" \
  || fail "kubectl kustomize: $(cat "${TMP}/kustomize.err")"

out=$("${K8S}/make-secrets.sh" "${TMP}/secrets" 2>&1) && [[ -s "${TMP}/secrets/secrets.yaml" ]] \
  && pass "make-secrets.sh: ${out}" || fail "make-secrets.sh: ${out}"
out=$(openssl verify -CAfile "${TMP}/secrets/ca.crt" "${TMP}/secrets/tls.crt" 2>&1) \
  && pass "certificate signed by the CA" || fail "openssl verify: ${out}"
sans=$(openssl x509 -in "${TMP}/secrets/tls.crt" -noout -ext subjectAltName 2>&1)
[[ "${sans}" == *"DNS:chorus-coordinator.chorus.svc,"* ]] && pass "certificate names the Service" \
  || fail "certificate names: ${sans}"
[[ "$(stat -c %a "${TMP}/secrets/admin.token")" == 600 ]] && pass "secret files are private" \
  || fail "admin.token mode $(stat -c %a "${TMP}/secrets/admin.token")"
out=$("${K8S}/make-secrets.sh" "${TMP}/secrets" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"exists"* ]] && pass "existing secrets are not overwritten" \
  || fail "make-secrets.sh over an existing dir rc=${rc}: ${out}"

# The Secrets' material works with Chorus itself: a coordinator with the
# manifest's TLS and token flags serves the CLI through localhost (what
# kubectl port-forward gives) with the admin token, and refuses the worker
# token an admin call.
COORDINATOR="${PREFIX}/bin/chorus-coordinator"
sec="${TMP}/secrets"
if start_coordinator -- --token_file "${sec}/tokens" --tls_cert "${sec}/tls.crt" --tls_key "${sec}/tls.key" \
     --checkpoint_data_port=-1; then
  cli=("${PREFIX}/bin/chorus" --coordinator "localhost:${COORDINATOR_PORT}" --tls_ca "${sec}/ca.crt" --timeout 10)
  out=$("${cli[@]}" --token_file "${sec}/admin.token" jobs 2>&1) && [[ "${out,,}" == "no jobs" ]] \
    && pass "TLS + admin token from the Secrets: chorus jobs answers" || fail "admin over TLS: ${out}"
  out=$("${cli[@]}" --token_file "${sec}/worker.token" jobs 2>&1) \
    && fail "the worker token listed jobs" \
    || { [[ "${out}" == *"needs a user or admin token"* ]] && pass "the worker token is refused job calls" \
         || fail "worker token: ${out}"; }
else
  fail "the coordinator did not start with the Secrets' TLS and tokens"
fi

"${PREFIX}/bin/chorus-coordinator" --help > "${TMP}/coordinator.help" 2>&1
"${PREFIX}/bin/chorus-worker" --help > "${TMP}/worker.help" 2>&1
helps=(--help_text "chorus-coordinator=${TMP}/coordinator.help"
       --help_text "chorus-worker=${TMP}/worker.help"
       --help_text "chorus-worker-cuda=${TMP}/worker.help")
manifests=("${TMP}/cpu.yaml" "${K8S}/cuda/worker-cuda-daemonset.yaml" "${TMP}/secrets/secrets.yaml")
"${PY}" "${CHECK}" "${helps[@]}" "${manifests[@]}" > "${TMP}/check.out" 2>&1; rc=$?
cat "${TMP}/check.out"
checks=$(grep -c '^ok:' "${TMP}/check.out")
[[ ${rc} -eq 0 && ${checks} -ge 20 ]] && pass "manifest checks: ${checks} ok" \
  || fail "manifest checks rc=${rc}: $(grep -v '^ok:' "${TMP}/check.out")"
grep -q 'nvidia.com/gpu: ' "${K8S}/cuda/worker-cuda-daemonset.yaml" \
  && grep -q -- '--device=cuda' "${K8S}/cuda/worker-cuda-daemonset.yaml" \
  && pass "the CUDA variant asks for GPUs and runs --device=cuda" || fail "CUDA variant"
grep -q 'prometheus.io/scrape' "${TMP}/cpu.yaml" && pass "Prometheus annotations" \
  || fail "no Prometheus annotations"

# deploy/kubernetes-ha: the same objects with three coordinators on a
# 3-member etcd StatefulSet (its flags checked against the installed
# etcd's --help) and a shared checkpoint claim.
K8S_HA="${PREFIX}/share/chorus/kubernetes-ha"
kubectl kustomize "${K8S_HA}" > "${TMP}/ha.yaml" 2>"${TMP}/kustomize-ha.err" \
  && pass "kubectl kustomize kubernetes-ha: $(grep -c '^kind:' "${TMP}/ha.yaml") objects" \
  || fail "kubectl kustomize kubernetes-ha: $(cat "${TMP}/kustomize-ha.err")"
/usr/bin/etcd --help > "${TMP}/etcd.help" 2>&1
ha_helps=("${helps[@]}" --help_text "quay.io/coreos/etcd=${TMP}/etcd.help")
"${PY}" "${CHECK}" "${ha_helps[@]}" "${TMP}/ha.yaml" "${TMP}/secrets/secrets.yaml" > "${TMP}/check-ha.out" 2>&1; rc=$?
cat "${TMP}/check-ha.out"
[[ ${rc} -eq 0 ]] && grep -q '^ok: StatefulSet/chorus-etcd (quay.io/coreos/etcd): every flag' "${TMP}/check-ha.out" \
  && grep -q '^ok: StatefulSet/chorus-coordinator (chorus-coordinator): every flag' "${TMP}/check-ha.out" \
  && pass "kubernetes-ha checks: $(grep -c '^ok:' "${TMP}/check-ha.out") ok" \
  || fail "kubernetes-ha checks rc=${rc}: $(grep -v '^ok:' "${TMP}/check-ha.out")"
python3 - "${TMP}/ha.yaml" <<'PY' && pass "kubernetes-ha: 3 coordinators on etcd, agents given all three" || fail "kubernetes-ha shape"
import sys, yaml
docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(open(sys.argv[1])) if d}
coordinator = docs[("StatefulSet", "chorus-coordinator")]["spec"]
etcd = docs[("StatefulSet", "chorus-etcd")]["spec"]
args = coordinator["template"]["spec"]["containers"][0]["args"]
env = {e["name"]: e.get("value") for e in
       docs[("DaemonSet", "chorus-worker")]["spec"]["template"]["spec"]["containers"][0]["env"]}
names = [f"chorus-coordinator-{i}.chorus-coordinator-headless.chorus.svc:29650" for i in range(3)]
assert coordinator["replicas"] == 3 and etcd["replicas"] == 3, "replicas"
assert docs[("Service", "chorus-etcd")]["spec"]["clusterIP"] == "None", "etcd headless"
assert any(a.startswith("--state=etcd://chorus-etcd-0.chorus-etcd.chorus.svc:2379,") for a in args), args
assert any(a.startswith("--advertise_address=$(POD_NAME).") for a in args), args
assert env["CHORUS_COORDINATOR"] == ",".join(names), env
PY
sans=$(openssl x509 -in "${TMP}/secrets/tls.crt" -noout -ext subjectAltName 2>&1)
[[ "${sans}" == *"DNS:*.chorus-coordinator-headless.chorus.svc"* ]] \
  && pass "the certificate names every coordinator pod" || fail "certificate names: ${sans}"

# The check can fail: an unknown field, a mistyped value, a flag the worker lacks.
sed 's/^      serviceAccountName: chorus$/&\n      serviceAcountName: chorus/' "${TMP}/cpu.yaml" > "${TMP}/bad1.yaml"
sed 's/readOnlyRootFilesystem: true/readOnlyRootFilesystem: "yes"/' "${TMP}/cpu.yaml" > "${TMP}/bad2.yaml"
sed 's/--device=cpu/--devices=cpu/' "${TMP}/cpu.yaml" > "${TMP}/bad3.yaml"
sed 's/--advertise_address=/--advertize_address=/' "${TMP}/ha.yaml" > "${TMP}/bad4.yaml"
sed 's/--initial-cluster-state=new/--initial-cluster-status=new/' "${TMP}/ha.yaml" > "${TMP}/bad5.yaml"
sed 's/claimName: chorus-checkpoints/claimName: chorus-checkpoint/' "${TMP}/ha.yaml" > "${TMP}/bad6.yaml"
helps=("${ha_helps[@]}")
for bad in bad1:serviceAcountName bad2:readOnlyRootFilesystem bad3:--devices bad4:--advertize_address \
           bad5:--initial-cluster-status bad6:chorus-checkpoint; do
  file=${bad%%:*} what=${bad#*:}
  out=$("${PY}" "${CHECK}" "${helps[@]}" "${TMP}/${file}.yaml" "${TMP}/secrets/secrets.yaml" 2>&1) \
    && fail "${what}: passed" \
    || { grep -q "FAIL: .*${what}" <<<"${out}" && pass "caught ${what}" \
         || fail "${what}: $(grep FAIL <<<"${out}")"; }
done
finish
