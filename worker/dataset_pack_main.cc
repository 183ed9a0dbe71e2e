// chorus-dataset-pack: writes tar shards (data.shards format TAR) from a
// tensor_file or a folder of KEY.x.npy / KEY.y.npy files, for
// `chorus dataset pack` (the CLI itself does not link LibTorch).
//
//   chorus-dataset-pack --from train.pt --out /data/train --samples_per_shard 10000
//
// Writes /data/train-000000.tar, ... (each with its index file, .tar.idx)
// and prints what it wrote and the glob
// for data.shards.paths. Exit 0 on success, 1 with a message otherwise.

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "worker/train/dataset_pack.h"

int main(int argc, char** argv) {
  chorus::PackOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--from") {
      options.from = argv[i + 1];
    } else if (flag == "--out") {
      options.out = argv[i + 1];
    } else if (flag == "--samples_per_shard" &&
               absl::SimpleAtoi(argv[i + 1], &options.samples_per_shard)) {
    } else {
      std::cerr << "chorus-dataset-pack: unknown flag or bad value: " << flag << "\n";
      return 1;
    }
  }
  absl::StatusOr<chorus::PackResult> r = chorus::PackDataset(options);
  if (!r.ok()) {
    std::cerr << "chorus dataset pack: " << r.status().message() << "\n";
    return 1;
  }
  std::cout << "wrote " << r->samples << " samples in " << r->shards << " shard(s), " << r->bytes
            << " bytes, each shard with its index file (.tar.idx) beside it\n"
            << "data { shards { format: TAR paths: \"" << r->paths_glob
            << "\" } }  (add num_classes for class targets)\n";
  return 0;
}
