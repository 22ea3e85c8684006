// Character-level text data (lib/models/text_data.h).
#include "lib/models/text_data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

namespace dtrun::train {
namespace {

// A whole file as bytes (the text, the token files, meta.pkl).
Result<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Invalid(path + ": cannot be read");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// nanoGPT's train.bin and val.bin: raw uint16 token ids, little-endian,
// as numpy's tofile() writes them on x86.
Result<std::vector<uint16_t>> ReadTokens(const std::string& path) {
  auto bytes = ReadWhole(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() % 2 != 0) {
    return Status::Invalid(path + ": " + std::to_string(bytes->size()) +
                           " bytes, not a whole number of uint16 tokens");
  }
  std::vector<uint16_t> out(bytes->size() / 2);
  std::memcpy(out.data(), bytes->data(), bytes->size());
  return out;
}

// meta.pkl as nanoGPT's prepare.py writes it (pickle protocol 4: a dict of
// vocab_size, itos and stoi): read by its opcodes, only as far as those two
// keys need. Integers: BININT1 'K', BININT2 'M', BININT 'J'; strings:
// SHORT_BINUNICODE 0x8c, BINUNICODE 'X'; memo writes (0x94, 'q', 'r')
// are skipped.
class MetaReader {
 public:
  explicit MetaReader(std::string bytes) : b_(std::move(bytes)) {}

  // The int after the string `key`, or -1.
  int64_t IntAfter(const std::string& key) {
    if (!Seek(key)) return -1;
    int64_t v = -1;
    return Int(&v) ? v : -1;
  }
  // itos: pairs of (int, string) after the key, until anything else.
  std::vector<std::string> Itos() {
    std::vector<std::string> out;
    if (!Seek("itos")) return out;
    while (pos_ < b_.size() && (b_[pos_] == '}' || b_[pos_] == '(')) {
      ++pos_;
      SkipMemo();
    }
    int64_t id = 0;
    std::string s;
    while (Int(&id) && Str(&s)) {
      if (id < 0 || id > 65535) break;
      if (out.size() <= static_cast<size_t>(id)) out.resize(id + 1);
      out[id] = s;
    }
    return out;
  }

 private:
  bool Seek(const std::string& key) {
    std::string needle = std::string(1, '\x8c') + char(key.size()) + key;
    size_t at = b_.find(needle);
    if (at == std::string::npos) return false;
    pos_ = at + needle.size();
    SkipMemo();
    return true;
  }
  void SkipMemo() {
    while (pos_ < b_.size()) {
      const unsigned char op = b_[pos_];
      if (op == 0x94) {
        pos_ += 1;
      } else if (op == 'q') {
        pos_ += 2;
      } else if (op == 'r') {
        pos_ += 5;
      } else {
        return;
      }
    }
  }
  uint64_t Le(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n && pos_ + i < b_.size(); ++i)
      v |= uint64_t(static_cast<unsigned char>(b_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  bool Int(int64_t* v) {
    if (pos_ >= b_.size()) return false;
    const char op = b_[pos_++];
    if (op == 'K') {
      *v = static_cast<int64_t>(Le(1));
    } else if (op == 'M') {
      *v = static_cast<int64_t>(Le(2));
    } else if (op == 'J') {
      *v = static_cast<int32_t>(Le(4));
    } else {
      --pos_;
      return false;
    }
    SkipMemo();
    return pos_ <= b_.size();
  }
  bool Str(std::string* s) {
    if (pos_ >= b_.size()) return false;
    const unsigned char op = b_[pos_++];
    size_t n = 0;
    if (op == 0x8c) {
      n = Le(1);
    } else if (op == 'X') {
      n = Le(4);
    } else {
      --pos_;
      return false;
    }
    if (pos_ + n > b_.size()) return false;
    *s = b_.substr(pos_, n);
    pos_ += n;
    SkipMemo();
    return true;
  }

  std::string b_;
  size_t pos_ = 0;
};

// nanoGPT's prepared folder; without meta.pkl (a BPE-tokenised one) the
// vocabulary is GPT-2's padded size, as nanoGPT assumes, and samples print
// token ids.
Result<TextData> LoadFolder(const std::string& dir) {
  TextData d;
  auto train = ReadTokens(dir + "/train.bin");
  if (!train.ok()) return train.status();
  auto val = ReadTokens(dir + "/val.bin");
  if (!val.ok()) return val.status();
  d.train = std::move(*train);
  d.val = std::move(*val);
  auto meta = ReadWhole(dir + "/meta.pkl");
  if (meta.ok()) {
    MetaReader reader(std::move(*meta));
    d.vocab_size = reader.IntAfter("vocab_size");
    d.itos = reader.Itos();
    if (d.vocab_size <= 0) {
      return Status::Invalid(dir +
                             "/meta.pkl: no vocab_size in it (write it "
                             "with nanoGPT's prepare.py)");
    }
  } else {
    d.vocab_size = 50304;  // nanoGPT's default: GPT-2's, padded
  }
  uint16_t top = 0;
  for (auto t : d.train) top = std::max(top, t);
  for (auto t : d.val) top = std::max(top, t);
  if (top >= d.vocab_size) {
    return Status::Invalid(dir + ": token " + std::to_string(top) +
                           " is not below vocab_size " +
                           std::to_string(d.vocab_size));
  }
  return d;
}

}  // namespace

Result<TextData> LoadTextData(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return Status::Invalid("data.path '" + path +
                           "': no such file or folder; give a text file or "
                           "nanoGPT's prepared folder (train.bin, val.bin)");
  }
  if (S_ISDIR(st.st_mode)) return LoadFolder(path);
  auto text = ReadWhole(path);
  if (!text.ok()) return text.status();
  std::set<unsigned char> chars(text->begin(), text->end());
  TextData d;
  std::vector<int> stoi(256, -1);
  for (unsigned char c : chars) {
    stoi[c] = static_cast<int>(d.itos.size());
    d.itos.push_back(std::string(1, static_cast<char>(c)));
  }
  d.vocab_size = static_cast<int64_t>(d.itos.size());
  const size_t n = text->size(), cut = static_cast<size_t>(n * 0.9);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<uint16_t>(stoi[(unsigned char)(*text)[i]]);
    (i < cut ? d.train : d.val).push_back(id);
  }
  return d;
}

// A token without text (no meta.pkl) prints as its id.
std::string TextData::Decode(const torch::Tensor& tokens) const {
  auto t = tokens.to(torch::kCPU).to(torch::kLong).contiguous();
  std::string out;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t id = t.data_ptr<int64_t>()[i];
    out += id >= 0 && id < static_cast<int64_t>(itos.size())
               ? itos[static_cast<size_t>(id)]
               : "<" + std::to_string(id) + ">";
  }
  return out;
}

