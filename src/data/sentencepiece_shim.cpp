// The SentencePiece shim module: see sentencepiece_shim.h for why it exists.
#include "sentencepiece_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

char* copy_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

int report(const sentencepiece::util::Status& status, char** error) {
  if (status.ok()) return 0;
  if (error != nullptr) *error = copy_string(status.ToString());
  return 1;
}

class CallbackIterator : public sentencepiece::SentenceIterator {
 public:
  CallbackIterator(spes_sp_next_line next, void* context) : next_(next), context_(context) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    std::size_t length = 0;
    const char* line = next_(context_, &length);
    if (line == nullptr) {
      done_ = true;
      return;
    }
    value_.assign(line, length);
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  spes_sp_next_line next_;
  void* context_;
  std::string value_;
  bool done_ = false;
};

}  // namespace

extern "C" {

void* spes_sp_load(const char* model_path, char** error) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  if (report(sp->Load(model_path), error) != 0) {
    delete sp;
    return nullptr;
  }
  return sp;
}

void spes_sp_close(void* handle) { delete static_cast<sentencepiece::SentencePieceProcessor*>(handle); }

int spes_sp_piece_size(void* handle) { return static_cast<sentencepiece::SentencePieceProcessor*>(handle)->GetPieceSize(); }

int spes_sp_eos_id(void* handle) { return static_cast<sentencepiece::SentencePieceProcessor*>(handle)->eos_id(); }

int spes_sp_encode(void* handle, const char* text, std::size_t length, int** ids, std::size_t* count, char** error) {
  std::vector<int> out;
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  if (report(sp->Encode(std::string_view(text, length), &out), error) != 0) return 1;
  *count = out.size();
  *ids = static_cast<int*>(std::malloc(std::max<std::size_t>(1, out.size()) * sizeof(int)));
  std::memcpy(*ids, out.data(), out.size() * sizeof(int));
  return 0;
}

int spes_sp_decode(void* handle, const int* ids, std::size_t count, char** text, char** error) {
  std::string out;
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  if (report(sp->Decode(std::vector<int>(ids, ids + count), &out), error) != 0) return 1;
  *text = copy_string(out);
  return 0;
}

int spes_sp_train(const char* const* options, std::size_t option_count, unsigned seed, spes_sp_next_line next_line,
                  void* context, char** model, std::size_t* model_length, char** error) {
  std::unordered_map<std::string, std::string> kwargs;
  for (std::size_t i = 0; i < option_count; ++i) {
    std::string kv = options[i];
    auto eq = kv.find('=');
    kwargs[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
  }
  sentencepiece::SetRandomGeneratorSeed(seed);
  CallbackIterator lines(next_line, context);
  std::string serialized;
  if (report(sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, &serialized), error) != 0) return 1;
  *model_length = serialized.size();
  *model = static_cast<char*>(std::malloc(std::max<std::size_t>(1, serialized.size())));
  std::memcpy(*model, serialized.data(), serialized.size());
  return 0;
}

void spes_sp_free_string(char* s) { std::free(s); }
void spes_sp_free_ids(int* ids) { std::free(ids); }
}
