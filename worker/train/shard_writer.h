// Writers of the shard formats ShardIndex reads (shard_index.h): ustar tar
// archives and NumPy .npy members. `chorus dataset pack` and the tests write
// shards with them.
//
// Thread-compatible: one writer per thread.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<TarWriter> tar, TarWriter::Create("/d/train-000.tar"));
//   RETURN_IF_ERROR(tar->Add("000001.x.npy", NpyBytes(ElementType::kFloat32, {784}, pixels)));
//   RETURN_IF_ERROR(tar->Close());
#ifndef CHORUS_WORKER_TRAIN_SHARD_WRITER_H_
#define CHORUS_WORKER_TRAIN_SHARD_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/train/shard_index.h"

namespace chorus {

// Writes a tar archive to a temporary name and renames it into place on
// Close(), so a reader never sees half a shard.
class TarWriter {
 public:
  // INVALID_ARGUMENT naming `path` if it cannot be created.
  static absl::StatusOr<std::unique_ptr<TarWriter>> Create(const std::string& path);
  ~TarWriter();
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  // Appends a regular file member. `name` is at most 100 bytes (longer
  // names get a GNU long-name member first).
  absl::Status Add(const std::string& name, absl::string_view bytes);
  // Writes the end-of-archive blocks and renames the file into place.
  absl::Status Close();
  // Bytes written so far.
  int64_t bytes() const { return bytes_; }

 private:
  TarWriter(std::FILE* file, std::string path, std::string partial)
      : file_(file), path_(std::move(path)), partial_(std::move(partial)) {}
  absl::Status Write(absl::string_view bytes);
  absl::Status Header(const std::string& name, int64_t size, char type);

  std::FILE* file_;
  const std::string path_;
  const std::string partial_;
  int64_t bytes_ = 0;
};

// The bytes of a version 1.0 .npy file holding `values` (C order, little
// endian) of `type` and `shape` (empty: a scalar).
std::string NpyBytes(ElementType type, const std::vector<int64_t>& shape, const void* values);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SHARD_WRITER_H_
