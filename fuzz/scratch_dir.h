// ScratchDir: the directory a fuzz target keeps its files in (a checkpoint
// store, a state database, the file an input is written to for a loader that
// takes a path): one per process, made on first use under $TEST_TMPDIR
// (bazel test) or $TMPDIR, /tmp otherwise.
//
// Thread-safety: safe to call from any thread (a function-local static:
// LLVMFuzzerTestOneInput has no context to carry state in, so a target's
// process-wide fixtures live in statics, built once).
//
// Example:
//   const std::string path = ScratchDir() + "/input.idx";
#ifndef CHORUS_FUZZ_SCRATCH_DIR_H_
#define CHORUS_FUZZ_SCRATCH_DIR_H_

#include <string>

namespace chorus {

const std::string& ScratchDir();

// Writes `bytes` to `path` (replacing it); aborts if it cannot: a fuzz
// target without its scratch file tests nothing.
void WriteScratchFile(const std::string& path, const std::string& bytes);

}  // namespace chorus

#endif  // CHORUS_FUZZ_SCRATCH_DIR_H_
