// A state dict from a file into a module by name (lib/trainer.h,
// LoadStateDict): model.init_from and train_cfg --sample read weights
// saved by this library or by torch.save.
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lib/checkpoint.h"
#include "lib/formats/checkpoint_payload.h"
#include "lib/process_group.h"
#include "lib/trainer.h"

namespace dtrun::train {
namespace {

// A .dtck file's named tensors as a state dict: a DDP step's file (its
// "ddp.model." tensors, the prefix dropped) or a file of named tensors
// (python -m dtrun.checkpoint import). An FSDP step's file holds no
// weights (its shards do), so it is refused with the way around.
std::map<std::string, torch::Tensor> ReadDtckStateDict(const std::string& what,
                                                       std::string bytes) {
  auto view = VerifyCheckpointBytes(std::move(bytes));
  if (!view.ok()) throw Error(what + ": " + view.status().message());
  auto tensors = DecodeTensors(*view);
  if (!tensors.ok()) throw Error(what + ": " + tensors.status().message());
  if (tensors->count("fsdp_shards"))
    throw Error(what +
                " is an FSDP step's file, whose shards hold the "
                "weights; convert the folder with python -m "
                "dtrun.checkpoint convert DIR OUT.pt, then import it");
  const std::string ddp = "ddp.model.";
  const bool step_file = tensors->count("step") > 0;
  std::map<std::string, torch::Tensor> given;
  for (auto& [name, t] : *tensors) {
    if (!step_file) {
      given[name] = t.clone();  // the payload's memory goes with `view`
    } else if (name.compare(0, ddp.size(), ddp) == 0) {
      given[name.substr(ddp.size())] = t.clone();
    }
  }
  return given;
}

// A torch.save file's plain dict of tensors. libtorch's reader turns
// collections.OrderedDict (what model.state_dict() is) into None and then
// fails to fill it: such a file is named as what it is, with the fix.
std::map<std::string, torch::Tensor> ReadPickledStateDict(
    const std::string& what, const std::vector<char>& bytes,
    const std::string& fix) {
  c10::IValue v;
  try {
    v = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    static const std::string kOrdered = "collections\nOrderedDict";
    if (std::search(bytes.begin(), bytes.end(), kOrdered.begin(),
                    kOrdered.end()) == bytes.end()) {
      std::string why = e.what();
      throw Error(what + ": neither a .dtck file nor one of torch.save (" +
                  why.substr(0, why.find('\n')) + ")" + fix);
    }
  }
  if (v.isNone())
    throw Error(what +
                " holds an OrderedDict (as torch.save(model.state_dict()) "
                "writes), which libtorch's reader cannot take" +
                fix);
  if (!v.isGenericDict())
    throw Error(what + " holds a " + std::string(v.tagKind()) +
                ", not a state dict (a dict of tensors by name)" + fix);
  std::map<std::string, torch::Tensor> given;
  for (const auto& e : v.toGenericDict()) {
    if (!e.key().isString() || !e.value().isTensor())
      throw Error(what + ": an entry that is not a name and a tensor" + fix);
    given[e.key().toStringRef()] = e.value().toTensor();
  }
  return given;
}

// The named tensors of model.init_from: a .dtck file or a torch.save'd
// plain dict.
std::map<std::string, torch::Tensor> ReadStateDictFile(
    const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(what + ": cannot be read: " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)),
                          std::istreambuf_iterator<char>());
  if (bytes.size() >= 6 && std::memcmp(bytes.data(), "DTCKPT", 6) == 0)
    return ReadDtckStateDict(what, std::string(bytes.begin(), bytes.end()));
  return ReadPickledStateDict(
      what, bytes,
      "; convert it with python -m dtrun.checkpoint import " + path +
          " OUT.dtck (or save dict(model.state_dict()))");
}

// model.init_from into the model's parameters and buffers by name. Every
// name must match, with its shape: a partial load would train a model that
// is half drawn.
}  // namespace

void LoadStateDict(torch::nn::Module& model, const std::string& path,
                   const std::string& what) {
  std::map<std::string, torch::Tensor> given = ReadStateDictFile(path, what);
  torch::NoGradGuard no_grad;
  std::string names;
  auto take = [&](const std::string& name, torch::Tensor& into) {
    names += (names.empty() ? "" : ", ") + name;
    auto it = given.find(name);
    if (it == given.end())
      throw Error(what + " has no '" + name + "' (the model's " + name +
                  " would stay drawn)");
    if (it->second.sizes() != into.sizes()) {
      std::ostringstream s;
      s << what << ": '" << name << "' is " << it->second.sizes()
        << ", the model's is " << into.sizes();
      throw Error(s.str());
    }
    into.copy_(it->second);
    given.erase(it);
  };
  for (auto& p : model.named_parameters()) take(p.key(), p.value());
  for (auto& b : model.named_buffers()) take(b.key(), b.value());
  if (!given.empty())
    throw Error(what + ": '" + given.begin()->first +
                "' is not in this model (its names: " + names + ")");
}

}  // namespace dtrun::train
