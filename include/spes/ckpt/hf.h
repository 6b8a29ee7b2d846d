// Hugging Face model folders, torch-free: export a checkpoint folder as an OLMoE folder (QK-norm
// over the full q and k vectors) or a Qwen3-MoE folder (per-head QK-norm), and read such folders
// back. Tensor names are ours with a "model." prefix (lm_head.weight as it is); see
// ARCHITECTURE.md and docs/checkpoint-format.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "spes/ckpt/shard.h"

namespace spes {

struct HfExportReport {
  std::string model_type;  // olmoe | qwen3_moe
  std::size_t tensors = 0;
  std::int64_t bytes = 0;  // of model.safetensors
  bool tokenizer = false;  // tokenizer files written
};

// Writes out_dir/config.json, model.safetensors (F32), generation_config.json and, when
// `tokenizer` names a SentencePiece model, tokenizer.model with tokenizer_config.json and
// special_tokens_map.json (a Llama-style SentencePiece tokenizer for transformers). The folder is
// written under a temporary name and renamed; an existing out_dir is an error.
// Error(Checkpoint) when the model has no such layout (no QK-norm).
HfExportReport export_hf(const Shard& model, const std::string& out_dir, const std::string& tokenizer);

// Reads an OLMoE or Qwen3-MoE folder (config.json; model.safetensors or a sharded
// model.safetensors.index.json; F32, BF16 or F16) into a weights-only folder of kind "imported".
// Error(Checkpoint) naming the file and key for an unsupported config or a missing or misshaped
// tensor.
Shard import_hf(const std::string& dir);

// Reads a dense Llama / Mistral / Qwen3 folder (safetensors) as a 1-expert model in our names
// (the MLP as expert 0, a zero router), kind "imported", for upcycling. Error(Checkpoint) for what
// spes cannot hold: biases, rope scaling, sliding windows, head_dim != hidden / heads.
Shard import_hf_dense(const std::string& dir);

// Every tensor of a Hugging Face folder under its own name (model.safetensors, or the files a
// model.safetensors.index.json lists), widened to fp32.
std::map<std::string, LoadedTensor> read_hf_tensors(const std::string& dir);

// A checkpoint folder (manifest.json) or a Hugging Face folder (config.json).
Shard read_model_folder(const std::string& path);

}  // namespace spes
