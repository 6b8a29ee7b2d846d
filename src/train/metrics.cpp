#include "spes/train/metrics.h"

#include <nlohmann/json.hpp>

#include "spes/util/error.h"

namespace spes {

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) raise(ErrorKind::Io, "cannot open metrics file '{}'", path);
}

void MetricsLog::write(const StepStats& s) {
  nlohmann::json j = {{"type", "train"},
                      {"step", s.step},
                      {"loss", s.loss},
                      {"ce", s.ce},
                      {"z_loss", s.z_loss},
                      {"load_balance", s.load_balance},
                      {"router_z", s.router_z},
                      {"grad_norm", s.grad_norm},
                      {"lr", s.lr},
                      {"seconds", s.seconds},
                      {"tokens", s.tokens},
                      {"tokens_per_s", s.tokens_per_s},
                      {"flops", s.flops},
                      {"mfu", s.mfu},
                      {"peak_rss", s.peak_rss},
                      {"peak_device_bytes", s.peak_device_bytes},
                      {"frozen_share", s.frozen_share},
                      {"expert_load", s.expert_load}};
  out_ << j.dump() << '\n';
  out_.flush();
  if (!out_) raise(ErrorKind::Io, "cannot write metrics file '{}'", path_);
}

void MetricsLog::write(const EvalStats& e) {
  nlohmann::json j = {{"type", "eval"}, {"step", e.step}, {"val_loss", e.loss},
                      {"val_perplexity", e.perplexity}, {"tokens", e.tokens}};
  out_ << j.dump() << '\n';
  out_.flush();
  if (!out_) raise(ErrorKind::Io, "cannot write metrics file '{}'", path_);
}

void MetricsLog::write_line(const std::string& json_object) {
  out_ << json_object << '\n';
  out_.flush();
}

}  // namespace spes
