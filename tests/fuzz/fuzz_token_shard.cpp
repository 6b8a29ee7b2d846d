// The token shard reader (data/*.bin) on arbitrary bytes: refused with spes::Error, or every
// token below the vocabulary size it declares.
#include "seeds.h"
#include "spes/data/shard.h"
#include "spes/util/error.h"

void write_seeds(const std::filesystem::path& dir) {
  spes::write_token_shard(dir / "small", {1, 2, 3, 0, 7, 1}, 8, 0);
  spes::write_token_shard(dir / "one", {5}, 512, 2);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = as_scratch_file("shard", data, size);
  try {
    spes::TokenShard shard(path);
    for (auto t : shard.tokens())
      if (t >= shard.vocab_size()) std::abort();
  } catch (const spes::Error&) {
  }
  return 0;
}
