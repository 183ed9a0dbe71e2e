#!/usr/bin/env bash
# Makes the two Secrets the manifests mount, with fresh material:
#   chorus-tokens           tokens ("admin TOKEN" and "worker TOKEN" lines, for the
#                           coordinator), worker.token (agents and ranks), admin.token
#   chorus-coordinator-tls  tls.crt/tls.key (the coordinator, valid for
#                           chorus-coordinator[.chorus[.svc[.cluster.local]]] and,
#                           for kubectl port-forward, localhost and 127.0.0.1) and
#                           ca.crt (the private CA that signed it, for everyone else)
# Usage: make-secrets.sh DIR [NAMESPACE]
#   Writes the material (mode 0600) and DIR/secrets.yaml into DIR, which must
#   not exist yet; then: kubectl apply -f DIR/secrets.yaml. Keep DIR/admin.token
#   and DIR/ca.crt for the chorus CLI; the CA key can be deleted.
# Needs openssl and kubectl (offline: `kubectl create secret --dry-run=client`).
set -euo pipefail

die() { echo "make-secrets: error: $*" >&2; exit 2; }
[[ $# -ge 1 ]] || die "usage: make-secrets.sh DIR [NAMESPACE]"
dir=$1
namespace=${2:-chorus}
[[ ! -e "${dir}" ]] || die "${dir} exists; give a new directory (old secrets are not overwritten)"
for tool in openssl kubectl; do command -v "${tool}" >/dev/null || die "${tool} is not installed"; done
umask 077
mkdir -p "${dir}"

admin=$(openssl rand -hex 32)
worker=$(openssl rand -hex 32)
printf 'admin %s\nworker %s\n' "${admin}" "${worker}" > "${dir}/tokens"
printf '%s\n' "${admin}" > "${dir}/admin.token"
printf '%s\n' "${worker}" > "${dir}/worker.token"

service=chorus-coordinator
names="DNS:${service},DNS:${service}.${namespace},DNS:${service}.${namespace}.svc"
names+=",DNS:${service}.${namespace}.svc.cluster.local"
# Each coordinator pod of deploy/kubernetes-ha by name, as agents list them.
names+=",DNS:*.${service}-headless.${namespace}.svc"
# kubectl port-forward: the CLI dials localhost.
names+=",DNS:localhost,IP:127.0.0.1"
openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=Chorus CA (${namespace})" \
  -keyout "${dir}/ca.key" -out "${dir}/ca.crt" 2>/dev/null || die "openssl could not make the CA"
openssl req -newkey rsa:3072 -nodes -subj "/CN=${service}.${namespace}.svc" \
  -keyout "${dir}/tls.key" -out "${dir}/tls.csr" 2>/dev/null || die "openssl could not make the key"
openssl x509 -req -in "${dir}/tls.csr" -CA "${dir}/ca.crt" -CAkey "${dir}/ca.key" \
  -CAcreateserial -days 825 -out "${dir}/tls.crt" \
  -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "${names}") 2>/dev/null \
  || die "openssl could not sign the certificate"
rm -f "${dir}/tls.csr" "${dir}/ca.srl"

{
  kubectl create secret generic chorus-tokens --namespace "${namespace}" --dry-run=client -o yaml \
    --from-file=tokens="${dir}/tokens" --from-file=worker.token="${dir}/worker.token" \
    --from-file=admin.token="${dir}/admin.token"
  echo "---"
  kubectl create secret generic chorus-coordinator-tls --namespace "${namespace}" \
    --type=kubernetes.io/tls --dry-run=client -o yaml --from-file=tls.crt="${dir}/tls.crt" \
    --from-file=tls.key="${dir}/tls.key" --from-file=ca.crt="${dir}/ca.crt"
} > "${dir}/secrets.yaml" || die "kubectl could not write the Secrets"
echo "make-secrets: wrote ${dir}/secrets.yaml; apply it with: kubectl apply -f ${dir}/secrets.yaml"
