// `spes data prepare`: corpus → tokenizer → train/validation token shards in data.dir.
//
// data.dir/tokenizer.model, train.bin, val.bin and meta.json (what was built from what).
// Documents are split into train and validation by a hash of their names, so the split does
// not depend on file order; the tokenizer is trained on the train documents only; every
// document ends with the EOS token. A data.dir whose meta.json matches the config is reused.
#pragma once

#include <cstdint>
#include <filesystem>

#include "spes/config/config.h"

namespace spes {

struct DataPaths {
  std::filesystem::path dir, tokenizer, train, val, meta;
};
DataPaths data_paths(const DataConfig& data);

struct PreparedData {
  DataPaths paths;
  std::int64_t vocab_size = 0;
  std::int64_t train_tokens = 0, val_tokens = 0;
  std::int64_t train_docs = 0, val_docs = 0;
  bool reused = false;  // an existing, matching preparation was kept
};

// force: rebuild even when data.dir already matches.
PreparedData prepare_data(const Config& config, bool force = false);

// True when document `name` belongs to the validation split.
bool is_validation_document(const std::string& name, double val_fraction);

}  // namespace spes
