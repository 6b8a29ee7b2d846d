// Splitting a loop over many independent items across a few threads (the codec's chunks).
#pragma once

#include <cstdint>
#include <functional>

namespace spes {

// `requested` threads, or one per core when it is 0.
int threads_or_cores(int requested);

// Calls body(lo, hi) over consecutive ranges that cover [0, count), each at most `grain` items,
// on up to `threads` threads (the calling one included; no thread is started for a single range).
// Ranges are disjoint, so a body that only writes its own items gives the same result at any
// thread count. The first exception a body throws is rethrown here after every thread has stopped.
void parallel_ranges(std::int64_t count, std::int64_t grain, int threads,
                     const std::function<void(std::int64_t lo, std::int64_t hi)>& body);

}  // namespace spes
