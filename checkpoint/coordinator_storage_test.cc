#include "checkpoint/coordinator_storage.h"

#include <map>
#include <string>
#include <vector>

#include "checkpoint/fake_checkpoint_service.h"
#include "checkpoint/layout.h"
#include "checkpoint/store_retry.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// A file whose bytes come in pieces of `piece` bytes.
CheckpointFileSource Source(std::string name, std::string bytes, size_t piece) {
  return {std::move(name),
          [bytes = std::move(bytes), piece](const CheckpointByteSink& out) -> absl::Status {
            for (size_t offset = 0; offset < bytes.size(); offset += piece) {
              if (absl::Status s = out(absl::string_view(bytes).substr(offset, piece)); !s.ok())
                return s;
            }
            return absl::OkStatus();
          }};
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + seed);
  return s;
}

// 9 MB of model (three 4 MB chunks over the stream) and a small state file.
struct TwoFiles {
  std::string model = Pattern(9 << 20, 3);
  std::string state = Pattern(1000, 5);
  std::vector<CheckpointFileSource> sources() const {
    return {Source(kModelFile, model, 300 << 10), Source(kTrainStateFile, state, 7)};
  }
};

void ExpectStored(const FakeCheckpointService& coordinator, int64_t step, const TwoFiles& files) {
  std::map<std::string, FakeCheckpointService::StoredFile> stored = coordinator.Files(step);
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_TRUE(stored.at(kModelFile).bytes == files.model) << "model.pt differs";
  EXPECT_EQ(stored.at(kTrainStateFile).bytes, files.state);
  EXPECT_EQ(stored.at(kModelFile).record.crc32c(), Crc32c(files.model));
}

TEST(CoordinatorCheckpointStorageTest, UploadsOverTheStreamWhenTheCoordinatorHasNoDataPort) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kNone);
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
  TwoFiles files;
  absl::Status s = storage.Store(30, files.sources());
  ASSERT_TRUE(s.ok()) << s;
  ExpectStored(coordinator, 30, files);
  EXPECT_EQ(coordinator.stream_uploads(), 1);
  // It remembers: the next checkpoint goes straight to the stream.
  ASSERT_TRUE(storage.Store(60, files.sources()).ok());
  ExpectStored(coordinator, 60, files);
  EXPECT_EQ(coordinator.open_upload_calls(), 1);
  EXPECT_EQ(coordinator.stream_uploads(), 2);
}

TEST(CoordinatorCheckpointStorageTest, AnEmptyCoordinatorHostMeansTheStreamOnly) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kServing);
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0,
                                       /*coordinator_host=*/"");
  TwoFiles files;
  ASSERT_TRUE(storage.Store(30, files.sources()).ok());
  ExpectStored(coordinator, 30, files);
  EXPECT_EQ(coordinator.open_upload_calls(), 0);
  EXPECT_EQ(coordinator.stream_uploads(), 1);
}

TEST(CoordinatorCheckpointStorageTest, UploadsOverTheDataPortWhenOffered) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kServing);
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
  TwoFiles files;
  absl::Status s = storage.Store(30, files.sources());
  ASSERT_TRUE(s.ok()) << s;
  ExpectStored(coordinator, 30, files);
  EXPECT_EQ(coordinator.data_port_uploads(), 1);
  EXPECT_EQ(coordinator.stream_uploads(), 0);
}

// With several coordinators the rank does not know which one leads: the
// data port is dialled on the host of the one that granted the upload.
TEST(CoordinatorCheckpointStorageTest, TheHostThatAnswersIsTheOneThatGrantedTheUpload) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kServing);
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0,
                                       CoordinatorCheckpointStorage::kHostThatAnswers);
  TwoFiles files;
  absl::Status s = storage.Store(30, files.sources());
  ASSERT_TRUE(s.ok()) << s;
  ExpectStored(coordinator, 30, files);
  EXPECT_EQ(coordinator.data_port_uploads(), 1);
  EXPECT_EQ(coordinator.stream_uploads(), 0);
}

TEST(CoordinatorCheckpointStorageTest, PeerHostReadsGrpcPeers) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.1:29650"), "10.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:[::1]:29650"), "::1");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:29650"), "::1");
  EXPECT_EQ(PeerHost("unix:/tmp/socket"), "");
  EXPECT_EQ(PeerHost(""), "");
}

TEST(CoordinatorCheckpointStorageTest, ABusyDataPortSendsThisUploadOverTheStreamOnly) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kBusy);
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
  TwoFiles files;
  ASSERT_TRUE(storage.Store(30, files.sources()).ok());
  ExpectStored(coordinator, 30, files);
  EXPECT_EQ(coordinator.stream_uploads(), 1);
  ASSERT_TRUE(storage.Store(60, files.sources()).ok());
  EXPECT_EQ(coordinator.open_upload_calls(), 2)
      << "the data port is tried again for the next checkpoint";
  EXPECT_EQ(coordinator.stream_uploads(), 2);
}

TEST(CoordinatorCheckpointStorageTest, AnUnreachableDataPortIsLeftAloneForAWhile) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kUnreachable);
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
  TwoFiles files;
  ASSERT_TRUE(storage.Store(30, files.sources()).ok());
  ExpectStored(coordinator, 30, files);
  ASSERT_TRUE(storage.Store(60, files.sources()).ok());
  ExpectStored(coordinator, 60, files);
  EXPECT_EQ(coordinator.open_upload_calls(), 1) << "no second try within kDataPortRetryAfter";
  EXPECT_EQ(coordinator.stream_uploads(), 2);
  EXPECT_EQ(coordinator.data_port_uploads(), 0);
}

