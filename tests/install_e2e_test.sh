#!/usr/bin/env bash
# End to end: `bazel run //deploy:install -- --prefix DIR` gives a tree that
# runs on its own: every program answers --help and --version from DIR/bin,
# every shared library resolves, the files are copies (not links into Bazel's
# output tree), and `chorus up --local 2` from DIR/bin trains a job (the CLI
# finds chorus-coordinator and chorus-worker beside it, the worker finds
# chorus-rank beside it).
#
# Usage (from Bazel): install_e2e_test.sh INSTALL
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

INSTALL=$1
PREFIX="${TMP}/opt/chorus"
STAGE="${TMP}/stage"

out=$("${INSTALL}" --prefix "${PREFIX}" 2>&1); rc=$?
[[ ${rc} -eq 0 ]] && pass "install --prefix: ${out}" || fail "install rc=${rc}: ${out}"

programs=(chorus chorus-coordinator chorus-worker chorus-rank chorus-trainer chorus-script-export)
for p in "${programs[@]}"; do
  f="${PREFIX}/bin/${p}"
  if [[ -f "${f}" && ! -L "${f}" && -x "${f}" ]]; then pass "${p} is an executable copy"
  else fail "${f} is not an executable regular file: $(ls -l "${f}" 2>&1)"; fi
  missing=$(ldd "${f}" 2>&1 | grep 'not found')
  [[ -z "${missing}" ]] && pass "${p}: every shared library resolves" \
    || fail "${p} lacks: ${missing}"
done
for p in chorus chorus-coordinator chorus-worker; do
  help=$("${PREFIX}/bin/${p}" --help 2>&1); rc=$?
  [[ ${rc} -eq 0 && "${help}" == *"Usage"* ]] && pass "${p} --help" \
    || fail "${p} --help rc=${rc}: $(head -3 <<<"${help}")"
done
# chorus-rank has no flags: it is started by the worker and says so.
out=$("${PREFIX}/bin/chorus-rank" 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"started by chorus-worker"* ]] && pass "chorus-rank by hand explains itself" \
  || fail "chorus-rank by hand rc=${rc}: ${out}"
version=$("${PREFIX}/bin/chorus-worker" --version 2>&1)
[[ "${version}" =~ ^[0-9]+\.[0-9]+ ]] && pass "chorus-worker --version ${version}" \
  || fail "chorus-worker --version printed '${version}'"
[[ -s "${PREFIX}/share/chorus/examples/fashion_mnist_mlp_ddp.textproto" ]] \
  && pass "examples installed" || fail "no examples under ${PREFIX}/share/chorus/examples"

# The files that name the programs name the installed ones.
left=$(grep -rl '@PREFIX@' "${PREFIX}/share/chorus" 2>/dev/null)
[[ -z "${left}" ]] && grep -q "^prefix=\${CHORUS_PREFIX:-${PREFIX}}\$" "${PREFIX}/share/chorus/slurm/chorus.sbatch" \
  && grep -q "^ExecStart=${PREFIX}/bin/chorus-worker " "${PREFIX}/share/chorus/systemd/chorus-worker.service" \
  && pass "@PREFIX@ replaced by ${PREFIX}" || fail "@PREFIX@ left in: ${left:-(none; but the sbatch or unit names another prefix)}"

# Bad usage says what to do.
out=$("${INSTALL}" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"--prefix DIR is required"* ]] && pass "no --prefix explained" \
  || fail "install without --prefix rc=${rc}: ${out}"

# --destdir stages the tree; the paths written into the files stay PREFIX.
out=$("${INSTALL}" --prefix /opt/chorus --destdir "${STAGE}" 2>&1); rc=$?
[[ ${rc} -eq 0 && -x "${STAGE}/opt/chorus/bin/chorus-worker" ]] \
  && pass "install --destdir stages under ${STAGE}/opt/chorus" || fail "destdir rc=${rc}: ${out}"

# A job from the installed tree alone.
PATH=/usr/bin:/bin up_small_job "${PREFIX}/bin/chorus" installed
if [[ ${UP_RC} -eq 0 && "$(json_get - state <<<"${UP_LAST}")" == SUCCEEDED \
      && "$(json_get - final_metrics.steps <<<"${UP_LAST}")" == 8 ]]; then
  pass "chorus up --local 2 from the installed tree: ${UP_LAST}"
else
  fail "installed chorus up rc=${UP_RC} out='${UP_OUT}' err=$(tail -5 "${TMP}/up.err")"
fi
assert_no_leftovers "a job from the installed tree"
finish
