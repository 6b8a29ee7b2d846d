// A checkpoint folder whose manifest.json is arbitrary bytes (the tensor files stay valid):
// read_shard must refuse it with spes::Error naming the folder, or load a shard that agrees with
// its files; never crash.
#include <random>

#include "seeds.h"
#include "spes/ckpt/shard.h"
#include "spes/model/size.h"
#include "spes/util/error.h"

namespace {

// A valid node shard of a tiny model, written once per process.
std::filesystem::path template_folder() {
  static const std::filesystem::path dir = [] {
    const auto path = std::filesystem::temp_directory_path() / ("spes-fuzz-ckpt-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    spes::Config c;
    c.model.vocab_size = 32;
    c.model.d_model = 8;
    c.model.n_layers = 1;
    c.model.n_heads = 2;
    c.model.d_ff = 6;
    c.model.n_experts = 2;
    c.model.top_k = 1;
    c.model.max_seq_len = 16;
    c.train.owned_experts = {0};
    spes::Shard s;
    s.info.step = 7;
    s.info.sync_round = 1;
    s.info.owned_experts = {0};
    s.info.config_fields = spes::resume_fields(c);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (const auto& [name, shape] : spes::parameter_shapes(c.model)) {
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      spes::LoadedTensor t{shape, std::vector<float>(static_cast<std::size_t>(n))};
      for (auto& v : t.values) v = normal(rng);
      s.model[name] = t;
      s.info.adam_steps[name] = 7;
      s.optimizer[name + ".exp_avg"] = t;
      s.optimizer[name + ".exp_avg_sq"] = t;
    }
    spes::write_shard_folder(path.string(), s);
    return path;
  }();
  return dir;
}

}  // namespace

void write_seeds(const std::filesystem::path& dir) {
  std::filesystem::copy_file(template_folder() / "manifest.json", dir / "manifest");
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto folder = template_folder();
  {
    std::ofstream out(folder / "manifest.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const spes::Shard s = spes::read_shard(folder.string());
    for (const auto& [name, t] : s.model) {
      std::int64_t n = 1;
      for (auto d : t.shape) n *= d;
      if (static_cast<std::size_t>(n) != t.values.size()) std::abort();
    }
  } catch (const spes::Error&) {
  }
  return 0;
}
