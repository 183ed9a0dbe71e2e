#include "worker/train/sample_trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"

namespace chorus {

absl::StatusOr<std::unique_ptr<SampleTrace>> SampleTrace::Open(const std::string& dir) {
  if (dir.empty()) return std::unique_ptr<SampleTrace>();
  const std::string path = absl::StrCat(dir, "/", ::getpid(), ".trace");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CHORUS_SAMPLE_TRACE: cannot open ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<SampleTrace>(new SampleTrace(fd));
}

SampleTrace::~SampleTrace() { ::close(fd_); }

void SampleTrace::Write(const std::string& line) {
  // Best effort: a test reading the trace notices a missing line.
  const ssize_t written = ::write(fd_, line.data(), line.size());
  (void)written;
}

void SampleTrace::Step(int64_t generation, int rank, int64_t step, int64_t epoch,
                       const at::Tensor& indices) {
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  const int64_t* p = idx.data_ptr<int64_t>();
  std::string line = absl::StrCat("step ", generation, " ", rank, " ", step, " ", epoch, " ");
  for (int64_t i = 0; i < idx.numel(); ++i) absl::StrAppend(&line, i > 0 ? "," : "", p[i]);
  line += "\n";
  Write(line);
}

void SampleTrace::State(int64_t generation, int rank, int source, int64_t step, int64_t held,
                        Model& model) {
  Write(absl::StrFormat("state %d %d source %d step %d had %d model %08x\n", generation, rank,
                        source, step, held, Fingerprint(model)));
}

void SampleTrace::Final(int64_t generation, int rank, int64_t step, Model& model) {
  Write(absl::StrFormat("final %d %d %d %08x\n", generation, rank, step, Fingerprint(model)));
}

uint32_t SampleTrace::Fingerprint(Model& model) {
  uint32_t crc = 0;
  std::vector<NamedTensor> tensors = model.NamedParameters();
  for (NamedTensor& b : model.NamedBuffers()) tensors.push_back(b);
  for (const NamedTensor& t : tensors) {
    const at::Tensor c = t.tensor.detach().contiguous();
    crc = Crc32cExtend(crc, absl::string_view(static_cast<const char*>(c.data_ptr()), c.nbytes()));
  }
  return crc;
}

}  // namespace chorus
