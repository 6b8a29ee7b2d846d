#include "spes/util/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "spes/util/error.h"
#include "spes/util/fs.h"

namespace spes {
namespace {

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int shift = 0;
      while (!(mant & 0x400u)) { mant <<= 1; ++shift; }
      bits = sign | (static_cast<std::uint32_t>(113 - shift) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Little-endian 16-bit values (bf16: the top half of an fp32; f16: IEEE half) to fp32, exactly.
void widen_to_f32(const char* src, bool bf16, std::vector<float>& out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::uint16_t h = static_cast<std::uint16_t>(static_cast<unsigned char>(src[2 * i]) |
                                                       (static_cast<unsigned char>(src[2 * i + 1]) << 8));
    if (bf16) {
      const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
      std::memcpy(&out[i], &bits, 4);
    } else {
      out[i] = f16_to_f32(h);
    }
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};  // what transformers checks for
  std::size_t offset = 0;
  for (const auto& t : tensors) {
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    const std::size_t bytes = static_cast<std::size_t>(n) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // data starts 8-byte aligned
  std::string out(8, '\0');
  const std::uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += text;
  out.reserve(out.size() + offset);
  for (const auto& t : tensors) {
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    out.append(reinterpret_cast<const char*>(t.data), static_cast<std::size_t>(n) * 4);
  }
  write_file_atomic(path, out);
}

std::map<std::string, LoadedTensor> read_safetensors(const std::string& path) {
  std::string file;
  try {
    file = read_file(path);
  } catch (const Error& e) {
    raise(ErrorKind::Checkpoint, "{}", e.what());
  }
  if (file.size() < 8) raise(ErrorKind::Checkpoint, "'{}' is too short to be a safetensors file", path);
  std::uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<std::uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  if (len > file.size() - 8) raise(ErrorKind::Checkpoint, "'{}': header length {} exceeds the file", path, len);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.substr(8, len));
  } catch (const nlohmann::json::exception& e) {
    raise(ErrorKind::Checkpoint, "'{}': header is not JSON: {}", path, e.what());
  }
  if (!header.is_object()) raise(ErrorKind::Checkpoint, "'{}': header is not a JSON object", path);
  const std::size_t data_start = 8 + len;
  std::map<std::string, LoadedTensor> out;
  std::size_t data_end = 0;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    try {
      const auto& h = it.value();
      const std::string dtype = h.at("dtype").get<std::string>();
      const std::size_t width = dtype == "F32" ? 4 : (dtype == "BF16" || dtype == "F16") ? 2 : 0;
      if (width == 0)
        raise(ErrorKind::Checkpoint, "'{}': tensor '{}' is {}; F32, BF16 and F16 are read", path, it.key(), dtype);
      LoadedTensor t;
      t.shape = h.at("shape").get<std::vector<std::int64_t>>();
      const auto off = h.at("data_offsets").get<std::vector<std::size_t>>();
      // Every dimension >= 0 and no product past the file's size (no overflow to a small number).
      std::int64_t n = 1;
      for (auto d : t.shape) {
        if (d < 0 || (d > 0 && n > static_cast<std::int64_t>(file.size()) / d))
          raise(ErrorKind::Checkpoint, "'{}': tensor '{}' has an impossible shape", path, it.key());
        n *= d;
      }
      if (off.size() != 2 || off[1] < off[0] || off[1] - off[0] != static_cast<std::size_t>(n) * width ||
          data_start + off[1] > file.size())
        raise(ErrorKind::Checkpoint, "'{}': tensor '{}' has bad data offsets", path, it.key());
      t.values.resize(static_cast<std::size_t>(n));
      const char* src = file.data() + data_start + off[0];
      if (dtype == "F32") std::memcpy(t.values.data(), src, off[1] - off[0]);
      else widen_to_f32(src, dtype == "BF16", t.values);
      data_end = std::max(data_end, off[1]);
      out.emplace(it.key(), std::move(t));
    } catch (const nlohmann::json::exception& e) {
      raise(ErrorKind::Checkpoint, "'{}': tensor '{}': {}", path, it.key(), e.what());
    }
  }
  if (data_start + data_end != file.size())
    raise(ErrorKind::Checkpoint, "'{}' has {} bytes after its last tensor (truncated or appended to?)", path,
          file.size() - data_start - data_end);
  return out;
}

}  // namespace spes
