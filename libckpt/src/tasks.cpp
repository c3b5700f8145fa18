#include "qf/tasks.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qf {

void run_tasks(size_t n, int threads,
               const std::function<std::function<void(size_t)>()>& make_worker) {
  if (n == 0) return;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n));
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr err;
  auto worker = [&] {
    try {
      const std::function<void(size_t)> run = make_worker();
      for (size_t i; (i = next.fetch_add(1)) < n;) run(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace qf
