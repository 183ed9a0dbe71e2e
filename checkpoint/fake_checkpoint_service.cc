#include "checkpoint/fake_checkpoint_service.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/wire.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/sha256.h"

namespace chorus {
namespace {

constexpr size_t kDownloadChunkBytes = 1 << 20;

// A listener on 127.0.0.1 with a free port; its fd, and the port in *port.
int ListenOnLoopback(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(fd, 8) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// Appends a chunk of `data` to `file`, checking it as the coordinator does.
absl::Status AddChunk(const std::string& name, uint64_t offset, absl::string_view data,
                      uint32_t chunk_crc, FakeCheckpointService::StoredFile& file) {
  if (offset != file.bytes.size() || Crc32c(data) != chunk_crc) {
    return absl::DataLossError(absl::StrCat(name, ": chunk at offset ", offset, " is damaged"));
  }
  file.bytes.append(data.data(), data.size());
  return absl::OkStatus();
}

// Checks a finished file against the size and CRC-32C its sender claimed.
absl::Status EndFile(const std::string& name, uint64_t size, uint32_t crc,
                     FakeCheckpointService::StoredFile& file) {
  if (size != file.bytes.size() || crc != Crc32c(file.bytes)) {
    return absl::DataLossError(absl::StrCat(name, " does not match its size and CRC-32C"));
  }
  file.record.set_name(name);
  file.record.set_size(static_cast<int64_t>(size));
  file.record.set_crc32c(crc);
  file.record.set_sha256(Sha256Hex(file.bytes));
  return absl::OkStatus();
}

}  // namespace

FakeCheckpointService::FakeCheckpointService(std::string shared_root)
    : shared_root_(std::move(shared_root)) {}

FakeCheckpointService::~FakeCheckpointService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (data_thread_.joinable()) data_thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

void FakeCheckpointService::set_data_port(DataPort mode) {
  absl::MutexLock lock(&mu_);
  mode_ = mode;
}

void FakeCheckpointService::set_store_error(absl::Status status) {
  absl::MutexLock lock(&mu_);
  store_error_ = std::move(status);
}

void FakeCheckpointService::CutNextUploadAfter(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  cut_after_bytes_ = bytes;
}

bool FakeCheckpointService::CutNow(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (cut_after_bytes_ < 0 || bytes < cut_after_bytes_) return false;
  cut_after_bytes_ = -1;
  return true;
}

void FakeCheckpointService::set_download_script(std::vector<v1::CheckpointChunk> chunks,
                                                grpc::Status end) {
  absl::MutexLock lock(&mu_);
  download_script_.emplace(std::move(chunks), std::move(end));
}

absl::Status FakeCheckpointService::Start() {
  DataPort mode;
  {
    absl::MutexLock lock(&mu_);
    mode = mode_;
  }
  if (mode != DataPort::kNone) {
    listen_fd_ = ListenOnLoopback(&data_port_);
    if (listen_fd_ < 0) return absl::UnavailableError("fake data port: cannot listen on 127.0.0.1");
    if (mode == DataPort::kUnreachable) {
      ::close(listen_fd_);  // the port is known to be free now
      listen_fd_ = -1;
    } else {
      data_thread_ = std::thread([this] { ServeDataPort(); });
    }
  }
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(this);
  // As the coordinator: a chunk message is 4 MB of data plus its fields.
  builder.SetMaxReceiveMessageSize(16 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0)
    return absl::UnavailableError("fake checkpoint service: cannot listen");
  channel_ =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  return absl::OkStatus();
}

std::map<std::string, FakeCheckpointService::StoredFile> FakeCheckpointService::Files(
    int64_t step) const {
  absl::MutexLock lock(&mu_);
  auto it = steps_.find(step);
  return it == steps_.end() ? std::map<std::string, StoredFile>() : it->second.files;
}

std::optional<v1::CheckpointManifest> FakeCheckpointService::Manifest(int64_t step) const {
  absl::MutexLock lock(&mu_);
  auto it = steps_.find(step);
  if (it == steps_.end()) return std::nullopt;
  v1::CheckpointManifest manifest;
  manifest.set_job_id(it->second.job_id);
  manifest.set_step(step);
  manifest.set_directory(it->second.directory);
  for (const auto& [name, file] : it->second.files) *manifest.add_files() = file.record;
  return manifest;
}

int FakeCheckpointService::stream_uploads() const {
  absl::MutexLock lock(&mu_);
  return stream_uploads_;
}

int FakeCheckpointService::data_port_uploads() const {
  absl::MutexLock lock(&mu_);
  return data_port_uploads_;
}

int FakeCheckpointService::open_upload_calls() const {
  absl::MutexLock lock(&mu_);
  return open_upload_calls_;
}

std::vector<v1::CommitCheckpointRequest> FakeCheckpointService::commits() const {
  absl::MutexLock lock(&mu_);
  return commits_;
}

std::vector<std::string> FakeCheckpointService::committed_staging_paths() const {
  absl::MutexLock lock(&mu_);
  return committed_staging_paths_;
}

absl::Status FakeCheckpointService::Record(const std::string& job_id, int64_t step,
                                           std::map<std::string, StoredFile> files,
                                           const std::string& directory) {
  absl::MutexLock lock(&mu_);
  if (!store_error_.ok()) return store_error_;
  Step& s = steps_[step];
  s.job_id = job_id;
  s.directory = directory;
  for (auto& [name, file] : files) s.files[name] = std::move(file);
  return absl::OkStatus();
}

grpc::Status FakeCheckpointService::Upload(grpc::ServerContext* context,
                                           grpc::ServerReader<v1::CheckpointChunk>* reader,
                                           v1::UploadCheckpointResponse*) {
  {
    absl::MutexLock lock(&mu_);
    ++stream_uploads_;
  }
  v1::CheckpointChunk chunk;
  std::string job_id;
  int64_t step = -1;
  std::map<std::string, StoredFile> files;
  int64_t received = 0;
  while (reader->Read(&chunk)) {
    received += static_cast<int64_t>(chunk.data().size());
    if (CutNow(received)) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed");
    if (step < 0) {
      job_id = chunk.job_id();
      step = chunk.step();
    }
    StoredFile& file = files[chunk.file_name()];
    absl::Status s = AddChunk(chunk.file_name(), static_cast<uint64_t>(chunk.offset()),
                              chunk.data(), chunk.chunk_crc32c(), file);
    if (s.ok() && chunk.last()) {
      s = EndFile(chunk.file_name(), static_cast<uint64_t>(chunk.file_size()), chunk.file_crc32c(),
                  file);
    }
    if (!s.ok()) return ToGrpcStatus(s);
  }
  if (context->IsCancelled())
    return grpc::Status(grpc::StatusCode::CANCELLED, "the rank cancelled the upload");
  if (step < 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "an upload without chunks");
  for (const auto& [name, file] : files) {
    if (file.record.name().empty())
      return grpc::Status(grpc::StatusCode::DATA_LOSS, name + " ended early");
  }
  return ToGrpcStatus(Record(job_id, step, std::move(files), ""));
}

grpc::Status FakeCheckpointService::OpenUpload(grpc::ServerContext*,
                                               const v1::OpenUploadRequest* request,
                                               v1::OpenUploadResponse* response) {
  absl::MutexLock lock(&mu_);
  ++open_upload_calls_;
  if (mode_ == DataPort::kNone)
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no checkpoint data port");
  absl::StatusOr<std::string> token = NewUploadToken();
  if (!token.ok()) return ToGrpcStatus(token.status());
  if (mode_ != DataPort::kForgetsUploads) tokens_[*token] = {request->job_id(), request->step()};
  response->set_port(data_port_);
  response->set_token(*token);
  return grpc::Status::OK;
}

void FakeCheckpointService::ServeDataPort() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;  // shut down
    ReceiveDataUpload(fd);
    ::close(fd);
  }
}

