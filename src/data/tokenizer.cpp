#include "spes/data/tokenizer.h"

#include <dlfcn.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <mutex>
#include <sstream>

#include "sentencepiece_shim.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"

namespace spes {
namespace fs = std::filesystem;

namespace {

// The dlopen'ed SentencePiece shim (see sentencepiece_shim.h), loaded once per process.
struct SentencePieceModule {
  decltype(&spes_sp_load) load;
  decltype(&spes_sp_close) close;
  decltype(&spes_sp_piece_size) piece_size;
  decltype(&spes_sp_eos_id) eos_id;
  decltype(&spes_sp_encode) encode;
  decltype(&spes_sp_decode) decode;
  decltype(&spes_sp_train) train;
  decltype(&spes_sp_free_string) free_string;
  decltype(&spes_sp_free_ids) free_ids;
};

std::vector<fs::path> module_candidates() {
  std::vector<fs::path> out;
  if (const char* env = std::getenv("SPES_SENTENCEPIECE_MODULE")) out.emplace_back(env);
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back(exe.parent_path() / "libspes_sentencepiece.so");
    out.push_back(exe.parent_path() / ".." / "lib" / "libspes_sentencepiece.so");
  }
  out.emplace_back(SPES_SENTENCEPIECE_MODULE_PATH);  // the build tree
  return out;
}

template <typename F>
void bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (fn == nullptr) raise(ErrorKind::Io, "the SentencePiece module lacks {}: rebuild spes", name);
}

const SentencePieceModule& module() {
  static std::once_flag once;
  static SentencePieceModule m;
  std::call_once(once, [] {
    std::string tried;
    void* lib = nullptr;
    for (const auto& path : module_candidates()) {
      if (!fs::exists(path)) {
        tried += "\n  " + path.string() + " (missing)";
        continue;
      }
      lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (lib != nullptr) break;
      tried += "\n  " + path.string() + " (" + ::dlerror() + ")";
    }
    if (lib == nullptr) raise(ErrorKind::Io, "cannot load the SentencePiece module libspes_sentencepiece.so; tried:{}", tried);
    bind(lib, "spes_sp_load", m.load);
    bind(lib, "spes_sp_close", m.close);
    bind(lib, "spes_sp_piece_size", m.piece_size);
    bind(lib, "spes_sp_eos_id", m.eos_id);
    bind(lib, "spes_sp_encode", m.encode);
    bind(lib, "spes_sp_decode", m.decode);
    bind(lib, "spes_sp_train", m.train);
    bind(lib, "spes_sp_free_string", m.free_string);
    bind(lib, "spes_sp_free_ids", m.free_ids);
  });
  return m;
}

std::string take_error(char* error) {
  std::string s = error != nullptr ? error : "unknown error";
  if (error != nullptr) module().free_string(error);
  return s;
}

// Hands SentencePiece one non-empty line of the documents at a time.
struct LineFeeder {
  explicit LineFeeder(const std::vector<Document>& d) : docs(d) {}
  const std::vector<Document>& docs;
  std::size_t doc = 0;
  std::unique_ptr<std::istringstream> stream;
  std::string line;

  static const char* next(void* self, std::size_t* length) {
    auto* f = static_cast<LineFeeder*>(self);
    while (f->doc < f->docs.size()) {
      if (!f->stream) f->stream = std::make_unique<std::istringstream>(f->docs[f->doc].text);
      if (std::getline(*f->stream, f->line)) {
        if (f->line.empty()) continue;
        *length = f->line.size();
        return f->line.c_str();
      }
      f->stream.reset();
      ++f->doc;
    }
    return nullptr;
  }
};

}  // namespace

struct Tokenizer::Impl {
  void* handle = nullptr;
  ~Impl() {
    if (handle != nullptr) module().close(handle);
  }
};

Tokenizer::Tokenizer(const fs::path& model_file) : impl_(std::make_unique<Impl>()), path_(model_file) {
  if (!fs::exists(model_file))
    raise(ErrorKind::Data, "tokenizer model '{}' does not exist (run `spes data prepare` first, "
          "or fix data.tokenizer)", model_file.string());
  char* error = nullptr;
  impl_->handle = module().load(model_file.c_str(), &error);
  if (impl_->handle == nullptr)
    raise(ErrorKind::Data, "cannot load tokenizer model '{}': {}", model_file.string(), take_error(error));
  if (module().eos_id(impl_->handle) < 0)
    raise(ErrorKind::Data, "tokenizer model '{}' has no end-of-sequence piece", model_file.string());
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::train(const std::vector<Document>& docs, const fs::path& model_file,
                      const TokenizerTrainOptions& options) {
  if (docs.empty()) raise(ErrorKind::Data, "cannot train a tokenizer on an empty corpus");
  if (options.vocab_size < 64)
    raise(ErrorKind::Data, "tokenizer vocab size {} is too small (at least 64)", options.vocab_size);
  // Byte fallback needs 256 byte pieces; only worth it when the vocabulary has room.
  const bool byte_fallback = options.vocab_size >= 2048;
  std::vector<std::string> args = {
      "model_type=" + options.model_type,
      "vocab_size=" + std::to_string(options.vocab_size),
      "character_coverage=1.0",
      std::string("byte_fallback=") + (byte_fallback ? "true" : "false"),
      "num_threads=" + std::to_string(std::max(1, options.threads)),
      "max_sentence_length=16384",
      "hard_vocab_limit=true",
      "minloglevel=2",
  };
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  LineFeeder feeder(docs);
  char* model = nullptr;
  std::size_t model_length = 0;
  char* error = nullptr;
  if (module().train(argv.data(), argv.size(), options.seed, &LineFeeder::next, &feeder, &model, &model_length, &error) != 0)
    raise(ErrorKind::Data, "SentencePiece training failed for vocab size {}: {} "
          "(a smaller model.vocab_size may fit this corpus)", options.vocab_size, take_error(error));
  std::string serialized(model, model_length);
  module().free_string(model);
  write_file_atomic(model_file, serialized);
}

std::vector<std::uint32_t> Tokenizer::encode(const std::string& text) const {
  int* ids = nullptr;
  std::size_t count = 0;
  char* error = nullptr;
  if (module().encode(impl_->handle, text.data(), text.size(), &ids, &count, &error) != 0)
    raise(ErrorKind::Data, "tokenizer '{}' failed to encode: {}", path_.string(), take_error(error));
  std::vector<std::uint32_t> out(ids, ids + count);
  module().free_ids(ids);
  return out;
}

std::string Tokenizer::decode(const std::vector<std::uint32_t>& ids) const {
  std::vector<int> as_int(ids.begin(), ids.end());
  char* text = nullptr;
  char* error = nullptr;
  if (module().decode(impl_->handle, as_int.data(), as_int.size(), &text, &error) != 0)
    raise(ErrorKind::Data, "tokenizer '{}' failed to decode: {}", path_.string(), take_error(error));
  std::string out(text);
  module().free_string(text);
  return out;
}

std::int64_t Tokenizer::vocab_size() const { return module().piece_size(impl_->handle); }
std::uint32_t Tokenizer::eos_id() const { return static_cast<std::uint32_t>(module().eos_id(impl_->handle)); }

}  // namespace spes
