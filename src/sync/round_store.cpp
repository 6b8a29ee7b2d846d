#include "round_store.h"

namespace spes::sync_detail {

StreamPtr stream_for(const StreamPtr& stream, std::uint64_t caller_base_round) {
  if (!stream->make_full || (caller_base_round != 0 && caller_base_round == stream->base_round)) return stream;
  std::call_once(stream->full_once, [&] { stream->full = stream->make_full(); });
  return stream->full;
}

void RoundStore::publish(std::uint64_t round, StreamPtr experts, std::vector<StreamPtr> raw_slices) {
  {
    std::lock_guard lock(mutex_);
    Round& r = rounds_[round];
    r.experts = std::move(experts);
    r.raw = std::move(raw_slices);
    latest_ = std::max(latest_, round);
    while (!rounds_.empty() && rounds_.begin()->first + 1 < latest_) rounds_.erase(rounds_.begin());
  }
  changed_.notify_all();
}

void RoundStore::publish_average(std::uint64_t round, StreamPtr averaged) {
  {
    std::lock_guard lock(mutex_);
    rounds_[round].averaged = std::move(averaged);
  }
  changed_.notify_all();
}

RoundStore::Lookup RoundStore::get(std::uint64_t round, spes::v1::Part part, std::uint32_t slice,
                                   std::chrono::steady_clock::time_point deadline,
                                   const std::function<bool()>& cancelled, StreamPtr& out) {
  std::unique_lock lock(mutex_);
  while (true) {
    if (closed_) return Lookup::Closed;
    if (round + 1 < latest_) return Lookup::Gone;
    if (round > latest_ + 1) return Lookup::TooFar;
    auto it = rounds_.find(round);
    if (it != rounds_.end() && it->second.experts) {
      const Round& r = it->second;
      if (part == spes::v1::EXPERTS) {
        out = r.experts;
        return Lookup::Ok;
      }
      if (slice >= r.raw.size()) return Lookup::NoSuchSlice;
      if (part == spes::v1::SHARED_RAW) {
        out = r.raw[slice];
        return Lookup::Ok;
      }
      if (r.averaged) {  // SHARED_AVERAGED: the caller checked that `slice` is ours
        out = r.averaged;
        return Lookup::Ok;
      }
    }
    if (cancelled && cancelled()) return Lookup::Cancelled;
    if (std::chrono::steady_clock::now() >= deadline) return Lookup::Timeout;
    // Wake up now and then to notice a cancelled call.
    changed_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
  }
}

void RoundStore::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
}

void RoundStore::count_served(std::uint64_t round, const ServedKey& key) {
  {
    std::lock_guard lock(mutex_);
    served_[round].insert(key);
    while (!served_.empty() && served_.begin()->first + 1 < latest_) served_.erase(served_.begin());
  }
  changed_.notify_all();
}

bool RoundStore::wait_served(std::uint64_t round, const std::vector<ServedKey>& expected,
                             std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return changed_.wait_until(lock, deadline, [&] {
    const auto& served = served_[round];
    for (const auto& key : expected)
      if (!served.count(key)) return false;
    return true;
  });
}

std::uint64_t RoundStore::latest() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

}  // namespace spes::sync_detail
