// The members of a TAR shard's samples (data.shards, format TAR) and how
// each is parsed. By its suffix's last extension a member is a NumPy .npy
// file (ParseNpy in shard_index.h), the bytes of torch.save(tensor) (.pt or
// .pth: ParsePtMember, Note [.pt members] in tar_members.cc) or, as a
// target only, an integer class label written as text (.cls, .txt or
// .json: ParseTextLabel, Note [Text label members] in tar_members.cc).
// The TAR format (tar_format.cc) reads members with these.
//
// Thread-safety: pure functions.
//
// Example:
//   MemberKind kind = TargetMemberKind("cls");           // MemberKind::kTextLabel
//   ASSIGN_OR_RETURN(int64_t label, ParseTextLabel("7\n", 2));  // 7
//   ASSIGN_OR_RETURN(PtMember m, ParsePtMember(bytes, size));  // m.array.shape, m.tensor
#ifndef CHORUS_WORKER_TRAIN_TAR_MEMBERS_H_
#define CHORUS_WORKER_TRAIN_TAR_MEMBERS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/train/shard_index.h"

namespace chorus {

// How a member's bytes are parsed.
enum class MemberKind {
  kNpy,        // a NumPy .npy file
  kPt,         // torch.save(tensor)
  kTextLabel,  // one integer as text (targets only)
};

// The kind of the input member named by `suffix` (data.shards.input_member,
// "x.npy" or WebDataset's bare "npy"): kPt for .pt and .pth, else kNpy.
MemberKind InputMemberKind(absl::string_view suffix);
// The same for the target member (data.shards.target_member), which may
// also be a text label: .cls, .txt or .json.
MemberKind TargetMemberKind(absl::string_view suffix);

// The tensor of a .pt tar member, the bytes of torch.save(tensor) (Note
// [.pt members] in tar_members.cc): `array` describes it as a .npy member
// would be, its values (data_offset 0) those of the contiguous `tensor`.
struct PtMember {
  NpyArray array;
  at::Tensor tensor;
};
// INVALID_ARGUMENT saying what is wrong (the caller adds the file and
// offset): not a zip torch.save file, not a tensor, a dtype not read.
absl::StatusOr<PtMember> ParsePtMember(const char* bytes, int64_t size);

// The class label of a .cls, .txt or .json target member of `size` bytes
// (Note [Text label members] in tar_members.cc): one integer as text,
// whitespace around it allowed. INVALID_ARGUMENT quoting the text otherwise
// (the caller adds the file, offset, sample and member).
absl::StatusOr<int64_t> ParseTextLabel(const char* bytes, int64_t size);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_TAR_MEMBERS_H_