// Greedy, longest token first: the text's characters are single bytes for
// a text file, and whatever itos holds for a prepared folder.
Result<torch::Tensor> TextData::Encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < text.size();) {
    size_t best = 0;
    int64_t id = -1;
    for (size_t k = 0; k < itos.size(); ++k) {  // the longest match
      const std::string& s = itos[k];
      if (!s.empty() && s.size() > best && text.compare(i, s.size(), s) == 0) {
        best = s.size();
        id = static_cast<int64_t>(k);
      }
    }
    if (id < 0) {
      return Status::Invalid("the prompt's character at byte " +
                             std::to_string(i) +
                             " is not in the data's vocabulary");
    }
    ids.push_back(id);
    i += best;
  }
  return torch::tensor(ids, torch::kLong).view({1, -1});
}

// nanoGPT's get_batch: offsets uniform in [0, n - block), y one token on;
// the generator is the caller's seed alone, not torch's global one.
void TextWindows(const std::vector<uint16_t>& data, int64_t block, int batch,
                 uint64_t seed, torch::Device device, torch::Tensor* x,
                 torch::Tensor* y) {
  const int64_t n = static_cast<int64_t>(data.size());
  if (n <= block) {
    throw std::invalid_argument(
        "the text has " + std::to_string(n) +
        " tokens in a split, not more than model.block_size (" +
        std::to_string(block) + "): use more text or a smaller block_size");
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto offsets = torch::randint(n - block, {batch}, gen, torch::kLong);
  auto xs = torch::empty({batch, block}, torch::kLong);
  auto ys = torch::empty({batch, block}, torch::kLong);
  int64_t* xp = xs.data_ptr<int64_t>();
  int64_t* yp = ys.data_ptr<int64_t>();
  for (int b = 0; b < batch; ++b) {
    const int64_t at = offsets[b].item<int64_t>();
    for (int64_t t = 0; t < block; ++t) {
      xp[b * block + t] = data[static_cast<size_t>(at + t)];
      yp[b * block + t] = data[static_cast<size_t>(at + t + 1)];
    }
  }
  *x = xs.to(device);
  *y = ys.to(device);
}

}  // namespace dtrun::train
