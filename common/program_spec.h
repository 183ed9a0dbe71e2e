// What a `program` job (JobSpec.program, docs/programs.md) may ask for, and
// where its binary is: the rules the spec validation, the client and the
// rank's supervisor share.
//
//   - ProgramBinaryPath resolves argv[0] the way the supervisor executes it
//     (absolute, or relative to working_dir; never a PATH lookup).
//   - IsChorusSetVariable names the environment variables Chorus sets for a
//     rank, which program.env may not override.
//   - CheckProgramBinary looks at the binary on this machine (it exists, is
//     a file, is executable): `chorus submit`, `validate` and `up` call it,
//     since `chorus up --local` and most clusters run the same paths there.
//
// Thread-safety: plain functions, no state.
//
// Example:
//   for (const SpecError& e : CheckProgramBinary(spec.program()))
//     std::cerr << e.field << ": " << e.message << "\n";
#ifndef CHORUS_COMMON_PROGRAM_SPEC_H_
#define CHORUS_COMMON_PROGRAM_SPEC_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "chorus/v1/job.pb.h"
#include "common/job_spec.h"

namespace chorus {

// The variables Chorus sets in every program rank's environment
// (docs/programs.md has what each holds).
const std::vector<std::string>& ChorusSetVariables();

// Whether `name` is one of ChorusSetVariables().
bool IsChorusSetVariable(absl::string_view name);

// The path the supervisor executes: argv[0] when absolute, else argv[0]
// under working_dir; empty when neither gives an absolute path (no argv,
// or a relative argv[0] without an absolute working_dir).
std::string ProgramBinaryPath(const v1::ProgramSpec& program);

// The problems with `program`'s binary as this machine sees it; empty when
// argv[0] names an executable regular file (through symbolic links).
// Problems are on the field "program.argv[0]", e.g.
//   program.argv[0]: /opt/train does not exist
//   program.argv[0]: /opt/train.py is not executable (mode 0644); run it
//       through its interpreter, e.g. ["/usr/bin/python3", "/opt/train.py"]
//   program.argv[0]: relative path bin/train does not resolve against
//       program.working_dir /home/me/proj (/home/me/proj/bin/train does not exist)
// A spec whose argv[0] cannot be resolved at all is ValidateJobSpec's to
// refuse; this returns nothing for it.
std::vector<SpecError> CheckProgramBinary(const v1::ProgramSpec& program);

}  // namespace chorus

#endif  // CHORUS_COMMON_PROGRAM_SPEC_H_
