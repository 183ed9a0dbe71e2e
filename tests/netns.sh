# Private networks for the tests that cut, slow or lose packets on one
# link (issue 56, gray failure). Sourced after lib.sh:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"
#   netns_hub my_test                    # or the test is skipped, saying why
#   netns_host c 1; netns_host a 2       # 10.213.0.1 and 10.213.0.2 on one bridge
#   ip netns exec "$(ns a)" iptables ...
#
# What it provides:
#   netns_hub TEST                 a namespace holding a bridge; skips TEST
#                                  (exit 0, a skipped XML result) when
#                                  namespaces cannot be made (not root)
#   netns_host NAME N              a namespace NAME with address 10.213.0.N/24
#                                  on the bridge, loopback up
#   netns_tun_host NAME N          the same address on a TUN device whose
#                                  packets a relay process carries to the hub
#   ns NAME                        the namespace's full name
#   netns_cut NAME ADDR...         drop every packet between NAME and each
#                                  ADDR (iptables inside NAME's namespace)
#   netns_heal NAME ADDR...        take those rules out again
#   netns_tokens                   TMP/tokens (admin and worker) and
#                                  TMP/admin.token, TMP/worker.token: a
#                                  coordinator listening on a non-loopback
#                                  address needs them
#
# Everything is made inside namespaces of this test's own (named after its
# pid): the veth pairs are created in them, never in the machine's own
# namespace, and the iptables rules live in them; on exit every process in
# them is killed and the namespaces are deleted, which takes their
# interfaces, bridge and rules with them. Traffic goes only to 10.213.0.0/24
# inside them.

_netns_names=()
ns() { echo "chorus-$$-$1"; }

netns_skip() {
  echo "SKIPPED: $2"
  if [[ -n "${XML_OUTPUT_FILE:-}" ]]; then
    cat >"${XML_OUTPUT_FILE}" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="$1" tests="1" skipped="1">
<testcase name="$1" classname="$1"><skipped message="$2"/></testcase>
</testsuite></testsuites>
XML
  fi
  exit 0
}

# Registers namespace NAME for deletion at exit, with every process in it.
_netns_add() {
  local full
  full=$(ns "$1")
  on_exit "ip netns pids '${full}' 2>/dev/null | xargs -r kill -KILL 2>/dev/null; ip netns del '${full}' 2>/dev/null"
  ip netns add "${full}"
}

netns_hub() {
  _NETNS_TEST=$1
  _netns_add hub 2>"${TMP}/netns.err" \
    || netns_skip "$1" "cannot create network namespaces here ($(head -1 "${TMP}/netns.err")); needs root and iproute2"
  ip -n "$(ns hub)" link add br0 type bridge || netns_skip "$1" "cannot create a bridge"
  ip -n "$(ns hub)" link set br0 up
}

netns_host() {
  local full hub
  full=$(ns "$1"); hub=$(ns hub)
  _netns_add "$1" || netns_skip "${_NETNS_TEST}" "cannot create namespace ${full}"
  ip link add eth0 netns "${full}" type veth peer name "to-$1" netns "${hub}" \
    || netns_skip "${_NETNS_TEST}" "cannot create a veth pair"
  ip -n "${hub}" link set "to-$1" master br0
  ip -n "${hub}" link set "to-$1" up
  ip -n "${full}" addr add "10.213.0.$2/24" dev eth0
  ip -n "${full}" link set lo up
  ip -n "${full}" link set eth0 up
}

# netns_tun_host NAME N: a namespace NAME whose only link, the TUN device
# tun0 with 10.213.0.N/24, ends in the hub's TUN device to-NAME; whatever
# holds both devices' other ends (tests/delay_relay.py) carries the packets.
# The hub routes 10.213.0.N to to-NAME and answers ARP for it on the bridge.
netns_tun_host() {
  local full hub
  full=$(ns "$1"); hub=$(ns hub)
  _netns_add "$1" || netns_skip "${_NETNS_TEST}" "cannot create namespace ${full}"
  ip -n "${full}" tuntap add dev tun0 mode tun && ip -n "${hub}" tuntap add dev "to-$1" mode tun \
    || netns_skip "${_NETNS_TEST}" "cannot create TUN devices"
  ip -n "${full}" addr add "10.213.0.$2/24" dev tun0
  ip -n "${full}" link set lo up
  ip -n "${full}" link set tun0 up
  ip -n "${hub}" link set "to-$1" up
  ip -n "${hub}" route add "10.213.0.$2/32" dev "to-$1"
  ip -n "${hub}" addr add 10.213.0.254/24 dev br0 2>/dev/null  # once for every such host
  ip netns exec "${hub}" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.br0.proxy_arp=1 \
    net.ipv4.neigh.br0.proxy_delay=0
}

# -I puts the rules first; -D takes out one copy each.
_netns_rules() {
  local op=$1 name=$2 addr
  shift 2
  for addr in "$@"; do
    ip netns exec "$(ns "${name}")" iptables "${op}" INPUT -s "${addr}" -j DROP || return 1
    ip netns exec "$(ns "${name}")" iptables "${op}" OUTPUT -d "${addr}" -j DROP || return 1
  done
}
netns_cut() { _netns_rules -I "$@"; }
netns_heal() { _netns_rules -D "$@"; }

netns_tokens() {
  local admin worker
  admin=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  worker=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf 'admin %s\nworker %s\n' "${admin}" "${worker}" >"${TMP}/tokens"
  echo "${admin}" >"${TMP}/admin.token"
  echo "${worker}" >"${TMP}/worker.token"
  # Token files readable by others are refused.
  chmod 600 "${TMP}/tokens" "${TMP}/admin.token" "${TMP}/worker.token"
}
