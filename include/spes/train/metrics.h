// What a training step and an evaluation report, and the JSONL file they are appended to
// (one JSON object per line, flushed each time, so a crashed run keeps its history).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace spes {

struct StepStats {
  std::int64_t step = 0;  // 1-based optimizer step just finished
  double loss = 0, ce = 0, z_loss = 0, load_balance = 0, router_z = 0;  // terms unweighted
  double grad_norm = 0, lr = 0;
  double seconds = 0;       // wall time of the step
  std::int64_t tokens = 0;  // tokens in the step (all micro-batches)
  double tokens_per_s = 0;
  double flops = 0;         // model FLOPs of the step by count
  double mfu = 0;           // flops / seconds / measured matmul peak (0 if unknown)
  std::int64_t peak_rss = 0;
  std::int64_t peak_device_bytes = 0;  // GPU: most bytes in live tensors so far (0 on the CPU)
  double frozen_share = 0;  // fraction of routed pairs that went to frozen experts
  std::vector<std::vector<std::int64_t>> expert_load;  // [layer][expert] routed pairs
};

struct EvalStats {
  std::int64_t step = 0;
  double loss = 0;        // mean validation cross-entropy (nats/token)
  double perplexity = 0;
  std::int64_t tokens = 0;
};

class MetricsLog {
 public:
  MetricsLog() = default;
  // Truncates unless `append`. Error(Io) if the file cannot be opened.
  MetricsLog(const std::string& path, bool append);
  void write(const StepStats& s);
  void write(const EvalStats& e);
  // Any other record: one JSON object, already serialized, written as one line.
  void write_line(const std::string& json_object);
  bool is_open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace spes