void FakeCheckpointService::ReceiveDataUpload(int fd) {
  SetReceiveTimeout(fd, absl::Seconds(10));
  SetSendTimeout(fd, absl::Seconds(10));
  std::string hello(kHelloMagicBytes + kTokenBytes, '\0');
  if (!ReceiveAll(fd, hello.data(), hello.size(), "hello").ok()) return;
  std::string job_id;
  int64_t step = -1;
  absl::Status accept;
  {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(hello.substr(kHelloMagicBytes));
    if (mode_ == DataPort::kBusy) {
      accept = absl::ResourceExhaustedError(
          "checkpoint data port: too many uploads are running; upload over gRPC");
    } else if (hello.compare(0, kHelloMagicBytes, kHelloMagic, kHelloMagicBytes) != 0 ||
               it == tokens_.end()) {
      accept = absl::PermissionDeniedError("checkpoint data port: unknown token");
    } else {
      job_id = it->second.first;
      step = it->second.second;
      tokens_.erase(it);
    }
  }
  if (!SendAll(fd, {EncodeReply(accept)}, "acceptance").ok() || !accept.ok()) return;
  {
    absl::MutexLock lock(&mu_);
    ++data_port_uploads_;
  }
  std::map<std::string, StoredFile> files;
  std::string current;
  absl::Status status;
  int64_t received = 0;
  while (status.ok()) {
    char header_bytes[kChunkHeaderBytes];
    ChunkHeader header;
    status = ReceiveAll(fd, header_bytes, sizeof(header_bytes), "chunk header");
    if (status.ok()) status = DecodeChunkHeader(header_bytes, &header);
    if (!status.ok() || (header.flags & ChunkHeader::kEndOfUpload) != 0) break;
    std::string name(header.name_len, '\0');
    std::string data(header.data_len, '\0');
    status = ReceiveAll(fd, name.data(), name.size(), "file name");
    if (status.ok()) status = ReceiveAll(fd, data.data(), data.size(), "chunk data");
    if (!status.ok()) break;
    received += static_cast<int64_t>(data.size());
    if (CutNow(received)) return;  // gone, without a word
    if (!name.empty()) current = name;
    StoredFile& file = files[current];
    status = AddChunk(current, header.offset, data, header.chunk_crc32c, file);
    if (status.ok() && (header.flags & ChunkHeader::kLast) != 0) {
      status = EndFile(current, header.file_size, header.file_crc32c, file);
    }
  }
  for (const auto& [name, file] : files) {
    if (status.ok() && file.record.name().empty())
      status = absl::DataLossError(name + " ended early");
  }
  if (status.ok()) status = Record(job_id, step, std::move(files), "");
  (void)SendAll(fd, {EncodeReply(status)}, "reply");
}

