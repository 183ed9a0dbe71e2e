#include "worker/train/tar_members.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <exception>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/output_limits.h"

namespace chorus {
namespace {

// A member suffix's last extension, which says how the member is read:
// "x.npy" and WebDataset's bare "npy" are both .npy members.
absl::string_view MemberExtension(absl::string_view suffix) {
  const size_t dot = suffix.rfind('.');
  return dot == absl::string_view::npos ? suffix : suffix.substr(dot + 1);
}

bool IsPtMember(absl::string_view suffix) {
  const absl::string_view ext = MemberExtension(suffix);
  return ext == "pt" || ext == "pth";
}

// Note [Text label members].
bool IsTextMember(absl::string_view suffix) {
  const absl::string_view ext = MemberExtension(suffix);
  return ext == "cls" || ext == "txt" || ext == "json";
}

std::optional<ElementType> TorchElementType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ElementType::kFloat32;
    case at::kDouble:
      return ElementType::kFloat64;
    case at::kChar:
      return ElementType::kInt8;
    case at::kByte:
      return ElementType::kUInt8;
    case at::kShort:
      return ElementType::kInt16;
    case at::kInt:
      return ElementType::kInt32;
    case at::kLong:
      return ElementType::kInt64;
    default:
      return std::nullopt;
  }
}

}  // namespace

MemberKind InputMemberKind(absl::string_view suffix) {
  return IsPtMember(suffix) ? MemberKind::kPt : MemberKind::kNpy;
}

MemberKind TargetMemberKind(absl::string_view suffix) {
  return IsTextMember(suffix) ? MemberKind::kTextLabel : InputMemberKind(suffix);
}

// Note [.pt members]
// A .pt member is the bytes of torch.save(tensor): a zip archive that
// LibTorch's pickle_load reads whole (its values are copied once more than
// a .npy member's, which is parsed in place). The tensor is made contiguous
// and its values converted into the batch row as a .npy member's are.
absl::StatusOr<PtMember> ParsePtMember(const char* bytes, int64_t size) {
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(bytes, bytes + size));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a torch.save file (", e.what_without_backtrace(), ")"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a torch.save file (", e.what(), ")"));
  }
  if (!value.isTensor()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "holds a ", value.tagKind(), ", not a tensor: a .pt member must be torch.save(tensor)"));
  }
  PtMember m;
  m.tensor = value.toTensor().contiguous();
  const std::optional<ElementType> type = TorchElementType(m.tensor.scalar_type());
  if (!type || !m.tensor.is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("holds a tensor of ", c10::toString(m.tensor.scalar_type()),
                     ", which is not read (float32, float64, int8, uint8, int16, int32 and int64 "
                     "are)"));
  }
  m.array.type = *type;
  m.array.shape = m.tensor.sizes().vec();
  m.array.data_offset = 0;
  return m;
}

// Note [Text label members]
// WebDataset writes a class label as a member KEY.cls (or .txt, or .json)
// holding the integer as text, str(label) or json.dumps(label), perhaps
// with a newline after it. Such a target member is read as a .npy member
// holding one int64 would be: shape (), every sample the same.
absl::StatusOr<int64_t> ParseTextLabel(const char* bytes, int64_t size) {
  const absl::string_view text(bytes, static_cast<size_t>(size));
  const absl::string_view number = absl::StripAsciiWhitespace(text);
  int64_t label = 0;
  if (!number.empty() && (absl::ascii_isdigit(number[0]) || number[0] == '-') &&
      absl::SimpleAtoi(number, &label)) {
    return label;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "holds \"", EscapeErrorText(text, 64),
      "\", not one integer: a .cls, .txt or .json target member must hold an integer class "
      "label as text (as WebDataset writes one)"));
}

}  // namespace chorus
