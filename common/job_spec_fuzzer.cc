// Fuzz target: a job spec as a user (or a client of JobService.SubmitJob)
// sends it, in any of the three formats, through parsing, normalization and
// validation (common/job_spec.h).
//
// Input: one byte choosing the format (textproto, JSON, YAML: byte % 3),
// then the spec's text.
//
// Besides "no crash, no hang, no sanitizer report", every accepted spec
// must keep these properties, checked here:
//   - normalizing twice changes nothing;
//   - validation's verdict agrees with CheckJobSpec, and every problem names
//     a field and says what is wrong;
//   - the spec printed as text (JobSpecToText) and as JSON (JobSpecToJson)
//     parses back to the same spec, and so does its binary form (what
//     JobService.SubmitJob carries).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/job_spec.h"
#include "fuzz/fuzz_input.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/message_differencer.h"

namespace chorus {
namespace {

[[noreturn]] void Fail(const std::string& what, const v1::JobSpec& spec) {
  std::fprintf(stderr, "job_spec_fuzzer: %s\nspec:\n%s\n", what.c_str(),
               JobSpecToText(spec).c_str());
  std::abort();
}

// Equal field by field; NaN equals NaN (a NaN the user wrote is printed and
// read back as NaN, but not bit for bit).
bool SameSpec(const v1::JobSpec& a, const v1::JobSpec& b) {
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  return differencer.Compare(a, b);
}

void CheckRoundTrip(const v1::JobSpec& spec, const std::string& text, SpecFormat format,
                    const char* what) {
  absl::StatusOr<v1::JobSpec> back = ParseJobSpec(text, format, what);
  if (!back.ok()) {
    Fail(std::string(what) + " does not parse back: " + std::string(back.status().message()) +
             "\nprinted:\n" + text,
         spec);
  }
  if (!SameSpec(spec, *back)) Fail(std::string(what) + " parses back to another spec", spec);
}

void CheckSpec(const std::string& text, SpecFormat format) {
  absl::StatusOr<v1::JobSpec> parsed = ParseJobSpec(text, format, "fuzz");
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("a bad spec is not INVALID_ARGUMENT: " + parsed.status().ToString(), v1::JobSpec());
    }
    return;
  }
  v1::JobSpec spec = *std::move(parsed);
  NormalizeJobSpec(spec);
  v1::JobSpec again = spec;
  NormalizeJobSpec(again);
  if (!SameSpec(spec, again)) Fail("normalizing a normalized spec changed it", spec);

  const std::vector<SpecError> errors = ValidateJobSpec(spec);
  for (const SpecError& e : errors) {
    if (e.field.empty() || e.message.empty()) Fail("a problem without field or message", spec);
  }
  const absl::Status checked = CheckJobSpec(spec, "fuzz");
  if (checked.ok() != errors.empty()) Fail("CheckJobSpec disagrees with ValidateJobSpec", spec);
  if (errors.empty()) {
    if (spec.strategy().has_decentralized())
      (void)TopologyFromSpec(spec.strategy().decentralized());
  }

  CheckRoundTrip(spec, JobSpecToText(spec), SpecFormat::kTextProto, "JobSpecToText");
  CheckRoundTrip(spec, JobSpecToJson(spec), SpecFormat::kJson, "JobSpecToJson");
  // What SubmitJob sends: an accepted spec must survive the wire.
  v1::JobSpec wire;
  if (!wire.ParseFromString(spec.SerializeAsString()) || !SameSpec(spec, wire)) {
    Fail("the spec does not survive serialization", spec);
  }
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::FuzzInput in(data, size);
  const uint8_t format = in.Byte() % 3;
  chorus::CheckSpec(in.Rest(), format == 0   ? chorus::SpecFormat::kTextProto
                               : format == 1 ? chorus::SpecFormat::kJson
                                             : chorus::SpecFormat::kYaml);
  return 0;
}
