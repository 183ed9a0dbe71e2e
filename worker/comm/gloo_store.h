// GlooStore: lets Gloo's rendezvous (gloo::rendezvous::Store) run over any
// chorus Store — MemoryStore in tests, the coordinator's StoreService in jobs.
//
// Gloo expects exceptions, so failures surface as gloo::IoException carrying
// the Store's message; CreateGlooCommunicator turns them back into Status.
//
// Thread-safety: as the wrapped Store.
#ifndef CHORUS_WORKER_COMM_GLOO_STORE_H_
#define CHORUS_WORKER_COMM_GLOO_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/comm/store.h"

namespace chorus {

class GlooStore : public gloo::rendezvous::Store {
 public:
  // `store` is not owned and must outlive this. Blocking calls without an
  // explicit timeout use `timeout`.
  GlooStore(chorus::Store& store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  chorus::Store& store_;
  const absl::Duration timeout_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_GLOO_STORE_H_
