#!/usr/bin/env bash
# deploy/container, checked as far as a machine without an image registry or
# a container builder allows (docs/operating.md says what else was verified
# by hand):
#   - build.sh assembles each role's build context from an installed tree
#     (the programs of that role, the package list, image-setup.sh);
#   - the package list provides every shared library the role's programs
#     load: the Debian package of each ELF NEEDED entry is listed, or a
#     dependency of a listed package, or essential; and every listed package
#     exists in bookworm (apt-cache, offline);
#   - containerfile_check.py lints each Containerfile against its context;
#   - image-setup.sh parses and rejects a bad role.
#
# Usage (from Bazel): container_definitions_test.sh INSTALL BUILD_SH CHECK_PY
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

INSTALL=$1
BUILD_SH=$2
CHECK=$3
PY=/usr/bin/python3
TREE="${TMP}/tree"

"${INSTALL}" --prefix /opt/chorus --destdir "${TREE}" >"${TMP}/install.log" 2>&1 \
  || { fail "install: $(cat "${TMP}/install.log")"; finish; }

declare -A expected_programs=([coordinator]="chorus-coordinator chorus" \
                              [worker]="chorus-worker chorus-rank chorus-trainer chorus-script-export chorus")
for role in coordinator worker; do
  ctx="${TMP}/context-${role}"
  out=$("${BUILD_SH}" "${role}" --tree "${TREE}" --context "${ctx}" --context-only 2>&1); rc=$?
  [[ ${rc} -eq 0 && "${out}" == "${ctx}" ]] && pass "${role}: build context assembled" \
    || { fail "${role}: build.sh rc=${rc}: ${out}"; continue; }
  have=$(ls "${ctx}/opt/chorus/bin" | sort | paste -sd' ')
  want=$(tr ' ' '\n' <<<"${expected_programs[${role}]}" | sort | paste -sd' ')
  [[ "${have}" == "${want}" ]] && pass "${role}: programs ${have}" || fail "${role}: programs '${have}', want '${want}'"

  packages_file="${ctx}/chorus-image/${role}.packages"
  mapfile -t listed < <(grep -v '^#' "${packages_file}")
  known=$(apt-cache show --no-all-versions "${listed[@]}" 2>/dev/null | awk '/^Package:/ {print $2}')
  unknown=()
  for p in "${listed[@]}"; do grep -qxF "${p}" <<<"${known}" || unknown+=("${p}"); done
  [[ ${#unknown[@]} -eq 0 ]] && pass "${role}: all ${#listed[@]} listed packages exist" \
    || fail "${role}: no such Debian package: ${unknown[*]}"
  # What the listed packages bring with them, and what every Debian system has.
  provided=$( { printf '%s\n' "${listed[@]}"
                apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
                  --no-breaks --no-replaces --no-enhances "${listed[@]}" 2>/dev/null \
                  | awk '/^[a-z0-9]/ {print $1}'
                dpkg-query -W -f='${Package} ${Essential}\n' | awk '$2 == "yes" {print $1}'; } \
              | sed 's/:.*//' | sort -u)
  # PROGRAM LIB PATH for every NEEDED entry (ldd once per program), then one
  # dpkg -S for all paths: it reads every package's file list per call.
  needed="${TMP}/needed-${role}"
  : > "${needed}"
  for program in "${ctx}"/opt/chorus/bin/*; do
    ldd "${program}" > "${TMP}/ldd" 2>&1
    readelf -d "${program}" | awk '/NEEDED/ {gsub(/[][]/, "", $5); print $5}' | while read -r lib; do
      # "libfoo.so.1 => /path (0x...)", or the dynamic loader's own line
      # "/lib64/ld-linux-x86-64.so.2 (0x...)" (NEEDED where code calls
      # __tls_get_addr, as position-independent code does).
      path=$(awk -v l="${lib}" '$1 == l && $2 == "=>" {print $3; exit}
        {n = split($1, part, "/"); if (n > 1 && part[n] == l) {print $1; exit}}' "${TMP}/ldd")
      echo "$(basename "${program}") ${lib} $([[ -n "${path}" ]] && realpath "${path}")"
    done >> "${needed}"
  done
  owners=$(awk 'NF == 3 {print $3; sub("^/usr", "", $3); print $3}' "${needed}" | sort -u \
           | xargs -r dpkg -S 2>/dev/null | sed 's/^\([^:]*\)\(:[a-z0-9]*\)\{0,1\}: /\1 /')
  missing=()
  needed_count=0
  while read -r program lib path; do
    needed_count=$((needed_count + 1))
    [[ -n "${path}" ]] || { missing+=("${program}:${lib}(unresolved)"); continue; }
    pkg=$(awk -v a="${path}" -v b="${path#/usr}" '$2 == a || $2 == b {print $1; exit}' <<<"${owners}")
    grep -qxF "${pkg}" <<<"${provided}" || missing+=("${program}:${lib}(${pkg:-no package})")
  done < "${needed}"
  [[ ${#missing[@]} -eq 0 ]] && pass "${role}: the list provides all ${needed_count} NEEDED libraries" \
    || fail "${role}: not provided by ${role}.packages: ${missing[*]}"

  out=$("${PY}" "${CHECK}" "${ctx}/Containerfile" "${ctx}" 2>&1); rc=$?
  [[ ${rc} -eq 0 ]] && pass "${role}: Containerfile lint: $(tr '\n' ';' <<<"${out}")" \
    || fail "${role}: Containerfile lint: ${out}"
done

# The checks can fail: a list without LibTorch, a Containerfile that runs as
# root and copies what the context lacks.
ctx="${TMP}/context-worker"
grep -v '^libtorch' "${ctx}/chorus-image/worker.packages" > "${TMP}/short.packages"
dropped=$(comm -23 <(grep -v '^#' "${ctx}/chorus-image/worker.packages" | sort) <(grep -v '^#' "${TMP}/short.packages" | sort))
[[ "${dropped}" == libtorch1.13 ]] || fail "test setup: expected to drop libtorch1.13, dropped '${dropped}'"
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances $(grep -v '^#' "${TMP}/short.packages") 2>/dev/null | awk '/^[a-z0-9]/ {print $1}' | sort -u)
grep -qx libtorch1.13 <<<"${closure}" && fail "libtorch1.13 still provided without it listed" \
  || pass "a list without libtorch1.13 would not provide chorus-trainer's libtorch"
sed -e 's/^USER 999:999$/USER root/' -e 's|^COPY opt/ /opt/$|COPY missing/ /opt/|' "${ctx}/Containerfile" > "${TMP}/Containerfile.bad"
out=$("${PY}" "${CHECK}" "${TMP}/Containerfile.bad" "${ctx}" 2>&1) && fail "a bad Containerfile passed" \
  || { [[ "${out}" == *"USER root"* && "${out}" == *"missing/"* ]] && pass "a bad Containerfile is caught" \
       || fail "bad Containerfile: ${out}"; }

# The coordinator image's CMD flags are sound together (its checkpoint data
# port once was the HTTP port's default).
mapfile -t cmd_flags < <(/usr/bin/python3 -c 'import json, re, sys
for line in open(sys.argv[1]):
    if line.startswith("CMD "): print("\n".join(json.loads(line[4:])))' "${TMP}/context-coordinator/Containerfile")
out=$("${TREE}/opt/chorus/bin/chorus-coordinator" "${cmd_flags[@]}" --check_flags 2>&1) \
  && [[ ${#cmd_flags[@]} -ge 3 ]] && pass "coordinator CMD flags are sound: ${cmd_flags[*]}" \
  || fail "coordinator CMD ${cmd_flags[*]}: ${out}"

sh -n "${ctx}/chorus-image/image-setup.sh" && pass "image-setup.sh parses" || fail "image-setup.sh syntax"
out=$(sh "${ctx}/chorus-image/image-setup.sh" nosuchrole 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *usage* ]] && pass "image-setup.sh rejects a bad role" || fail "image-setup.sh rc=${rc}: ${out}"
finish
