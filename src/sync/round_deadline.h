// How long a round may take before the peers still missing are skipped: a multiple of the slowest
// recent round that every peer answered in time, between a floor and sync.round_timeout_s.
// Internal to the sync module; no gRPC, no torch.
#pragma once

#include <cstddef>
#include <deque>

namespace spes::sync_detail {

class RoundDeadline {
 public:
  // factor 0: always `ceiling_s` (the fixed sync.round_timeout_s of old). Otherwise the deadline
  // is factor × the slowest of the last `window` clean rounds × the back-off, clamped to
  // [min(floor_s, ceiling_s), ceiling_s]; before the first clean round it is ceiling_s.
  RoundDeadline(double factor, double floor_s, double ceiling_s, std::size_t window = 16);

  // The deadline of the next round, in seconds from its start.
  double next() const;

  // After a round: how long it took; clean = no peer was skipped; slow_link = a skipped peer
  // had sent part of its data (a link slower than the deadline assumed, so the next deadline
  // doubles until a round is clean again). A peer that sent nothing (dead or hung) changes
  // nothing: waiting longer for it would only slow every round down.
  void record(double seconds, bool clean, bool slow_link);

  double backoff() const { return backoff_; }

 private:
  double factor_, floor_, ceiling_;
  std::size_t window_;
  std::deque<double> clean_;  // durations of the last clean rounds, oldest first
  double backoff_ = 1;
};

}  // namespace spes::sync_detail
