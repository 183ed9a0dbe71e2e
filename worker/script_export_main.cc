// chorus-script-export: puts a checkpoint's weights into the TorchScript
// module a job trained and saves the module, for `chorus export --torchscript`
// (the CLI itself does not link LibTorch).
//
//   chorus-script-export --module MODULE.pt --state model.pt --output OUT.pt
//
// MODULE.pt is the job's torchscript.path (the untrained module), model.pt
// a checkpoint's state dict. Every parameter and buffer of the module must be
// in the state dict with the same shape and dtype. Writes OUT.pt atomically;
// torch.jit.load reads it. Exit 0 on success, 1 with a message otherwise.

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <string>

namespace {

int Fail(const std::string& why) {
  std::cerr << "chorus-script-export: " << why << "\n";
  return 1;
}

int Main(int argc, char** argv) {
  std::string module_path, state_path, output;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--module")
      module_path = argv[i + 1];
    else if (flag == "--state")
      state_path = argv[i + 1];
    else if (flag == "--output")
      output = argv[i + 1];
    else
      return Fail("unknown flag " + flag);
  }
  if (module_path.empty() || state_path.empty() || output.empty()) {
    return Fail("usage: chorus-script-export --module MODULE.pt --state model.pt --output OUT.pt");
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(module_path);
  } catch (const std::exception& e) {
    return Fail("cannot load the job's TorchScript module " + module_path + ": " + e.what());
  }
  std::ifstream in(state_path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, at::Tensor> state;
  try {
    c10::IValue value = torch::jit::pickle_load(bytes);
    for (const auto& item : value.toGenericDict())
      state[item.key().toStringRef()] = item.value().toTensor();
  } catch (const std::exception& e) {
    return Fail("cannot read the checkpoint's state dict " + state_path + ": " + e.what());
  }
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, at::Tensor target) -> bool {
    auto it = state.find(name);
    if (it == state.end()) {
      Fail("the checkpoint has no tensor \"" + name + "\" of the module: was it trained from " +
           module_path + "?");
      return false;
    }
    if (it->second.sizes() != target.sizes() || it->second.scalar_type() != target.scalar_type()) {
      Fail("checkpoint tensor \"" + name + "\" is " + c10::str(it->second.sizes()) +
           ", the module's is " + c10::str(target.sizes()) +
           ": the module file changed since training");
      return false;
    }
    target.copy_(it->second);
    return true;
  };
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (!load(p.name, p.value)) return 1;
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    if (!load(b.name, b.value)) return 1;
  }
  const std::string tmp = output + ".tmp";
  try {
    module.save(tmp);
  } catch (const std::exception& e) {
    return Fail("cannot write " + output + ": " + e.what());
  }
  if (std::rename(tmp.c_str(), output.c_str()) != 0) return Fail("cannot write " + output);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
