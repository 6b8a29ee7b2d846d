#include "spes/util/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace spes {

int threads_or_cores(int requested) {
  return requested > 0 ? requested : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void parallel_ranges(std::int64_t count, std::int64_t grain, int threads,
                     const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (count <= 0) return;
  grain = std::max<std::int64_t>(1, grain);
  const std::int64_t ranges = (count + grain - 1) / grain;
  const auto workers = static_cast<int>(std::min<std::int64_t>(std::max(1, threads), ranges));
  if (workers == 1) {
    for (std::int64_t lo = 0; lo < count; lo += grain) body(lo, std::min(count, lo + grain));
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    for (;;) {
      const std::int64_t r = next.fetch_add(1);
      if (r >= ranges) return;
      try {
        body(r * grain, std::min(count, (r + 1) * grain));
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next = ranges;  // the others stop after their current range
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(workers - 1));
  for (int t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace spes