grpc::Status FakeCheckpointService::Commit(grpc::ServerContext*,
                                           const v1::CommitCheckpointRequest* request,
                                           v1::UploadCheckpointResponse*) {
  namespace fs = std::filesystem;
  const std::string job_dir = absl::StrCat(shared_root_, "/", request->job_id());
  const std::string staging = absl::StrCat(job_dir, "/", request->staging_dir());
  std::map<std::string, StoredFile> files;
  for (const v1::CheckpointFile& f : request->files()) {
    const std::string path = absl::StrCat(staging, "/", f.name());
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    StoredFile& file = files[f.name()];
    file.bytes = bytes.str();
    if (!in || static_cast<int64_t>(file.bytes.size()) != f.size() ||
        Crc32c(file.bytes) != f.crc32c()) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          absl::StrCat(path, " does not match its size and CRC-32C"));
    }
    file.record = f;
    absl::MutexLock lock(&mu_);
    committed_staging_paths_.push_back(path);
  }
  {
    absl::MutexLock lock(&mu_);
    commits_.push_back(*request);
    if (!store_error_.ok()) return ToGrpcStatus(store_error_);
  }
  const std::string committed = absl::StrCat(job_dir, "/", request->step());
  std::error_code ec;
  fs::rename(staging, committed, ec);
  if (ec)
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("rename ", staging, ": ", ec.message()));
  return ToGrpcStatus(Record(request->job_id(), request->step(), std::move(files), committed));
}

grpc::Status FakeCheckpointService::Download(grpc::ServerContext*,
                                             const v1::DownloadCheckpointRequest* request,
                                             grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  std::string bytes;
  v1::CheckpointFile record;
  {
    absl::MutexLock lock(&mu_);
    if (download_script_.has_value()) {
      for (const v1::CheckpointChunk& chunk : download_script_->first) writer->Write(chunk);
      return download_script_->second;
    }
    auto step = request->step() == 0 ? (steps_.empty() ? steps_.end() : std::prev(steps_.end()))
                                     : steps_.find(request->step());
    if (step == steps_.end())
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such checkpoint");
    auto file = step->second.files.find(request->file_name());
    if (file == step->second.files.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("no file ", request->file_name()));
    }
    bytes = file->second.bytes;
    record = file->second.record;
  }
  size_t offset = 0;
  do {
    v1::CheckpointChunk chunk;
    const size_t n = std::min(kDownloadChunkBytes, bytes.size() - offset);
    chunk.set_offset(static_cast<int64_t>(offset));
    chunk.set_data(bytes.substr(offset, n));
    chunk.set_chunk_crc32c(Crc32c(chunk.data()));
    offset += n;
    if (offset == bytes.size()) {
      chunk.set_last(true);
      chunk.set_file_size(record.size());
      chunk.set_file_crc32c(record.crc32c());
      chunk.set_file_sha256(record.sha256());
    }
    if (!writer->Write(chunk)) break;
  } while (offset < bytes.size());
  return grpc::Status::OK;
}

}  // namespace chorus
