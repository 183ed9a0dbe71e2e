#include "checkpoint/storage.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(ReadAllTest, GathersEveryPieceInOrder) {
  const CheckpointFileSource source{"model.pt", [](const CheckpointByteSink& out) -> absl::Status {
                                      for (absl::string_view piece : {"ab", "", "cde", "f"}) {
                                        if (absl::Status s = out(piece); !s.ok()) return s;
                                      }
                                      return absl::OkStatus();
                                    }};
  absl::StatusOr<CheckpointFileData> data = ReadAll(source);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->name, "model.pt");
  EXPECT_EQ(data->bytes, "abcdef");
}

TEST(ReadAllTest, ReturnsTheSourcesError) {
  const CheckpointFileSource source{
      "train_state.pt", [](const CheckpointByteSink& out) -> absl::Status {
        (void)out("partial");
        return absl::InternalError("serializing train_state.pt: out of memory");
      }};
  absl::StatusOr<CheckpointFileData> data = ReadAll(source);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(data.status().message(), ::testing::HasSubstr("train_state.pt"));
}

}  // namespace
}  // namespace chorus
