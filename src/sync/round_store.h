// What a node's SyncService serves: the encoded streams of its latest two rounds. Streams are
// immutable once published and shared by pointer, so a round can be dropped while a slow peer
// is still reading it. Internal to the sync module.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "spes/v1/sync.pb.h"

namespace spes::sync_detail {

struct Stream {
  std::vector<spes::v1::TensorChunk> chunks;
  std::size_t bytes = 0;  // serialized size of all chunks
  // int8_delta streams: the round whose result the deltas are against, and how to build the
  // same values in fp32 for a caller whose copy is from another round (built on first demand).
  std::uint64_t base_round = 0;
  std::function<std::shared_ptr<const Stream>()> make_full;
  mutable std::once_flag full_once;
  mutable std::shared_ptr<const Stream> full;
};
using StreamPtr = std::shared_ptr<const Stream>;

// What to send a caller whose copy of the part is from `caller_base_round`: the stream itself,
// or (a delta stream against another round) its fp32 twin.
StreamPtr stream_for(const StreamPtr& stream, std::uint64_t caller_base_round);

// One stream served in full: who fetched it (their node id), which part, which slice.
using ServedKey = std::tuple<std::uint32_t, spes::v1::Part, std::uint32_t>;

class RoundStore {
 public:
  enum class Lookup { Ok, Gone, TooFar, NoSuchSlice, Timeout, Closed, Cancelled };

  // `first_round`: the first round this store will publish (a plan's effective round). Requests
  // for it are waited on like requests for the next round.
  explicit RoundStore(std::uint64_t first_round = 1) : latest_(first_round > 0 ? first_round - 1 : 0) {}

  // Publishes round r's experts and raw shared slices (index = slice). Drops rounds < r - 1.
  void publish(std::uint64_t round, StreamPtr experts, std::vector<StreamPtr> raw_slices);
  // Publishes the averaged slice this node aggregates in round r.
  void publish_average(std::uint64_t round, StreamPtr averaged);
  // Waits until the part is published (or the deadline passes, or `cancelled` says so).
  Lookup get(std::uint64_t round, spes::v1::Part part, std::uint32_t slice,
             std::chrono::steady_clock::time_point deadline, const std::function<bool()>& cancelled,
             StreamPtr& out);
  // Wakes every waiter with Closed; later calls return Closed.
  void close();
  std::uint64_t latest() const;
  // Records a stream of `round` served in full; waits until every `expected` one was (or the deadline).
  void count_served(std::uint64_t round, const ServedKey& key);
  bool wait_served(std::uint64_t round, const std::vector<ServedKey>& expected,
                   std::chrono::steady_clock::time_point deadline);

 private:
  struct Round {
    StreamPtr experts;
    std::vector<StreamPtr> raw;
    StreamPtr averaged;
  };
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::uint64_t, Round> rounds_;
  std::uint64_t latest_ = 0;
  bool closed_ = false;
  std::map<std::uint64_t, std::set<ServedKey>> served_;
};

}  // namespace spes::sync_detail