TEST(CoordinatorCheckpointStorageTest, TheCoordinatorsRefusalNamesTheStep) {
  for (FakeCheckpointService::DataPort mode :
       {FakeCheckpointService::DataPort::kNone, FakeCheckpointService::DataPort::kServing}) {
    FakeCheckpointService coordinator;
    coordinator.set_data_port(mode);
    coordinator.set_store_error(absl::FailedPreconditionError("job-000001 is not running"));
    ASSERT_TRUE(coordinator.Start().ok());
    CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
    TwoFiles files;
    absl::Status s = storage.Store(30, files.sources());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("uploading checkpoint step 30: "));
    EXPECT_THAT(s.message(), HasSubstr("job-000001 is not running"));
    EXPECT_TRUE(coordinator.Files(30).empty());
  }
}

TEST(CoordinatorCheckpointStorageTest, ASerializationErrorStopsTheUpload) {
  for (FakeCheckpointService::DataPort mode :
       {FakeCheckpointService::DataPort::kNone, FakeCheckpointService::DataPort::kServing}) {
    FakeCheckpointService coordinator;
    coordinator.set_data_port(mode);
    ASSERT_TRUE(coordinator.Start().ok());
    CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
    const CheckpointFileSource broken{
        kModelFile, [](const CheckpointByteSink& out) -> absl::Status {
          (void)out("PK");
          return absl::InternalError("serializing checkpoint file model.pt: bad tensor");
        }};
    absl::Status s = storage.Store(30, {broken});
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(s.message(),
                HasSubstr("uploading checkpoint step 30: serializing checkpoint file model.pt"));
    EXPECT_TRUE(coordinator.Files(30).empty());
  }
}

// A coordinator killed in the middle of an upload (restarting, say): the
// failure says the coordinator could not be reached, so that the rank tries
// again instead of failing (checkpoint/store_retry.h); nothing is recorded
// and the next upload goes through the data port again.
TEST(CoordinatorCheckpointStorageTest, AnUploadCutHalfWayIsUnreachableAndTheNextOneGoesThrough) {
  for (FakeCheckpointService::DataPort mode :
       {FakeCheckpointService::DataPort::kNone, FakeCheckpointService::DataPort::kServing}) {
    FakeCheckpointService coordinator;
    coordinator.set_data_port(mode);
    ASSERT_TRUE(coordinator.Start().ok());
    CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
    TwoFiles files;
    coordinator.CutNextUploadAfter(5 << 20);
    absl::Status s = storage.Store(1000, files.sources());
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr("uploading checkpoint step 1000: "));
    EXPECT_TRUE(IsCoordinatorUnreachable(s)) << s;
    EXPECT_TRUE(coordinator.Files(1000).empty());
    s = storage.Store(1000, files.sources());
    ASSERT_TRUE(s.ok()) << s;
    ExpectStored(coordinator, 1000, files);
    if (mode == FakeCheckpointService::DataPort::kServing) {
      EXPECT_EQ(coordinator.data_port_uploads(), 2);
      EXPECT_EQ(coordinator.stream_uploads(), 0);
    }
  }
}

TEST(CoordinatorCheckpointStorageTest, ATokenTheCoordinatorForgotIsUnreachable) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kForgetsUploads);
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
  TwoFiles files;
  absl::Status s = storage.Store(40, files.sources());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("unknown token"));
  EXPECT_THAT(s.message(), HasSubstr("restarted"));
  EXPECT_EQ(coordinator.stream_uploads(), 0) << "not a reason to leave the data port";
}

TEST(CoordinatorCheckpointStorageTest, ACoordinatorThatIsGoneIsUnreachable) {
  std::shared_ptr<grpc::Channel> channel;
  {
    FakeCheckpointService coordinator;
    coordinator.set_data_port(FakeCheckpointService::DataPort::kServing);
    ASSERT_TRUE(coordinator.Start().ok());
    channel = coordinator.channel();
  }
  CoordinatorCheckpointStorage storage(channel, "job-000001", 1, 0, "127.0.0.1");
  TwoFiles files;
  absl::Status s = storage.Store(40, files.sources());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("uploading checkpoint step 40: "));
}

// The data port refuses connections and the stream fails too: the whole
// coordinator is away, so its data port is tried again for the next upload
// (rather than left alone for kDataPortRetryAfter).
TEST(CoordinatorCheckpointStorageTest, ADataPortIsNotBlamedWhenTheWholeCoordinatorIsAway) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kUnreachable);
  coordinator.set_store_error(absl::UnavailableError("Socket closed"));
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
  TwoFiles files;
  EXPECT_EQ(storage.Store(30, files.sources()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(coordinator.stream_uploads(), 1);
  EXPECT_EQ(storage.Store(60, files.sources()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(coordinator.open_upload_calls(), 2);
}

TEST(CoordinatorCheckpointStorageTest, LoadDownloadsWhatTheManifestLists) {
  FakeCheckpointService coordinator;
  ASSERT_TRUE(coordinator.Start().ok());
  CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
  TwoFiles files;
  ASSERT_TRUE(storage.Store(30, files.sources()).ok());
  std::optional<v1::CheckpointManifest> manifest = coordinator.Manifest(30);
  ASSERT_TRUE(manifest.has_value());
  manifest->set_job_id("job-000001");
  absl::StatusOr<std::vector<CheckpointFileData>> loaded = storage.Load(*manifest);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ((*loaded)[0].name, kModelFile);
  EXPECT_TRUE((*loaded)[0].bytes == files.model);
  EXPECT_EQ((*loaded)[1].name, kTrainStateFile);
  EXPECT_EQ((*loaded)[1].bytes, files.state);

  v1::CheckpointManifest missing = *manifest;
  missing.mutable_files(1)->set_name(TrainStateFileName(3));
  EXPECT_EQ(storage.Load(missing).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace chorus
